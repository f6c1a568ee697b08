//! The daemon's core, independent of D-Bus: the configuration, the registry
//! of published devices, re-reading the inventory, and the task that owns
//! them all ([`spawn`]): it runs the periodic rescan, the health pulse and
//! partition switches, writes the CDI spec, takes requests through a
//! [`Handle`] and sends each change as a [`Published`] for a transport to
//! apply. No lock is shared with the transport.
//!
//! AMD SMI is probed at start, on an explicit rescan, and whenever the KFD
//! topology's `generation_id` moves (a partition switch, a driver reload);
//! periodic rescans otherwise read sysfs only. Every rescan also detects the
//! dmem backend again (kubelet may start after the daemon; a GPU rebind
//! re-registers its region). While the last AMD SMI probe reports a fatal
//! device state, every rescan probes it again, so that a recovered device is
//! seen (see [`crate::health`]).

mod api;
mod daemon;
mod health;
mod pulse;
pub mod registry;
mod scan;
mod scans;
mod switch;

use std::{sync::Arc, time::Instant};

pub use api::{Handle, Origin, Published, ScanError, Snapshot, SwitchError};
pub use daemon::spawn;
pub use health::Shown;
pub use registry::{ObjectKey, Presence, Registry, Update};
pub use scan::{ScanPlan, Scanned};
use tracing::info;

use crate::{
    amdsmi::{AmdSmiConfig, report::AmdSmiReport},
    dmem::{self, Dmem, DmemConfig},
    health::{HealthConfig, Monitor},
    hostpaths::HostPaths,
    inventory::{AmdSmiSummary, Inventory},
    published_ids::PublishedIds,
};

/// What the service needs to run.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    pub paths: HostPaths,
    pub amdsmi: AmdSmiConfig,
    /// UIDs allowed to call methods (root and the plugin's).
    pub allowed_uids: Vec<u32>,
    /// The dmem VRAM cap backend.
    pub dmem: DmemConfig,
    /// Write the CDI spec of the GPUs into `paths.cdi`.
    pub cdi: bool,
    /// Health checks.
    pub health: HealthConfig,
    /// The loader check (`InspectImage`, `StageMemoryHook`).
    pub loader: crate::loader_check::config::LoaderConfig,
}

/// Inventory-wide facts of the last read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Meta {
    pub kfd_generation: Option<u64>,
    pub amdsmi: AmdSmiSummary,
    pub warnings: Vec<String>,
    /// The dmem backend at the last detection.
    pub dmem: dmem::Status,
}

/// The state behind every published object, owned by the service task
/// ([`spawn`]).
#[derive(Debug)]
pub struct Service {
    config: ServiceConfig,
    registry: Registry,
    meta: Meta,
    amdsmi: Option<AmdSmiReport>,
    dmem: Arc<Dmem>,
    /// The IDs GPUs are published under (internally synchronized).
    ids: Arc<PublishedIds>,
    health: Monitor<ObjectKey>,
    /// When a `Rescan` call last probed AMD SMI.
    requested_probe: Option<Instant>,
}

impl Service {
    /// A service with nothing read yet but the dmem backend detected
    /// (blocking I/O).
    pub fn new(config: ServiceConfig) -> Self {
        let dmem = Arc::new(Dmem::new(config.paths.clone(), config.dmem.clone()));
        let meta = Meta {
            dmem: dmem.status(),
            ..Meta::default()
        };
        let ids = Arc::new(PublishedIds::load(&config.paths.state));
        Self {
            ids,
            health: Monitor::new(config.health.params),
            config,
            registry: Registry::default(),
            meta,
            amdsmi: None,
            dmem,
            requested_probe: None,
        }
    }

    /// The dmem backend (internally synchronized: a transport keeps a clone
    /// to set VRAM caps and read the backend's state).
    pub fn dmem(&self) -> &Arc<Dmem> {
        &self.dmem
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    pub fn meta(&self) -> &Meta {
        &self.meta
    }

    pub fn config(&self) -> &ServiceConfig {
        &self.config
    }

    fn fold(&mut self, inventory: Inventory) -> Update {
        for warning in inventory
            .warnings
            .iter()
            .filter(|w| !self.meta.warnings.contains(w))
        {
            tracing::warn!("{warning}");
        }
        self.meta.kfd_generation = inventory.generation_id;
        self.meta.warnings = inventory.warnings.clone();
        let update = self.registry.apply(&inventory);
        if !update.is_empty() {
            info!(
                added = update.added.len(),
                missing = update.missing.len(),
                changed = update.changed.len(),
                generation = self.registry.generation(),
                "inventory changed"
            );
        }
        update
    }
}
