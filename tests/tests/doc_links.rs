//! Every relative link in the repository's Markdown (README files, `docs/`, the crates' front
//! pages) points at a file that exists, and a `#fragment` into a Markdown file at one of its
//! headings (GitHub's anchors). A renamed file or heading breaks the build, not a reader's click.
//! A crate's front page has no relative link at all (docs.rs and crates.io show it without the
//! repository), and the guides it names by path exist.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

/// The repository root (this crate lives in `tests/`).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Every `.md` file under `dir`, skipping build output and hidden folders.
fn markdown_files(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            if !name.starts_with('.') && name != "target" && name != "node_modules" {
                markdown_files(&path, found);
            }
        } else if name.ends_with(".md") {
            found.push(path);
        }
    }
}

/// The lines of `text` outside its code blocks (fenced with ```).
fn prose_lines(text: &str) -> impl Iterator<Item = &str> {
    let mut in_fence = false;
    text.lines().filter(move |line| {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            return false;
        }
        !in_fence
    })
}

/// The targets of the inline links `[text](target)` of `text`, outside code blocks and code
/// spans.
fn link_targets(text: &str) -> Vec<String> {
    let mut targets = Vec::new();
    for line in prose_lines(text) {
        // Drop code spans: a link inside backticks is an example, not a link.
        let plain: String = line.split('`').step_by(2).collect();
        let mut rest = plain.as_str();
        while let Some(start) = rest.find("](") {
            let after = &rest[start + 2..];
            let Some(end) = after.find(')') else { break };
            let target = after[..end].split_whitespace().next().unwrap_or("");
            targets.push(target.to_owned());
            rest = &after[end..];
        }
    }
    targets
}

/// GitHub's anchor of a heading: lower case, punctuation other than `-` and `_` dropped,
/// spaces as `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of every heading of a Markdown file.
fn anchors(text: &str) -> Vec<String> {
    prose_lines(text)
        .filter(|line| line.starts_with('#'))
        .map(|line| anchor(line.trim_start_matches('#')))
        .collect()
}

/// Whether `target` is another site's (or a mail address), not a file of this repository.
fn is_external(target: &str) -> bool {
    target.contains("://") || target.starts_with("mailto:")
}

#[test]
fn every_relative_link_in_the_markdown_resolves() {
    let root = root();
    let mut files = Vec::new();
    markdown_files(&root, &mut files);
    assert!(
        files.len() > 10,
        "found only {} Markdown files",
        files.len()
    );
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for target in link_targets(&text) {
            if target.is_empty() || is_external(&target) {
                continue;
            }
            checked += 1;
            let (path, fragment) = match target.split_once('#') {
                Some((path, fragment)) => (path, Some(fragment)),
                None => (target.as_str(), None),
            };
            let resolved = if path.is_empty() {
                file.clone()
            } else {
                file.parent().unwrap().join(path)
            };
            let shown = file.strip_prefix(&root).unwrap().display();
            if !resolved.exists() {
                broken.push(format!("{shown}: {target} (no such file)"));
                continue;
            }
            if let Some(fragment) = fragment
                && resolved.extension().is_some_and(|e| e == "md")
            {
                let headings = anchors(&std::fs::read_to_string(&resolved).unwrap());
                if !headings.iter().any(|a| a == fragment) {
                    broken.push(format!("{shown}: {target} (no such heading)"));
                }
            }
        }
    }
    assert!(checked > 20, "checked only {checked} links");
    assert!(
        broken.is_empty(),
        "{} broken links:\n{}",
        broken.len(),
        broken.join("\n")
    );
}

/// The code spans of `text` outside code blocks.
fn code_spans(text: &str) -> Vec<String> {
    prose_lines(text)
        .flat_map(|line| line.split('`').skip(1).step_by(2).map(str::to_owned))
        .collect()
}

/// The crates' front pages (`crates/*/README.md`), which are also their rustdoc.
fn crate_front_pages(root: &Path) -> Vec<PathBuf> {
    let mut pages: Vec<PathBuf> = std::fs::read_dir(root.join("crates"))
        .unwrap()
        .map(|entry| entry.unwrap().path().join("README.md"))
        .filter(|page| page.exists())
        .collect();
    pages.sort();
    pages
}

#[test]
fn a_crate_front_page_has_no_relative_link_and_the_guides_it_names_exist() {
    let root = root();
    let pages = crate_front_pages(&root);
    assert!(
        pages.len() > 5,
        "found only {} crate front pages",
        pages.len()
    );
    let mut wrong = Vec::new();
    let mut guides = 0;
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        let shown = page.strip_prefix(&root).unwrap().display();
        for target in link_targets(&text) {
            if !is_external(&target) {
                wrong.push(format!(
                    "{shown}: {target} (a relative link: docs.rs and crates.io show this page \
                     without the repository, so it leads nowhere there)"
                ));
            }
        }
        // A guide named by its path (`docs/http.md`), or by its name in the `docs/` folder.
        for span in code_spans(&text) {
            if !span.ends_with(".md") || span.contains(' ') {
                continue;
            }
            guides += 1;
            let path = if span.contains('/') {
                root.join(&span)
            } else {
                root.join("docs").join(&span)
            };
            if !path.exists() {
                wrong.push(format!(
                    "{shown}: `{span}` (no such file in the repository)"
                ));
            }
        }
    }
    assert!(guides > 15, "the front pages name only {guides} guides");
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_checker_sees_links_and_anchors_as_github_does() {
    assert_eq!(
        link_targets("see [a](docs/a.md#x-y) and `[b](no.md)` and [c](https://e.org)"),
        ["docs/a.md#x-y", "https://e.org"]
    );
    assert_eq!(
        anchor(" What each table mode guarantees across a database crash"),
        "what-each-table-mode-guarantees-across-a-database-crash"
    );
    assert_eq!(
        anchor("`once` on NATS: JetStream"),
        "once-on-nats-jetstream"
    );
}
