//! Out-struct images at the byte offsets of docs/amd-hardware.md §3, per ABI.
//!
//! Every writer builds a zeroed byte image of exactly the documented size of
//! the struct at that ABI; the FFI layer copies the image into the caller's
//! buffer. Nothing here touches raw pointers.

use crate::fixture::{Abi, Process, Processor, Profile, ProfileConfig, accel_type_value, nps_bit};

/// A zeroed struct image with bounds-checked little-endian field writers.
/// A write that does not fit is dropped, so an image never grows.
pub(crate) struct Image(Vec<u8>);

impl Image {
    pub(crate) fn new(size: usize) -> Self {
        Self(vec![0; size])
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        &self.0
    }

    fn put(&mut self, offset: usize, data: &[u8]) {
        let end = offset.saturating_add(data.len());
        if let Some(field) = self.0.get_mut(offset..end) {
            field.copy_from_slice(data);
        }
    }

    pub(crate) fn u32(&mut self, offset: usize, value: u32) {
        self.put(offset, &value.to_le_bytes());
    }

    pub(crate) fn u64(&mut self, offset: usize, value: u64) {
        self.put(offset, &value.to_le_bytes());
    }

    /// A `char[cap]` field: the text truncated to `cap - 1` bytes, then NUL.
    pub(crate) fn str(&mut self, offset: usize, cap: usize, text: &str) {
        let len = text.len().min(cap.saturating_sub(1));
        self.put(offset, text.as_bytes().get(..len).unwrap_or_default());
        self.put(offset.saturating_add(len), &[0]);
    }
}

/// `amdsmi_version_t` (docs/amd-hardware.md §1.2): 24 bytes, `build` pointer at 16.
pub(crate) const VERSION_SIZE: usize = 24;

/// The numbers `amdsmi_get_lib_version` reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Version {
    pub year: u32,
    pub major: u32,
    pub minor: u32,
    pub release: u32,
}

pub(crate) fn version(abi: Abi, v: Version, build_addr: usize) -> Image {
    let mut img = Image::new(VERSION_SIZE);
    if abi.is_7x() {
        img.u32(0, v.major);
        img.u32(4, v.minor);
        img.u32(8, v.release);
    } else {
        img.u32(0, v.year);
        img.u32(4, v.major);
        img.u32(8, v.minor);
        img.u32(12, v.release);
    }
    img.u64(16, u64::try_from(build_addr).unwrap_or(0));
    img
}

/// `amdsmi_asic_info_t` offsets (docs/amd-hardware.md §3.2).
struct AsicLayout {
    size: usize,
    vendor_name_len: usize,
    subvendor_id: usize,
    device_id: usize,
    rev_id: usize,
    asic_serial: usize,
    asic_serial_len: usize,
    oam_id: usize,
    num_of_compute_units: Option<usize>,
    target_graphics_version: Option<usize>,
    subsystem_id: Option<usize>,
}

const ASIC_MARKET_NAME: usize = 0;
const ASIC_MARKET_NAME_LEN: usize = 256;
const ASIC_VENDOR_ID: usize = 256;
const ASIC_VENDOR_NAME: usize = 260;
/// What the real library reports as `vendor_name` for AMD GPUs.
pub(crate) const AMD_VENDOR_NAME: &str = "Advanced Micro Devices Inc. [AMD/ATI]";
/// PCI vendor id of AMD/ATI, the default `vendor_id`.
pub(crate) const AMD_VENDOR_ID: u32 = 0x1002;

fn asic_layout(abi: Abi) -> AsicLayout {
    match abi {
        Abi::V6_2 | Abi::V6_3 => AsicLayout {
            size: if abi == Abi::V6_2 { 448 } else { 456 },
            vendor_name_len: 64,
            subvendor_id: 324,
            device_id: 328,
            rev_id: 336,
            asic_serial: 340,
            asic_serial_len: 32,
            oam_id: 372,
            num_of_compute_units: (abi == Abi::V6_3).then_some(376),
            target_graphics_version: (abi == Abi::V6_3).then_some(384),
            subsystem_id: None,
        },
        Abi::V6_4 | Abi::V7_0 | Abi::V7_13 => AsicLayout {
            size: 896,
            vendor_name_len: 256,
            subvendor_id: 516,
            device_id: 520,
            rev_id: 528,
            asic_serial: 532,
            asic_serial_len: 256,
            oam_id: 788,
            num_of_compute_units: Some(792),
            target_graphics_version: Some(800),
            subsystem_id: (abi >= Abi::V7_0).then_some(808),
        },
    }
}

