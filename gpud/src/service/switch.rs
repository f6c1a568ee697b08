//! A compute-partition switch, after the service task found the GPU: the
//! core ([`crate::partition::switch`]) checks and writes off the executor,
//! then this waits until the driver shows the GPU's new partitions,
//! rescanning (through the service task, like any caller) as it goes, so
//! that the answer comes with the new inventory published.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use tokio::sync::{mpsc, oneshot};
use tracing::{Instrument, Span, info, warn};

use super::{
    Presence, Registry,
    api::{Origin, Request, ScanError, Snapshot, SwitchError},
};
use crate::{
    amdsmi::AmdSmiConfig,
    hostpaths::HostPaths,
    inventory::Gpu,
    partition::{self, Switched},
    pci::PciAddress,
};

/// How long the driver may take to re-create the partitions.
pub const SWITCH_TIMEOUT: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(200);

/// A switch to run: the GPU as the registry has it, and what to reach the
/// service task with (weakly: a switch does not keep the task alive).
#[derive(Debug)]
pub struct Job {
    pub paths: HostPaths,
    pub amdsmi: AmdSmiConfig,
    pub gpu: Gpu,
    pub mode: &'static str,
    pub allocations_exist: bool,
    pub service: mpsc::WeakSender<Request>,
    pub span: Span,
}

impl Job {
    /// Runs the switch and the wait; returns the inventory generation after
    /// it.
    pub async fn run(self) -> Result<u64, SwitchError> {
        let span = self.span.clone();
        self.switch_and_wait().instrument(span).await
    }

    async fn switch_and_wait(self) -> Result<u64, SwitchError> {
        let (bdf, mode) = (self.gpu.bdf, self.mode);
        let xccs = self.gpu.total_xccs();
        let (paths, amdsmi, gpu) = (self.paths, self.amdsmi, self.gpu);
        let allocations_exist = self.allocations_exist;
        let switched = tokio::task::spawn_blocking(move || {
            partition::switch(&paths, &amdsmi, &gpu, mode, allocations_exist)
        })
        .await
        .map_err(SwitchError::Task)?
        .inspect_err(|e| warn!("compute partition switch refused: {e}"))?;
        match switched {
            Switched::Already => info!(gpu = %bdf, mode, "already in this compute partition mode"),
            Switched::Written => {
                info!(gpu = %bdf, mode, "compute partition written to sysfs; waiting for the driver");
            }
            Switched::ByAmdSmi { profile_index } => info!(
                gpu = %bdf, mode, profile_index,
                "accelerator profile selected through AMD SMI; waiting for the driver"
            ),
        }
        let want = partition::expected_partitions(mode, xccs);
        wait_for(&self.service, bdf, mode, want).await
    }
}

/// Rescans until `bdf` is in `mode` with `want` live partitions.
async fn wait_for(
    service: &mpsc::WeakSender<Request>,
    bdf: PciAddress,
    mode: &'static str,
    want: u32,
) -> Result<u64, SwitchError> {
    let start = Instant::now();
    loop {
        let state = rescan(service).await.map_err(SwitchError::Rescan)?;
        let (live, current) = live_partitions(&state.registry, bdf);
        if live == want && current.eq_ignore_ascii_case(mode) {
            info!(gpu = %bdf, mode, partitions = live, "compute partition switched");
            return Ok(state.generation());
        }
        if start.elapsed() > SWITCH_TIMEOUT {
            return Err(SwitchError::Timeout {
                bdf,
                mode,
                waited: SWITCH_TIMEOUT,
                live,
                current,
                want,
            });
        }
        tokio::time::sleep(POLL).await;
    }
}

async fn rescan(service: &mpsc::WeakSender<Request>) -> Result<Arc<Snapshot>, ScanError> {
    let service = service.upgrade().ok_or(ScanError::Stopped)?;
    let (reply, answer) = oneshot::channel();
    let request = Request::Rescan {
        origin: Origin::Internal,
        span: Span::current(),
        reply,
    };
    service
        .send(request)
        .await
        .map_err(|_| ScanError::Stopped)?;
    drop(service);
    answer.await.map_err(|_| ScanError::Stopped)?
}

/// (partitions not missing, current mode) of `bdf`.
fn live_partitions(registry: &Registry, bdf: PciAddress) -> (u32, String) {
    let live = registry
        .partition_indices(bdf)
        .into_iter()
        .filter(|i| {
            registry
                .partition(bdf, *i)
                .is_some_and(|(_, presence)| presence == Presence::Present)
        })
        .count();
    let mode = registry
        .gpu(bdf)
        .and_then(|(g, _)| g.compute_partition.clone())
        .unwrap_or_default();
    (u32::try_from(live).unwrap_or(u32::MAX), mode)
}
