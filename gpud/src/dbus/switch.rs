//! `SetComputePartition`: the D-Bus side of a compute-partition switch. The
//! core ([`crate::partition::switch`]) checks and writes; this waits until
//! the driver shows the GPU's new partitions, rescanning and publishing as
//! it goes, so the caller's answer comes with the new inventory announced.

use std::time::{Duration, Instant};

use ipc::ApiError;
use tracing::{info, warn};
use zbus::Connection;

use super::{node::Shared, publish};
use crate::{
    partition::{self, PartitionError, Switched},
    pci::PciAddress,
    service::Presence,
};

/// How long the driver may take to re-create the partitions.
pub const SWITCH_TIMEOUT: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(200);

fn api_error(err: PartitionError) -> ApiError {
    let text = err.to_string();
    match err {
        PartitionError::BadMode { .. } => ApiError::InvalidArgument(text),
        PartitionError::NotPartitionable { .. } | PartitionError::NotOffered { .. } => {
            ApiError::NotSupported(text)
        }
        PartitionError::Busy { .. } => ApiError::Busy(text),
        PartitionError::Write { .. } => ApiError::Failed(text),
    }
}

/// Switches GPU `gpu` to `mode`; returns the inventory generation after it.
///
/// # Errors
/// Typed as [`ipc::proxy::NodeProxy::set_compute_partition`] documents.
pub async fn set_compute_partition(
    conn: &Connection,
    shared: &Shared,
    gpu: &str,
    mode: &str,
    allocations_exist: bool,
) -> Result<u64, ApiError> {
    let bdf: PciAddress = gpu
        .parse()
        .map_err(|e| ApiError::InvalidArgument(format!("GPU {gpu:?}: {e}")))?;
    let mode = partition::parse_mode(mode).map_err(api_error)?;
    let (found, paths, amdsmi) = {
        let service = shared
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let found = service
            .registry()
            .gpu(bdf)
            .filter(|(_, presence)| *presence == Presence::Present)
            .map(|(g, _)| g.clone());
        let config = service.config();
        (found, config.paths.clone(), config.amdsmi.clone())
    };
    let found = found.ok_or_else(|| ApiError::NotFound(format!("no GPU at {bdf}")))?;
    let xccs = found.total_xccs();
    let switched = tokio::task::spawn_blocking(move || {
        partition::switch(&paths, &amdsmi, &found, mode, allocations_exist)
    })
    .await
    .map_err(|e| ApiError::Failed(format!("the switch task failed: {e}")))?
    .map_err(|e| {
        warn!("compute partition switch refused: {e}");
        api_error(e)
    })?;
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
    wait_for(
        conn,
        shared,
        bdf,
        mode,
        partition::expected_partitions(mode, xccs),
    )
    .await
}

/// Rescans until `bdf` is in `mode` with `want` live partitions.
async fn wait_for(
    conn: &Connection,
    shared: &Shared,
    bdf: PciAddress,
    mode: &str,
    want: u32,
) -> Result<u64, ApiError> {
    let start = Instant::now();
    loop {
        let generation = publish::rescan(conn, shared, false)
            .await
            .map_err(|e| ApiError::Failed(format!("rescanning after the switch: {e:#}")))?;
        let (live, current) = live_partitions(shared, bdf);
        if live == want && current.eq_ignore_ascii_case(mode) {
            info!(gpu = %bdf, mode, partitions = live, "compute partition switched");
            return Ok(generation);
        }
        if start.elapsed() > SWITCH_TIMEOUT {
            return Err(ApiError::Failed(format!(
                "GPU {bdf}: {mode} was written, but after {SWITCH_TIMEOUT:?} the driver shows \
                 {live} partition(s) in mode {current:?} instead of {want}"
            )));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// (partitions not missing, current mode) of `bdf`.
fn live_partitions(shared: &Shared, bdf: PciAddress) -> (u32, String) {
    let service = shared
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let registry = service.registry();
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
