//! Bus name, object paths and interface names.

use zbus::zvariant::OwnedObjectPath;

/// Well-known bus name owned by `amd-gpud`. The trailing `1` is the major
/// version of the API: a breaking change makes `io.hami.AmdGpu2`.
pub const BUS_NAME: &str = "io.hami.AmdGpu1";

/// Object path of the node's root object (Node interface and ObjectManager).
pub const ROOT_PATH: &str = "/io/hami/AmdGpu1";

/// Prefix of every interface name served by `amd-gpud`.
pub const INTERFACE_PREFIX: &str = "io.hami.AmdGpu1";

/// The node: inventory-wide properties, `Rescan`, the `InventoryChanged` signal.
pub const NODE_INTERFACE: &str = "io.hami.AmdGpu1.Node";

/// One physical GPU.
pub const GPU_INTERFACE: &str = "io.hami.AmdGpu1.Gpu";

/// One compute partition (one KFD node) of a GPU.
pub const PARTITION_INTERFACE: &str = "io.hami.AmdGpu1.Partition";

/// Prefix of every typed error name sent on the wire.
pub const ERROR_PREFIX: &str = "io.hami.AmdGpu1.Error";

/// System user the device plugin runs as (see `systemd/amd-gpud.sysusers.conf`
/// and the Helm chart's `runAsUser`).
pub const PLUGIN_USER: &str = "amdgpu-plugin";

/// Fixed UID (and GID) of [`PLUGIN_USER`]: in systemd's unused range 60578–61183.
pub const PLUGIN_UID: u32 = 60700;

/// Health values of GPUs and partitions. Anything but [`HEALTHY`] is unhealthy.
pub const HEALTHY: &str = "Healthy";
/// A device that failed its health checks.
pub const UNHEALTHY: &str = "Unhealthy";
/// A device that was in the inventory and is no longer found.
pub const MISSING: &str = "Missing";

/// Path element for a PCI address: `0000:05:00.0` becomes `0000_05_00_0`
/// (D-Bus path elements allow only `[A-Za-z0-9_]`).
pub fn bdf_element(bdf: &str) -> String {
    bdf.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// Object path of the GPU at PCI address `bdf`.
pub fn gpu_path(bdf: &str) -> OwnedObjectPath {
    owned(format!("{ROOT_PATH}/gpu/{}", bdf_element(bdf)))
}

/// Object path of partition `index` of the GPU at `bdf`.
pub fn partition_path(bdf: &str, index: u32) -> OwnedObjectPath {
    owned(format!(
        "{ROOT_PATH}/gpu/{}/partition/{index}",
        bdf_element(bdf)
    ))
}

fn owned(path: String) -> OwnedObjectPath {
    // Every element is built from [A-Za-z0-9_] above, so this cannot fail;
    // fall back to the root rather than panic if it ever did.
    OwnedObjectPath::try_from(path).unwrap_or_else(|_| OwnedObjectPath::from(root()))
}

/// The root object path.
pub fn root() -> zbus::zvariant::ObjectPath<'static> {
    zbus::zvariant::ObjectPath::from_static_str_unchecked(ROOT_PATH)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_share_the_major_version() {
        assert!(ROOT_PATH.ends_with("AmdGpu1"));
        assert!(ERROR_PREFIX.starts_with(BUS_NAME));
        for iface in [NODE_INTERFACE, GPU_INTERFACE, PARTITION_INTERFACE] {
            assert!(iface.starts_with(INTERFACE_PREFIX));
        }
    }

    #[test]
    fn paths_escape_pci_addresses() {
        assert_eq!(
            gpu_path("0000:05:00.0").as_str(),
            "/io/hami/AmdGpu1/gpu/0000_05_00_0"
        );
        assert_eq!(
            partition_path("0001:c1:00.0", 7).as_str(),
            "/io/hami/AmdGpu1/gpu/0001_c1_00_0/partition/7"
        );
        assert_eq!(gpu_path("../x").as_str(), "/io/hami/AmdGpu1/gpu/___x");
    }
}
