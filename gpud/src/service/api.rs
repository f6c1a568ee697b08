//! The seam between the service task and a transport: the requests it
//! takes ([`Handle`]), the changes it publishes ([`Published`]) and the
//! state they carry ([`Snapshot`]). Nothing here knows of D-Bus.

use std::{sync::Arc, time::Duration};

use tokio::sync::{mpsc, oneshot};
use tracing::Span;

use super::{Meta, ObjectKey, Registry, Shown, Update};
use crate::{
    deadline::Overdue, partition::PartitionError, pci::PciAddress, topology::TopologyError,
};

/// The inventory as last published: what a transport shows between two
/// [`Published`] changes. Cheap to share; never locked.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// Shared with the service task until its next change (copy on write),
    /// so that a daemon at rest holds one copy of the registry.
    pub registry: Arc<Registry>,
    pub meta: Meta,
}

impl Snapshot {
    /// Counts changes of the inventory since the daemon started.
    pub fn generation(&self) -> u64 {
        self.registry.generation()
    }
}

/// One change, for the transport to apply in order. The service waits for
/// `applied` before it answers the request that caused the change, so that
/// the answer comes with the change announced.
#[derive(Debug)]
pub struct Published {
    pub update: Update,
    /// What each object of `update` shows now, GPUs before their
    /// partitions (a partition's object names its GPU's).
    pub shown: Vec<(ObjectKey, Shown)>,
    /// The inventory after the change.
    pub state: Arc<Snapshot>,
    /// Whether the inventory-wide facts ([`Meta`]) changed.
    pub meta_changed: bool,
    /// The transport's word that the change is out, or why it is not.
    pub applied: oneshot::Sender<Result<(), String>>,
}

/// Why a rescan failed.
#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    #[error("reading the inventory: {0}")]
    Inventory(#[from] TopologyError),
    #[error("{0}")]
    Overdue(#[from] Overdue),
    #[error("publishing the change: {0}")]
    Publish(String),
    #[error("the amd-gpud service task has stopped")]
    Stopped,
}

/// Why a compute-partition switch failed.
#[derive(Debug, thiserror::Error)]
pub enum SwitchError {
    #[error("no GPU at {0}")]
    NotFound(PciAddress),
    #[error(transparent)]
    Refused(#[from] PartitionError),
    #[error("the switch task failed: {0}")]
    Task(#[source] tokio::task::JoinError),
    #[error("rescanning after the switch: {0}")]
    Rescan(#[source] ScanError),
    #[error(
        "GPU {bdf}: {mode} was written, but after {waited:?} the driver shows \
         {live} partition(s) in mode {current:?} instead of {want}"
    )]
    Timeout {
        bdf: PciAddress,
        mode: &'static str,
        waited: Duration,
        live: u32,
        current: String,
        want: u32,
    },
    #[error("the amd-gpud service task has stopped")]
    Stopped,
}

/// Who asked for a rescan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The daemon's first read (AMD SMI is probed).
    First,
    /// A `Rescan` call: AMD SMI is probed at most once per
    /// [`super::scan::RESCAN_PROBE_EVERY`].
    Caller,
    /// The service itself (a partition switch waiting for the driver).
    Internal,
}

/// A request to the service task. Each carries its caller's span, so that
/// the service logs in it.
#[derive(Debug)]
pub enum Request {
    Rescan {
        origin: Origin,
        span: Span,
        reply: oneshot::Sender<Result<Arc<Snapshot>, ScanError>>,
    },
    SetComputePartition {
        gpu: PciAddress,
        mode: &'static str,
        allocations_exist: bool,
        span: Span,
        reply: oneshot::Sender<Result<u64, SwitchError>>,
    },
}

/// How a transport reaches the service task. Cloning is cheap; the task
/// stops once every handle is gone.
#[derive(Debug, Clone)]
pub struct Handle {
    pub(super) requests: mpsc::Sender<Request>,
}

impl Handle {
    /// Reads the inventory again and publishes the change; returns the
    /// inventory after it (once the change is applied).
    ///
    /// # Errors
    /// See [`ScanError`].
    pub async fn rescan(&self, origin: Origin) -> Result<Arc<Snapshot>, ScanError> {
        let (reply, answer) = oneshot::channel();
        let span = Span::current();
        let request = Request::Rescan {
            origin,
            span,
            reply,
        };
        self.requests
            .send(request)
            .await
            .map_err(|_| ScanError::Stopped)?;
        answer.await.map_err(|_| ScanError::Stopped)?
    }

    /// Switches the compute partition of `gpu` to `mode` (a name of
    /// [`crate::partition::MODES`]) and waits until the driver shows the new
    /// partitions; returns the inventory generation after it.
    ///
    /// # Errors
    /// See [`SwitchError`].
    pub async fn set_compute_partition(
        &self,
        gpu: PciAddress,
        mode: &'static str,
        allocations_exist: bool,
    ) -> Result<u64, SwitchError> {
        let (reply, answer) = oneshot::channel();
        let request = Request::SetComputePartition {
            gpu,
            mode,
            allocations_exist,
            span: Span::current(),
            reply,
        };
        self.requests
            .send(request)
            .await
            .map_err(|_| SwitchError::Stopped)?;
        answer.await.map_err(|_| SwitchError::Stopped)?
    }
}
