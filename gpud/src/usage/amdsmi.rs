//! Each GPU's VRAM used and activity from AMD SMI where it answers, for
//! `GetUsage`: the light probe (`amdsmi-probe --usage`) runs in a child
//! process, as every AMD SMI call, at most one at a time and never when AMD
//! SMI is disabled. A probe that fails or is late leaves the sysfs figures,
//! says why once at warn (then at debug until one answers again), and is
//! not tried again for [`RETRY_AFTER`].

use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use ipc::usage::GpuUse;
use tokio::sync::oneshot;

use crate::{
    amdsmi::{self, AmdSmiConfig, AmdSmiError, LibrarySource, report::GpuUsage},
    pci::PciAddress,
};

/// How long the probe child may run before it is killed: within
/// `GetUsage`'s own limit, with room for the sysfs read.
pub(crate) const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long after a failed (or figureless) probe AMD SMI is left alone.
pub(crate) const RETRY_AFTER: Duration = Duration::from_secs(30);

/// What AMD SMI said of one GPU.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Figures {
    pub(crate) busy_percent: Option<u32>,
    pub(crate) vram_used_bytes: Option<u64>,
}

/// The figures by PCI address.
pub(crate) type ByGpu = BTreeMap<PciAddress, Figures>;

/// The answer of one probe, as its thread hands it over.
pub(crate) type Pending = oneshot::Receiver<Result<Vec<GpuUsage>, AmdSmiError>>;

/// The probe's configuration and what the last probes did.
#[derive(Debug)]
pub(crate) struct SmiUsage {
    config: AmdSmiConfig,
    /// Set while a probe's thread runs.
    probing: Arc<AtomicBool>,
    /// No probe before this.
    quiet_until: Mutex<Option<Instant>>,
    /// Whether the current run of failures was logged at warn already.
    warned: AtomicBool,
}

impl SmiUsage {
    pub(crate) fn new(config: AmdSmiConfig) -> Self {
        Self {
            config,
            probing: Arc::new(AtomicBool::new(false)),
            quiet_until: Mutex::new(None),
            warned: AtomicBool::new(false),
        }
    }

    /// Starts a probe on a thread of its own, unless AMD SMI is disabled, a
    /// probe still runs, or the last one failed less than [`RETRY_AFTER`]
    /// ago.
    pub(crate) fn start(&self, now: Instant) -> Option<Pending> {
        if self.config.library == LibrarySource::Disabled {
            return None;
        }
        let quiet = *self
            .quiet_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if quiet.is_some_and(|until| now < until) || self.probing.swap(true, Ordering::AcqRel) {
            return None;
        }
        let (config, done) = (self.config.clone(), Done(self.probing.clone()));
        let spawned = crate::deadline::spawn("the AMD SMI usage probe", move || {
            let _done = done;
            amdsmi::gpu_usage(&config, PROBE_TIMEOUT)
        });
        match spawned {
            Ok(rx) => Some(rx),
            Err(err) => {
                self.failed(now, &err.to_string());
                None
            }
        }
    }

    /// The figures of a finished probe (`Err`: why there are none), logged
    /// and remembered for the next [`Self::start`].
    pub(crate) fn finish(&self, now: Instant, result: Result<Vec<GpuUsage>, String>) -> ByGpu {
        let list = match result {
            Ok(list) => list,
            Err(why) => {
                self.failed(now, &why);
                return ByGpu::new();
            }
        };
        let figures = by_gpu(&list);
        if figures.is_empty() {
            self.failed(now, "it reports no activity or VRAM used for any GPU");
        } else {
            if self.warned.swap(false, Ordering::AcqRel) {
                tracing::info!(gpus = figures.len(), "GetUsage: AMD SMI answers again");
            }
            tracing::debug!(gpus = figures.len(), "AMD SMI usage probe done");
        }
        figures
    }

    fn failed(&self, now: Instant, why: &str) {
        *self
            .quiet_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(now + RETRY_AFTER);
        let after = RETRY_AFTER.as_secs();
        if self.warned.swap(true, Ordering::AcqRel) {
            tracing::debug!(why, retry_after_s = after, "GetUsage: no AMD SMI figures");
        } else {
            tracing::warn!(
                why,
                retry_after_s = after,
                "GetUsage: no AMD SMI figures; VRAM used and activity come from sysfs"
            );
        }
    }
}

/// Clears the probing flag when the probe's thread ends, however it ends
/// (or when the thread could not be started at all).
struct Done(Arc<AtomicBool>);

impl Drop for Done {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// The usable figures of `list` by PCI address (entries with an address
/// that does not parse, or with no figure at all, are left out; the first
/// entry of an address wins).
pub(crate) fn by_gpu(list: &[GpuUsage]) -> ByGpu {
    let mut out = ByGpu::new();
    for entry in list.iter().take(super::MAX_ENTRIES) {
        let Ok(bdf) = entry.bdf.parse::<PciAddress>() else {
            continue;
        };
        let figures = Figures {
            busy_percent: entry.gfx_activity_percent,
            vram_used_bytes: entry.vram_used_bytes,
        };
        if figures != Figures::default() {
            out.entry(bdf).or_insert(figures);
        }
    }
    out
}

/// Puts AMD SMI's figures over sysfs's where it has them, and says in
/// `source` where VRAM used and activity came from (`amdsmi`: both from
/// AMD SMI; `amdsmi-vram` or `amdsmi-busy`: that one from AMD SMI, the
/// other from sysfs; `sysfs`: both from sysfs). Temperature and power are
/// always sysfs's.
pub(crate) fn merge(gpus: &mut [GpuUse], figures: &ByGpu) {
    for gpu in gpus {
        let Some(f) = gpu
            .bdf
            .parse::<PciAddress>()
            .ok()
            .and_then(|b| figures.get(&b))
        else {
            continue;
        };
        if let Some(busy) = f.busy_percent {
            gpu.busy_percent = i64::from(busy);
        }
        if let Some(used) = f.vram_used_bytes.and_then(|b| i64::try_from(b).ok()) {
            gpu.vram_used_bytes = used;
        }
        let source = match (f.vram_used_bytes.is_some(), f.busy_percent.is_some()) {
            (true, true) => "amdsmi",
            (true, false) => "amdsmi-vram",
            (false, true) => "amdsmi-busy",
            (false, false) => continue,
        };
        source.clone_into(&mut gpu.source);
    }
}

#[cfg(test)]
mod tests;
