//! amd-gpud's `SetPodVramLimits` as a [`CapSink`].

use std::{collections::BTreeMap, time::Duration};

use ipc::proxy::NodeProxy;
use tokio::sync::watch;
use tracing::debug;
use zbus::proxy::CacheProperties;

use super::CapSink;
use crate::{
    gpud::{Bus, connect},
    inventory::Snapshot,
};

/// amd-gpud's `SetPodVramLimits`, over a fresh connection per call (a
/// container start is rare, and amd-gpud may have restarted in between).
#[derive(Debug, Clone)]
pub(crate) struct GpudCaps {
    pub(crate) bus: Bus,
    pub(crate) snapshots: watch::Receiver<Snapshot>,
}

impl CapSink for GpudCaps {
    fn backend_on(&self) -> bool {
        self.snapshots.borrow().dmem_on()
    }

    fn set(
        &self,
        uid: String,
        limits: BTreeMap<String, u64>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send>> {
        let bus = self.bus.clone();
        Box::pin(async move {
            let call = async {
                let conn = connect(&bus).await.map_err(|e| e.to_string())?;
                let node = NodeProxy::builder(&conn)
                    .cache_properties(CacheProperties::No)
                    .build()
                    .await
                    .map_err(|e| e.to_string())?;
                let limits: std::collections::HashMap<&str, u64> =
                    limits.iter().map(|(k, v)| (k.as_str(), *v)).collect();
                let cgroup = node
                    .set_pod_vram_limits(&uid, limits)
                    .await
                    .map_err(|e| e.to_string())?;
                debug!(cgroup, "dmem.max written");
                Ok(())
            };
            tokio::time::timeout(Duration::from_secs(10), call)
                .await
                .map_err(|_| "amd-gpud did not answer SetPodVramLimits within 10 s".to_owned())?
        })
    }
}
