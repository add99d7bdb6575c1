//! Compiles the proto with protox (pure Rust), so no system `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../proto");
    let file = format!("{root}/recollect/v1/recollect.proto");
    println!("cargo:rerun-if-changed={file}");
    let fds = protox::compile([&file], [root])?;
    tonic_prost_build::configure().compile_fds(fds)?;
    Ok(())
}
