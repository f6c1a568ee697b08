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

/// A pod as pod-resources names it: `(namespace, name)`.
type PodKey = (String, String);

/// The pods kubelet admitted with devices of our resource, when known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Admitted {
    Listed {
        /// Each pod pod-resources lists with our devices.
        with_devices: HashSet<PodKey>,
        /// Each pod it lists at all: those kubelet has taken in, the one it
        /// is admitting now among them (kubelet adds a pod to its pod
        /// manager before admitting it, one pod at a time).
        known: HashSet<PodKey>,
    },
    /// pod-resources is off or did not answer: every pod counts.
    Unknown,
}

impl Admitted {
    /// Whether `pod`'s grant may count.
    pub(crate) fn admits(&self, pod: &Pod) -> bool {
        match self {
            Self::Unknown => true,
            Self::Listed { with_devices, .. } => with_devices.contains(&key_of(pod)),
        }
    }

    /// The pods kubelet has taken in, when known.
    pub(crate) fn known(&self) -> Option<&HashSet<PodKey>> {
        match self {
            Self::Unknown => None,
            Self::Listed { known, .. } => Some(known),
        }
    }

    /// Asks kubelet's pod-resources API at `socket` (none: [`Self::Unknown`]).
    pub(crate) async fn read(socket: Option<&Path>, resource: &str) -> Self {
        let Some(socket) = socket else {
            return Self::Unknown;
        };
        match tokio::time::timeout(LIST_TIMEOUT, list_pod_resources(socket)).await {
            Ok(Ok(list)) => {
                let (mut with_devices, mut known) = (HashSet::new(), HashSet::new());
                for pod in list.pod_resources {
                    let ours = pod.containers.iter().any(|c| {
                        c.devices
                            .iter()
                            .any(|d| d.resource_name == resource && !d.device_ids.is_empty())
                    });
                    let key = (pod.namespace, pod.name);
                    if ours {
                        with_devices.insert(key.clone());
                    }
                    known.insert(key);
                }
                debug!(
                    pods = with_devices.len(),
                    known = known.len(),
                    "pods kubelet admitted with {resource}"
                );
                Self::Listed {
                    with_devices,
                    known,
                }
            }
            Ok(Err(why)) => unknown(socket, &why.to_string()),
            Err(_) => unknown(socket, &format!("no answer within {LIST_TIMEOUT:?}")),
        }
    }
}

/// `pod` as pod-resources names it.
fn key_of(pod: &Pod) -> PodKey {
    (pod.namespace().unwrap_or_default(), pod.name_any())
}
