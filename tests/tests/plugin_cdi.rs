//! CDI end to end: amd-gpud writes a CDI 0.6.0 spec for the node (checked
//! field by field against the format's rules), the plugin with `--cdi true`
//! answers Allocate with the spec's device names only, and the spec's nodes
//! for that device are exactly what a plugin without CDI hands out.
//! Needs root (private bus).

// An integration-test file is itself the test module, and a failed unwrap is a
// failed test here.
#![allow(clippy::tests_outside_test_module, clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::world::{Setup, schedule, world_with};
use serde_json::Value;

/// CDI's rule for device names (the part after `kind=`).
fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || "_.:-".contains(c))
}

#[test]
fn the_cdi_spec_matches_what_allocate_returns() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(Duration::from_secs(120), cdi());
}

async fn cdi() {
    let args = ["--cdi".to_owned(), "true".to_owned()];
    let mut w = world_with(&Setup {
        fixture: "mi300x-8-spx",
        devices: 80,
        gpud_args: &[],
        plugin_args: &args,
        prepare: &|_| {},
    })
    .await;
    let path = w.root().join("var/run/cdi/amd.com-gpu.json");
    let spec: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(spec["cdiVersion"], "0.6.0");
    assert_eq!(spec["kind"], "amd.com/gpu");
    let common_nodes = spec["containerEdits"]["deviceNodes"].as_array().unwrap();
    assert_eq!(common_nodes.len(), 1);
    assert_eq!(common_nodes[0]["path"], "/dev/kfd");
    assert_eq!(common_nodes[0]["type"], "c");
    let devices = spec["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 8);
    check_devices(devices);

    // Allocate names the device; the runtime injects its nodes from the spec.
    let g0 = common::world::Gpu {
        id: w.gpus[0].id.clone(),
        device_type: w.gpus[0].device_type.clone(),
        rocr_uuid: w.gpus[0].rocr_uuid.clone(),
    };
    let g0 = &g0;
    schedule(&w.api, "cdi-pod", &[(g0, 1024, 76)], 900);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let answer = w
        .kubelet
        .allocate(vec![format!("{}#0", g0.id)])
        .await
        .unwrap();
    assert!(answer.devices.is_empty(), "{:?}", answer.devices);
    let names: Vec<&str> = answer.cdi_devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["amd.com/gpu=0000:05:00.0"]);
    assert_eq!(
        answer.envs["HSA_CU_MASK"], "0:0-75",
        "the environment is unchanged"
    );
    let entry = devices
        .iter()
        .find(|d| d["name"] == "0000:05:00.0")
        .unwrap();
    let from_spec: Vec<&str> = entry["containerEdits"]["deviceNodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["path"].as_str().unwrap())
        .collect();

    // Without CDI the same GPU's device nodes are the spec's, plus /dev/kfd.
    let n = w.extra.len();
    w.extra.truncate(n - 2);
    w.restart_plugin().await;
    schedule(&w.api, "plain-pod", &[(g0, 1024, 76)], 901);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let plain = w
        .kubelet
        .allocate(vec![format!("{}#1", g0.id)])
        .await
        .unwrap();
    let paths: Vec<&str> = plain
        .devices
        .iter()
        .map(|d| d.container_path.as_str())
        .collect();
    assert_eq!(paths[0], "/dev/kfd");
    assert_eq!(paths[1..], from_spec[..]);
    assert!(plain.cdi_devices.is_empty());
}

/// Every device's name and nodes follow CDI's rules and exist on the host.
fn check_devices(devices: &[Value]) {
    for device in devices {
        let name = device["name"].as_str().unwrap();
        assert!(valid_name(name), "{name}");
        for node in device["containerEdits"]["deviceNodes"].as_array().unwrap() {
            let container = node["path"].as_str().unwrap();
            assert!(container.starts_with("/dev/dri/"), "{node}");
            assert_eq!(node["type"], "c");
            let host = node["hostPath"].as_str().unwrap();
            assert!(std::path::Path::new(host).exists(), "{host}");
            assert!(host.ends_with(container), "{host} vs {container}");
        }
    }
}
