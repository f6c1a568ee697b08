//! `GetUsage` without its transport: targets from the inventory, the read
//! on a thread of its own within [`READ_LIMIT`] (with the AMD SMI usage
//! probe beside it, when AMD SMI is configured), one read at a time,
//! answers cached for [`cache::TTL`].

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use super::{Reading, Targets, amdsmi::SmiUsage, cache};
use crate::{
    HostPaths,
    amdsmi::AmdSmiConfig,
    deadline::{self, Overdue},
    dmem::DmemConfig,
    service::{Presence, Registry},
};

/// How long one read of the host may take before the call fails. A read of
/// 110 processes on 64 partitions takes milliseconds (docs/benchmarks.md).
pub(crate) const READ_LIMIT: Duration = Duration::from_secs(3);

/// Why a usage read gave no answer. A late or failed AMD SMI probe is no
/// error: sysfs figures are served then.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UsageError {
    /// An earlier caller's read still held the gate at the deadline.
    #[error("another usage read is late")]
    GateLate,
    /// The read missed its deadline, an earlier one is still blocked in the
    /// kernel, or its thread could not start or died.
    #[error(transparent)]
    Overdue(#[from] Overdue),
}

/// What `GetUsage` needs besides the inventory.
#[derive(Debug)]
pub(crate) struct UsageReader {
    paths: HostPaths,
    dmem: DmemConfig,
    cache: cache::Cache,
    /// One read at a time: later callers wait, then take its answer.
    gate: tokio::sync::Mutex<()>,
    /// Set while a read's thread runs (it may outlive its deadline).
    busy: Arc<AtomicBool>,
    /// VRAM used and activity from AMD SMI, where it answers.
    smi: SmiUsage,
}

