//! A pod placed by a real HAMi scheduler (`node-sim --cluster real
//! --hami-scheduler PATH`, [`crate::cluster::hami`]): node-sim creates the
//! pod with `schedulerName: hami-scheduler` (what HAMi's webhook sets) and a
//! node selector for the node of its mode, then waits for kube-scheduler and
//! HAMi's extender to bind it, or to give up on it (`PodScheduled` False).
//! What HAMi granted is read back from the pod's annotations.

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use serde_json::json;

use super::{RealSession, admit::create_with_cgroup, node::RealNode};
use crate::{
    hami_emulator::{
        Placement, SCHEDULER_NAME,
        filter::{ALLOCATED_KEY, decode_devices},
        request,
    },
    node_sim::pods::ExamplePod,
};

/// How long HAMi gets to bind or refuse a pod.
const SCHEDULE_TIMEOUT: Duration = Duration::from_secs(60);

/// Why HAMi did not bind the pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotBound(pub String);

/// Creates `pod` for HAMi's scheduler, pinned to `node`, makes its pod
/// cgroup, and waits for the Binding: what HAMi granted and the cgroup.
///
/// # Errors
/// HAMi's reason when it left the pod unscheduled, or why the pod could not
/// be created or read.
pub async fn schedule(
    session: &RealSession,
    node: &RealNode,
    pod: &ExamplePod,
) -> Result<(Placement, Option<PathBuf>), NotBound> {
    wait_registered(session, &node.name).await?;
    let mut manifest = pod.manifest.clone();
    manifest["metadata"]["namespace"] = json!(pod.namespace);
    manifest["spec"]["schedulerName"] = json!(SCHEDULER_NAME);
    manifest["spec"]["nodeSelector"]["kubernetes.io/hostname"] = json!(node.name);
    let cgroup = create_with_cgroup(session, node, pod, manifest)
        .await
        .map_err(NotBound)?;
    let pods: Api<Pod> = Api::namespaced(session.client.clone(), &pod.namespace);
    let bound = wait_bound(&pods, &pod.name).await?;
    Ok((placement_of(&bound)?, cgroup))
}

/// Waits until HAMi's scheduler has registered `node` (it reads the
/// plugin's register annotation when the Node changes and every 15 s): a
/// pod it filters before that is refused (`node unregistered`) and, as
/// nothing about the cluster changes after, kube-scheduler tries it again
/// only minutes later.
async fn wait_registered(session: &RealSession, node: &str) -> Result<(), NotBound> {
    let Some(hami) = session.hami.clone() else {
        return Ok(());
    };
    let start = Instant::now();
    loop {
        let (hami, name) = (hami.clone(), node.to_owned());
        let known = tokio::task::spawn_blocking(move || hami.knows_node(&name))
            .await
            .unwrap_or(false);
        if known {
            return Ok(());
        }
        if start.elapsed() > SCHEDULE_TIMEOUT {
            return Err(NotBound(format!(
                "HAMi's scheduler did not register node {node} within {} s",
                SCHEDULE_TIMEOUT.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Polls the pod until it is bound, or HAMi's scheduler marked it
/// unschedulable (`PodScheduled` False with a reason).
async fn wait_bound(pods: &Api<Pod>, name: &str) -> Result<Pod, NotBound> {
    let start = Instant::now();
    let mut last = "not seen yet".to_owned();
    while start.elapsed() < SCHEDULE_TIMEOUT {
        if let Ok(pod) = pods.get(name).await {
            if pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.as_ref())
                .is_some()
            {
                return Ok(pod);
            }
            let refused = pod
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .into_iter()
                .flatten()
                .find(|c| c.type_ == "PodScheduled" && c.status == "False");
            if let Some(condition) = refused {
                last = condition.message.clone().unwrap_or_default();
                if start.elapsed() > Duration::from_secs(5) {
                    return Err(NotBound(last));
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(NotBound(format!(
        "not bound within {} s ({last})",
        SCHEDULE_TIMEOUT.as_secs()
    )))
}

/// What HAMi granted the bound `pod`: its AMD requests and the entries of
/// `hami.io/amd-devices-allocated` (none when HAMi bound it without).
fn placement_of(pod: &Pod) -> Result<Placement, NotBound> {
    let requests = request::requests_of(pod).map_err(|e| NotBound(e.to_string()))?;
    let allocated = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ALLOCATED_KEY));
    let grants = match allocated {
        Some(value) => decode_devices(value)
            .map_err(|e| NotBound(format!("{ALLOCATED_KEY} {value:?}: {e}")))?
            .into_iter()
            .filter(|g| !g.is_empty())
            .collect(),
        None => Vec::new(),
    };
    // No grant: HAMi placed nothing, whatever the spec asks.
    let kept = if grants.is_empty() {
        Vec::new()
    } else {
        requests.kept
    };
    Ok(Placement {
        requests: kept,
        grants,
        dropped: requests.dropped,
    })
}
