//! The D-Bus side of `GetUsage`, over [`crate::usage`]: targets from the
//! inventory, the read on a thread of its own within [`READ_LIMIT`] (with
//! the AMD SMI usage probe beside it, when AMD SMI is configured), one read
//! at a time, answers cached for [`cache::TTL`].

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use ipc::{
    ApiError,
    usage::{ContainerVram, GpuUse, PodDmem},
};

use crate::{
    HostPaths,
    amdsmi::AmdSmiConfig,
    deadline,
    dmem::DmemConfig,
    service::{Presence, Registry},
    usage::{self, Reading, Targets, amdsmi::SmiUsage, cache},
};

/// How long one read of the host may take before the call fails. A read of
/// 110 processes on 64 partitions takes milliseconds (docs/benchmarks.md).
pub const READ_LIMIT: Duration = Duration::from_secs(3);

/// The answer of `GetUsage`.
pub type Answer = (Vec<ContainerVram>, Vec<PodDmem>, Vec<GpuUse>);

/// What `GetUsage` needs besides the inventory.
#[derive(Debug)]
pub struct UsageState {
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

impl UsageState {
    pub fn new(paths: HostPaths, dmem: DmemConfig, amdsmi: AmdSmiConfig) -> Self {
        Self {
            smi: SmiUsage::new(amdsmi),
            paths,
            dmem,
            cache: cache::Cache::default(),
            gate: tokio::sync::Mutex::new(()),
            busy: Arc::new(AtomicBool::new(false)),
        }
    }
}

/// The present GPUs and the KFD `gpu_id`s of their present partitions.
pub fn targets(registry: &Registry) -> Targets {
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

/// The usage now, from the cache or one read.
///
/// # Errors
/// `Failed` when the read misses [`READ_LIMIT`], or an earlier one is still
/// blocked in the kernel. A late or failed AMD SMI probe is no error: sysfs
/// figures are served then.
pub async fn get(state: &UsageState, targets: Targets) -> Result<Answer, ApiError> {
    // One deadline for the whole call: the wait for an earlier read and this one.
    let deadline = tokio::time::Instant::now() + READ_LIMIT;
    let waited = tokio::time::timeout_at(deadline, state.gate.lock()).await;
    let _gate = waited.map_err(|_| ApiError::Failed("another usage read is late".to_owned()))?;
    if let Some(reading) = state.cache.fresh(Instant::now()) {
        return Ok(answer(&reading));
    }
    if state.busy.swap(true, Ordering::AcqRel) {
        let err = deadline::Overdue::StillBlocked { what: WHAT };
        return Err(ApiError::Failed(err.to_string()));
    }
    let started = Instant::now();
    // The probe child runs beside the sysfs read; it is only waited for
    // once that is done, and never past the call's deadline.
    let probe = state.smi.start(started);
    let mut reading = read_host(state, targets, deadline).await?;
    if let Some(probe) = probe {
        let figures = probe_figures(&state.smi, probe, deadline).await;
        usage::amdsmi::merge(&mut reading.usage.gpus, &figures);
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
    state.cache.store(Instant::now(), reading.clone());
    Ok(answer(&reading))
}

/// The read of the host's files, on a thread of its own, by `deadline`.
async fn read_host(
    state: &UsageState,
    targets: Targets,
    deadline: tokio::time::Instant,
) -> Result<Reading, ApiError> {
    let (paths, dmem) = (state.paths.clone(), state.dmem.clone());
    let release = Release(state.busy.clone());
    let rx = deadline::spawn(WHAT, move || {
        let _release = release;
        let layouts = usage::layouts(&paths, &dmem);
        usage::read(&paths, &layouts, &targets)
    })
    .map_err(|e| ApiError::Failed(e.to_string()))?;
    match tokio::time::timeout_at(deadline, rx).await {
        Ok(Ok(reading)) => Ok(reading),
        Ok(Err(_)) => {
            let err = deadline::Overdue::Died { what: WHAT };
            Err(ApiError::Failed(err.to_string()))
        }
        Err(_) => {
            let err = deadline::Overdue::Late {
                what: WHAT,
                limit: READ_LIMIT,
            };
            tracing::warn!("GetUsage: {err}");
            Err(ApiError::Failed(err.to_string()))
        }
    }
}

/// AMD SMI's figures, if its probe answers [`PROBE_MARGIN`] before `deadline`.
async fn probe_figures(
    smi: &SmiUsage,
    probe: usage::amdsmi::Pending,
    deadline: tokio::time::Instant,
) -> usage::amdsmi::ByGpu {
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

fn answer(reading: &Reading) -> Answer {
    let u = &reading.usage;
    (u.containers.clone(), u.dmem.clone(), u.gpus.clone())
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
            let state = UsageState::new(paths, DmemConfig::default(), no_amdsmi());
            let start = Instant::now();
            let late = get(&state, Targets::default()).await.unwrap_err();
            assert!(
                matches!(&late, ApiError::Failed(m) if m.contains("did not finish")),
                "{late:?}"
            );
            assert!(start.elapsed() < READ_LIMIT + Duration::from_secs(1));
            let blocked = get(&state, Targets::default()).await.unwrap_err();
            assert!(
                matches!(&blocked, ApiError::Failed(m) if m.contains("still blocked")),
                "{blocked:?}"
            );
            // The writer comes: the read ends, and the next call reads again.
            drop(fs::OpenOptions::new().write(true).open(&fifo).unwrap());
            tokio::time::sleep(Duration::from_millis(200)).await;
            fs::remove_file(&fifo).unwrap();
            fs::write(&fifo, "0::/system.slice/x.service\n").unwrap();
            let (containers, _, _) = get(&state, Targets::default()).await.unwrap();
            assert!(containers.is_empty());
        })
        .await
        .expect("timed out");
    }
}
