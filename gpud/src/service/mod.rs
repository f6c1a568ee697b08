//! The daemon's core, independent of D-Bus: the configuration, the registry
//! of published devices, and re-reading the inventory.
//!
//! AMD SMI is probed at start, on an explicit rescan, and whenever the KFD
//! topology's `generation_id` moves (a partition switch, a driver reload);
//! periodic rescans otherwise read sysfs only. Every rescan also detects the
//! dmem backend again (kubelet may start after the daemon; a GPU rebind
//! re-registers its region). While the last AMD SMI probe reports a fatal
//! device state, every rescan probes it again, so that a recovered device is
//! seen (see [`crate::health`]).

mod health;
pub mod registry;
mod scan;

use std::{sync::Arc, time::Instant};

pub use health::Shown;
pub use registry::{ObjectKey, Presence, Registry, Update};
pub use scan::{RESCAN_PROBE_EVERY, ScanPlan, Scanned};
use tracing::info;

use crate::{
    amdsmi::{AmdSmiConfig, report::AmdSmiReport},
    dmem::{self, Dmem, DmemConfig},
    health::{HealthConfig, Monitor},
    hostpaths::HostPaths,
    inventory::{AmdSmiSummary, Inventory},
    published_ids::PublishedIds,
    topology::TopologyError,
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

/// The state behind every published object.
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

    /// The dmem backend (internally synchronized; callers need not hold the
    /// service lock to use it).
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

    /// Whether `uid` may call methods.
    pub fn allows(&self, uid: u32) -> bool {
        self.config.allowed_uids.contains(&uid)
    }

    /// Reads the inventory again (blocking I/O: call it off the async
    /// executor, and not under a lock D-Bus answers need: see
    /// [`Service::plan_scan`]) and folds it into the registry. `reprobe`
    /// forces a new AMD SMI probe.
    ///
    /// # Errors
    /// When the KFD topology cannot be read at all; the registry is unchanged.
    pub fn rescan(&mut self, reprobe: bool) -> Result<Update, TopologyError> {
        let scanned = self.plan_scan(reprobe).run()?;
        Ok(self.fold_scan(scanned))
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
