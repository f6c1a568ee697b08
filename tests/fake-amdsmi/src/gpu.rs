//! Exported GPU getters and setters: ASIC, memory, KFD/enumeration info,
//! partitions, accelerator profiles and processes.

use std::ffi::{c_char, c_void};

use crate::{
    ffi::{Need, call, get, put, put_c_string, put_slice},
    fixture::{Abi, Processor, Profile, compute_mode_name},
    host,
    layout::{self, MAX_PARTITIONS},
    state::State,
    status,
};

/// `NOT_SUPPORTED` for a symbol the fixture's ABI does not have.
fn need_abi(st: &State, since: Abi) -> Result<Abi, u32> {
    let abi = st.abi()?;
    if abi < since {
        Err(status::NOT_SUPPORTED)
    } else {
        Ok(abi)
    }
}

fn need_root(st: &State) -> Result<(), u32> {
    if st.loaded()?.fixture.root {
        Ok(())
    } else {
        Err(status::NO_PERM)
    }
}

/// `NOT_SUPPORTED` unless at least one of the reported fields is present.
fn any_present(present: &[bool]) -> Result<(), u32> {
    if present.contains(&true) {
        Ok(())
    } else {
        Err(status::NOT_SUPPORTED)
    }
}

fn socket_busy(processors: &[Processor]) -> bool {
    processors
        .iter()
        .any(|p| p.processes.as_ref().is_some_and(|l| !l.is_empty()))
}

/// `amdsmi_asic_info_t` in the layout of the fixture's ABI (docs/amd-hardware.md §3.2).
///
/// # Safety
/// `info` is null or valid for the size of `amdsmi_asic_info_t` at that ABI.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn amdsmi_get_gpu_asic_info(handle: *mut c_void, info: *mut u8) -> u32 {
    call("amdsmi_get_gpu_asic_info", Need::Init, |st| {
        let abi = st.abi()?;
        let p = st.processor(handle)?;
        any_present(&[
            p.market_name.is_some(),
            p.vendor_id.is_some(),
            p.subvendor_id.is_some(),
            p.device_id.is_some(),
            p.rev_id.is_some(),
            p.asic_serial.is_some(),
            p.oam_id.is_some(),
            p.num_compute_units.is_some(),
            p.target_graphics_version.is_some(),
            p.subsystem_id.is_some(),
        ])?;
        let img = layout::asic_info(abi, p);
        // SAFETY: `info` is null or holds the struct size at this ABI, which is
        // exactly the image size.
        unsafe { put_slice(info, img.bytes()) }
    })
}

/// VRAM (0) and VIS_VRAM (1) answer `vram_total_bytes`; GTT (2) is not
/// supported; other types are invalid.
///
/// # Safety
/// `total` is null or a valid `uint64_t*`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn amdsmi_get_gpu_memory_total(
    handle: *mut c_void,
    mem_type: u32,
    total: *mut u64,
) -> u32 {
    call("amdsmi_get_gpu_memory_total", Need::Init, |st| {
        let p = st.processor(handle)?;
        let bytes = match mem_type {
            0 | 1 => p.vram_total_bytes.ok_or(status::NOT_SUPPORTED)?,
            2 => return Err(status::NOT_SUPPORTED),
            _ => return Err(status::INVAL),
        };
        // SAFETY: the caller passes null or a valid `uint64_t*`.
        unsafe { put(total, bytes) }
    })
}

/// `amdsmi_kfd_info_t` (6.3+, docs/amd-hardware.md §3.4).
///
/// # Safety
/// `info` is null or valid for 64 bytes.
#[cfg_attr(not(feature = "abi-6-2"), unsafe(no_mangle))]
pub unsafe extern "C" fn amdsmi_get_gpu_kfd_info(handle: *mut c_void, info: *mut u8) -> u32 {
    call("amdsmi_get_gpu_kfd_info", Need::Init, |st| {
        need_abi(st, Abi::V6_3)?;
        let p = st.processor(handle)?;
        any_present(&[p.kfd_id.is_some(), p.kfd_node.is_some()])?;
        let img = layout::kfd_info(p);
        // SAFETY: `info` is null or holds the 64-byte struct.
        unsafe { put_slice(info, img.bytes()) }
    })
}

