//! Pods that forge HAMi's annotations to exhaust the plugin's memory (issue
//! #19). Anyone who may create a pod can write any annotation on it; the
//! plugin reads every pod of its node. The plugin runs in a memory cgroup of
//! the chart's limit (128 MiB) and must survive each attack, keep serving
//! honest pods, and say which pod and key it refused. Needs root (private
//! bus, cgroup).

// An integration-test file is itself the test module, and a failed unwrap is a
// failed test here.
#![allow(clippy::tests_outside_test_module, clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::memcg::{CHART_LIMIT, MemCg, alive, status_kib};
use common::world::{Gpu, NODE, World, pod_annotation, released, schedule, world};
use serde_json::{Value, json};
use tests::apiserver::{FakeApiServer, Kind};

const CUS: &str = "hami.io/amd-cu-allocated";
const SPARE: &str = "hami.io/amd-cu-init-spare";
const ALLOCATED: &str = "hami.io/amd-devices-allocated";

/// The plugin of `w` in a memory cgroup of the chart's limit (less what it
/// holds already: the kernel may not move those pages' charge along).
fn contain(w: &World) -> Option<MemCg> {
    let pid = w.plugin.0.id();
    let cg = MemCg::new(CHART_LIMIT.saturating_sub(status_kib(pid, "VmRSS") * 1024))?;
    cg.add(pid);
    Some(cg)
}

/// The plugin is alive and was never OOM-killed; its VmHWM (KiB) is logged.
fn assert_survived(w: &World, cg: Option<&MemCg>, what: &str) -> u64 {
    let pid = w.plugin.0.id();
    assert!(alive(pid), "the plugin died: {what}");
    if let Some(cg) = cg {
        assert_eq!(cg.oom_kills(), 0, "OOM kill in the plugin's cgroup: {what}");
    }
    let hwm = status_kib(pid, "VmHWM");
    let cg_peak = cg.map_or(0, |c| c.max_usage() / 1024);
    eprintln!("memory: {what}: plugin VmHWM {hwm} KiB, cgroup peak {cg_peak} KiB");
    hwm
}

/// A running pod on the node with forged `annotations`. It asks for one
/// `amd.com/gpu` (a pod asking for none has its claims refused before they
/// are read), so that the bounds on the values themselves are what is tried.
fn forger(api: &FakeApiServer, name: &str, annotations: Value) {
    let limits = json!({"limits": {"amd.com/gpu": "1"}});
    api.put_pod(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "annotations": annotations},
        "spec": {"nodeName": NODE,
                 "containers": [{"name": "c", "image": "busybox", "resources": limits}]},
        "status": {"phase": "Running"},
    }));
}

fn set_phase(api: &FakeApiServer, name: &str, phase: &str) {
    let mut pod = api.get(Kind::Pod, "default", name).unwrap();
    pod["status"]["phase"] = json!(phase);
    api.put_pod(pod);
}

/// Kubelet's Allocate of slot `slot` of `gpu`: `HSA_CU_MASK` or the error.
async fn allocate(w: &World, gpu: &Gpu, slot: usize) -> Result<String, String> {
    tokio::time::sleep(Duration::from_millis(300)).await; // the watch delivers the pod
    w.kubelet
        .allocate(vec![format!("{}#{slot}", gpu.id)])
        .await
        .map(|a| a.envs.get("HSA_CU_MASK").cloned().unwrap_or_default())
        .map_err(|s| s.message().to_owned())
}

