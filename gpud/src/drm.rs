//! DRM and PCI sysfs: what the amdgpu driver says about a device beyond KFD.
//!
//! Everything here is optional. A fake host root with only a KFD capture, or
//! a kernel without partition support, simply yields `None`s.

use std::{fs, io, path::Path};

use serde::Serialize;

use crate::{hostpaths::HostPaths, pci::PciAddress};

/// The compute partition modes, in menu order (the names the driver's
/// `available_compute_partition` and `supported_xcp_configs` use).
pub const MODES: [&str; 5] = ["SPX", "DPX", "TPX", "QPX", "CPX"];

/// Files of the GPU's PCI device directory (`<sys>/bus/pci/devices/<bdf>`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PciDeviceInfo {
    /// `vendor`, e.g. 0x1002.
    pub vendor: Option<u32>,
    /// `device`, the PCI device id (0x74a1).
    pub device: Option<u16>,
    /// `revision`, the PCI revision (0x00, 0xc0).
    pub revision: Option<u8>,
    /// `unique_id` (16 hex digits; absent on GPUs without a serial).
    pub unique_id: Option<u64>,
    /// `numa_node`; `None` when absent or -1.
    pub numa_node: Option<u32>,
    /// `mem_info_vram_total`, bytes.
    pub vram_total: Option<u64>,
    /// `current_compute_partition`, upper case (`SPX`, `CPX`, ...).
    pub compute_partition: Option<String>,
    /// `available_compute_partition`, upper case: the modes the current
    /// memory mode allows.
    pub available_compute_partitions: Vec<String>,
    /// `compute_partition_config/supported_xcp_configs` (newer kernels), upper
    /// case: every mode the GPU has, whatever the memory mode. AMD SMI numbers
    /// its profiles in this list's order.
    pub supported_compute_partitions: Vec<String>,
    /// `current_memory_partition` (`NPS1`, ...).
    pub memory_partition: Option<String>,
    /// `available_memory_partition`.
    pub available_memory_partitions: Vec<String>,
}

/// What `<sys>/class/drm/renderD<N>` says about a render node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RenderNodeInfo {
    /// Minor of the `card<M>` sibling of the render node, when there is one.
    pub card_minor: Option<u32>,
    /// The device serving the render node.
    pub parent: RenderParent,
}

/// The device a render node hangs off.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RenderParent {
    /// The GPU's PCI function (unpartitioned GPUs and partition 0).
    Pci(String),
    /// An XCP platform device `amdgpu_xcp_<k>` or `amdgpu_xcp.<k>`.
    Xcp(u32),
    /// Anything else (another driver's device).
    Other(String),
}

/// Reads the PCI device directory of `bdf`; `None` when it does not exist.
pub fn read_pci_device(paths: &HostPaths, bdf: PciAddress) -> Option<PciDeviceInfo> {
    let dir = paths.pci_device(&bdf.to_string());
    crate::deadline::reading(&dir);
    if !dir.is_dir() {
        return None;
    }
    let text = |name: &str| read_trimmed(&dir.join(name));
    Some(PciDeviceInfo {
        vendor: text("vendor").and_then(|v| parse_hex(&v)),
        device: text("device").and_then(|v| parse_hex(&v)?.try_into().ok()),
        revision: text("revision").and_then(|v| parse_hex(&v)?.try_into().ok()),
        unique_id: text("unique_id").and_then(|v| u64::from_str_radix(&v, 16).ok()),
        numa_node: text("numa_node")
            .and_then(|v| v.parse::<i64>().ok())
            .and_then(|v| u32::try_from(v).ok()),
        vram_total: text("mem_info_vram_total").and_then(|v| v.parse().ok()),
        compute_partition: text("current_compute_partition").map(|v| v.to_ascii_uppercase()),
        available_compute_partitions: text("available_compute_partition")
            .map(|v| split_modes(&v))
            .unwrap_or_default(),
        // "Not supported" when the kernel has no XCP manager: no mode names.
        supported_compute_partitions: text("compute_partition_config/supported_xcp_configs")
            .map(|v| split_modes(&v))
            .unwrap_or_default()
            .into_iter()
            .filter(|m| MODES.contains(&m.as_str()))
            .collect(),
        memory_partition: text("current_memory_partition").map(|v| v.to_ascii_uppercase()),
        available_memory_partitions: text("available_memory_partition")
            .map(|v| split_modes(&v))
            .unwrap_or_default(),
    })
}

/// Reads `<sys>/class/drm/renderD<minor>`; `None` when it does not exist.
pub fn read_render_node(paths: &HostPaths, minor: u32) -> Option<RenderNodeInfo> {
    let node = paths.drm_class().join(format!("renderD{minor}"));
    // Resolve the whole chain: kernels and fake trees spell the link differently.
    crate::deadline::reading(&node);
    let target = fs::canonicalize(node.join("device")).ok()?;
    let parent_name = target.file_name()?.to_string_lossy().into_owned();
    let parent = if let Some(k) = xcp_index(&parent_name) {
        RenderParent::Xcp(k)
    } else if parent_name.parse::<PciAddress>().is_ok() {
        RenderParent::Pci(parent_name)
    } else {
        RenderParent::Other(parent_name)
    };
    Some(RenderNodeInfo {
        card_minor: card_minor(&node.join("device/drm")),
        parent,
    })
}

