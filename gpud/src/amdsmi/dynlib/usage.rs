//! The two getters `amdsmi-probe --usage` calls, beside the loader (whose
//! symbols and buffers they share) but in a file of their own. No `unsafe`
//! here: both write a plain struct, which [`Session::get_struct`] hands over
//! in an over-sized zeroed buffer, and `amdsmi::usage` decodes by offset.

use super::{CallFail, Handle, STRUCT_BUF, Session};

/// `amdsmi_get_gpu_activity(handle, amdsmi_engine_usage_t*)`, every release.
pub const GPU_ACTIVITY: &str = "amdsmi_get_gpu_activity";
/// `amdsmi_get_gpu_vram_usage(handle, amdsmi_vram_usage_t*)`, every release.
pub const GPU_VRAM_USAGE: &str = "amdsmi_get_gpu_vram_usage";

impl Session<'_> {
    /// `amdsmi_get_gpu_activity` raw bytes (`amdsmi_engine_usage_t`, 64 bytes).
    pub fn gpu_activity(&self, h: Handle<'_>) -> Result<Vec<u8>, CallFail> {
        let f = self.lib.syms.get_gpu_activity;
        self.get_struct(f, GPU_ACTIVITY, h, STRUCT_BUF)
    }

    /// `amdsmi_get_gpu_vram_usage` raw bytes (`amdsmi_vram_usage_t`, 16 bytes).
    pub fn gpu_vram_usage(&self, h: Handle<'_>) -> Result<Vec<u8>, CallFail> {
        let f = self.lib.syms.get_gpu_vram_usage;
        self.get_struct(f, GPU_VRAM_USAGE, h, STRUCT_BUF)
    }
}
