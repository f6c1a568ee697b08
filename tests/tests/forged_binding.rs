//! Issue 19, defect 3: a pod's author forges the annotations of HAMi's
//! fallback rule (`bind-phase: allocating`, an old `bind-time`, a grant of a
//! whole GPU) to be taken for the pod kubelet is admitting when no node
//! lock names one (HAMi takes none for a pod whose AMD request is in init
//! containers only; older HAMi writes a bare time). The plugin chooses from
//! what the author cannot forge (the binding to this node, the spec's
//! request for the devices) and refuses to guess between several pods
//! unless admission protects HAMi's annotations (`--annotations-protected`).
//! Whole stack: private bus, amd-gpud, the plugin, fake kubelet and API
//! server. Needs root.

// An integration-test file is itself the test module, and a failed unwrap is a
// failed test here.
#![allow(clippy::tests_outside_test_module, clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::world::{Gpu, NODE, Setup, World, grant, pod_annotation, world, world_with};
use serde_json::{Value, json};
use tests::{
    apiserver::Kind,
    hami_emulator::{HamiEmulator, encode},
};

const LIMIT: Duration = Duration::from_secs(120);

/// A pod the author put on the node with the fallback rule's annotations,
/// claiming all of `g` since Unix time 1; its container asks for
/// `amd.com/gpu` when `asks` is.
fn forge(w: &World, g: &Gpu, asks: bool) {
    let entry = encode(&[vec![grant(g, 196_608, 304)]]);
    let resources = if asks {
        json!({"limits": {"amd.com/gpu": "1"}})
    } else {
        json!({})
    };
    w.api.put_pod(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "forger", "namespace": "default", "annotations": {
            "hami.io/vgpu-node": NODE, "hami.io/bind-phase": "allocating",
            "hami.io/bind-time": "1", "hami.io/amd-devices-to-allocate": entry,
            "hami.io/amd-devices-allocated": entry}},
        "spec": {"nodeName": NODE,
                 "containers": [{"name": "c", "image": "x", "resources": resources}]},
        "status": {"phase": "Pending"}}));
}

/// HAMi's Filter and Bind of `default/<name>`, 38 CUs of `g`, no node lock.
fn bind_without_lock(w: &World, name: &str, g: &Gpu, bind_time: u64) {
    let hami = HamiEmulator {
        node: NODE.to_owned(),
    };
    hami.bind_unlocked(&w.api, name, &[vec![grant(g, 1024, 38)]], bind_time);
}

fn bind_phase(w: &World, name: &str) -> Option<String> {
    pod_annotation(&w.api, name, "hami.io/bind-phase")
}

/// A forged pod that asks for no GPU is never the one kubelet admits: the
/// honest pod gets its own 38 CUs, not the forged whole GPU.
#[test]
fn a_forged_pod_without_a_gpu_request_is_not_taken_for_the_admitted_one() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(LIMIT, async {
        let w = world().await;
        let g = w.gpus[2].clone();
        bind_without_lock(&w, "honest", &g, 2000);
        forge(&w, &g, false);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let answer = w.kubelet.allocate(vec![format!("{}#0", g.id)]).await;
        let answer = answer.unwrap();
        assert_eq!(
            answer.envs.get("HSA_CU_MASK").map(String::as_str),
            Some("0:0-37"),
            "the honest pod's grant: {:?}",
            answer.envs
        );
        assert_eq!(bind_phase(&w, "honest").as_deref(), Some("success"));
        assert_eq!(bind_phase(&w, "forger").as_deref(), Some("allocating"));
    });
}

/// A pod that also asks for another vendor's GPU: that vendor's plugin
/// allocated first, marked it `bind-phase: success` and released the node
/// lock. Its AMD entry is still pending, so it is still the pod kubelet is
/// admitting, and gets its grant.
#[test]
fn a_pod_another_vendor_marked_success_still_gets_its_amd_grant() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(LIMIT, async {
        let w = world().await;
        let g = w.gpus[1].clone();
        bind_without_lock(&w, "mixed", &g, 2000);
        let mut pod = w.api.get(Kind::Pod, "default", "mixed").unwrap();
        pod["metadata"]["annotations"]["hami.io/bind-phase"] = json!("success");
        w.api.put_pod(pod);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let answer = w.kubelet.allocate(vec![format!("{}#0", g.id)]).await;
        let answer = answer.unwrap();
        assert_eq!(
            answer.envs.get("HSA_CU_MASK").map(String::as_str),
            Some("0:0-37"),
            "{:?}",
            answer.envs
        );
        assert_eq!(bind_phase(&w, "mixed").as_deref(), Some("success"));
        let left = pod_annotation(&w.api, "mixed", "hami.io/amd-devices-to-allocate");
        assert!(
            left.as_deref()
                .is_none_or(|v| v.trim_matches(';').is_empty()),
            "the AMD entry is taken: {left:?}"
        );
    });
}

