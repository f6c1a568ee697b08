//! Exported use getters: `amdsmi_get_gpu_activity` and
//! `amdsmi_get_gpu_vram_usage` (the same layouts in every release;
//! ROCm/amdsmi:include/amd_smi/amdsmi.h).

use std::ffi::c_void;

use crate::{
    ffi::{Need, call, put_slice},
    status,
};

/// `amdsmi_engine_usage_t`: three `uint32_t` percentages, `reserved[13]`.
const ENGINE_USAGE_SIZE: usize = 64;
/// `amdsmi_vram_usage_t`: `vram_total`, `vram_used` (MiB), `reserved[2]`.
const VRAM_USAGE_SIZE: usize = 16;
const MIB: u64 = 1 << 20;

fn image(words: &[u32], size: usize) -> Vec<u8> {
    let mut bytes: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
    bytes.resize(size, 0);
    bytes
}

/// The fixture's `gfx_activity`, `umc_activity`, `mm_activity` (a missing
/// one reads 0); `NOT_SUPPORTED` when all three are missing.
///
/// # Safety
/// `info` is null or valid for 64 bytes of writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn amdsmi_get_gpu_activity(handle: *mut c_void, info: *mut u8) -> u32 {
    call("amdsmi_get_gpu_activity", Need::Init, |st| {
        let p = st.processor(handle)?;
        let words = [p.gfx_activity, p.umc_activity, p.mm_activity];
        if words.iter().all(Option::is_none) {
            return Err(status::NOT_SUPPORTED);
        }
        let img = image(&words.map(|w| w.unwrap_or(0)), ENGINE_USAGE_SIZE);
        // SAFETY: `info` is null or holds the 64-byte struct.
        unsafe { put_slice(info, &img) }
    })
}

/// The fixture's `vram_used_mib`, with `vram_total_bytes` in MiB as the
/// total (0 when missing); `NOT_SUPPORTED` without `vram_used_mib`.
///
/// # Safety
/// `info` is null or valid for 16 bytes of writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn amdsmi_get_gpu_vram_usage(handle: *mut c_void, info: *mut u8) -> u32 {
    call("amdsmi_get_gpu_vram_usage", Need::Init, |st| {
        let p = st.processor(handle)?;
        let used = p.vram_used_mib.ok_or(status::NOT_SUPPORTED)?;
        let total = p.vram_total_bytes.unwrap_or(0) / MIB;
        let total = u32::try_from(total).unwrap_or(u32::MAX);
        let img = image(&[total, used], VRAM_USAGE_SIZE);
        // SAFETY: `info` is null or holds the 16-byte struct.
        unsafe { put_slice(info, &img) }
    })
}