/// `amdsmi_enumeration_info_t` (6.4+; 272 bytes, 276 on 7.13, docs/amd-hardware.md §3.5).
///
/// # Safety
/// `info` is null or valid for the struct size at the fixture's ABI.
#[cfg_attr(not(any(feature = "abi-6-2", feature = "abi-6-3")), unsafe(no_mangle))]
pub unsafe extern "C" fn amdsmi_get_gpu_enumeration_info(
    handle: *mut c_void,
    info: *mut u8,
) -> u32 {
    call("amdsmi_get_gpu_enumeration_info", Need::Init, |st| {
        let abi = need_abi(st, Abi::V6_4)?;
        let p = st.processor(handle)?;
        any_present(&[
            p.drm_render.is_some(),
            p.drm_card.is_some(),
            p.hsa_id.is_some(),
            p.hip_id.is_some(),
            p.hip_uuid.is_some(),
        ])?;
        let img = layout::enumeration_info(abi, p);
        // SAFETY: `info` is null or holds the struct size at this ABI.
        unsafe { put_slice(info, img.bytes()) }
    })
}

/// The compute partition mode string, e.g. "CPX".
///
/// # Safety
/// `buf` is null or valid for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn amdsmi_get_gpu_compute_partition(
    handle: *mut c_void,
    buf: *mut c_char,
    len: u32,
) -> u32 {
    call("amdsmi_get_gpu_compute_partition", Need::Init, |st| {
        let p = st.processor(handle)?;
        let mode = p
            .compute_partition
            .as_deref()
            .ok_or(status::NOT_SUPPORTED)?;
        // SAFETY: `buf` is null or holds `len` bytes.
        unsafe { put_c_string(buf.cast::<u8>(), len, mode) }
    })
}

/// Records a compute partition mode for every processor of the socket.
#[unsafe(no_mangle)]
pub extern "C" fn amdsmi_set_gpu_compute_partition(handle: *mut c_void, mode: u32) -> u32 {
    call("amdsmi_set_gpu_compute_partition", Need::Init, |st| {
        let at = st.resolve(handle)?;
        let abi = st.abi()?;
        need_root(st)?;
        if st.processor_at(at)?.compute_partition.is_none() {
            return Err(status::NOT_SUPPORTED);
        }
        let name = compute_mode_name(abi, mode).ok_or(status::SETTING_UNAVAILABLE)?;
        let processors = st.socket_processors_mut(at.socket)?;
        if socket_busy(processors) {
            return Err(status::BUSY);
        }
        for p in processors {
            p.compute_partition = Some(name.to_owned());
        }
        Ok(())
    })
}

/// The memory partition mode string, e.g. "NPS1".
///
/// # Safety
/// `buf` is null or valid for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn amdsmi_get_gpu_memory_partition(
    handle: *mut c_void,
    buf: *mut c_char,
    len: u32,
) -> u32 {
    call("amdsmi_get_gpu_memory_partition", Need::Init, |st| {
        let p = st.processor(handle)?;
        let mode = p.memory_partition.as_deref().ok_or(status::NOT_SUPPORTED)?;
        // SAFETY: `buf` is null or holds `len` bytes.
        unsafe { put_c_string(buf.cast::<u8>(), len, mode) }
    })
}

/// The current accelerator partition profile (6.3+, docs/amd-hardware.md §3.6, §4.8). Always
/// writes `partition_id[0]`; only partition 0 answers the profile.
///
/// # Safety
/// `profile` is null or valid for 1152 bytes; `partition_id` is null or valid
/// for 8 `u32`.
#[cfg_attr(not(feature = "abi-6-2"), unsafe(no_mangle))]
pub unsafe extern "C" fn amdsmi_get_gpu_accelerator_partition_profile(
    handle: *mut c_void,
    profile: *mut u8,
    partition_id: *mut u32,
) -> u32 {
    call(
        "amdsmi_get_gpu_accelerator_partition_profile",
        Need::Init,
        |st| {
            need_abi(st, Abi::V6_3)?;
            let p = st.processor(handle)?;
            // SAFETY: `partition_id` is null or holds 8 `u32`.
            unsafe { put(partition_id, p.partition_id) }?;
            if p.partition_id != 0 {
                return Err(status::NOT_SUPPORTED);
            }
            let current = p.profile.as_ref().ok_or(status::NOT_SUPPORTED)?;
            let img = layout::profile(current, p.profile_config.as_ref());
            // SAFETY: `profile` is null or holds the 1152-byte struct.
            unsafe { put_slice(profile, img.bytes()) }?;
            let ids = current
                .partition_ids
                .get(..MAX_PARTITIONS)
                .unwrap_or(&current.partition_ids);
            if ids.is_empty() {
                return Ok(());
            }
            // SAFETY: `partition_id` holds 8 `u32` and `ids.len() <= 8`.
            unsafe { put_slice(partition_id, ids) }
        },
    )
}

