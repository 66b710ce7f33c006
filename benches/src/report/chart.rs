//! The latency chart.

use super::measure::Cell;
use super::render::p50_at;
use idempotency_bench::http_pg::PgRow;
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

/// Draws, at the largest client count measured, each variant's requests/s (top) and WAL bytes
/// per request (bottom) as bars: what the claim modes and table modes cost a service at a glance.
pub(crate) fn draw_http_pg(path: &std::path::Path, rows: &[PgRow]) -> Result<(), String> {
    use plotters::prelude::*;
    let Some(clients) = rows.iter().map(|r| r.clients).max() else {
        return Ok(());
    };
    let rows: Vec<_> = rows.iter().filter(|r| r.clients == clients).collect();
    let names: Vec<&str> = rows.iter().map(|r| r.variant.name()).collect();
    let root = SVGBackend::new(path, (1000, 720)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let (top, bottom) = root.split_vertically(360);
    fn throughput(row: &PgRow) -> f64 {
        row.throughput
    }
    fn wal(row: &PgRow) -> f64 {
        row.wal_per_request
    }
    type Value = fn(&PgRow) -> f64;
    let panels = [top, bottom];
    let measures: [(&str, Value); 2] = [("requests/s", throughput), ("WAL bytes per request", wal)];
    for (area, (what, value)) in panels.into_iter().zip(measures) {
        let max = rows.iter().map(|r| value(r)).fold(1.0, f64::max) * 1.15;
        let mut chart = ChartBuilder::on(&area)
            .caption(
                format!("{what} at {clients} clients, by handler"),
                ("sans-serif", 20),
            )
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(70)
            .build_cartesian_2d((0..names.len().max(1) - 1).into_segmented(), 0.0..max)
            .map_err(err)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(names.len())
            .x_label_formatter(&|x| match x {
                SegmentValue::CenterOf(i) => names.get(*i).map_or(String::new(), |n| {
                    n.replace("one-transaction", "1-tx")
                        .replace("-transaction", "-tx")
                }),
                _ => String::new(),
            })
            .y_desc(what)
            .draw()
            .map_err(err)?;
        chart
            .draw_series(rows.iter().enumerate().map(|(i, r)| {
                let color = if r.variant.name().starts_with("bare") {
                    BLACK.mix(0.5)
                } else if r.variant.name().starts_with("one-transaction") {
                    GREEN.mix(0.8)
                } else if r.variant.name().starts_with("lease") {
                    RED.mix(0.7)
                } else {
                    BLUE.mix(0.6)
                };
                let mut bar = Rectangle::new(
                    [
                        (SegmentValue::Exact(i), 0.0),
                        (SegmentValue::Exact(i + 1), value(r)),
                    ],
                    color.filled(),
                );
                bar.set_margin(0, 0, 12, 12);
                bar
            }))
            .map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}
