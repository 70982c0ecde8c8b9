//! The README's command blocks, for tests that follow the documentation as written: a block is
//! marked by `<!-- NAME:begin -->` and `<!-- NAME:end -->` around one or more ```sh blocks.

use std::path::PathBuf;

/// The repository's root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("repository root")
}

/// The ```sh blocks of README.md between `<!-- NAME:begin -->` and `<!-- NAME:end -->`, in
/// order; panics when the markers or the blocks are missing.
pub fn readme_blocks(name: &str) -> Vec<String> {
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README.md");
    let (begin, end) = (
        format!("<!-- {name}:begin -->"),
        format!("<!-- {name}:end -->"),
    );
    let from = readme
        .find(&begin)
        .unwrap_or_else(|| panic!("README.md has no {begin}"));
    let to = from
        + readme[from..]
            .find(&end)
            .unwrap_or_else(|| panic!("README.md has no {end}"));
    let mut blocks = Vec::new();
    let mut rest = &readme[from..to];
    while let Some(i) = rest.find("```sh\n") {
        let body = &rest[i + "```sh\n".len()..];
        let j = body.find("```").expect("a closed block");
        blocks.push(body[..j].to_string());
        rest = &body[j + 3..];
    }
    assert!(!blocks.is_empty(), "no sh block between {begin} and {end}");
    blocks
}
