//! Decoders for the out-structs the probe reads (docs/amd-hardware.md §2.4, §2.5, §2.7,
//! §3.2–§3.10).
//!
//! Every decoder is a pure function over the zeroed over-sized buffer the library wrote into,
//! reading fields by the offsets of the detected [`Layout`]. Short buffers read as zeros.

use super::{
    layout::{Layout, cstr_at, u32_at, u64_at},
    report::{AsicInfo, EnumerationInfo, PartitionProfile, ProcessEntry, ProfileConfig},
};

/// `AMDSMI_MAX_ACCELERATOR_PARTITIONS`: entries in the profile's `partition_id` out-array.
pub const MAX_PARTITIONS: usize = 8;
/// `AMDSMI_MAX_ACCELERATOR_PROFILE` and `AMDSMI_MAX_CP_PROFILE_RESOURCES`.
const MAX_PROFILES: usize = 32;
/// Size of one `amdsmi_accelerator_partition_profile_t` (§3.6).
const PROFILE_SIZE: usize = 1152;
/// Size of one `amdsmi_accelerator_partition_resource_profile_t` (§3.7).
const RESOURCE_PROFILE_SIZE: usize = 64;
/// `AMDSMI_ACCELERATOR_XCC` (§2.5).
const RESOURCE_XCC: u32 = 0;

/// The fields of `amdsmi_kfd_info_t` (§3.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KfdInfo {
    pub kfd_id: u64,
    pub node_id: u32,
    pub current_partition_id: u32,
}

/// `amdsmi_asic_info_t` (§3.2): the market name and the identity fields.
pub fn asic_info(layout: Layout, b: &[u8]) -> (String, AsicInfo) {
    let market_name = cstr_at(b, 0, 256);
    let info = if layout.wide_strings() {
        AsicInfo {
            vendor_id: u32_at(b, 256),
            device_id: u64_at(b, 520),
            rev_id: u32_at(b, 528),
            asic_serial: cstr_at(b, 532, 256),
            oam_id: u32_at(b, 788),
            num_compute_units: Some(u32_at(b, 792)),
        }
    } else {
        AsicInfo {
            vendor_id: u32_at(b, 256),
            device_id: u64_at(b, 328),
            rev_id: u32_at(b, 336),
            asic_serial: cstr_at(b, 340, 32),
            oam_id: u32_at(b, 372),
            num_compute_units: (layout >= Layout::V6_3).then(|| u32_at(b, 376)),
        }
    };
    (market_name, info)
}

/// `amdsmi_kfd_info_t` (§3.4; same layout from 6.3 on).
pub fn kfd_info(b: &[u8]) -> KfdInfo {
    KfdInfo {
        kfd_id: u64_at(b, 0),
        node_id: u32_at(b, 8),
        current_partition_id: u32_at(b, 12),
    }
}

/// `amdsmi_enumeration_info_t` (§3.5; the fields read here are the same in every size).
pub fn enumeration_info(b: &[u8]) -> EnumerationInfo {
    EnumerationInfo {
        drm_render: u32_at(b, 0),
        drm_card: u32_at(b, 4),
        hsa_id: u32_at(b, 8),
        hip_id: u32_at(b, 12),
        hip_uuid: cstr_at(b, 16, 256),
    }
}

/// `amdsmi_accelerator_partition_type_t` (§2.4) as its mode string.
pub fn profile_type_name(value: u32) -> String {
    match value {
        0 => "INVALID".to_owned(),
        1 => "SPX".to_owned(),
        2 => "DPX".to_owned(),
        3 => "TPX".to_owned(),
        4 => "QPX".to_owned(),
        5 => "CPX".to_owned(),
        other => format!("UNKNOWN_{other}"),
    }
}

/// `amdsmi_nps_caps_t` (§2.7) as the list of allowed modes.
pub fn nps_caps(bits: u32) -> Vec<String> {
    ["NPS1", "NPS2", "NPS4", "NPS8"]
        .iter()
        .enumerate()
        .filter(|(bit, _)| bits & (1 << bit) != 0)
        .map(|(_, name)| (*name).to_owned())
        .collect()
}

