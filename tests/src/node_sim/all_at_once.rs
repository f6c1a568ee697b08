//! `--all-at-once` on the fake cluster: HAMi binds every pod of a node
//! before kubelet admits any, so that what happens between a Bind and its
//! admission can be replayed, such as a pod whose AMD request is in init
//! containers only, bound without the node lock while another pod holds
//! it (issue 35, point 1).
//!
//! HAMi's Bind takes the node lock for a pod with AMD requests in app
//! containers and fails while another pod holds it (the plugin releases
//! it once that pod's devices are allocated); HAMi then tries the pod
//! again later. So each round binds, in order, every waiting pod that
//! needs no lock, and the first that needs it takes it; the others wait
//! for the next round. Kubelet then admits the pods bound without the
//! lock, in order, while the lock names the pod whose Binding comes last
//! (the race of point 1), and then that pod.

use std::time::{Duration, Instant};

use super::{
    Session,
    admit::{self, Bound},
    node::SimNode,
    pods::ExamplePod,
    report::{ContainerReport, PodReport},
};
use serde_json::json;

use crate::{apiserver::Kind, hami_emulator::request::GpuPolicy};

/// The node lock HAMi's Bind takes (`docs/hami-protocol.md` §3.7).
const LOCK_KEY: &str = "hami.io/mutex.lock";

/// How long a round waits for the plugin to release the node lock.
const LOCK_TIMEOUT: Duration = Duration::from_secs(10);

/// Binds every pod of `pods` on `node` as HAMi would, then admits them;
/// their reports, in the order of `pods`.
pub async fn admit_all(
    session: &Session,
    node: &mut SimNode,
    pods: &[&ExamplePod],
    policy: GpuPolicy,
) -> Vec<PodReport> {
    let mut reports: Vec<Option<PodReport>> = vec![None; pods.len()];
    let mut waiting: Vec<usize> = (0..pods.len()).collect();
    let mut first = true;
    while !waiting.is_empty() {
        if !first && let Err(holder) = wait_unlocked(session, &node.name).await {
            for i in waiting {
                reports[i] = Some(lock_stuck(session, node, pods[i], policy, &holder));
            }
            break;
        }
        first = false;
        let round = bind_round(session, node, pods, &waiting, policy);
        for (i, report) in round.refused {
            reports[i] = Some(report);
        }
        for (i, bound) in round.bound {
            reports[i] = Some(admit::kubelet_admits(session, node, pods[i], bound).await);
        }
        if let Some((i, bound)) = round.locked {
            complete_binding(session, node, pods[i]);
            reports[i] = Some(admit::kubelet_admits(session, node, pods[i], bound).await);
        }
        waiting = round.deferred;
    }
    reports.into_iter().flatten().collect()
}

/// What one round of HAMi's Binds did with the waiting pods (indexes).
#[derive(Default)]
struct Round {
    /// Bound without the node lock, in order.
    bound: Vec<(usize, Bound)>,
    /// The pod that took the node lock, its Binding not yet made.
    locked: Option<(usize, Bound)>,
    /// Pods HAMi cannot place, with their reports.
    refused: Vec<(usize, PodReport)>,
    /// Pods whose Bind found the lock taken: the next round's.
    deferred: Vec<usize>,
}

/// HAMi's Binds of the `waiting` pods, in order: a pod that needs the node
/// lock takes it if it is free (its Binding waits until the pods bound
/// without the lock are admitted: those are bound while it holds the
/// lock) and waits for the next round if not.
fn bind_round(
    session: &Session,
    node: &SimNode,
    pods: &[&ExamplePod],
    waiting: &[usize],
    policy: GpuPolicy,
) -> Round {
    let mut round = Round::default();
    for &i in waiting {
        let pod = pods[i];
        let locks = takes_lock(session, node, pod, policy);
        if locks && let Some(holder) = lock_holder(session, &node.name) {
            let say = format!(
                "HAMi's Bind of pod {} waits: {holder} holds the node lock",
                pod.name
            );
            session.host.progress.step(&node.name, &say);
            round.deferred.push(i);
            continue;
        }
        match admit::schedule(session, node, pod, policy, !locks) {
            Ok(bound) if locks => round.locked = Some((i, bound)),
            Ok(bound) => round.bound.push((i, bound)),
            Err(report) => round.refused.push((i, *report)),
        }
    }
    round
}

/// HAMi's Binding of a pod that holds the node lock.
fn complete_binding(session: &Session, node: &SimNode, pod: &ExamplePod) {
    if let Some(mut stored) = session.api.get(Kind::Pod, &pod.namespace, &pod.name) {
        stored["spec"]["nodeName"] = json!(node.name);
        session.api.put_pod(stored);
    }
}

/// Whether HAMi's Bind of `pod` would take the node lock: HAMi places it
/// here with an AMD request in an app container.
fn takes_lock(session: &Session, node: &SimNode, pod: &ExamplePod, policy: GpuPolicy) -> bool {
    node.hami
        .filter(&session.api, &pod.manifest, policy)
        .is_ok_and(|p| p.requests.iter().any(|r| !r.init))
}

/// The pod the node lock of `node` names, if it is taken.
fn lock_holder(session: &Session, node: &str) -> Option<String> {
    let stored = session.api.get(Kind::Node, "", node)?;
    holder_of(stored["metadata"]["annotations"][LOCK_KEY].as_str()?)
}

/// `namespace/name` of the pod a lock (`<time>,<namespace>,<name>`) names.
fn holder_of(lock: &str) -> Option<String> {
    let mut parts = lock.splitn(3, ',').skip(1);
    Some(format!("{}/{}", parts.next()?, parts.next()?))
}

/// Waits until the plugin has released the node lock.
///
/// # Errors
/// The pod the lock still names after [`LOCK_TIMEOUT`].
async fn wait_unlocked(session: &Session, node: &str) -> Result<(), String> {
    let start = Instant::now();
    loop {
        let Some(holder) = lock_holder(session, node) else {
            return Ok(());
        };
        if start.elapsed() > LOCK_TIMEOUT {
            return Err(holder);
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// The report of a pod HAMi places but cannot bind: the lock stays taken.
fn lock_stuck(
    session: &Session,
    node: &SimNode,
    pod: &ExamplePod,
    policy: GpuPolicy,
    holder: &str,
) -> PodReport {
    let mut report = PodReport::new(pod, node);
    let why = format!(
        "not bound: the node lock still names {holder} {} s after its admission",
        LOCK_TIMEOUT.as_secs()
    );
    session
        .host
        .progress
        .step(&node.name, &format!("pod {}: {why}", pod.name));
    if let Ok(placement) = node.hami.filter(&session.api, &pod.manifest, policy) {
        for (request, grants) in placement.requests.iter().zip(&placement.grants) {
            let mut container = ContainerReport::new(request, grants);
            container.error = Some(why.clone());
            report.containers.push(container);
        }
    }
    report.scheduled = true;
    report.reason = Some(why);
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lock_names_its_pod() {
        let holder = holder_of("2026-12-03T10:00:00Z,default,r-app");
        assert_eq!(holder.as_deref(), Some("default/r-app"));
        assert_eq!(holder_of("no commas"), None);
    }
}
