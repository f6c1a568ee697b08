//! The node object: inventory-wide properties, `Rescan`, `InventoryChanged`.

use std::sync::{Arc, Mutex};

use ipc::ApiError;
use tracing::{Instrument, info_span};
use zbus::{
    Connection, interface,
    message::Header,
    object_server::SignalEmitter,
    zvariant::{ObjectPath, OwnedObjectPath},
};

use super::{auth, publish};
use crate::service::Service;

/// The service, shared between the node object and the rescan loop.
pub type Shared = Arc<Mutex<Service>>;

/// `io.hami.AmdGpu1.Node` on `/io/hami/AmdGpu1`.
pub struct NodeObject {
    pub service: Shared,
}

impl NodeObject {
    fn with<T>(&self, f: impl FnOnce(&Service) -> T) -> T {
        let service = self
            .service
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&service)
    }
}

#[interface(name = "io.hami.AmdGpu1.Node")]
impl NodeObject {
    /// Reads the inventory again now (AMD SMI included) and publishes what
    /// changed; returns the inventory generation after it.
    async fn rescan(
        &self,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<u64, ApiError> {
        let uid = auth::caller_uid(conn, &header).await;
        let span = info_span!(
            "dbus",
            method = "Rescan",
            object = %header.path().map(ToString::to_string).unwrap_or_default(),
            caller_uid = uid.as_ref().map_or(-1, |u| i64::from(*u)),
        );
        async {
            let uid = uid?;
            tracing::info!("rescan requested");
            let allowed = self.with(|s| s.config().allowed_uids.clone());
            auth::check(uid, &allowed, "Rescan").inspect_err(|e| tracing::warn!("{e}"))?;
            publish::rescan(conn, &self.service, true)
                .await
                .map_err(|e| ApiError::Failed(format!("{e:#}")))
        }
        .instrument(span)
        .await
    }

    /// Emitted after every change of the inventory.
    #[zbus(signal)]
    pub async fn inventory_changed(
        emitter: &SignalEmitter<'_>,
        generation: u64,
        added: Vec<ObjectPath<'_>>,
        missing: Vec<ObjectPath<'_>>,
        changed: Vec<ObjectPath<'_>>,
    ) -> zbus::Result<()>;

    /// Counts changes of the inventory since the daemon started.
    #[zbus(property)]
    fn generation(&self) -> u64 {
        self.with(|s| s.registry().generation())
    }

    /// KFD `generation_id` at the last read; 0 when the kernel has none.
    #[zbus(property)]
    fn kfd_generation(&self) -> u64 {
        self.with(|s| s.meta().kfd_generation.unwrap_or(0))
    }

    /// Every GPU object, ordered by PCI address (missing ones included).
    #[zbus(property)]
    fn gpus(&self) -> Vec<OwnedObjectPath> {
        self.with(|s| {
            s.registry()
                .gpus()
                .map(|(g, _)| ipc::gpu_path(&g.bdf.to_string()))
                .collect()
        })
    }

    /// `<state>: <detail>` of AMD SMI: loaded, unavailable or disabled.
    #[zbus(property)]
    fn amd_smi(&self) -> String {
        self.with(|s| format!("{}: {}", s.meta().amdsmi.state, s.meta().amdsmi.detail))
    }

    /// Problems found at the last read, each naming its file or device.
    #[zbus(property)]
    fn warnings(&self) -> Vec<String> {
        self.with(|s| s.meta().warnings.clone())
    }
}
