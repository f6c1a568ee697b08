//! `amdsmi-probe --usage`, run inside the child: the light probe behind
//! `GetUsage`. Per GPU (PCI address) it reads, on the GPU's partition-0
//! processor, `amdsmi_get_gpu_activity` and `amdsmi_get_gpu_vram_usage`,
//! and nothing else the full probe reads. Both getters are optional: a
//! library without them, or one answering an error, gives `None`.
//!
//! Layouts (unchanged from 6.2 through lib 26.5;
//! ROCm/amdsmi:include/amd_smi/amdsmi.h):
//! * `amdsmi_engine_usage_t`: `uint32_t gfx_activity @0, umc_activity @4,
//!   mm_activity @8` (percent), then `uint32_t reserved[13]`; 64 bytes.
//! * `amdsmi_vram_usage_t`: `uint32_t vram_total @0, vram_used @4` (MiB),
//!   then `uint32_t reserved[2]`; 16 bytes.

use std::{collections::BTreeMap, path::PathBuf};

use tracing::{debug, debug_span};

use super::{
    LIB_DIR_ENV, LibrarySource,
    child::{Found, detect, enumerate, retry_busy},
    decode,
    dynlib::{CallFail, Handle, Session},
    layout::{self, u32_at},
    locate,
    report::{AmdSmiReport, GpuUsage, ProbeFailure},
};

const MIB: u64 = 1 << 20;
/// Most percent an activity can be; larger values (AMD SMI's `UINT16_MAX`
/// or `UINT32_MAX` for "not available") are dropped.
const MAX_PERCENT: u32 = 100;

/// `gfx_activity` of an `amdsmi_engine_usage_t`, when it is a percentage.
pub(super) fn gfx_activity(bytes: &[u8]) -> Option<u32> {
    Some(u32_at(bytes, 0)).filter(|p| *p <= MAX_PERCENT)
}

/// `vram_used` of an `amdsmi_vram_usage_t`, in bytes; `None` for the
/// "not available" `UINT32_MAX` and for more used than the total says.
pub(super) fn vram_used_bytes(bytes: &[u8]) -> Option<u64> {
    let (total, used) = (u32_at(bytes, 0), u32_at(bytes, 4));
    if used == u32::MAX || (total != 0 && used > total) {
        return None;
    }
    Some(u64::from(used) * MIB)
}

/// Loads the library and reads the use of every GPU it enumerates.
pub fn run(source: &LibrarySource) -> Result<AmdSmiReport, ProbeFailure> {
    let env_dir = std::env::var_os(LIB_DIR_ENV)
        .filter(|d| !d.is_empty())
        .map(PathBuf::from);
    let (lib, library) = locate::open(source, env_dir.as_deref())?;
    let span = debug_span!("amdsmi_usage", library = %library);
    let _entered = span.enter();
    let (version, layout, session) = detect(&lib, &library)?;
    let usage = {
        let found = enumerate(&session, &library, layout.family())?;
        primaries(&session, &found)
            .into_iter()
            .map(|(bdf, handle)| figures(&session, bdf, handle))
            .collect()
    };
    let _ = session.shut_down();
    Ok(AmdSmiReport {
        usage: Some(usage),
        ..AmdSmiReport::of_library(library, version, layout.name())
    })
}

/// Per PCI address, the processor with partition id 0, else the first one
/// (the handle of partition 0 speaks for the whole device,
/// docs/amd-hardware.md §4.8, §4.9); `--set-profile` picks its GPU's from this
/// too. Processors whose address cannot be read are left out.
pub(super) fn primaries<'s>(
    session: &'s Session<'_>,
    found: &[Found<'s>],
) -> BTreeMap<String, Handle<'s>> {
    let mut chosen: BTreeMap<String, (bool, Handle<'s>)> = BTreeMap::new();
    for f in found {
        let Ok(raw) = retry_busy(|| session.device_bdf(f.handle)) else {
            continue;
        };
        let bdf = layout::format_bdf(raw);
        if chosen.get(&bdf).is_some_and(|(zero, _)| *zero) {
            continue;
        }
        let partition = retry_busy(|| session.kfd_info(f.handle))
            .map(|b| decode::kfd_info(&b).current_partition_id)
            .or_else(|_| retry_busy(|| session.bdf_id(f.handle)).map(layout::bdf_id_partition));
        let zero = partition == Ok(0);
        let entry = chosen.entry(bdf).or_insert((zero, f.handle));
        if zero {
            *entry = (true, f.handle);
        }
    }
    chosen.into_iter().map(|(bdf, (_, h))| (bdf, h)).collect()
}

fn figures(session: &Session<'_>, bdf: String, handle: Handle<'_>) -> GpuUsage {
    let get = |name: &str, call: &dyn Fn() -> Result<Vec<u8>, CallFail>| match retry_busy(call) {
        Ok(bytes) => Some(bytes),
        Err(why) => {
            debug!(gpu = %bdf, call = name, ?why, "no AMD SMI usage figure");
            None
        }
    };
    let activity = get("amdsmi_get_gpu_activity", &|| session.gpu_activity(handle));
    let vram = get("amdsmi_get_gpu_vram_usage", &|| {
        session.gpu_vram_usage(handle)
    });
    GpuUsage {
        gfx_activity_percent: activity.as_deref().and_then(gfx_activity),
        vram_used_bytes: vram.as_deref().and_then(vram_used_bytes),
        bdf,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(values: &[u32], size: usize) -> Vec<u8> {
        let mut bytes: Vec<u8> = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
        bytes.resize(size, 0);
        bytes
    }

    #[test]
    fn activity_is_the_first_word_when_a_percentage() {
        assert_eq!(gfx_activity(&words(&[37, 80, 5], 64)), Some(37));
        assert_eq!(gfx_activity(&words(&[100], 64)), Some(100));
        assert_eq!(gfx_activity(&words(&[0], 64)), Some(0));
        assert_eq!(gfx_activity(&words(&[101], 64)), None);
        assert_eq!(gfx_activity(&words(&[u32::from(u16::MAX)], 64)), None);
        assert_eq!(gfx_activity(&words(&[u32::MAX], 64)), None);
    }

    #[test]
    fn vram_used_is_the_second_word_in_mib() {
        // 192 GiB total, 5000 MiB used.
        let bytes = words(&[196_608, 5000, 0, 0], 16);
        assert_eq!(vram_used_bytes(&bytes), Some(5000 * MIB));
        assert_eq!(vram_used_bytes(&words(&[0, 12], 16)), Some(12 * MIB));
        assert_eq!(vram_used_bytes(&words(&[100, 101], 16)), None);
        assert_eq!(vram_used_bytes(&words(&[0, u32::MAX], 16)), None);
        assert_eq!(
            vram_used_bytes(&words(&[u32::MAX, u32::MAX - 1], 16)),
            Some(u64::from(u32::MAX - 1) * MIB)
        );
    }

    #[test]
    fn a_short_buffer_reads_as_zero() {
        assert_eq!(gfx_activity(&[]), Some(0));
        assert_eq!(vram_used_bytes(&[1, 0]), Some(0));
    }
}