/// The note of the first Warning Event `reason` on `pod`.
async fn warning(api: &FakeApiServer, pod: &str, reason: &str) -> String {
    let start = Instant::now();
    loop {
        let found = api.events().into_iter().find(|e| {
            e["regarding"]["name"] == pod && e["reason"] == reason && e["type"] == "Warning"
        });
        if let Some(event) = found {
            return event["note"].as_str().unwrap_or_default().to_owned();
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no {reason} Event for {pod}: {:?}",
            api.events()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[test]
fn a_forged_cu_range_on_a_bystander_pod_is_refused_without_expanding_it() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(Duration::from_secs(180), forged_bystander());
}

async fn forged_bystander() {
    let mut w = world().await;
    let mut cg = contain(&w);
    let idle = assert_survived(&w, cg.as_ref(), "idle, before the attack");
    let g = &w.gpus[0];
    let id = g.id.clone();
    // A grant of 2^31-1 CUs, a claim of as many and a spare set, all forged.
    forger(
        &w.api,
        "forger",
        json!({
            ALLOCATED: format!("{id},{},1,2147483647:;", g.device_type),
            CUS: json!({ id.clone(): "0-2147483646" }).to_string(),
            SPARE: json!({ id.clone(): "0" }).to_string(),
        }),
    );
    // Longer than any value the plugin writes, and too many ranges.
    let long = format!("{{\"{id}\":\"0{}\"}}", ",9".repeat(200_000));
    forger(&w.api, "long", json!({ ALLOCATED: "", CUS: long }));
    schedule(&w.api, "honest", &[(g, 1024, 76)], 700);
    assert_eq!(allocate(&w, g, 0).await.unwrap(), "0:0-75");
    assert!(released(&w.api).await);
    let note = warning(&w.api, "forger", "UntrustedCuClaim").await;
    assert!(
        note.contains(CUS) && note.contains("default/forger") && note.contains("has 304 CUs"),
        "{note}"
    );
    let note = warning(&w.api, "long", "UntrustedCuClaim").await;
    assert!(note.contains(CUS) && note.contains("more than"), "{note}");
    let attacked = assert_survived(&w, cg.as_ref(), "forged range, first Allocate");

    // After a restart (nothing recorded), and with the forger Succeeded.
    drop(cg);
    w.restart_plugin().await;
    cg = contain(&w);
    let g = &w.gpus[0];
    schedule(&w.api, "after-restart", &[(g, 1024, 76)], 701);
    assert_eq!(allocate(&w, g, 1).await.unwrap(), "0:76-151");
    set_phase(&w.api, "forger", "Succeeded");
    schedule(&w.api, "after-success", &[(g, 1024, 76)], 702);
    assert_eq!(allocate(&w, g, 2).await.unwrap(), "0:152-227");
    let restarted = assert_survived(&w, cg.as_ref(), "forged range, after a restart");
    eprintln!("memory: idle {idle} KiB, attacked {attacked} KiB, restarted {restarted} KiB");
}

#[test]
fn a_pod_forging_its_own_cu_record_fails_allocate_and_frees_the_lock() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(Duration::from_secs(120), forged_own_record());
}

async fn forged_own_record() {
    let w = world().await;
    let cg = contain(&w);
    let idle = assert_survived(&w, cg.as_ref(), "idle, before the attack");
    let g = &w.gpus[1];
    // HAMi places the pod; its manifest set the plugin's CU record itself.
    schedule(&w.api, "greedy", &[(g, 1024, 76)], 800);
    let mut pod = w.api.get(Kind::Pod, "default", "greedy").unwrap();
    pod["metadata"]["annotations"][CUS] =
        json!(json!({ g.id.clone(): "0-2147483646" }).to_string());
    w.api.put_pod(pod);
    let err = allocate(&w, g, 0).await.unwrap_err();
    assert!(
        err.contains("default/greedy") && err.contains(CUS) && err.contains("has 304 CUs"),
        "{err}"
    );
    assert!(released(&w.api).await, "the node lock is released");
    assert_eq!(
        pod_annotation(&w.api, "greedy", "hami.io/bind-phase").as_deref(),
        Some("failed")
    );
    schedule(&w.api, "next", &[(g, 1024, 76)], 801);
    assert_eq!(allocate(&w, g, 1).await.unwrap(), "0:0-75");
    let attacked = assert_survived(&w, cg.as_ref(), "forged own record");
    eprintln!("memory: idle {idle} KiB, attacked {attacked} KiB");
}

#[test]
fn edits_of_a_recorded_claim_are_reported_in_bounded_memory() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(Duration::from_secs(240), edited_again_and_again());
}

/// Distinct values of a pod's annotation written again and again (each seen
/// by an Allocate): what the plugin remembers of them must not grow.
async fn edited_again_and_again() {
    const EDITS: usize = 200;
    let w = world().await;
    let cg = contain(&w);
    let g = &w.gpus[2];
    schedule(&w.api, "editor", &[(g, 1024, 76)], 900);
    assert_eq!(allocate(&w, g, 0).await.unwrap(), "0:0-75");
    assert!(released(&w.api).await);
    let pid = w.plugin.0.id();
    let before = assert_survived(&w, cg.as_ref(), "before the edits");
    let rss_before = status_kib(pid, "VmRSS");
    // The largest values the API server stores (256 KiB of annotations).
    let filler = "9".repeat(250 * 1024);
    for i in 0..EDITS {
        let mut pod = w.api.get(Kind::Pod, "default", "editor").unwrap();
        pod["metadata"]["annotations"][CUS] = json!(format!("{i}{filler}"));
        w.api.put_pod(pod);
        tokio::time::sleep(Duration::from_millis(100)).await;
        // No pod is being bound: the Allocate fails, after judging the view.
        let slot = format!("{}#1", g.id);
        assert!(w.kubelet.allocate(vec![slot]).await.is_err());
    }
    let note = warning(&w.api, "editor", "UntrustedCuClaim").await;
    assert!(note.contains(CUS) && note.contains("edited"), "{note}");
    let after = assert_survived(&w, cg.as_ref(), "after the edits");
    let rss_after = status_kib(pid, "VmRSS");
    eprintln!(
        "memory: {EDITS} edits of 250 KiB: VmHWM {before} -> {after} KiB, \
         VmRSS {rss_before} -> {rss_after} KiB"
    );
    // Each value kept would be 250 KiB: 50 MiB for all of them.
    assert!(
        rss_after < rss_before + 16 * 1024,
        "the plugin keeps what users wrote: VmRSS {rss_before} -> {rss_after} KiB"
    );
}
