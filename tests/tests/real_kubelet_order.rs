//! The order in which the real kubelet (1.36) calls a device plugin while it
//! admits and starts a pod, against its runtime's calls: a probe device
//! plugin (`tests::cluster::probe`) records its calls, `recording-cri` the
//! image pull and CreateContainer, both with the wall clock. Issue 22 builds
//! on the answer: Allocate comes at admission, before the image is pulled;
//! PreStartContainer after the pull and before CreateContainer. Needs root.

// An integration-test file is itself the test module, and a failed unwrap is a
// failed test here.
#![allow(clippy::tests_outside_test_module, clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{
    cluster::{LIMIT, admin, eventually},
    real_node::{capacity, ready, wait_running},
};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use serde_json::json;
use tests::cluster::{
    ADMIN_TOKEN, RealCluster,
    kubelet::{KUBELET_NODE, RealKubelet},
    probe::{CallProbe, PROBE_RESOURCE},
};

const IMAGE: &str = "registry.example/never-pulled-before:1";

#[test]
fn allocate_comes_before_the_image_pull_and_pre_start_after_it() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(LIMIT, async {
        let cluster = RealCluster::start().unwrap();
        let client = admin(&cluster).await;
        let kubelet = RealKubelet::start(&cluster).unwrap();
        let nodes: Api<Node> = Api::all(client.clone());
        let limit = Duration::from_secs(60);
        eventually(limit, "the Node Ready", || ready(&nodes, KUBELET_NODE)).await;
        let probe = CallProbe::default();
        let _server = probe.start(&kubelet.device_plugin_dir()).await.unwrap();
        let two = || async {
            let count = capacity(&nodes, KUBELET_NODE, PROBE_RESOURCE).await?;
            (count == "2").then_some(())
        };
        eventually(limit, "the probe's capacity", two).await;

        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probed"},
            "spec": {"nodeName": KUBELET_NODE, "containers": [{"name": "c", "image": IMAGE,
                     "resources": {"limits": {PROBE_RESOURCE: "1"}}}]}});
        let path = "/api/v1/namespaces/default/pods";
        let (code, answer) = cluster
            .request_as(ADMIN_TOKEN, "POST", path, Some(&pod.to_string()))
            .unwrap();
        assert_eq!(code, 201, "{answer}");
        let pods: Api<Pod> = Api::namespaced(client, "default");
        wait_running(&pods, "probed", &kubelet).await;

        let mut events: Vec<(u64, String)> = probe
            .calls()
            .into_iter()
            .map(|(call, at)| (at, format!("plugin {call}")))
            .collect();
        let pulls = kubelet.timed_requests("PullImage");
        let pull = pulls
            .iter()
            .find(|(_, r)| r["image"]["image"] == IMAGE)
            .unwrap_or_else(|| panic!("no PullImage of {IMAGE}: {pulls:?}"));
        events.push((pull.0, "runtime PullImage".to_owned()));
        let created = kubelet.timed_requests("CreateContainer");
        let create = created
            .iter()
            .find(|(_, r)| r["sandboxConfig"]["metadata"]["name"] == "probed")
            .unwrap();
        events.push((create.0, "runtime CreateContainer".to_owned()));
        events.sort_unstable();
        let order: Vec<&str> = events.iter().map(|(_, e)| e.as_str()).collect();
        let first = events[0].0;
        for (at, event) in &events {
            let ms = at.saturating_sub(first) as f64 / 1e6;
            println!("{ms:>9.1} ms  {event}");
        }
        assert_eq!(
            order,
            [
                "plugin GetPreferredAllocation",
                "plugin Allocate",
                "runtime PullImage",
                "plugin PreStartContainer",
                "runtime CreateContainer",
            ],
            "kubelet's order"
        );
    });
}
