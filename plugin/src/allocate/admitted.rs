//! Which pods kubelet admitted with our devices, from its pod-resources API.
//!
//! A pod's author can write HAMi's annotations (`amd-devices-allocated`,
//! `amd-cu-allocated`) unless admission protects them, so a grant and its
//! CU record count only for a pod that kubelet actually gave devices of our
//! resource (or whose record this plugin wrote itself, see `ours`). A pod
//! that merely claims CUs cannot then block other pods' slices, nor make an
//! honest pod's claim look like the overlapping one. When pod-resources is
//! off or does not answer, nothing can be told apart and every claim counts
//! as before: a forged claim then costs CUs, never a CU granted twice.

use std::{
    collections::HashSet,
    path::Path,
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use tracing::{debug, warn};

use crate::vram::owners::list_pod_resources;

/// Longest wait for kubelet's answer, within Allocate's deadline.
const LIST_TIMEOUT: Duration = Duration::from_secs(2);

/// Whether a failed read was logged as a warning already (then as debug:
/// every Allocate reads).
static WARNED: AtomicBool = AtomicBool::new(false);

fn unknown(socket: &Path, why: &str) -> Admitted {
    let message = format!(
        "pod-resources at {}: {why}; every pod's claim counts",
        socket.display()
    );
    if WARNED.swap(true, Ordering::Relaxed) {
        debug!("{message}");
    } else {
        warn!("{message} (said once; further failures are logged at debug)");
    }
    Admitted::Unknown
}

/// The pods kubelet admitted with devices of our resource, when known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Admitted {
    /// `(namespace, name)` of each pod pod-resources lists with our devices.
    Listed(HashSet<(String, String)>),
    /// pod-resources is off or did not answer: every pod counts.
    Unknown,
}

impl Admitted {
    /// Whether `pod`'s grant may count.
    pub(crate) fn admits(&self, pod: &Pod) -> bool {
        match self {
            Self::Unknown => true,
            Self::Listed(pods) => {
                let key = (pod.namespace().unwrap_or_default(), pod.name_any());
                pods.contains(&key)
            }
        }
    }

    /// Asks kubelet's pod-resources API at `socket` (none: [`Self::Unknown`]).
    pub(crate) async fn read(socket: Option<&Path>, resource: &str) -> Self {
        let Some(socket) = socket else {
            return Self::Unknown;
        };
        match tokio::time::timeout(LIST_TIMEOUT, list_pod_resources(socket)).await {
            Ok(Ok(list)) => {
                let pods: HashSet<(String, String)> = list
                    .pod_resources
                    .into_iter()
                    .filter(|p| {
                        p.containers.iter().any(|c| {
                            c.devices
                                .iter()
                                .any(|d| d.resource_name == resource && !d.device_ids.is_empty())
                        })
                    })
                    .map(|p| (p.namespace, p.name))
                    .collect();
                debug!(pods = pods.len(), "pods kubelet admitted with {resource}");
                Self::Listed(pods)
            }
            Ok(Err(why)) => unknown(socket, &why.to_string()),
            Err(_) => unknown(socket, &format!("no answer within {LIST_TIMEOUT:?}")),
        }
    }
}
