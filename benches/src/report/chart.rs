//! The latency chart.

use super::measure::Cell;
use super::render::p50_at;
use idempotency_bench::{Target, err};

/// Draws p50 latency by concurrency, one line per store, on a log scale.
pub(crate) fn draw(path: &std::path::Path, cells: &[Cell], levels: &[usize]) -> Result<(), String> {
    use plotters::prelude::*;
    let max = cells.iter().map(|c| c.p50_us).max().unwrap_or(1).max(2) as f64 * 1.5;
    let min = cells.iter().map(|c| c.p50_us).min().unwrap_or(1).max(1) as f64 / 1.5;
    let root = SVGBackend::new(path, (900, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption("p50 latency per request by concurrency", ("sans-serif", 22))
        .margin(16)
        .margin_right(48)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(
            0f64..(levels.len().max(2) - 1) as f64,
            (min..max).log_scale(),
        )
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_labels(levels.len())
        .x_label_formatter(&|x| {
            levels
                .get(x.round() as usize)
                .map_or(String::new(), |c| format!("{c} clients"))
        })
        .y_desc("µs (log scale)")
        .draw()
        .map_err(err)?;
    let colors = [RED, BLUE, GREEN, MAGENTA, BLACK];
    for (i, target) in Target::ALL.iter().enumerate() {
        let points: Vec<(f64, f64)> = levels
            .iter()
            .enumerate()
            .filter_map(|(x, &c)| p50_at(cells, *target, c).map(|p| (x as f64, p as f64)))
            .collect();
        if points.is_empty() {
            continue;
        }
        let color = colors[i % colors.len()];
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
            .map_err(err)?
            .label(target.name())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart
            .draw_series(
                points
                    .into_iter()
                    .map(|p| Circle::new(p, 3, color.filled())),
            )
            .map_err(err)?;
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}