impl UsageReader {
    pub(crate) fn new(paths: HostPaths, dmem: DmemConfig, amdsmi: AmdSmiConfig) -> Self {
        Self {
            smi: SmiUsage::new(amdsmi),
            paths,
            dmem,
            cache: cache::Cache::default(),
            gate: tokio::sync::Mutex::new(()),
            busy: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The usage now, from the cache or one read.
    ///
    /// # Errors
    /// [`UsageError`] when the read misses [`READ_LIMIT`], or an earlier one
    /// is still blocked in the kernel.
    pub(crate) async fn get(&self, targets: Targets) -> Result<Arc<Reading>, UsageError> {
        // One deadline for the whole call: the wait for an earlier read and this one.
        let deadline = tokio::time::Instant::now() + READ_LIMIT;
        let waited = tokio::time::timeout_at(deadline, self.gate.lock()).await;
        let _gate = waited.map_err(|_| UsageError::GateLate)?;
        if let Some(reading) = self.cache.fresh(Instant::now()) {
            return Ok(reading);
        }
        if self.busy.swap(true, Ordering::AcqRel) {
            return Err(Overdue::StillBlocked { what: WHAT }.into());
        }
        let started = Instant::now();
        // The probe child runs beside the sysfs read; it is only waited for
        // once that is done, and never past the call's deadline.
        let probe = self.smi.start(started);
        let mut reading = self.read_host(targets, deadline).await?;
        if let Some(probe) = probe {
            let figures = probe_figures(&self.smi, probe, deadline).await;
            super::amdsmi::merge(&mut reading.usage.gpus, &figures);
        }
        if reading.skipped > 0 {
            tracing::warn!(
                skipped = reading.skipped,
                "GetUsage: KFD processes past the bound left out"
            );
        }
        tracing::debug!(
            elapsed_us = started.elapsed().as_micros(),
            containers = reading.usage.containers.len(),
            outside = reading.outside,
            "usage read"
        );
        let reading = Arc::new(reading);
        self.cache.store(Instant::now(), reading.clone());
        Ok(reading)
    }

    /// The read of the host's files, on a thread of its own, by `deadline`.
    async fn read_host(
        &self,
        targets: Targets,
        deadline: tokio::time::Instant,
    ) -> Result<Reading, Overdue> {
        let (paths, dmem) = (self.paths.clone(), self.dmem.clone());
        let release = Release(self.busy.clone());
        let (rx, progress) = deadline::spawn_watched(WHAT, move || {
            let _release = release;
            let layouts = super::layouts(&paths, &dmem);
            super::read(&paths, &layouts, &targets)
        })?;
        match tokio::time::timeout_at(deadline, rx).await {
            Ok(Ok(reading)) => Ok(reading),
            Ok(Err(_)) => Err(Overdue::Died { what: WHAT }),
            Err(_) => {
                let err = Overdue::Late {
                    what: WHAT,
                    limit: READ_LIMIT,
                    at: progress.at(),
                };
                tracing::warn!("GetUsage: {err}");
                Err(err)
            }
        }
    }
}

/// The present GPUs and the KFD `gpu_id`s of their present partitions.
pub(crate) fn targets(registry: &Registry) -> Targets {
    let mut targets = Targets::default();
    for (gpu, presence) in registry.gpus() {
        if presence != Presence::Present {
            continue;
        }
        targets.gpus.push(gpu.bdf.to_string());
        for index in registry.partition_indices(gpu.bdf) {
            if let Some((part, Presence::Present)) = registry.partition(gpu.bdf, index) {
                targets.gpu_ids.extend(part.gpu_id);
            }
        }
    }
    targets.gpu_ids.sort_unstable();
    targets.gpu_ids.dedup();
    targets
}

/// AMD SMI's figures, if its probe answers [`PROBE_MARGIN`] before `deadline`.
async fn probe_figures(
    smi: &SmiUsage,
    probe: super::amdsmi::Pending,
    deadline: tokio::time::Instant,
) -> super::amdsmi::ByGpu {
    let until = deadline.checked_sub(PROBE_MARGIN).unwrap_or(deadline);
    let result = match tokio::time::timeout_at(until, probe).await {
        Ok(Ok(result)) => result.map_err(|e| e.to_string()),
        Ok(Err(_)) => Err("the probe's thread died".to_owned()),
        Err(_) => Err("the probe helper did not end in time".to_owned()),
    };
    smi.finish(Instant::now(), result)
}

/// Time left after the AMD SMI probe for the answer to go out.
const PROBE_MARGIN: Duration = Duration::from_millis(250);

const WHAT: &str = "the usage read";

/// Clears the busy flag when the read's thread ends, however it ends (a
/// thread that never returns from the kernel keeps it set: no second read).
struct Release(Arc<AtomicBool>);

impl Drop for Release {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;
    use crate::amdsmi::LibrarySource;

    fn no_amdsmi() -> AmdSmiConfig {
        AmdSmiConfig {
            library: LibrarySource::Disabled,
            helper: Vec::new(),
            timeout: Duration::from_secs(1),
            child_env: Vec::new(),
        }
    }

    #[tokio::test]
    async fn a_read_blocked_in_the_kernel_fails_in_time_and_starts_no_second() {
        tokio::time::timeout(Duration::from_secs(20), async {
            let tmp = tempfile::tempdir().unwrap();
            let paths = HostPaths::under(tmp.path());
            fs::create_dir_all(paths.kfd_proc().join("77")).unwrap();
            fs::create_dir_all(paths.proc.join("77")).unwrap();
            // Opening a FIFO with no writer blocks, as a hung sysfs read does.
            let fifo = paths.proc.join("77/cgroup");
            rustix::fs::mkfifoat(
                rustix::fs::CWD,
                &fifo,
                rustix::fs::Mode::from_raw_mode(0o600),
            )
            .unwrap();
            let reader = UsageReader::new(paths, DmemConfig::default(), no_amdsmi());
            let start = Instant::now();
            let late = reader.get(Targets::default()).await.unwrap_err();
            assert!(
                matches!(&late, UsageError::Overdue(Overdue::Late { .. }))
                    && late.to_string().contains("did not finish"),
                "{late:?}"
            );
            let named = format!("blocked at {}", fifo.display());
            assert!(late.to_string().contains(&named), "{late}");
            assert!(start.elapsed() < READ_LIMIT + Duration::from_secs(1));
            let blocked = reader.get(Targets::default()).await.unwrap_err();
            assert!(blocked.to_string().contains("still blocked"), "{blocked:?}");
            // The writer comes: the read ends, and the next call reads again.
            drop(fs::OpenOptions::new().write(true).open(&fifo).unwrap());
            tokio::time::sleep(Duration::from_millis(200)).await;
            fs::remove_file(&fifo).unwrap();
            fs::write(&fifo, "0::/system.slice/x.service\n").unwrap();
            let reading = reader.get(Targets::default()).await.unwrap();
            assert!(reading.usage.containers.is_empty());
        })
        .await
        .expect("timed out");
    }
}
