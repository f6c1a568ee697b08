//! Node Events for GPU health transitions, as amd-gpud reports them:
//! `AMDGPUUnhealthy` (Warning), `AMDGPUMissing` (Warning) and
//! `AMDGPURecovered` (Normal), each naming the GPU's id and PCI address.
//!
//! One Event per transition seen in the followed snapshots. After a plugin
//! start the first inventory is compared with nothing: a GPU that is already
//! unhealthy or missing is reported then (a previous plugin instance may have
//! reported it too), a healthy one is not. Events are sent in the background
//! (see [`Events`]), never on the Allocate path.

use std::{
    collections::{BTreeMap, BTreeSet},
    future::Future,
};

use ipc::Health;
use tokio::sync::watch;
use tracing::info;

use super::{Device, Snapshot};
use crate::kube::{Caches, Events, Regarding};

/// The Event reasons.
pub(crate) const UNHEALTHY: &str = "AMDGPUUnhealthy";
pub(crate) const RECOVERED: &str = "AMDGPURecovered";
pub(crate) const MISSING: &str = "AMDGPUMissing";

/// One transition of one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Transition {
    /// [`UNHEALTHY`], [`RECOVERED`] or [`MISSING`].
    pub(crate) reason: &'static str,
    pub(crate) gpu: String,
    pub(crate) bdf: String,
    /// The Event's note.
    pub(crate) note: String,
}

impl Transition {
    /// Whether the Event is a Warning (else Normal).
    pub(crate) fn warning(&self) -> bool {
        self.reason != RECOVERED
    }
}

/// GPU id and health by PCI address, as last reported.
pub(crate) type Known = BTreeMap<String, (String, Health)>;

/// The transitions from `known` to `gpus`, and `known` updated. A GPU that
/// is no longer listed at all is reported missing, once (the followed
/// snapshot keeps the GPUs a restarted amd-gpud forgot, see
/// `gpud::client::keep_vanished`; this covers one replaced at its PCI address).
pub(crate) fn transitions(known: &mut Known, gpus: &[Device]) -> Vec<Transition> {
    let mut out = vanished(known, gpus);
    for gpu in gpus {
        let (id, bdf) = (gpu.id.clone(), gpu.bdf.clone());
        let before = known
            .insert(bdf.clone(), (id.clone(), gpu.health.clone()))
            .map(|(_, health)| health);
        if before.as_ref() == Some(&gpu.health) {
            continue;
        }
        let why = |what: &str| match gpu.health_reason.as_str() {
            "" => format!("GPU {id} (PCI {bdf}) is {what}"),
            reason => format!("GPU {id} (PCI {bdf}) is {what}: {reason}"),
        };
        let (reason, note) = match gpu.health {
            Health::Healthy if before.is_none() => continue,
            Health::Healthy => (RECOVERED, format!("GPU {id} (PCI {bdf}) is healthy again")),
            Health::Missing => (MISSING, why("missing")),
            Health::Unhealthy | Health::Other(_) => (UNHEALTHY, why("unhealthy")),
        };
        out.push(Transition {
            reason,
            gpu: id,
            bdf,
            note,
        });
    }
    out
}

fn vanished(known: &mut Known, gpus: &[Device]) -> Vec<Transition> {
    let listed: BTreeSet<&str> = gpus.iter().map(|g| g.bdf.as_str()).collect();
    let gone: Vec<String> = known
        .keys()
        .filter(|bdf| !listed.contains(bdf.as_str()))
        .cloned()
        .collect();
    gone.into_iter()
        .filter_map(|bdf| {
            let (id, health) = known.get_mut(&bdf)?;
            let was = std::mem::replace(health, Health::Missing);
            let id = id.clone();
            (was != Health::Missing).then(|| Transition {
                reason: MISSING,
                note: format!("GPU {id} (PCI {bdf}) is missing: amd-gpud no longer lists it"),
                gpu: id,
                bdf,
            })
        })
        .collect()
}

/// Follows `snapshots` and publishes one Node Event per transition, until
/// `shutdown`.
pub(crate) async fn follow(
    mut snapshots: watch::Receiver<Snapshot>,
    events: Events,
    caches: Caches,
    shutdown: impl Future<Output = ()>,
) {
    let mut known = Known::new();
    tokio::pin!(shutdown);
    loop {
        let gpus = snapshots.borrow_and_update().devices().to_vec();
        let found = transitions(&mut known, &gpus);
        if !found.is_empty() {
            let regarding = Regarding::node_of(&caches);
            for t in found {
                info!(gpu = %t.gpu, bdf = %t.bdf, reason = t.reason, "{}", t.note);
                if t.warning() {
                    events.warning(&regarding, t.reason, "HealthCheck", t.note);
                } else {
                    events.normal(&regarding, t.reason, "HealthCheck", t.note);
                }
            }
        }
        tokio::select! {
            () = &mut shutdown => return,
            changed = snapshots.changed() => if changed.is_err() { return },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(bdf: &str, health: &str, reason: &str) -> Device {
        let mut gpu = crate::testutil::mi300x(bdf, &format!("GPU-00000000000000{}", &bdf[5..7]));
        (gpu.market_name, gpu.vram_bytes, gpu.numa_node) = (String::new(), 1 << 30, -1);
        (gpu.health, gpu.health_reason) = (health.into(), reason.into());
        Device::whole(&gpu)
    }

    fn reasons(t: &[Transition]) -> Vec<(&str, &str)> {
        t.iter().map(|t| (t.reason, t.bdf.as_str())).collect()
    }

    #[test]
    fn one_event_per_transition() {
        let (a, b) = ("0000:05:00.0", "0000:15:00.0");
        let mut known = Known::new();
        let start = [gpu(a, ipc::HEALTHY, ""), gpu(b, ipc::MISSING, "gone")];
        assert_eq!(reasons(&transitions(&mut known, &start)), [(MISSING, b)]);
        assert!(
            transitions(&mut known, &start).is_empty(),
            "no change, no Event"
        );
        let broken = [
            gpu(a, ipc::UNHEALTHY, "cannot open /dev/dri/renderD128"),
            gpu(b, ipc::MISSING, "gone"),
        ];
        let found = transitions(&mut known, &broken);
        assert_eq!(reasons(&found), [(UNHEALTHY, a)]);
        assert!(found[0].warning());
        assert_eq!(
            found[0].note,
            "GPU GPU-0000000000000005 (PCI 0000:05:00.0) is unhealthy: \
             cannot open /dev/dri/renderD128"
        );
        let back = [gpu(a, ipc::HEALTHY, ""), gpu(b, ipc::HEALTHY, "")];
        let found = transitions(&mut known, &back);
        assert_eq!(reasons(&found), [(RECOVERED, a), (RECOVERED, b)]);
        assert!(!found[0].warning());
        assert!(found[1].note.contains("GPU-0000000000000015") && found[1].note.contains(b));
        // A restarted amd-gpud no longer lists `b`: missing once.
        let found = transitions(&mut known, &back[..1]);
        assert_eq!(reasons(&found), [(MISSING, b)]);
        assert!(
            found[0].note.contains("GPU-0000000000000015"),
            "{}",
            found[0].note
        );
        assert!(transitions(&mut known, &back[..1]).is_empty());
        assert_eq!(reasons(&transitions(&mut known, &back)), [(RECOVERED, b)]);
    }
}