pub(crate) fn asic_info(abi: Abi, p: &Processor) -> Image {
    let l = asic_layout(abi);
    let mut img = Image::new(l.size);
    let vendor_id = p.vendor_id.unwrap_or(AMD_VENDOR_ID);
    img.str(
        ASIC_MARKET_NAME,
        ASIC_MARKET_NAME_LEN,
        p.market_name.as_deref().unwrap_or(""),
    );
    img.u32(ASIC_VENDOR_ID, vendor_id);
    img.str(ASIC_VENDOR_NAME, l.vendor_name_len, AMD_VENDOR_NAME);
    img.u32(l.subvendor_id, p.subvendor_id.unwrap_or(vendor_id));
    img.u64(l.device_id, p.device_id.unwrap_or(0));
    img.u32(l.rev_id, p.rev_id.unwrap_or(0));
    img.str(
        l.asic_serial,
        l.asic_serial_len,
        p.asic_serial.as_deref().unwrap_or(""),
    );
    img.u32(l.oam_id, p.oam_id.unwrap_or(0));
    if let Some(off) = l.num_of_compute_units {
        img.u32(off, p.num_compute_units.unwrap_or(0));
    }
    if let Some(off) = l.target_graphics_version {
        img.u64(off, p.target_graphics_version.unwrap_or(0));
    }
    if let Some(off) = l.subsystem_id {
        img.u32(off, p.subsystem_id.unwrap_or(0));
    }
    img
}

/// `amdsmi_kfd_info_t` (docs/amd-hardware.md §3.4).
pub(crate) const KFD_INFO_SIZE: usize = 64;

pub(crate) fn kfd_info(p: &Processor) -> Image {
    let mut img = Image::new(KFD_INFO_SIZE);
    img.u64(0, p.kfd_id.unwrap_or(0));
    img.u32(8, p.kfd_node.unwrap_or(0));
    img.u32(12, p.partition_id);
    img
}

/// `amdsmi_enumeration_info_t` (docs/amd-hardware.md §3.5).
const ENUM_HIP_UUID: usize = 16;
const ENUM_HIP_UUID_LEN: usize = 256;
const ENUM_OAM_ID: usize = 272;

pub(crate) fn enumeration_info(abi: Abi, p: &Processor) -> Image {
    let with_oam = abi >= Abi::V7_13;
    let mut img = Image::new(if with_oam { 276 } else { 272 });
    img.u32(0, p.drm_render.unwrap_or(0));
    img.u32(4, p.drm_card.unwrap_or(0));
    img.u32(8, p.hsa_id.unwrap_or(0));
    img.u32(12, p.hip_id.unwrap_or(0));
    img.str(
        ENUM_HIP_UUID,
        ENUM_HIP_UUID_LEN,
        p.hip_uuid.as_deref().unwrap_or(""),
    );
    if with_oam {
        img.u32(ENUM_OAM_ID, p.oam_id.unwrap_or(0));
    }
    img
}

/// `amdsmi_accelerator_partition_profile_t` (docs/amd-hardware.md §3.6).
pub(crate) const PROFILE_SIZE: usize = 1152;
const PROFILE_RESOURCES: usize = 20;
/// `AMDSMI_MAX_ACCELERATOR_PARTITIONS` and `AMDSMI_MAX_CP_PROFILE_RESOURCES`.
pub(crate) const MAX_PARTITIONS: usize = 8;
const MAX_RESOURCES: usize = 32;
/// `amdsmi_accelerator_partition_resource_type_t` XCC.
const RESOURCE_XCC: u32 = 0;

/// The resource profiles of a profile config: one XCC entry per profile that
/// has `xcc_per_partition`, in profile order (docs/amd-hardware.md §3.7).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ResourceProfile {
    pub profile_index: u32,
    pub xcc: u32,
}

pub(crate) fn resource_profiles(config: Option<&ProfileConfig>) -> Vec<ResourceProfile> {
    config
        .map(|c| c.profiles.as_slice())
        .unwrap_or_default()
        .iter()
        .filter_map(|p| {
            p.xcc_per_partition.map(|xcc| ResourceProfile {
                profile_index: p.profile_index,
                xcc,
            })
        })
        .take(MAX_RESOURCES)
        .collect()
}

