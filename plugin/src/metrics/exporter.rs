//! The plugin's [`Exporter`]: per-GPU series refreshed at each scrape from
//! amd-gpud's inventory and the pod cache (so nothing on the Allocate path
//! computes them), readiness from the kubelet registration and amd-gpud
//! (connected, or absent from the node: ready with no device).

use std::sync::Arc;

use tokio::sync::watch;

use super::{
    Exporter, Metrics,
    server::{NotReady, Ready},
    usage,
};
use crate::{gpud::reach::Reach, inventory::Snapshot, kube::Caches};

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
    /// How the last attempt to reach amd-gpud went (readiness without it).
    pub(crate) reach: watch::Receiver<Reach>,
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

    fn ready(&self) -> Result<Ready, NotReady> {
        if !self.metrics.kubelet_registered() {
            return Err(NotReady::NotRegistered);
        }
        if self.snapshots.borrow().connected {
            return Ok(Ready::Serving);
        }
        readiness_without_gpud(&self.reach.borrow())
    }
}

/// Readiness of a registered plugin that amd-gpud is not connected to: ready
/// with no device when amd-gpud is absent from the node (a CPU node, where
/// the Go plugin is ready too, so `helm upgrade --install --wait` and
/// `kubectl rollout status` finish), unready when it is there and failing or
/// not tried yet.
fn readiness_without_gpud(reach: &Reach) -> Result<Ready, NotReady> {
    match reach {
        Reach::Unreachable(cause) if cause.absent() => Ok(Ready::WithoutGpud(match cause {
            crate::gpud::reach::Unreachable::UnknownUid { uid, .. } => format!(
                "the bus knows no user with UID {uid}, the amdgpu-plugin user its package creates"
            ),
            _ => format!("nobody owns {} on the system bus", ipc::BUS_NAME),
        })),
        Reach::Unreachable(_) | Reach::Connected | Reach::Unknown => Err(NotReady::GpudAway),
    }
}

#[cfg(test)]
mod readiness_tests {
    use std::time::Duration;

    use super::*;
    use crate::gpud::reach::Unreachable;

    fn unreachable(cause: Unreachable) -> Reach {
        Reach::Unreachable(cause)
    }

    #[test]
    fn absent_amd_gpud_is_ready_with_no_device_and_says_why() {
        let ready = readiness_without_gpud(&unreachable(Unreachable::NotOnBus)).unwrap();
        let text = ready.to_string();
        assert!(text.starts_with("ok, no device"), "{text}");
        assert!(text.contains(ipc::BUS_NAME), "{text}");
        let package_user = unreachable(Unreachable::UnknownUid {
            uid: ipc::PLUGIN_UID,
            error: "closed".to_owned(),
        });
        let text = readiness_without_gpud(&package_user).unwrap().to_string();
        assert!(text.contains("UID 60700"), "{text}");
    }

    #[test]
    fn amd_gpud_there_but_failing_keeps_the_plugin_unready() {
        let failing = [
            Reach::Unknown,
            unreachable(Unreachable::NoBus {
                error: "no socket".to_owned(),
            }),
            unreachable(Unreachable::Denied {
                uid: ipc::PLUGIN_UID,
                error: "AccessDenied".to_owned(),
            }),
            unreachable(Unreachable::UnknownUid {
                uid: 60799,
                error: "closed".to_owned(),
            }),
            unreachable(Unreachable::Hung {
                waited: Duration::from_secs(5),
            }),
            unreachable(Unreachable::Failed {
                error: "boom".to_owned(),
            }),
        ];
        for reach in failing {
            assert_eq!(
                readiness_without_gpud(&reach),
                Err(NotReady::GpudAway),
                "{reach:?}"
            );
        }
    }
}