/// `amdgpu_xcp_7` and `amdgpu_xcp.7` both name XCP platform device 7.
fn xcp_index(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("amdgpu_xcp")?;
    rest.strip_prefix('_')
        .or_else(|| rest.strip_prefix('.'))?
        .parse()
        .ok()
}

fn card_minor(drm_dir: &Path) -> Option<u32> {
    crate::deadline::reading(drm_dir);
    fs::read_dir(drm_dir)
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.strip_prefix("card")?.parse().ok())
        .min()
}

fn read_trimmed(path: &Path) -> Option<String> {
    crate::deadline::reading(path);
    match fs::read_to_string(path) {
        Ok(text) => Some(text.trim().to_owned()).filter(|t| !t.is_empty()),
        Err(err) => {
            if err.kind() != io::ErrorKind::NotFound {
                tracing::warn!(path = %path.display(), error = %err, "cannot read sysfs file");
            }
            None
        }
    }
}

fn parse_hex(text: &str) -> Option<u32> {
    u32::from_str_radix(text.trim_start_matches("0x"), 16).ok()
}

/// "SPX, DPX, QPX, CPX" -> ["SPX", "DPX", "QPX", "CPX"].
fn split_modes(text: &str) -> Vec<String> {
    text.split([',', ' ', '\n'])
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .map(str::to_ascii_uppercase)
        .collect()
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    #[test]
    fn xcp_devices_are_recognised_in_both_spellings() {
        assert_eq!(xcp_index("amdgpu_xcp_7"), Some(7));
        assert_eq!(xcp_index("amdgpu_xcp.12"), Some(12));
        assert_eq!(xcp_index("amdgpu_xcp"), None);
        assert_eq!(xcp_index("amdgpu_xcpx1"), None);
    }

    #[test]
    fn mode_lists_are_split_and_upper_cased() {
        assert_eq!(
            split_modes("SPX, dpx,QPX, CPX\n"),
            ["SPX", "DPX", "QPX", "CPX"]
        );
        assert!(split_modes("").is_empty());
    }

    #[test]
    fn reads_pci_files_and_follows_the_render_link() {
        let dir = tempfile::tempdir().unwrap();
        let paths = HostPaths::under(dir.path());
        let pci = dir.path().join("sys/devices/pci0000:00/0000:05:00.0");
        fs::create_dir_all(pci.join("drm/card3")).unwrap();
        fs::create_dir_all(pci.join("drm/renderD131")).unwrap();
        fs::write(pci.join("vendor"), "0x1002\n").unwrap();
        fs::write(pci.join("device"), "0x74a1\n").unwrap();
        fs::write(pci.join("revision"), "0xc1\n").unwrap();
        fs::write(pci.join("unique_id"), "af54e92b0a5d57c8\n").unwrap();
        fs::write(pci.join("numa_node"), "-1\n").unwrap();
        fs::write(pci.join("current_compute_partition"), "cpx\n").unwrap();
        fs::create_dir_all(pci.join("compute_partition_config")).unwrap();
        fs::write(
            pci.join("compute_partition_config/supported_xcp_configs"),
            "SPX, DPX, QPX, CPX\n",
        )
        .unwrap();
        fs::create_dir_all(dir.path().join("sys/bus/pci/devices")).unwrap();
        symlink(
            "../../../devices/pci0000:00/0000:05:00.0",
            dir.path().join("sys/bus/pci/devices/0000:05:00.0"),
        )
        .unwrap();
        symlink("../../../0000:05:00.0", pci.join("drm/renderD131/device")).unwrap();
        fs::create_dir_all(paths.drm_class()).unwrap();
        symlink(
            "../../devices/pci0000:00/0000:05:00.0/drm/renderD131",
            paths.drm_class().join("renderD131"),
        )
        .unwrap();

        let info = read_pci_device(&paths, "0000:05:00.0".parse().unwrap()).unwrap();
        assert_eq!(info.vendor, Some(0x1002));
        assert_eq!((info.device, info.revision), (Some(0x74a1), Some(0xc1)));
        assert_eq!(info.unique_id, Some(0xaf54_e92b_0a5d_57c8));
        assert_eq!(info.numa_node, None);
        assert_eq!(info.compute_partition.as_deref(), Some("CPX"));
        assert_eq!(
            info.supported_compute_partitions,
            ["SPX", "DPX", "QPX", "CPX"]
        );
        assert!(read_pci_device(&paths, "0000:06:00.0".parse().unwrap()).is_none());

        let render = read_render_node(&paths, 131).unwrap();
        assert_eq!(render.parent, RenderParent::Pci("0000:05:00.0".into()));
        assert_eq!(render.card_minor, Some(3));
        assert!(read_render_node(&paths, 132).is_none());
    }
}
