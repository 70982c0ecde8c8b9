//! The command blocks of the README and the docs/ pages, for tests that follow the
//! documentation as written: a block is marked by `<!-- NAME:begin -->` and `<!-- NAME:end -->`
//! around one or more ```sh blocks, in the page that documents it.

use std::path::PathBuf;

/// The repository's root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("repository root")
}

/// The ```sh blocks of `doc` (a Markdown file, relative to the repository's root, e.g.
/// `docs/operating.md`) between `<!-- NAME:begin -->` and `<!-- NAME:end -->`, in order; panics
/// when the file, the markers or the blocks are missing.
pub fn doc_blocks(doc: &str, name: &str) -> Vec<String> {
    let text = std::fs::read_to_string(repo().join(doc)).unwrap_or_else(|e| panic!("{doc}: {e}"));
    let (begin, end) = (
        format!("<!-- {name}:begin -->"),
        format!("<!-- {name}:end -->"),
    );
    let from = text
        .find(&begin)
        .unwrap_or_else(|| panic!("{doc} has no {begin}"));
    let to = from
        + text[from..]
            .find(&end)
            .unwrap_or_else(|| panic!("{doc} has no {end}"));
    let mut blocks = Vec::new();
    let mut rest = &text[from..to];
    while let Some(i) = rest.find("```sh\n") {
        let body = &rest[i + "```sh\n".len()..];
        let j = body.find("```").expect("a closed block");
        blocks.push(body[..j].to_string());
        rest = &body[j + 3..];
    }
    assert!(
        !blocks.is_empty(),
        "no sh block between {begin} and {end} in {doc}"
    );
    blocks
}
