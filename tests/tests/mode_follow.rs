//! Issue 20, point 7: `hami.io/amd-operating-mode` is followed while the
//! plugin runs. On an MI300X node in CPX (8 GPUs of 8 partitions), the
//! plugin starts in cu mode (80 slots); the annotation asks for partition
//! mode while a pod holds a slice: the plugin waits and says why once;
//! when the pod has finished, the 64 partitions replace the GPUs for
//! kubelet and HAMi, and a Normal Event says so. Needs root.

// An integration-test file is itself the test module, and a failed unwrap is a
// failed test here.
#![allow(clippy::tests_outside_test_module, clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::world::{NODE, Setup, schedule, world_with};
use serde_json::{Value, json};
use tests::apiserver::{FakeApiServer, Kind};

const DEFERRED: &str = "OperatingModeDeferred";
const CHANGED: &str = "OperatingModeChanged";

fn node_events(api: &FakeApiServer, reason: &str) -> Vec<Value> {
    api.events()
        .into_iter()
        .filter(|e| e["regarding"]["kind"] == "Node" && e["reason"] == reason)
        .collect()
}

async fn wait_event(api: &FakeApiServer, reason: &str) -> Value {
    let start = Instant::now();
    loop {
        if let Some(e) = node_events(api, reason).into_iter().next() {
            return e;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no {reason} Event: {:?}",
            api.events()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn set_mode(api: &FakeApiServer, mode: &str) {
    let mut node = api.get(Kind::Node, "", NODE).unwrap();
    node["metadata"]["annotations"]["hami.io/amd-operating-mode"] = json!(mode);
    api.put_node(node);
}

fn registered_len(api: &FakeApiServer) -> usize {
    let node = api.get(Kind::Node, "", NODE).unwrap();
    node["metadata"]["annotations"]["hami.io/node-amd-register"]
        .as_str()
        .and_then(|v| serde_json::from_str::<Vec<Value>>(v).ok())
        .map_or(0, |d| d.len())
}

#[test]
fn the_mode_annotation_is_followed_once_no_allocation_is_live() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(Duration::from_secs(150), async {
        let args = ["--pod-resources-socket".to_owned(), "none".to_owned()];
        let w = world_with(&Setup {
            fixture: "mi300x-8-cpx",
            devices: 80,
            gpud_args: &[],
            plugin_args: &args,
            prepare: &|_| {},
        })
        .await;
        let g = w.gpus[0].clone();
        schedule(&w.api, "busy", &[(&g, 4096, 38)], 100);
        tokio::time::sleep(Duration::from_millis(300)).await;
        w.kubelet
            .allocate(vec![format!("{}#0", g.id)])
            .await
            .unwrap();

        set_mode(&w.api, "partition");
        let deferred = wait_event(&w.api, DEFERRED).await;
        let note = deferred["note"].as_str().unwrap_or_default();
        assert!(note.contains("default/busy"), "names the holder: {note}");
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(w.kubelet.devices().len(), 80, "still cu mode");
        assert_eq!(node_events(&w.api, DEFERRED).len(), 1, "said once");
        assert!(node_events(&w.api, CHANGED).is_empty());

        let mut pod = w.api.get(Kind::Pod, "default", "busy").unwrap();
        pod["status"]["phase"] = json!("Succeeded");
        w.api.put_pod(pod);
        wait_event(&w.api, CHANGED).await;
        let devices = w
            .kubelet
            .wait_devices(Duration::from_secs(20), |d| d.len() == 64)
            .await
            .unwrap();
        assert!(
            devices.iter().all(|d| d.id.contains("-cpx")),
            "{:?}",
            devices.first()
        );
        let start = Instant::now();
        while registered_len(&w.api) != 64 {
            assert!(start.elapsed() < Duration::from_secs(20), "HAMi sees 64");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
}