/// One `amdsmi_accelerator_partition_profile_t` (§3.6) starting at `b[0]`.
///
/// `partition_ids` is the separate out-array of `amdsmi_get_gpu_accelerator_partition_profile`
/// (empty for profiles inside the profile config); only its first `num_partitions` entries are
/// kept. `xcc_per_partition` is left `None`: it comes from the profile config.
pub fn partition_profile(b: &[u8], partition_ids: &[u32]) -> PartitionProfile {
    let num_partitions = u32_at(b, 4);
    let keep = usize::try_from(num_partitions)
        .unwrap_or(usize::MAX)
        .min(MAX_PARTITIONS);
    PartitionProfile {
        profile_type: profile_type_name(u32_at(b, 0)),
        num_partitions,
        memory_caps: nps_caps(u32_at(b, 8)),
        profile_index: u32_at(b, 12),
        partition_ids: partition_ids.iter().take(keep).copied().collect(),
        xcc_per_partition: None,
    }
}

/// `amdsmi_accelerator_partition_profile_config_t` (§3.8), with each profile's XCC count taken
/// from the resource profile whose `profile_index` matches and whose type is XCC.
pub fn profile_config(b: &[u8]) -> ProfileConfig {
    let num_profiles = count(u32_at(b, 0), MAX_PROFILES);
    let profiles = (0..num_profiles)
        .map(|i| {
            let p = b.get(2064 + i * PROFILE_SIZE..).unwrap_or_default();
            let mut profile = partition_profile(p, &[]);
            profile.xcc_per_partition = xcc_per_partition(b, profile.profile_index);
            profile
        })
        .collect();
    ProfileConfig {
        default_profile_index: u32_at(b, 2056),
        profiles,
    }
}

/// In a profile config `b` (§3.8), the `partition_resource` of the first resource profile
/// (§3.7) with this `profile_index` and resource type XCC.
pub fn xcc_per_partition(b: &[u8], profile_index: u32) -> Option<u32> {
    let num_resources = count(u32_at(b, 4), MAX_PROFILES);
    (0..num_resources).find_map(|i| {
        let r = b.get(8 + i * RESOURCE_PROFILE_SIZE..).unwrap_or_default();
        (u32_at(r, 0) == profile_index && u32_at(r, 4) == RESOURCE_XCC).then(|| u32_at(r, 8))
    })
}

/// The first `count` entries of an `amdsmi_proc_info_t` array (§3.10), at the layout's stride.
pub fn processes(layout: Layout, b: &[u8], count: u32) -> Vec<ProcessEntry> {
    let stride = layout.proc_stride();
    let n = usize::try_from(count)
        .unwrap_or(usize::MAX)
        .min(b.len() / stride);
    // (name len, pid, mem, memory_usage.vram_mem)
    let (name_len, pid, mem, vram) = if layout.wide_strings() {
        (256, 256, 264, 352)
    } else {
        (32, 32, 40, 128)
    };
    (0..n)
        .map(|i| {
            let e = b.get(i * stride..).unwrap_or_default();
            ProcessEntry {
                pid: u32_at(e, pid),
                name: cstr_at(e, 0, name_len),
                mem_bytes: u64_at(e, mem),
                vram_bytes: u64_at(e, vram),
            }
        })
        .collect()
}