/// Every available profile (6.4+, docs/amd-hardware.md §3.8); needs root.
///
/// # Safety
/// `config` is null or valid for 39168 bytes.
#[cfg_attr(not(any(feature = "abi-6-2", feature = "abi-6-3")), unsafe(no_mangle))]
pub unsafe extern "C" fn amdsmi_get_gpu_accelerator_partition_profile_config(
    handle: *mut c_void,
    config: *mut u8,
) -> u32 {
    call(
        "amdsmi_get_gpu_accelerator_partition_profile_config",
        Need::Init,
        |st| {
            need_abi(st, Abi::V6_4)?;
            let p = st.processor(handle)?;
            need_root(st)?;
            let available = p.profile_config.as_ref().ok_or(status::NOT_SUPPORTED)?;
            let img = layout::profile_config(available);
            // SAFETY: `config` is null or holds the 39168-byte struct.
            unsafe { put_slice(config, img.bytes()) }
        },
    )
}

/// The profile of `profile_config` with that `profile_index`, as the new
/// current profile (partition ids default to 0..num_partitions).
fn selected_profile(p: &Processor, profile_index: u32) -> Result<Profile, u32> {
    let available = p.profile_config.as_ref().ok_or(status::NOT_SUPPORTED)?;
    let mut chosen = available
        .profiles
        .iter()
        .find(|q| q.profile_index == profile_index)
        .cloned()
        .ok_or(status::INVAL)?;
    if chosen.partition_ids.is_empty() {
        let count = usize::try_from(chosen.num_partitions).unwrap_or(MAX_PARTITIONS);
        let count = u32::try_from(count.min(MAX_PARTITIONS)).unwrap_or(0);
        chosen.partition_ids = (0..count).collect();
    }
    Ok(chosen)
}

/// Selects a profile by index into the profile config (6.4+); needs root.
#[cfg_attr(not(any(feature = "abi-6-2", feature = "abi-6-3")), unsafe(no_mangle))]
pub extern "C" fn amdsmi_set_gpu_accelerator_partition_profile(
    handle: *mut c_void,
    profile_index: u32,
) -> u32 {
    call(
        "amdsmi_set_gpu_accelerator_partition_profile",
        Need::Init,
        |st| {
            need_abi(st, Abi::V6_4)?;
            let at = st.resolve(handle)?;
            need_root(st)?;
            let chosen = selected_profile(st.processor_at(at)?, profile_index)?;
            let bdf = st.processor_at(at)?.pci.to_string();
            let host_root = st.loaded()?.fixture.host_root.clone();
            let processors = st.socket_processors_mut(at.socket)?;
            if socket_busy(processors) {
                return Err(status::BUSY);
            }
            for p in processors {
                p.compute_partition = Some(chosen.profile_type.clone());
                if p.partition_id == 0 {
                    p.profile = Some(chosen.clone());
                }
            }
            match host_root {
                Some(root) => host::record_switch(
                    &root,
                    "amdsmi_set_gpu_accelerator_partition_profile",
                    &bdf,
                    profile_index,
                    &chosen.profile_type,
                ),
                None => Ok(()),
            }
        },
    )
}

/// The processes of the fixture at the ABI's `amdsmi_proc_info_t` stride.
/// `*max_processes` goes in as the capacity and comes back as the number of
/// processes; a short buffer is filled and answers `OUT_OF_RESOURCES`.
///
/// # Safety
/// `max_processes` is null or a valid `u32`; `list` is null or valid for
/// `*max_processes` entries at the ABI's stride.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn amdsmi_get_gpu_process_list(
    handle: *mut c_void,
    max_processes: *mut u32,
    list: *mut u8,
) -> u32 {
    call("amdsmi_get_gpu_process_list", Need::Init, |st| {
        let abi = st.abi()?;
        let p = st.processor(handle)?;
        let processes = p.processes.as_deref().ok_or(status::NOT_SUPPORTED)?;
        // SAFETY: the caller passes null or a valid `uint32_t*`.
        let capacity = unsafe { get(max_processes) }?;
        let total = u32::try_from(processes.len()).map_err(|_| status::OUT_OF_RESOURCES)?;
        if !list.is_null() && capacity > 0 {
            let fits = processes
                .get(..usize::try_from(capacity).unwrap_or(0))
                .unwrap_or(processes);
            let img = layout::process_list(abi, fits);
            // SAFETY: `list` holds `capacity` entries of the ABI's stride and the
            // image holds at most that many.
            unsafe { put_slice(list, img.bytes()) }?;
        }
        // SAFETY: as for the read above.
        unsafe { put(max_processes, total) }?;
        if !list.is_null() && capacity > 0 && capacity < total {
            return Err(status::OUT_OF_RESOURCES);
        }
        Ok(())
    })
}
