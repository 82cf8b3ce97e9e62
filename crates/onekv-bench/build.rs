//! Generates the etcd v3 KV client from `proto/etcd_kv.proto` with a vendored protoc.
//!
//! The protoc path is handed to prost-build directly rather than through `PROTOC`: raft-rs's own
//! build accepts only protoc 3.x and must keep using the one it bundles (as in onekv-proto).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    println!("cargo:rerun-if-changed=proto/etcd_kv.proto");
    let mut config = prost_build::Config::new();
    config.protoc_executable(protoc);
    tonic_prost_build::configure().build_server(false).compile_with_config(
        config,
        &["proto/etcd_kv.proto"],
        &["proto"],
    )?;
    Ok(())
}
