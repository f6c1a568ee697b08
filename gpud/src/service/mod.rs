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
    /// Shared with the last [`Snapshot`] published; changed through
    /// `Arc::make_mut`, which copies it only while a transport still holds
    /// the snapshot.
    registry: Arc<Registry>,
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
            registry: Arc::default(),
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

    /// The registry, shared, for a [`Snapshot`].
    pub fn shared_registry(&self) -> Arc<Registry> {
        Arc::clone(&self.registry)
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
        // A read that changes nothing (most periodic rescans) leaves the
        // shared registry alone rather than copy it.
        let update = if self.registry.unchanged_by(&inventory) {
            Update::default()
        } else {
            Arc::make_mut(&mut self.registry).apply(&inventory)
        };
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{registry::tests as reads, *};
    use crate::amdsmi::LibrarySource;

    fn service(root: &std::path::Path) -> Service {
        Service::new(ServiceConfig {
            paths: HostPaths::under(root),
            amdsmi: AmdSmiConfig {
                library: LibrarySource::Disabled,
                helper: Vec::new(),
                timeout: Duration::from_secs(1),
                child_env: Vec::new(),
            },
            allowed_uids: vec![0],
            dmem: DmemConfig::default(),
            cdi: false,
            health: HealthConfig::default(),
            loader: crate::loader_check::config::LoaderConfig {
                containerd_socket: root.join("containerd.sock"),
                containerd_namespace: "k8s.io".into(),
                memory_hook: root.join("hook.so"),
                budget: Duration::from_secs(600),
                inspector_memory: 1 << 30,
                inspector_uid: 60702,
                helper: Vec::new(),
            },
        })
    }

    /// A daemon at rest holds one registry, shared with the snapshot it
    /// published; a read that changes nothing keeps it shared, and a change
    /// copies it without touching what the transport still shows.
    #[test]
    fn the_published_registry_is_shared_until_a_change() {
        let root = tempfile::tempdir().unwrap();
        let mut service = service(root.path());
        let read = reads::inventory(vec![reads::gpu("0000:05:00.0", vec![reads::part(0, 38)])]);
        assert!(!service.fold(read.clone()).is_empty());
        let shown = service.shared_registry();
        assert!(service.fold(read).is_empty());
        assert!(Arc::ptr_eq(&shown, &service.shared_registry()));

        let grown = reads::gpu("0000:05:00.0", vec![reads::part(0, 38), reads::part(1, 38)]);
        assert!(!service.fold(reads::inventory(vec![grown])).is_empty());
        assert!(!Arc::ptr_eq(&shown, &service.shared_registry()));
        let bdf = "0000:05:00.0".parse().unwrap();
        assert_eq!(
            shown.partition_indices(bdf),
            [0],
            "the shown copy is unchanged"
        );
        assert_eq!(service.registry().partition_indices(bdf), [0, 1]);
    }
}
