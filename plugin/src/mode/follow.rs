//! `hami.io/amd-operating-mode` followed while the plugin runs.
//!
//! The node annotation wins over `--operating-mode`. When it changes, the
//! plugin changes mode (whole GPUs shared by CU masks, or each compute
//! partition a whole device) only once no container on the node holds an
//! AMD device: the device IDs change with the mode, and a running
//! container's devices must keep their meaning. Until then it says, once,
//! why it waits (log and a Warning Event on the Node); the change itself
//! is a Normal Event. Kubelet and HAMi see the new devices at once: the
//! device list and the register annotation follow the mode.

use std::{future::Future, time::Duration};

use kube::ResourceExt;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::{
    inventory::partition::{self, MODE_ANNOTATION, OperatingMode},
    mode::switch::{self, Sources},
};

/// The Event reasons.
pub(crate) const CHANGED: &str = "OperatingModeChanged";
pub(crate) const DEFERRED: &str = "OperatingModeDeferred";

/// How often the annotation and the allocations are looked at.
const CHECK: Duration = Duration::from_secs(2);

/// Follows the node annotation until `shutdown`, sending each mode change
/// on `mode` once no allocation is live. Needs the watch caches.
pub(crate) async fn follow(
    sources: Sources,
    flag: OperatingMode,
    mode: watch::Sender<OperatingMode>,
    shutdown: impl Future<Output = ()>,
) {
    let Some(caches) = sources.caches.clone() else {
        return;
    };
    tokio::pin!(shutdown);
    let mut seen: Option<Option<String>> = None;
    let mut wanted = *mode.borrow();
    let mut said: Option<String> = None;
    loop {
        let annotation = caches
            .node()
            .and_then(|n| n.annotations().get(MODE_ANNOTATION).cloned());
        if seen.as_ref() != Some(&annotation) {
            // Resolved (and a bad value logged) only when it changes.
            wanted = partition::resolve(annotation.as_deref(), flag);
            seen = Some(annotation);
        }
        let current = *mode.borrow();
        if wanted == current {
            said = None;
        } else {
            match blocker(&sources).await {
                None => {
                    mode.send_replace(wanted);
                    let note = format!(
                        "operating mode {current:?} -> {wanted:?}: the devices are published anew"
                    );
                    info!("{note}");
                    event(&sources, false, CHANGED, note);
                    said = None;
                }
                Some(why) if said.as_ref() != Some(&why) => {
                    let note = format!(
                        "{MODE_ANNOTATION} asks for {wanted:?}; the plugin stays in {current:?} \
                         until no container on the node holds an AMD device: {why}"
                    );
                    warn!("{note}");
                    event(&sources, true, DEFERRED, note);
                    said = Some(why);
                }
                Some(_) => {}
            }
        }
        tokio::select! {
            () = &mut shutdown => return,
            () = tokio::time::sleep(CHECK) => {}
        }
    }
}

/// Why the mode cannot change now, if anything stops it.
async fn blocker(sources: &Sources) -> Option<String> {
    match switch::allocations(sources).await {
        Err(why) => Some(format!("the allocations cannot be told yet ({why})")),
        Ok(held) => held.holders().map(|who| format!("held by {who}")),
    }
}

fn event(sources: &Sources, warning: bool, reason: &str, note: String) {
    switch::node_event(sources, warning, (reason, "OperatingMode"), note);
}
