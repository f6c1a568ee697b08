//! `SetComputePartition` on the bus: the arguments are checked here, the
//! switch and the wait for the driver's new partitions are the service
//! task's ([`crate::service::Handle::set_compute_partition`]), and its
//! errors are typed here.

use ipc::ApiError;

use crate::{
    partition::{self, PartitionError},
    pci::PciAddress,
    service::{Handle, SwitchError},
};

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

fn switch_error(err: SwitchError) -> ApiError {
    match err {
        SwitchError::NotFound(_) => ApiError::NotFound(err.to_string()),
        SwitchError::Refused(err) => api_error(err),
        other => ApiError::Failed(other.to_string()),
    }
}

/// Switches GPU `gpu` to `mode`; returns the inventory generation after it.
///
/// # Errors
/// Typed as [`ipc::proxy::NodeProxy::set_compute_partition`] documents.
pub async fn set_compute_partition(
    service: &Handle,
    gpu: &str,
    mode: &str,
    allocations_exist: bool,
) -> Result<u64, ApiError> {
    let bdf: PciAddress = gpu
        .parse()
        .map_err(|e| ApiError::InvalidArgument(format!("GPU {gpu:?}: {e}")))?;
    let mode = partition::parse_mode(mode).map_err(api_error)?;
    service
        .set_compute_partition(bdf, mode, allocations_exist)
        .await
        .map_err(switch_error)
}
