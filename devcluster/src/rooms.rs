//! The module map, checked: every `crate::` path in a room's code names a room it may call
//! (devcluster/README.md, "Module map"), so dependencies keep pointing one way.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Each room (a folder or a top-level module) and the rooms it may call.
const MAY_CALL: &[(&str, &[&str])] = &[
    ("cluster", &["auth", "faults", "http", "storage"]),
    (
        "http",
        &[
            "admission",
            "apply",
            "auth",
            "catalog",
            "faults",
            "listoptions",
            "meta",
            "protobuf",
            "render",
            "selector",
            "status",
            "storage",
        ],
    ),
    (
        "auth",
        &["catalog", "meta", "selector", "status", "storage"],
    ),
    ("faults", &["storage"]),
    (
        "storage",
        &[
            "admission",
            "apply",
            "catalog",
            "meta",
            "selector",
            "status",
        ],
    ),
    ("admission", &["catalog", "meta", "selector", "status"]),
    ("apply", &["catalog"]),
    ("catalog", &[]),
    ("render", &["catalog", "meta"]),
    ("protobuf", &["catalog"]),
    ("listoptions", &["status"]),
    ("selector", &[]),
    ("status", &[]),
    ("meta", &[]),
];

/// The rooms each source file's code (not its comments) refers to, by room.
fn calls(dir: &Path, src: &Path, out: &mut BTreeMap<String, BTreeSet<String>>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            calls(&path, src, out);
            continue;
        }
        let Ok(rel) = path.strip_prefix(src) else {
            continue;
        };
        let first = rel
            .components()
            .next()
            .map(|c| c.as_os_str().to_string_lossy());
        let room = first
            .unwrap_or_default()
            .trim_end_matches(".rs")
            .to_string();
        if matches!(room.as_str(), "lib" | "bin" | "rooms") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        for line in text.lines().filter(|l| !l.trim_start().starts_with("//")) {
            for (i, _) in line.match_indices("crate::") {
                let rest = &line[i + "crate::".len()..];
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                // Lower case: a module (crate::Error and other root items are no room).
                if name.starts_with(|c: char| c.is_ascii_lowercase()) && name != room {
                    out.entry(room.clone()).or_default().insert(name);
                }
            }
        }
    }
}

#[test]
fn rooms_call_only_what_the_map_allows() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut found = BTreeMap::new();
    calls(&src, &src, &mut found);
    let allowed: BTreeMap<&str, &[&str]> = MAY_CALL.iter().copied().collect();
    let mut wrong = Vec::new();
    for (room, targets) in &found {
        let Some(may) = allowed.get(room.as_str()) else {
            wrong.push(format!("{room} is not in the map"));
            continue;
        };
        for target in targets {
            if !may.contains(&target.as_str()) {
                wrong.push(format!("{room} calls {target}"));
            }
        }
    }
    assert!(wrong.is_empty(), "not in MAY_CALL: {wrong:?}");
    assert!(found.len() >= 10, "the source tree was read: {found:?}");
}

#[test]
fn the_map_has_no_cycles() {
    let edges: BTreeMap<&str, &[&str]> = MAY_CALL.iter().copied().collect();
    // Peel rooms that call nothing left; a cycle is what cannot be peeled.
    let mut left: BTreeSet<&str> = edges.keys().copied().collect();
    loop {
        let leaves: Vec<&str> = left
            .iter()
            .copied()
            .filter(|r| edges[r].iter().all(|t| !left.contains(t)))
            .collect();
        if leaves.is_empty() {
            break;
        }
        for leaf in leaves {
            left.remove(leaf);
        }
    }
    assert!(left.is_empty(), "rooms in a cycle: {left:?}");
}