/// Two pods that could each be the one: refused, naming both, unless the
/// annotations are protected by admission (then HAMi's oldest bind-time).
#[test]
fn two_pods_that_could_each_be_the_one_are_refused_unless_protected() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(LIMIT, async {
        let w = world().await;
        let g = w.gpus[3].clone();
        bind_without_lock(&w, "honest", &g, 2000);
        forge(&w, &g, true);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let err = w
            .kubelet
            .allocate(vec![format!("{}#0", g.id)])
            .await
            .unwrap_err();
        let message = err.message();
        for name in ["default/honest", "default/forger", "refusing to guess"] {
            assert!(message.contains(name), "{name}: {message}");
        }
        assert_eq!(bind_phase(&w, "honest").as_deref(), Some("allocating"));
        assert_eq!(bind_phase(&w, "forger").as_deref(), Some("allocating"));
        drop(w);

        let protected = ["--annotations-protected".to_owned(), "true".to_owned()];
        let w = world_with(&Setup {
            fixture: "mi300x-8-spx",
            devices: 80,
            gpud_args: &[],
            plugin_args: &protected,
            prepare: &|_| {},
        })
        .await;
        let g = w.gpus[3].clone();
        bind_without_lock(&w, "later", &g, 3001);
        bind_without_lock(&w, "earlier", &g, 3000);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let answer = w.kubelet.allocate(vec![format!("{}#0", g.id)]).await;
        let envs: Value = json!(answer.unwrap().envs);
        assert_eq!(envs["HSA_CU_MASK"], "0:0-37", "{envs}");
        assert_eq!(bind_phase(&w, "earlier").as_deref(), Some("success"));
        assert_eq!(bind_phase(&w, "later").as_deref(), Some("allocating"));
    });
}

/// Defect 4: a pod that asks for no GPU forges a grant of a whole GPU and
/// the plugin's CU record of it. HAMi never granted it anything, so its
/// claim holds no CU: an honest pod HAMi placed on that GPU gets its slice.
#[test]
fn a_whole_gpu_forged_by_a_pod_without_a_gpu_request_blocks_no_one() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(LIMIT, async {
        let w = world().await;
        let g = w.gpus[4].clone();
        let entry = encode(&[vec![grant(&g, 196_608, 304)]]);
        let record = json!({g.id.clone(): "0-303"}).to_string();
        w.api.put_pod(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "squatter", "namespace": "default", "annotations": {
                "hami.io/vgpu-node": NODE, "hami.io/bind-phase": "success",
                "hami.io/amd-devices-allocated": entry, "hami.io/amd-cu-allocated": record}},
            "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "x"}]},
            "status": {"phase": "Running"}}));
        common::world::schedule(&w.api, "honest", &[(&g, 1024, 76)], 4000);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let answer = w.kubelet.allocate(vec![format!("{}#0", g.id)]).await;
        let envs = answer.unwrap().envs;
        assert_eq!(envs["HSA_CU_MASK"], "0:0-75", "{envs:?}");
        assert_eq!(bind_phase(&w, "honest").as_deref(), Some("success"));
    });
}

/// Defect 4, the rest: the squatter's spec does ask for a GPU, so the spec
/// cannot tell it from an honest pod; but kubelet never admitted it with
/// our devices (pod-resources lists none for it), so its forged whole-GPU
/// grant and record hold no CU, and the Warning names the squatter, not
/// the honest pod. Before, every later pod on that GPU failed Allocate.
#[test]
fn a_whole_gpu_forged_by_a_pod_kubelet_never_admitted_blocks_no_one() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(LIMIT, async {
        let pod_resources = tests::kubelet::pod_resources::FakePodResources::start().unwrap();
        let args = [
            "--pod-resources-socket".to_owned(),
            pod_resources.socket().display().to_string(),
        ];
        let w = world_with(&Setup {
            fixture: "mi300x-8-spx",
            devices: 80,
            gpud_args: &[],
            plugin_args: &args,
            prepare: &|_| {},
        })
        .await;
        let g = w.gpus[5].clone();
        // An honest pod first, admitted by kubelet.
        common::world::schedule(&w.api, "first", &[(&g, 1024, 38)], 4000);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let id = format!("{}#0", g.id);
        let answer = w.kubelet.allocate(vec![id.clone()]).await.unwrap();
        assert_eq!(answer.envs["HSA_CU_MASK"], "0:0-37");
        pod_resources.assign("default", "first", "c", "amd.com/gpu", &[id]);

        let entry = encode(&[vec![grant(&g, 196_608, 304)]]);
        let record = json!({g.id.clone(): "0-303"}).to_string();
        w.api.put_pod(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "squatter", "namespace": "default",
                "creationTimestamp": "2020-01-01T00:00:00Z", "annotations": {
                "hami.io/vgpu-node": NODE, "hami.io/bind-phase": "success",
                "hami.io/amd-devices-allocated": entry, "hami.io/amd-cu-allocated": record}},
            "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "x",
                "resources": {"limits": {"amd.com/gpu": "1"}}}]},
            "status": {"phase": "Running"}}));
        common::world::schedule(&w.api, "second", &[(&g, 1024, 38)], 4001);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let answer = w.kubelet.allocate(vec![format!("{}#1", g.id)]).await;
        let envs = answer.unwrap().envs;
        assert_eq!(
            envs["HSA_CU_MASK"], "0:38-75",
            "around the first pod: {envs:?}"
        );
        // Events are sent in the background: wait for the squatter's.
        let untrusted = || -> Vec<Value> {
            w.api
                .events()
                .into_iter()
                .filter(|e| e["reason"] == "UntrustedCuClaim")
                .collect()
        };
        let start = std::time::Instant::now();
        while !untrusted()
            .iter()
            .any(|e| e["regarding"]["name"] == "squatter")
        {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "no Event on the squatter: {:?}",
                w.api.events()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let untrusted = untrusted();
        assert!(
            !untrusted.iter().any(|e| e["regarding"]["name"] == "first"),
            "the honest pod is not blamed: {untrusted:?}"
        );
    });
}
