//! The GPU's ISA name (`gfx942`, `gfx90a`, `gfx1201`) and what follows from it.

use std::fmt;

use serde::{Serialize, Serializer};

/// A gfx target: major, minor and stepping as KFD encodes them in
/// `gfx_target_version` (`major * 10000 + minor * 100 + stepping`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GfxTarget {
    pub major: u32,
    pub minor: u32,
    pub stepping: u32,
}

impl GfxTarget {
    /// Decodes KFD's `gfx_target_version`; `None` for 0 (CPU nodes, old kernels).
    pub fn from_kfd(version: u64) -> Option<Self> {
        let version = u32::try_from(version).ok().filter(|v| *v != 0)?;
        Some(Self {
            major: version / 10_000,
            minor: (version / 100) % 100,
            stepping: version % 100,
        })
    }

    /// Compute units per workgroup processor: 2 from gfx10 (RDNA) on, else 1.
    pub fn cus_per_wgp(self) -> u32 {
        if self.major >= 10 { 2 } else { 1 }
    }

    /// Best-effort target for kernels whose KFD properties lack
    /// `gfx_target_version`, from the PCI device id of well-known parts.
    pub fn from_pci_device_id(device_id: u64) -> Option<Self> {
        let (major, minor, stepping) = match device_id {
            0x6860..=0x687f => (9, 0, 0),                     // Vega 10: gfx900
            0x66a0..=0x66af => (9, 0, 6),                     // Vega 20: gfx906
            0x7388 | 0x738c | 0x738e | 0x7390 => (9, 0, 8),   // MI100: gfx908
            0x7408 | 0x740c | 0x740f | 0x7410 => (9, 0, 0xa), // MI200: gfx90a
            0x74a0..=0x74bd => (9, 4, 2),                     // MI300 family: gfx942
            0x75a0..=0x75a3 => (9, 5, 0),                     // MI350 family: gfx950
            0x744c => (11, 0, 0),                             // Navi 31: gfx1100
            0x7550 => (12, 0, 1),                             // Navi 48: gfx1201
            0x7590 => (12, 0, 0),                             // Navi 44: gfx1200
            _ => return None,
        };
        Some(Self {
            major,
            minor,
            stepping,
        })
    }
}

impl fmt::Display for GfxTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "gfx{}{:x}{:x}", self.major, self.minor, self.stepping)
    }
}

impl Serialize for GfxTarget {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minor_and_stepping_are_hex_digits() {
        let name = |v| GfxTarget::from_kfd(v).unwrap().to_string();
        assert_eq!(name(90402), "gfx942");
        assert_eq!(name(90010), "gfx90a");
        assert_eq!(name(90500), "gfx950");
        assert_eq!(name(110000), "gfx1100");
        assert_eq!(name(120001), "gfx1201");
        assert_eq!(name(100306), "gfx1036");
        assert_eq!(GfxTarget::from_kfd(0), None);
    }

    #[test]
    fn wgp_pairs_start_at_gfx10() {
        assert_eq!(GfxTarget::from_kfd(90402).unwrap().cus_per_wgp(), 1);
        assert_eq!(GfxTarget::from_kfd(100306).unwrap().cus_per_wgp(), 2);
        assert_eq!(GfxTarget::from_kfd(120001).unwrap().cus_per_wgp(), 2);
    }

    #[test]
    fn old_kernels_fall_back_to_the_device_id() {
        assert_eq!(
            GfxTarget::from_pci_device_id(0x6860).unwrap().to_string(),
            "gfx900"
        );
        assert_eq!(
            GfxTarget::from_pci_device_id(29857).unwrap().to_string(),
            "gfx942"
        );
        assert_eq!(GfxTarget::from_pci_device_id(0x1234), None);
    }
}
