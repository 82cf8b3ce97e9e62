//! Generates the gRPC types from `proto/onekv.proto` with a vendored protoc.
//!
//! The protoc path is handed to prost-build directly rather than through `PROTOC`: raft-rs's own
//! build accepts only protoc 3.x and must keep using the one it bundles.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    println!("cargo:rerun-if-changed=proto/onekv.proto");
    let mut config = prost_build::Config::new();
    config.protoc_executable(protoc);
    tonic_prost_build::configure().compile_with_config(config, &["proto/onekv.proto"], &["proto"])?;
    Ok(())
}
