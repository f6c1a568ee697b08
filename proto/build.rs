//! Compiles the kubelet and containerd `.proto` files into Rust without a `protoc` binary:
//! protox parses them into a descriptor set, tonic-prost-build generates the
//! prost messages plus tonic clients and servers into `OUT_DIR`.

use std::error::Error;

/// Proto files, relative to the include directory `proto/`.
const PROTOS: [&str; 5] = [
    "deviceplugin/v1beta1/api.proto",
    "podresources/v1/api.proto",
    "containerd/types/descriptor.proto",
    "containerd/services/images/v1/images.proto",
    "containerd/services/content/v1/content.proto",
];

fn main() -> Result<(), Box<dyn Error>> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(PROTOS, ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .emit_rerun_if_changed(false)
        .compile_fds(fds)?;
    Ok(())
}
