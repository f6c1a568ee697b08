//! Keeping `hami.io/node-amd-register` (and `hami.io/node-amd-gpus`, the
//! CRIU facts each physical GPU's devices share) in step with the inventory.
//!
//! The wanted values are compared with what the watched node carries; the
//! node is patched (one merge patch with both) only when one differs: after
//! an inventory or health change, or when someone else changed an annotation
//! (checked again on a slow interval). A stop leaves the published health
//! as it is: a rollout stops the plugin for seconds, and marking every GPU
//! unhealthy made HAMi drop the node's GPUs for all of it; kubelet learns
//! of a plugin that is gone on its own (its socket) and HAMi from kubelet.
//!
//! * [`entries`]: the register annotation's value, one HAMi DeviceInfo per
//!   device (the codec is [`crate::hami::register`]);
//! * [`custominfo`]: the Go plugin's `custominfo` keys (`partitionProfiles`,
//!   `xgmiPeers`, `computeQueues`);
//! * [`gpus`]: the `hami.io/node-amd-gpus` value, the CRIU facts once per GPU;
//! * [`capacity`]: `--report-node-capacity`, the healthy devices' memory and
//!   CUs as node capacity.

use std::{future::Future, time::Duration};

use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use serde_json::json;
use tokio::sync::watch;
use tracing::{info, warn};

pub(crate) mod capacity;
pub(crate) mod custominfo;
pub(crate) mod entries;
pub(crate) mod gpus;

use gpus::GPUS_KEY;

use crate::{
    hami::REGISTER_KEY,
    inventory::Snapshot,
    kube::{CALL_TIMEOUT, Caches},
};

/// How the registrar runs.
#[derive(Debug, Clone)]
pub(crate) struct RegisterConfig {
    pub(crate) split_count: u32,
    /// How often the node's annotation is compared again without a change.
    pub(crate) recheck: Duration,
    /// Whether the healthy devices' memory and CUs are published as node
    /// capacity ([`capacity`]).
    pub(crate) report_node_capacity: bool,
}

/// Runs until `shutdown`; the published annotation stays as it is.
pub(crate) async fn run_register(
    client: Client,
    caches: Caches,
    mut snapshots: watch::Receiver<Snapshot>,
    config: RegisterConfig,
    shutdown: impl Future<Output = ()>,
) {
    let nodes: Api<Node> = Api::all(client);
    let mut tick = tokio::time::interval(config.recheck);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            changed = snapshots.changed() => if changed.is_err() { break },
            _ = tick.tick() => {}
        }
        let snapshot = snapshots.borrow_and_update().clone();
        sync(&nodes, &caches, &snapshot, &config).await;
    }
    info!("stopping; {REGISTER_KEY} stays as published");
}

/// The node from the API server (`None` on an error or timeout).
async fn read_node(nodes: &Api<Node>, name: &str) -> Option<std::sync::Arc<Node>> {
    match tokio::time::timeout(CALL_TIMEOUT, nodes.get(name)).await {
        Ok(Ok(node)) => Some(std::sync::Arc::new(node)),
        _ => None,
    }
}

/// Patches the node when the wanted value differs from the cached node's.
async fn sync(nodes: &Api<Node>, caches: &Caches, snapshot: &Snapshot, config: &RegisterConfig) {
    if snapshot.devices().is_empty() {
        return;
    }
    let infos = entries::device_infos(snapshot, config.split_count);
    let wanted = match crate::hami::register_annotation(&infos) {
        Ok(value) => value,
        Err(err) => {
            warn!("not publishing {REGISTER_KEY}: {err}");
            return;
        }
    };
    let gpus = gpus::gpus_annotation(snapshot);
    // A failing watch keeps its last node, which may be long out of date
    // (after an API server outage it can take a minute to come back): read
    // the node itself then.
    let node = if caches.node_watch_answering() {
        caches.node()
    } else {
        read_node(nodes, &caches.node_name).await
    };
    let on_node = |key: &str| {
        node.as_ref()
            .and_then(|n| n.metadata.annotations.as_ref())
            .and_then(|a| a.get(key))
            .cloned()
    };
    if config.report_node_capacity {
        let capacity = capacity::wanted(&infos);
        if capacity::needs_write(&capacity, node.as_deref()) {
            capacity::publish(nodes, &caches.node_name, &capacity).await;
        }
    }
    let (current, current_gpus) = (on_node(REGISTER_KEY), on_node(GPUS_KEY));
    if node.is_some()
        && !entries::needs_write(&wanted, current.as_deref())
        && !entries::needs_write(&gpus, current_gpus.as_deref())
    {
        return;
    }
    let patch = json!({ "metadata": { "annotations": { REGISTER_KEY: wanted, GPUS_KEY: gpus } } });
    let (params, patch) = (PatchParams::default(), Patch::Merge(&patch));
    let call = nodes.patch(&caches.node_name, &params, &patch);
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(Ok(_)) => {
            info!(node = %caches.node_name, devices = snapshot.devices().len(), "published {REGISTER_KEY}")
        }
        Ok(Err(err)) => warn!(node = %caches.node_name, "patching {REGISTER_KEY} failed: {err}"),
        Err(_) => {
            warn!(node = %caches.node_name, "patching {REGISTER_KEY} timed out after {CALL_TIMEOUT:?}")
        }
    }
}