/// Writes a profile at `base` into `img`. `resources` is the resource profile
/// list of the processor's config; the XCC resource of this profile is the
/// entry with the same `profile_index` (or `profile_index` itself if the
/// config has none).
fn put_profile(img: &mut Image, base: usize, profile: &Profile, resources: &[ResourceProfile]) {
    let caps = profile
        .memory_caps
        .iter()
        .filter_map(|c| nps_bit(c))
        .fold(0, |a, b| a | b);
    img.u32(base, accel_type_value(&profile.profile_type).unwrap_or(0));
    img.u32(base + 4, profile.num_partitions);
    img.u32(base + 8, caps);
    img.u32(base + 12, profile.profile_index);
    if profile.xcc_per_partition.is_none() {
        return;
    }
    let xcc_index = resources
        .iter()
        .position(|r| r.profile_index == profile.profile_index)
        .and_then(|i| u32::try_from(i).ok())
        .unwrap_or(profile.profile_index);
    img.u32(base + 16, 1);
    let partitions = usize::try_from(profile.num_partitions).unwrap_or(MAX_PARTITIONS);
    for partition in 0..partitions.min(MAX_PARTITIONS) {
        img.u32(
            base + PROFILE_RESOURCES + partition * MAX_RESOURCES * 4,
            xcc_index,
        );
    }
}

pub(crate) fn profile(profile: &Profile, config: Option<&ProfileConfig>) -> Image {
    let mut img = Image::new(PROFILE_SIZE);
    put_profile(&mut img, 0, profile, &resource_profiles(config));
    img
}

/// `amdsmi_accelerator_partition_profile_config_t` (docs/amd-hardware.md §3.8).
pub(crate) const PROFILE_CONFIG_SIZE: usize = 39168;
const CONFIG_RESOURCE_PROFILES: usize = 8;
const RESOURCE_PROFILE_SIZE: usize = 64;
const CONFIG_DEFAULT_INDEX: usize = 2056;
const CONFIG_PROFILES: usize = 2064;

pub(crate) fn profile_config(config: &ProfileConfig) -> Image {
    let mut img = Image::new(PROFILE_CONFIG_SIZE);
    let resources = resource_profiles(Some(config));
    let profiles = config.profiles.iter().take(crate::fixture::MAX_PROFILES);
    img.u32(0, u32::try_from(profiles.len()).unwrap_or(0));
    img.u32(4, u32::try_from(resources.len()).unwrap_or(0));
    for (i, r) in resources.iter().enumerate() {
        let base = CONFIG_RESOURCE_PROFILES + i * RESOURCE_PROFILE_SIZE;
        img.u32(base, r.profile_index);
        img.u32(base + 4, RESOURCE_XCC);
        img.u32(base + 8, r.xcc);
        img.u32(base + 12, 1);
    }
    img.u32(CONFIG_DEFAULT_INDEX, config.default_profile_index);
    for (i, p) in profiles.enumerate() {
        put_profile(&mut img, CONFIG_PROFILES + i * PROFILE_SIZE, p, &resources);
    }
    img
}

/// `amdsmi_proc_info_t` offsets (docs/amd-hardware.md §3.10).
struct ProcLayout {
    stride: usize,
    name_len: usize,
    pid: usize,
    mem: usize,
    vram_mem: usize,
    container_name: usize,
}

fn proc_layout(abi: Abi) -> ProcLayout {
    if abi >= Abi::V6_4 {
        // memory_usage @336: gtt_mem +0, cpu_mem +8, vram_mem +16.
        ProcLayout {
            stride: 704,
            name_len: 256,
            pid: 256,
            mem: 264,
            vram_mem: 352,
            container_name: 400,
        }
    } else {
        // memory_usage @112.
        ProcLayout {
            stride: 224,
            name_len: 32,
            pid: 32,
            mem: 40,
            vram_mem: 128,
            container_name: 176,
        }
    }
}

#[cfg(test)]
pub(crate) fn proc_stride(abi: Abi) -> usize {
    proc_layout(abi).stride
}

/// `processes.len()` consecutive `amdsmi_proc_info_t` at the ABI's stride.
pub(crate) fn process_list(abi: Abi, processes: &[Process]) -> Image {
    let l = proc_layout(abi);
    let mut img = Image::new(l.stride * processes.len());
    for (i, proc) in processes.iter().enumerate() {
        let base = i * l.stride;
        img.str(base, l.name_len, &proc.name);
        img.u32(base + l.pid, proc.pid);
        img.u64(base + l.mem, proc.mem_bytes);
        img.u64(base + l.vram_mem, proc.vram_bytes);
        img.str(base + l.container_name, l.name_len, &proc.container_name);
    }
    img
}

#[cfg(test)]
#[path = "layout_tests.rs"]
mod tests;
