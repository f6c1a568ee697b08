//! Kubelet APIs spoken by `amd-device-plugin`, and the part of containerd's
//! API that `amd-gpud` reads images through.
//!
//! * [`v1beta1`]: the device-plugin API (kubelet's `Registration` service and
//!   the plugin's `DevicePlugin` service), generated from
//!   `proto/deviceplugin/v1beta1/api.proto`.
//! * [`podresources::v1`]: kubelet's `PodResourcesLister`, generated from
//!   `proto/podresources/v1/api.proto`.
//! * [`containerd`]: containerd's `Images.Get` and `Content.{Info,Read}`,
//!   generated from `proto/containerd/...` (client side in `amd-gpud`).
//! * [`unix`]: tonic clients and servers over Unix domain sockets.
//!
//! Both server and client code are generated at build time by protox and
//! tonic-prost-build (no `protoc`); nothing generated is committed.

pub mod unix;

/// Device-plugin API v1beta1: messages, `registration_{client,server}` and
/// `device_plugin_{client,server}`.
// Generated code: the servers' `call` functions (one match arm per RPC) run
// past the workspace's `too_many_lines` threshold.
#[allow(clippy::too_many_lines)]
pub mod v1beta1 {
    tonic::include_proto!("v1beta1");
}

/// Kubelet's pod-resources API.
pub mod podresources {
    /// Pod-resources API v1: messages, `pod_resources_lister_{client,server}`.
    // Generated code: see the comment on `v1beta1`.
    #[allow(clippy::too_many_lines)]
    pub mod v1 {
        tonic::include_proto!("v1");
    }
}

/// The subset of containerd's gRPC API that `amd-gpud`'s loader check uses
/// (packages `containerd.types`, `containerd.services.{images,content}.v1`).
pub mod containerd {
    /// Header every containerd call carries to pick its namespace (CRI's
    /// images live in [`K8S_NAMESPACE`]).
    pub const NAMESPACE_HEADER: &str = "containerd-namespace";

    /// The namespace containerd's CRI plugin keeps Kubernetes images in.
    pub const K8S_NAMESPACE: &str = "k8s.io";

    /// `containerd.types`: [`types::Descriptor`].
    pub mod types {
        tonic::include_proto!("containerd.types");
    }

    /// containerd's services.
    pub mod services {
        /// `containerd.services.images.v1`: `images_client::ImagesClient`.
        pub mod images {
            /// Version 1 of the images service.
            // Generated code: see the comment on `v1beta1`.
            #[allow(clippy::too_many_lines)]
            pub mod v1 {
                tonic::include_proto!("containerd.services.images.v1");
            }
        }

        /// `containerd.services.content.v1`: `content_client::ContentClient`.
        pub mod content {
            /// Version 1 of the content service.
            // Generated code: see the comment on `v1beta1`.
            #[allow(clippy::too_many_lines)]
            pub mod v1 {
                tonic::include_proto!("containerd.services.content.v1");
            }
        }
    }
}

/// Device-plugin API version a plugin registers with (`RegisterRequest.version`).
pub const VERSION: &str = "v1beta1";

/// File name of kubelet's registration socket inside the device-plugin directory.
pub const KUBELET_SOCKET: &str = "kubelet.sock";

/// `Device.health` of a device kubelet may allocate.
pub const HEALTHY: &str = "Healthy";

/// `Device.health` of a device kubelet must not allocate. Kubelet treats any
/// string other than [`HEALTHY`] as unhealthy; send this one.
pub const UNHEALTHY: &str = "Unhealthy";

/// Default device-plugin directory, holding [`KUBELET_SOCKET`] and the
/// plugin's own socket. Only a CLI default: code takes the directory from
/// configuration.
pub const DEFAULT_DEVICE_PLUGIN_DIR: &str = "/var/lib/kubelet/device-plugins";

/// Default pod-resources socket (`<kubelet root-dir>/pod-resources/kubelet.sock`).
/// Only a CLI default; mount its directory, not the file, since kubelet
/// re-creates the socket on restart.
pub const DEFAULT_POD_RESOURCES_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";

#[cfg(test)]
mod tests;