fn count(value: u32, max: usize) -> usize {
    usize::try_from(value).unwrap_or(usize::MAX).min(max)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(b: &mut [u8], off: usize, bytes: &[u8]) {
        b[off..off + bytes.len()].copy_from_slice(bytes);
    }
    fn put32(b: &mut [u8], off: usize, v: u32) {
        put(b, off, &v.to_ne_bytes());
    }
    fn put64(b: &mut [u8], off: usize, v: u64) {
        put(b, off, &v.to_ne_bytes());
    }

    /// An asic_info buffer with the given (device_id, rev, serial, oam, cu) offsets.
    fn asic_buf(offs: [usize; 5], size: usize) -> Vec<u8> {
        let mut b = vec![0u8; size];
        put(&mut b, 0, b"AMD Instinct MI300X\0");
        put32(&mut b, 256, 0x1002);
        put(&mut b, 260, b"Advanced Micro Devices\0");
        put64(&mut b, offs[0], 0x74a1);
        put32(&mut b, offs[1], 3);
        put(&mut b, offs[2], b"0xE3A7C0FFEE01F431\0");
        put32(&mut b, offs[3], 5);
        put32(&mut b, offs[4], 38);
        b
    }

    #[test]
    fn asic_info_narrow_strings() {
        let b = asic_buf([328, 336, 340, 372, 376], 456);
        let (name, info) = asic_info(Layout::V6_3, &b);
        assert_eq!(name, "AMD Instinct MI300X");
        let want = AsicInfo {
            vendor_id: 0x1002,
            device_id: 0x74a1,
            rev_id: 3,
            asic_serial: "0xE3A7C0FFEE01F431".into(),
            oam_id: 5,
            num_compute_units: Some(38),
        };
        assert_eq!(info, want);
        let (_, old) = asic_info(Layout::V6_2, &b[..448]);
        assert_eq!(
            old,
            AsicInfo {
                num_compute_units: None,
                ..want
            }
        );
    }

    #[test]
    fn asic_info_wide_strings() {
        let b = asic_buf([520, 528, 532, 788, 792], 896);
        for layout in [Layout::V6_4, Layout::V7_0, Layout::V7_13, Layout::V10_0] {
            let (name, info) = asic_info(layout, &b);
            assert_eq!(name, "AMD Instinct MI300X");
            assert_eq!(info.device_id, 0x74a1);
            assert_eq!(info.rev_id, 3);
            assert_eq!(info.asic_serial, "0xE3A7C0FFEE01F431");
            assert_eq!(info.oam_id, 5);
            assert_eq!(info.num_compute_units, Some(38));
        }
        // The narrow offsets read garbage-free zeros/strings from a wide buffer, not a panic.
        let (_, wrong) = asic_info(Layout::V6_3, &b);
        assert_ne!(wrong.device_id, 0x74a1);
    }

    #[test]
    fn kfd_info_fields() {
        let mut b = vec![0u8; 64];
        put64(&mut b, 0, 53862);
        put32(&mut b, 8, 2);
        put32(&mut b, 12, 7);
        assert_eq!(
            kfd_info(&b),
            KfdInfo {
                kfd_id: 53862,
                node_id: 2,
                current_partition_id: 7
            }
        );
    }

    #[test]
    fn enumeration_info_fields() {
        let mut b = vec![0u8; 276];
        put32(&mut b, 0, 128);
        put32(&mut b, 4, 1);
        put32(&mut b, 8, 2);
        put32(&mut b, 12, 0);
        put(&mut b, 16, b"GPU-e3a7c0ffee01f431\0");
        put32(&mut b, 272, 9);
        let e = enumeration_info(&b);
        assert_eq!(
            (e.drm_render, e.drm_card, e.hsa_id, e.hip_id),
            (128, 1, 2, 0)
        );
        assert_eq!(e.hip_uuid, "GPU-e3a7c0ffee01f431");
    }

    #[test]
    fn enum_names() {
        let names: Vec<String> = (0..7).map(profile_type_name).collect();
        assert_eq!(
            names,
            ["INVALID", "SPX", "DPX", "TPX", "QPX", "CPX", "UNKNOWN_6"]
        );
        assert_eq!(nps_caps(0b1001), ["NPS1", "NPS8"]);
        assert_eq!(nps_caps(0b0110), ["NPS2", "NPS4"]);
        assert!(nps_caps(0).is_empty());
        assert!(nps_caps(0x10).is_empty());
    }

    fn profile_at(b: &mut [u8], off: usize, (ty, parts, caps, index): (u32, u32, u32, u32)) {
        put32(b, off, ty);
        put32(b, off + 4, parts);
        put32(b, off + 8, caps);
        put32(b, off + 12, index);
    }

    #[test]
    fn current_profile() {
        let mut b = vec![0u8; 1152];
        profile_at(&mut b, 0, (5, 8, 0b101, 3));
        let p = partition_profile(&b, &[0, 1, 2, 3, 4, 5, 6, 7, 99, 99]);
        assert_eq!(p.profile_type, "CPX");
        assert_eq!(p.num_partitions, 8);
        assert_eq!(p.memory_caps, ["NPS1", "NPS4"]);
        assert_eq!(p.profile_index, 3);
        assert_eq!(p.partition_ids, [0, 1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(p.xcc_per_partition, None);
        profile_at(&mut b, 0, (2, 2, 1, 1));
        assert_eq!(partition_profile(&b, &[0, 4, 0, 0]).partition_ids, [0, 4]);
    }

    #[test]
    fn profile_config_with_resources() {
        let mut b = vec![0u8; 39168];
        put32(&mut b, 0, 2);
        put32(&mut b, 4, 3);
        // resource profiles: (profile_index, resource_type, partition_resource)
        for (i, (pi, ty, n)) in [(0u32, 0u32, 8u32), (1, 1, 4), (1, 0, 1)]
            .into_iter()
            .enumerate()
        {
            let off = 8 + i * 64;
            put32(&mut b, off, pi);
            put32(&mut b, off + 4, ty);
            put32(&mut b, off + 8, n);
        }
        put32(&mut b, 2056, 0);
        profile_at(&mut b, 2064, (1, 1, 1, 0));
        profile_at(&mut b, 2064 + 1152, (5, 8, 0b101, 1));
        let c = profile_config(&b);
        assert_eq!(c.default_profile_index, 0);
        assert_eq!(c.profiles.len(), 2);
        assert_eq!(c.profiles[0].profile_type, "SPX");
        assert_eq!(c.profiles[0].xcc_per_partition, Some(8));
        assert!(c.profiles[0].partition_ids.is_empty());
        assert_eq!(c.profiles[1].profile_type, "CPX");
        assert_eq!(c.profiles[1].memory_caps, ["NPS1", "NPS4"]);
        assert_eq!(c.profiles[1].xcc_per_partition, Some(1));
        assert_eq!(xcc_per_partition(&b, 1), Some(1));
        assert_eq!(xcc_per_partition(&b, 2), None);
    }

    #[test]
    fn profile_config_counts_are_capped() {
        let mut b = vec![0u8; 39168];
        put32(&mut b, 0, 1000);
        put32(&mut b, 4, u32::MAX);
        assert_eq!(profile_config(&b).profiles.len(), 32);
        assert_eq!(profile_config(&b[..100]).profiles.len(), 32);
    }

    fn proc_buf(layout: Layout, n: usize, offs: (usize, usize, usize, usize)) -> Vec<u8> {
        let stride = layout.proc_stride();
        let mut b = vec![0u8; stride * n + 4096];
        for i in 0..n {
            let e = i * stride;
            put(&mut b, e + offs.0, format!("proc{i}\0").as_bytes());
            put32(&mut b, e + offs.1, 4000 + u32::try_from(i).unwrap());
            put64(&mut b, e + offs.2, 1 << 20);
            put64(&mut b, e + offs.3, 2 << 20);
        }
        b
    }

    #[test]
    fn process_list_strides() {
        for (layout, offs) in [
            (Layout::V6_2, (0, 32, 40, 128)),
            (Layout::V6_3, (0, 32, 40, 128)),
            (Layout::V6_4, (0, 256, 264, 352)),
            (Layout::V7_13, (0, 256, 264, 352)),
        ] {
            let b = proc_buf(layout, 3, offs);
            let list = processes(layout, &b, 3);
            assert_eq!(list.len(), 3, "{layout:?}");
            assert_eq!(list[2].pid, 4002, "{layout:?}");
            assert_eq!(list[2].name, "proc2");
            assert_eq!(list[1].mem_bytes, 1 << 20);
            assert_eq!(list[1].vram_bytes, 2 << 20);
            assert_eq!(processes(layout, &b, 1).len(), 1);
        }
    }

    #[test]
    fn process_count_is_capped_by_the_buffer() {
        let b = vec![0u8; 224 * 2];
        assert_eq!(processes(Layout::V6_2, &b, 1000).len(), 2);
        assert!(processes(Layout::V7_0, &b, 1000).is_empty());
    }
}
