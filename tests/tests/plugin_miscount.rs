//! HAMi's init-container miscount against the plugin (docs/hami-protocol.md §4.2).
//! HAMi's usage count classifies a pod's device entries by position, while
//! its annotation lists only the containers that asked for an AMD GPU: a pod
//! whose init container is CPU-only has its first app container counted as
//! an init container, and once that init container has succeeded, not
//! counted at all. The scheduler (the emulator reproduces HAMi's count) then
//! places the next pod on CUs that are in use. The plugin must not hand them
//! out twice: Allocate fails and a Warning Event names the pods holding them.
//! Needs root (private bus).

// An integration-test file is itself the test module, and a failed unwrap is a
// failed test here.
#![allow(clippy::tests_outside_test_module, clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::world::{Gpu, NODE, World, pod_annotation, world};
use serde_json::{Value, json};
use tests::{
    apiserver::{FakeApiServer, Kind},
    hami_emulator::{HamiEmulator, request::GpuPolicy},
};

const CUS: &str = "hami.io/amd-cu-allocated";

/// A pod pinned to `gpu` (`amd.com/use-gpu-uuid`) whose app containers ask
/// for `apps` (percent of the CUs; 100 with no memory: the whole GPU), with
/// one CPU-only init container when `cpu_init`.
fn manifest(name: &str, gpu: &Gpu, cpu_init: bool, apps: &[u32]) -> Value {
    let containers: Vec<Value> = apps
        .iter()
        .enumerate()
        .map(|(i, pct)| {
            let mut limits = json!({"amd.com/gpu": "1"});
            if *pct < 100 {
                limits["amd.com/gpucores"] = json!(pct.to_string());
                limits["amd.com/gpumem"] = json!("1024");
            }
            json!({"name": format!("app-{i}"), "image": "rocm", "resources": {"limits": limits}})
        })
        .collect();
    let init = if cpu_init {
        json!([{"name": "setup", "image": "busybox"}])
    } else {
        json!([])
    };
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default",
                     "annotations": {"amd.com/use-gpu-uuid": gpu.id}},
        "spec": {"initContainers": init, "containers": containers},
    })
}

/// Filter and Bind by the emulator's HAMi; the CUs it granted per container.
fn place(api: &FakeApiServer, manifest: &Value, now: u64) -> Vec<u32> {
    let hami = HamiEmulator {
        node: NODE.to_owned(),
    };
    let placed = hami
        .schedule(api, manifest, now, GpuPolicy::Spread)
        .unwrap_or_else(|e| panic!("HAMi would not place {}: {e}", manifest["metadata"]["name"]));
    placed.grants.iter().map(|c| c[0].cus).collect()
}

/// The pod's init container has exited with 0 (kubelet's status).
fn init_succeeded(api: &FakeApiServer, name: &str) {
    let mut pod = api.get(Kind::Pod, "default", name).unwrap();
    pod["status"] = json!({"phase": "Running", "initContainerStatuses": [{
        "name": "setup", "image": "busybox", "imageID": "", "ready": false,
        "restartCount": 0, "state": {"terminated": {"exitCode": 0}}}]});
    api.put_pod(pod);
}

async fn allocate(w: &World, gpu: &Gpu, slot: usize) -> Result<String, String> {
    tokio::time::sleep(Duration::from_millis(300)).await; // the watch delivers the pod
    w.kubelet
        .allocate(vec![format!("{}#{slot}", gpu.id)])
        .await
        .map(|a| a.envs.get("HSA_CU_MASK").cloned().unwrap_or_default())
        .map_err(|s| s.message().to_owned())
}

/// The note of the plugin's `CuConflict` Warning Event on `pod`.
async fn conflict_event(api: &FakeApiServer, pod: &str) -> String {
    let start = Instant::now();
    loop {
        let found = api.events().into_iter().find(|e| {
            e["regarding"]["name"] == pod && e["reason"] == "CuConflict" && e["type"] == "Warning"
        });
        if let Some(event) = found {
            return event["note"].as_str().unwrap_or_default().to_owned();
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no CuConflict Event for {pod}: {:?}",
            api.events()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[test]
fn a_slice_that_hami_miscounted_is_refused_with_the_holders_named() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(Duration::from_secs(120), slice_on_miscounted());
}

async fn slice_on_miscounted() {
    let w = world().await;
    let g = &w.gpus[4];
    // Two app containers of 50 % on one GPU: 304 CUs in use, HAMi counts 152.
    let hidden = manifest("hidden", g, true, &[50, 50]);
    assert_eq!(place(&w.api, &hidden, 500), [152, 152]);
    assert_eq!(allocate(&w, g, 0).await.unwrap(), "0:0-151");
    assert_eq!(allocate(&w, g, 1).await.unwrap(), "0:152-303");
    // HAMi places another half on the same GPU; the plugin has no CU for it.
    assert_eq!(
        place(&w.api, &manifest("next", g, false, &[50]), 501),
        [152]
    );
    let err = allocate(&w, g, 2).await.unwrap_err();
    assert!(
        err.contains("not enough free CUs") && err.contains("default/hidden"),
        "{err}"
    );
    let note = conflict_event(&w.api, "next").await;
    assert!(note.contains("default/hidden"), "{note}");
    assert_eq!(pod_annotation(&w.api, "next", CUS), None, "nothing claimed");
    let hidden_cus = pod_annotation(&w.api, "hidden", CUS).unwrap();
    assert!(hidden_cus.contains("0-303"), "{hidden_cus}");
}

#[test]
fn whole_and_sliced_grants_on_one_gpu_never_share() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(Duration::from_secs(120), whole_against_slices());
}

async fn whole_against_slices() {
    let w = world().await;
    let (g, h) = (&w.gpus[2], &w.gpus[3]);
    // Once its CPU-only init container succeeded, HAMi counts nothing of
    // this pod: its only AMD entry sits where the init container would.
    let quiet = manifest("quiet", g, true, &[50]);
    assert_eq!(place(&w.api, &quiet, 600), [152]);
    assert_eq!(allocate(&w, g, 0).await.unwrap(), "0:0-151");
    init_succeeded(&w.api, "quiet");
    assert_eq!(
        place(&w.api, &manifest("whole", g, false, &[100]), 601),
        [304]
    );
    let err = allocate(&w, g, 1).await.unwrap_err();
    assert!(
        err.contains("granted GPU") && err.contains("whole") && err.contains("default/quiet"),
        "{err}"
    );
    assert!(
        conflict_event(&w.api, "whole")
            .await
            .contains("default/quiet")
    );

    // The other way round: a whole GPU is claimed whole, so a slice HAMi
    // places on it after the same miscount is refused too.
    let big = manifest("big", h, true, &[100]);
    assert_eq!(place(&w.api, &big, 602), [304]);
    assert_eq!(
        allocate(&w, h, 0).await.unwrap(),
        "",
        "no mask for a whole GPU"
    );
    assert_eq!(
        pod_annotation(&w.api, "big", CUS).unwrap(),
        json!({ h.id.clone(): "0-303" }).to_string()
    );
    init_succeeded(&w.api, "big");
    assert_eq!(
        place(&w.api, &manifest("small", h, false, &[25]), 603),
        [76]
    );
    let err = allocate(&w, h, 1).await.unwrap_err();
    assert!(err.contains("default/big"), "{err}");
    assert!(
        conflict_event(&w.api, "small")
            .await
            .contains("default/big")
    );
}
