//! Compiles the vendored Kubernetes `generated.proto` files (under `proto/`, the same upstream
//! files k8s-pb generates its types from) into one `FileDescriptorSet` with protox, a pure-Rust
//! protobuf compiler, so neither developers nor CI need `protoc`. `src/protobuf.rs` embeds it
//! and decodes request bodies by reflection.

use std::error::Error;
use std::path::{Path, PathBuf};

fn protos(dir: &Path, root: &Path, out: &mut Vec<PathBuf>) -> Result<(), Box<dyn Error>> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            protos(&path, root, out)?;
        } else if path.extension().is_some_and(|e| e == "proto") {
            out.push(path.strip_prefix(root)?.to_path_buf());
        }
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn Error>> {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let root = manifest_dir.join("proto");
    println!("cargo:rerun-if-changed=proto");
    let mut files = Vec::new();
    protos(&root, &root, &mut files)?;
    files.sort();
    let mut compiler = protox::Compiler::new([&root])?;
    compiler.include_imports(true);
    compiler.open_files(files)?;
    std::fs::write(
        out_dir.join("k8s_descriptors.bin"),
        compiler.encode_file_descriptor_set(),
    )?;
    Ok(())
}
