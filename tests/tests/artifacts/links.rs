//! Every relative link of the documentation leads somewhere: the README links to docs/ pages
//! instead of copying them, so a moved file or a renamed heading must fail a test, not a reader.
//!
//! A link's file must exist, and an `#anchor` into a Markdown file must be the slug of one of
//! its headings, by GitHub's rules (lowercase; letters, digits, `-` and `_` kept, spaces to `-`,
//! other punctuation dropped; a repeated heading gets `-1`, `-2`...). External links are not
//! fetched: the tests have no network.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate lives in the repository")
        .to_path_buf()
}

/// The Markdown files whose links are checked: the front page, every docs/ page, the SDKs'
/// READMEs and the other READMEs the front page links to.
fn checked_files(root: &Path) -> Vec<PathBuf> {
    let mut files = vec![root.join("README.md"), root.join("BENCHMARKS.md")];
    for dir in ["docs", "devcluster"] {
        let entries = std::fs::read_dir(root.join(dir)).expect("the folder exists");
        files.extend(
            entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == "md")),
        );
    }
    for readme in ["sdk", "python-sdk", "typescript-sdk", "python", "memcached"] {
        files.push(root.join("controllers").join(readme).join("README.md"));
    }
    files.push(root.join("tests/conformance/README.md"));
    files.push(root.join("fuzz/README.md"));
    files.retain(|f| f.exists());
    files.sort();
    files
}

/// The lines of `doc` outside fenced code blocks, with their 1-based numbers.
fn prose_lines(doc: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (i, line) in doc.lines().enumerate() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
            fenced = !fenced;
        } else if !fenced {
            out.push((i + 1, line));
        }
    }
    out
}

/// `line` without its inline code spans (`` `a](b)` `` is code, not a link), each replaced by
/// `x` so that a link whose text is code (``[`x`](y)``) keeps its shape.
fn without_code(line: &str) -> String {
    let mut out = String::new();
    let mut parts = line.split('`');
    if let Some(first) = parts.next() {
        out.push_str(first);
    }
    let rest: Vec<&str> = parts.collect();
    for (i, part) in rest.iter().enumerate() {
        // Odd pieces are code; an unclosed last backtick leaves plain text.
        if i % 2 == 0 && i + 1 < rest.len() {
            out.push('x');
        } else if i % 2 == 1 {
            out.push_str(part);
        } else {
            out.push('`');
            out.push_str(part);
        }
    }
    out
}

/// The targets of the inline links and images of `line` (`[text](target "title")`).
fn link_targets(line: &str) -> Vec<String> {
    let line = without_code(line);
    let mut targets = Vec::new();
    let mut rest = line.as_str();
    while let Some(i) = rest.find("](") {
        let after = &rest[i + 2..];
        let end = after.find(')').unwrap_or(after.len());
        let target = after[..end].split_whitespace().next().unwrap_or_default();
        targets.push(target.trim_matches(['<', '>']).to_string());
        rest = &after[end..];
    }
    targets
}

/// GitHub's anchor for a heading's text: inline links read as their text, then lowercase,
/// letters, digits, `-` and `_` kept, spaces made `-`, everything else dropped.
fn slug(heading: &str) -> String {
    let mut text = String::new();
    let mut rest = heading;
    // `[text](url)` renders as text: drop the `](url)` part and the brackets.
    while let Some(i) = rest.find("](") {
        text.push_str(&rest[..i]);
        let after = &rest[i + 2..];
        rest = after.find(')').map_or("", |j| &after[j + 1..]);
    }
    text.push_str(rest);
    text.trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// Every anchor `doc` defines: its headings' slugs (repeats numbered as GitHub numbers them)
/// and explicit `<a id>`/`<a name>` anchors.
fn anchors(doc: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for (_, line) in prose_lines(doc) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if (1..=6).contains(&hashes) && line[hashes..].starts_with(' ') {
            let base = slug(&line[hashes..]);
            let mut name = base.clone();
            let mut n = 0;
            while found.contains(&name) {
                n += 1;
                name = format!("{base}-{n}");
            }
            found.insert(name);
        }
        for attr in ["id=\"", "name=\""] {
            for (i, _) in line.match_indices(attr) {
                let value = &line[i + attr.len()..];
                if let Some(end) = value.find('"') {
                    found.insert(value[..end].to_string());
                }
            }
        }
    }
    found
}

/// What is wrong with one link of `file` (None when it leads somewhere).
fn broken(root: &Path, file: &Path, target: &str) -> Option<String> {
    if target.is_empty() {
        return Some("an empty link".into());
    }
    if target.contains("://") || target.starts_with("mailto:") {
        return None;
    }
    let (path, anchor) = target.split_once('#').unwrap_or((target, ""));
    let dest = if path.is_empty() {
        file.to_path_buf()
    } else if let Some(from_root) = path.strip_prefix('/') {
        root.join(from_root)
    } else {
        file.parent().expect("a file has a folder").join(path)
    };
    if !dest.exists() {
        return Some(format!("{target}: no such file"));
    }
    if anchor.is_empty() || dest.extension().is_none_or(|e| e != "md") {
        return None;
    }
    let doc = std::fs::read_to_string(&dest).expect("a Markdown file");
    (!anchors(&doc).contains(anchor)).then(|| format!("{target}: no heading #{anchor} there"))
}

#[test]
fn every_relative_link_of_the_docs_leads_to_a_file_and_heading() {
    let root = repo();
    let files = checked_files(&root);
    assert!(
        files.len() > 12,
        "the documentation was not found: {files:?}"
    );
    let mut problems = Vec::new();
    let mut links = 0;
    for file in &files {
        let doc = std::fs::read_to_string(file).expect("a Markdown file");
        for (number, line) in prose_lines(&doc) {
            for target in link_targets(line) {
                links += 1;
                if let Some(problem) = broken(&root, file, &target) {
                    let at = file.strip_prefix(&root).unwrap_or(file).display();
                    problems.push(format!("{at}:{number}: {problem}"));
                }
            }
        }
    }
    assert!(
        links > 50,
        "only {links} links found: the parser missed them"
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn slugs_follow_githubs_rules() {
    assert_eq!(slug(" The two commands"), "the-two-commands");
    assert_eq!(
        slug(" Bounds: what a stranger can spend"),
        "bounds-what-a-stranger-can-spend"
    );
    assert_eq!(
        slug(" Fault injection over HTTP (for out-of-process tests)"),
        "fault-injection-over-http-for-out-of-process-tests"
    );
    assert_eq!(
        slug(" Requests and results (`MODE_RECONCILE`)"),
        "requests-and-results-mode_reconcile"
    );
    assert_eq!(slug(" See [the guide](docs/x.md) now"), "see-the-guide-now");
    assert_eq!(slug(" Ünïcode stays, ✅ goes"), "ünïcode-stays--goes");
}

#[test]
fn repeated_headings_are_numbered_and_code_is_not_read() {
    let doc = "# A\n## Notes\n```sh\n# Notes\n```\n### Notes\n<a id=\"here\"></a>\n";
    let want: BTreeSet<String> = ["a", "notes", "notes-1", "here"].map(String::from).into();
    assert_eq!(anchors(doc), want);
    assert_eq!(
        link_targets("see [`x`](a.md#b), `[c](d)` and ![i](img.png \"title\")"),
        ["a.md#b", "img.png"]
    );
}
