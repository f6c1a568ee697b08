//! Compiles the CRIU amdgpu plugin image schemas (`proto/*.proto`, our own proto2 files)
//! into prost messages in `OUT_DIR`, without a `protoc` binary: protox parses them into a
//! descriptor set and prost-build generates the Rust types.

use std::error::Error;

/// Proto files, relative to the include directory `proto/`.
const PROTOS: [&str; 2] = ["criu_amdgpu.proto", "criu_amdgpu_v3_17.proto"];

fn main() -> Result<(), Box<dyn Error>> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(PROTOS, ["proto"])?;
    prost_build::Config::new().compile_fds(fds)?;
    Ok(())
}
