//! amd-gpud's `SetPodVramLimits` as a [`CapSink`].

use std::{collections::BTreeMap, time::Duration};

use tokio::sync::watch;
use tracing::debug;

use super::CapSink;
use crate::{
    gpud::{Bus, SessionError, connect, node_proxy},
    inventory::Snapshot,
};

/// How long amd-gpud has to answer `SetPodVramLimits`.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

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
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), SessionError>> + Send>> {
        let bus = self.bus.clone();
        Box::pin(async move {
            let call = async {
                let conn = connect(&bus).await?;
                let node = node_proxy(&conn).await?;
                let limits: std::collections::HashMap<&str, u64> =
                    limits.iter().map(|(k, v)| (k.as_str(), *v)).collect();
                let cgroup = node.set_pod_vram_limits(&uid, limits).await?;
                debug!(cgroup, "dmem.max written");
                Ok::<(), SessionError>(())
            };
            tokio::time::timeout(CALL_TIMEOUT, call)
                .await
                .map_err(|_| SessionError::Timeout(CALL_TIMEOUT))?
        })
    }
}
