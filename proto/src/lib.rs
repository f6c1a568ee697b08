//! Kubelet APIs spoken by `amd-device-plugin`.
//!
//! The generated tonic code for the device-plugin API (v1beta1) and the
//! pod-resources API (v1) lands here; until then the crate carries the
//! constants of the wire contract that do not need code generation.

/// API version the plugin registers with.
pub const DEVICE_PLUGIN_VERSION: &str = "v1beta1";

/// File name of kubelet's registration socket inside the device-plugin directory.
pub const KUBELET_SOCKET: &str = "kubelet.sock";

#[cfg(test)]
mod tests {
    #[test]
    fn version_is_v1beta1() {
        assert_eq!(super::DEVICE_PLUGIN_VERSION, "v1beta1");
    }
}
