//! Compiles the proto with protox (pure Rust), so no system `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Read at run time, not with `env!`: a build script compiled for one checkout is reused by
    // another one sharing the target dir, and must find that checkout's proto.
    let manifest = std::env::var("CARGO_MANIFEST_DIR")?;
    let root = format!("{manifest}/../../proto");
    let file = format!("{root}/recollect/v1/recollect.proto");
    println!("cargo:rerun-if-changed={file}");
    let fds = protox::compile([&file], [&root])?;
    tonic_prost_build::configure().compile_fds(fds)?;
    Ok(())
}
