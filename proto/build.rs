//! Compiles `ctrlhub/v1/*.proto` with protox (a protobuf compiler in pure
//! Rust, so neither developers nor CI need `protoc` on the PATH), writes the
//! resulting `FileDescriptorSet` to `$OUT_DIR` for `FILE_DESCRIPTOR_SET`, and
//! generates prost messages plus tonic client and server from that same
//! descriptor set, so the generated code and the embedded descriptors can
//! never disagree.

use std::error::Error;
use std::fs;
use std::path::PathBuf;

/// Directory (relative to this crate) holding package `ctrlhub.v1`; also the
/// include root, so imports read `import "ctrlhub/v1/resource.proto";`,
/// matching buf's module layout (`proto/buf.yaml`).
const PROTO_DIR: &str = "ctrlhub/v1";

fn main() -> Result<(), Box<dyn Error>> {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);

    // A directory makes Cargo rerun this script when any file below it
    // changes, including newly added .proto files.
    println!("cargo:rerun-if-changed={PROTO_DIR}");

    // Every .proto in the package, sorted so the output is reproducible:
    // adding a file to the package needs no edit here.
    let mut files = Vec::new();
    for entry in fs::read_dir(manifest_dir.join(PROTO_DIR))? {
        let path = entry?.path();
        if path.extension().is_some_and(|ext| ext == "proto") {
            // protox wants paths relative to an include root.
            files.push(path.strip_prefix(&manifest_dir)?.to_path_buf());
        }
    }
    files.sort();

    // Source info keeps the comments, which prost turns into rustdoc and which
    // reflection clients and doc generators can show; imports make the set
    // self-contained (google/protobuf/*.proto are bundled with protox).
    let mut compiler = protox::Compiler::new([&manifest_dir])?;
    compiler
        .include_source_info(true)
        .include_imports(true)
        .open_files(&files)?;

    fs::write(
        out_dir.join("ctrlhub_v1_descriptor.bin"),
        compiler.encode_file_descriptor_set(),
    )?;

    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        // The generated client's transport helper is an associated fn
        // `connect(endpoint)`, which collides with the `connect` method of
        // our `Connect` RPC. The RPC's name is
        // the language-neutral interface, so the Rust-only helper goes:
        // callers build a `tonic::transport::Channel` and use
        // `ControllerManagerClient::new(channel)`.
        .build_transport(false)
        // Register/Registered are ~500 bytes and sent once per session, while
        // results and requests (~70-200 bytes) flow all the time; boxing the
        // rare variants keeps every stream message small
        // (clippy::large_enum_variant).
        .boxed(".ctrlhub.v1.ControllerMessage.message.register")
        .boxed(".ctrlhub.v1.ManagerMessage.message.registered")
        .compile_fds(compiler.file_descriptor_set())?;
    Ok(())
}
