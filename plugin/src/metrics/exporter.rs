//! The plugin's [`Exporter`]: per-GPU series refreshed at each scrape from
//! amd-gpud's inventory and the pod cache (so nothing on the Allocate path
//! computes them), readiness from the kubelet registration and amd-gpud.

use std::sync::Arc;

use tokio::sync::watch;

use super::{Exporter, Metrics, server::NotReady, usage};
use crate::{inventory::Snapshot, kube::Caches};

/// What `/metrics` and `/readyz` read.
#[derive(Clone)]
pub(crate) struct NodeExporter {
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) snapshots: watch::Receiver<Snapshot>,
    /// The watch caches; `None` with `--kube none`.
    pub(crate) caches: Option<Caches>,
    /// `--split-count`.
    pub(crate) split_count: u32,
    /// amd-gpud's last `GetUsage` answer; `None` without metrics.
    pub(crate) usage: Option<crate::gpud::usage::UsageFeed>,
    /// The node's name (HAMi's `node` label).
    pub(crate) node_name: String,
}

impl Exporter for NodeExporter {
    fn metrics(&self) -> Result<String, std::fmt::Error> {
        let snapshot = self.snapshots.borrow().clone();
        let pods = self
            .caches
            .as_ref()
            .map(|c| c.pods.state())
            .unwrap_or_default();
        let usage = match &self.caches {
            Some(caches) => {
                self.metrics.set_apiserver_connected(caches.connected());
                usage(&pods)
            }
            None => super::Usage::new(),
        };
        self.metrics
            .observe_gpus(&snapshot, self.split_count, &usage);
        let measured = self.usage.as_ref().and_then(|u| u.borrow().clone());
        self.metrics.observe_usage(&super::hami::Inputs {
            node: &self.node_name,
            snapshot: &snapshot,
            pods: &pods,
            usage: measured.as_deref(),
        });
        self.metrics.encode()
    }

    fn ready(&self) -> Result<(), NotReady> {
        if !self.metrics.kubelet_registered() {
            return Err(NotReady::NotRegistered);
        }
        if !self.snapshots.borrow().connected {
            return Err(NotReady::GpudAway);
        }
        Ok(())
    }
}
