//! Allocate end to end for pods that are more than one container, and for
//! pods whose users edited the plugin's CU record: init containers lending
//! their CUs to the app containers (across a plugin restart), and every
//! forged-annotation case reported with an Event and never blocking others.
//! Needs root (private bus).

// An integration-test file is itself the test module, and a failed unwrap is a
// failed test here.
#![allow(clippy::tests_outside_test_module, clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::world::{
    Gpu, NODE, World, event_where, grant, pod_annotation, released, schedule, world,
};
use serde_json::{Value, json};
use tests::{
    apiserver::{FakeApiServer, Kind},
    hami_emulator::HamiEmulator,
};

const CUS: &str = "hami.io/amd-cu-allocated";
const SPARE: &str = "hami.io/amd-cu-init-spare";

fn cus_of(api: &FakeApiServer, pod: &str, gpu: &Gpu) -> Option<String> {
    let value: Value = serde_json::from_str(&pod_annotation(api, pod, CUS)?).unwrap();
    value[&gpu.id].as_str().map(str::to_owned)
}

async fn settle() {
    tokio::time::sleep(Duration::from_millis(300)).await; // the watch delivers the pod
}

async fn mask(w: &World, gpu: &Gpu, slot: usize) -> String {
    let answer = w
        .kubelet
        .allocate(vec![format!("{}#{slot}", gpu.id)])
        .await
        .unwrap();
    answer.envs["HSA_CU_MASK"].clone()
}

#[test]
fn init_containers_lend_their_cus_to_app_containers() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(Duration::from_secs(120), init_and_app());
}

async fn init_and_app() {
    let mut w = world().await;
    let g5 = &w.gpus[5];
    let hami = HamiEmulator {
        node: NODE.to_owned(),
    };
    // HAMi counts max(init 152, app 76 + 38) = 152 CUs for this pod.
    let init = vec![vec![grant(g5, 8192, 152)]];
    let app = vec![vec![grant(g5, 4096, 76)], vec![grant(g5, 2048, 38)]];
    hami.bind_staged(&w.api, "staged", &init, &app, 300);
    settle().await;
    assert_eq!(mask(&w, g5, 0).await, "0:0-151", "the init container");
    assert_eq!(cus_of(&w.api, "staged", g5).as_deref(), Some("0-151"));
    let g5_id = g5.id.clone();
    w.restart_plugin().await;
    let g5 = w.gpus.iter().find(|g| g.id == g5_id).unwrap();
    assert_eq!(
        mask(&w, g5, 1).await,
        "0:0-75",
        "the first app container reuses the init CUs, across a restart"
    );
    assert_eq!(mask(&w, g5, 2).await, "0:76-113", "never the first app's");
    assert_eq!(
        pod_annotation(&w.api, "staged", "hami.io/bind-phase").as_deref(),
        Some("success")
    );
    assert!(released(&w.api).await, "the lock is released");
    assert_eq!(cus_of(&w.api, "staged", g5).as_deref(), Some("0-151"));
    let spare: Value =
        serde_json::from_str(&pod_annotation(&w.api, "staged", SPARE).unwrap()).unwrap();
    assert_eq!(spare, json!({ g5.id.clone(): "114-151" }));

    // While the init container has not run, its spare CUs stay reserved.
    schedule(&w.api, "neighbour", &[(g5, 1024, 152)], 301);
    settle().await;
    assert_eq!(mask(&w, g5, 3).await, "0:152-303");

    // Once it has succeeded, they are free again, as HAMi counts them.
    let mut pod = w.api.get(Kind::Pod, "default", "staged").unwrap();
    pod["status"] = json!({"phase": "Running", "initContainerStatuses": [{
        "name": "init-0", "image": "rocm", "imageID": "", "ready": false, "restartCount": 0,
        "state": {"terminated": {"exitCode": 0}}}]});
    w.api.put_pod(pod);
    schedule(&w.api, "late", &[(g5, 1024, 38)], 302);
    settle().await;
    assert_eq!(mask(&w, g5, 4).await, "0:114-151");
}

#[test]
fn forged_cu_claims_are_reported_and_never_block_other_pods() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(Duration::from_secs(120), forged_claims());
}

/// Waits for the plugin's Warning Event about `pod`, and returns its note.
async fn untrusted_event(api: &FakeApiServer, pod: &str) -> String {
    let event = event_where(api, &format!("UntrustedCuClaim about {pod}"), |e| {
        e["regarding"]["name"] == pod
            && e["regarding"]["kind"] == "Pod"
            && e["reason"] == "UntrustedCuClaim"
            && e["type"] == "Warning"
    })
    .await;
    event["note"].as_str().unwrap_or_default().to_owned()
}

fn events_about(api: &FakeApiServer, pod: &str) -> usize {
    api.events()
        .iter()
        .filter(|e| e["regarding"]["name"] == pod)
        .count()
}

/// A running pod as a user left it: HAMi granted `granted` (id, CUs), the
/// CU record says `claimed`.
fn forged_pod(api: &FakeApiServer, name: &str, granted: (&Gpu, u32), claimed: Value) {
    let entry = format!(
        "{},{},1024,{}:;",
        granted.0.id, granted.0.device_type, granted.1
    );
    api.put_pod(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "annotations": {
            "hami.io/vgpu-node": NODE,
            "hami.io/amd-devices-allocated": entry,
            "hami.io/amd-devices-to-allocate": ";",
            "hami.io/bind-phase": "success",
            CUS: claimed.to_string(),
        }},
        // It asks for a GPU, as pods HAMi granted one do: the claim is then
        // judged against its grant (tests/tests/forged_binding.rs has one
        // that asks for none).
        "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "rocm",
                 "resources": {"limits": {"amd.com/gpu": "1"}}}]},
        "status": {"phase": "Running"}
    }));
}

async fn forged_claims() {
    let mut w = world().await;
    let (g6, g7) = (&w.gpus[6], &w.gpus[7]);
    schedule(&w.api, "honest", &[(g6, 1024, 76)], 400);
    settle().await;
    assert_eq!(mask(&w, g6, 0).await, "0:0-75");
    schedule(&w.api, "editor", &[(g6, 1024, 38)], 401);
    settle().await;
    assert_eq!(mask(&w, g6, 1).await, "0:76-113");
    schedule(&w.api, "older", &[(g7, 1024, 76)], 402);
    settle().await;
    assert_eq!(mask(&w, g7, 0).await, "0:0-75");

    // An edit of a record this plugin wrote: its own record still counts.
    let mut pod = w.api.get(Kind::Pod, "default", "editor").unwrap();
    pod["metadata"]["annotations"][CUS] = json!(json!({ g6.id.clone(): "0-303" }).to_string());
    w.api.put_pod(pod);
    schedule(&w.api, "after-edit", &[(g6, 1024, 38)], 403);
    settle().await;
    assert_eq!(
        mask(&w, g6, 2).await,
        "0:114-151",
        "the editor keeps 76-113"
    );
    let note = untrusted_event(&w.api, "editor").await;
    assert!(note.contains("edited after the plugin wrote it"), "{note}");

    // A restarted plugin has no record: the checks judge each claim.
    let (g6_id, g7_id) = (g6.id.clone(), g7.id.clone());
    w.restart_plugin().await;
    let g6 = w.gpus.iter().find(|g| g.id == g6_id).unwrap();
    let g7 = w.gpus.iter().find(|g| g.id == g7_id).unwrap();
    forged_pod(
        &w.api,
        "greedy",
        (g7, 38),
        json!({ g7.id.clone(): "152-303" }),
    );
    forged_pod(
        &w.api,
        "stranger",
        (g6, 38),
        json!({ g7.id.clone(): "200-237" }),
    );
    forged_pod(
        &w.api,
        "overlapper",
        (g7, 38),
        json!({ g7.id.clone(): "38-75" }),
    );
    schedule(&w.api, "fresh", &[(g7, 1024, 228)], 404);
    settle().await;
    assert_eq!(
        mask(&w, g7, 1).await,
        "0:76-303",
        "no forged claim blocks the rest of the GPU, the overlap adds nothing"
    );
    let greedy = untrusted_event(&w.api, "greedy").await;
    assert!(
        greedy.contains("claims 152 CUs") && greedy.contains("granted the pod 38"),
        "{greedy}"
    );
    let stranger = untrusted_event(&w.api, "stranger").await;
    assert!(stranger.contains("did not grant"), "{stranger}");
    let overlapper = untrusted_event(&w.api, "overlapper").await;
    assert!(
        overlapper.contains("also claimed by another pod"),
        "{overlapper}"
    );

    // Reported once per forgery, however many Allocates follow.
    let g0 = &w.gpus[0];
    schedule(&w.api, "one-more", &[(g0, 1024, 38)], 405);
    settle().await;
    assert_eq!(mask(&w, g0, 0).await, "0:0-37");
    tokio::time::sleep(Duration::from_millis(300)).await;
    for pod in ["greedy", "stranger", "overlapper"] {
        assert_eq!(events_about(&w.api, pod), 1, "{pod}");
    }
}

#[test]
fn a_pod_bound_without_the_lock_is_admitted_whatever_the_lock_says() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(Duration::from_secs(120), racing_binds());
}

/// Issue 35, point 1, as real HAMi v2.10.0 did it: HAMi takes the node lock
/// for an app pod, and before that pod's Binding binds a pod whose AMD
/// request is in init containers only, without the lock; kubelet admits the
/// second pod at once. Then a lock that outlived its pod.
async fn racing_binds() {
    let w = world().await;
    let (g2, g3) = (&w.gpus[2], &w.gpus[3]);
    let hami = HamiEmulator {
        node: NODE.to_owned(),
    };
    hami.lock_before_binding(&w.api, "r-app", &[vec![grant(g2, 1024, 76)]], 500);
    let init = vec![vec![grant(g3, 2048, 38)]];
    hami.bind_staged(&w.api, "r-init", &init, &[], 501);
    settle().await;
    assert_eq!(
        mask(&w, g3, 0).await,
        "0:0-37",
        "the init-only pod, bound while r-app holds the lock"
    );
    assert_eq!(
        pod_annotation(&w.api, "r-init", "hami.io/bind-phase").as_deref(),
        Some("success")
    );
    assert_eq!(
        common::world::lock(&w.api).as_deref(),
        Some("2026-11-29T08:00:00Z,default,r-app"),
        "r-app's lock is r-app's to release"
    );
    hami.complete_binding(&w.api, "r-app");
    settle().await;
    assert_eq!(mask(&w, g2, 0).await, "0:0-75", "the lock owner, bound now");
    assert!(released(&w.api).await, "r-app's lock is released");

    // A lock whose owner is gone: init-only pods are admitted all the same.
    hami.stale_lock(&w.api, "gone");
    hami.bind_staged(&w.api, "s-init", &init, &[], 502);
    settle().await;
    assert_eq!(
        mask(&w, g3, 1).await,
        "0:38-75",
        "r-init's init CUs stay held"
    );
    assert_eq!(
        pod_annotation(&w.api, "s-init", "hami.io/bind-phase").as_deref(),
        Some("success")
    );
    assert!(
        common::world::lock(&w.api).is_some(),
        "a stale lock is HAMi's to take over, not ours to release"
    );
    // No refusal was reported on the way.
    let refused = w
        .api
        .events()
        .into_iter()
        .filter(|e| e["reason"] == "AllocateRefused" || e["reason"] == "AllocateFailed");
    assert_eq!(refused.count(), 0, "{:?}", w.api.events());
}

#[test]
fn a_refused_allocate_is_a_warning_event_on_the_node() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(Duration::from_secs(120), async {
        let w = world().await;
        let g4 = &w.gpus[4];
        let refused = w.kubelet.allocate(vec![format!("{}#0", g4.id)]).await;
        let err = refused.unwrap_err().to_string();
        assert!(err.contains("no binding pod found"), "{err}");
        event_where(&w.api, "AllocateRefused on the node", |e| {
            e["reason"] == "AllocateRefused"
                && e["regarding"]["kind"] == "Node"
                && e["type"] == "Warning"
                && e["note"]
                    .as_str()
                    .is_some_and(|n| n.contains("no binding pod found"))
        })
        .await;
    });
}

#[test]
fn a_pod_hami_places_on_a_running_sidecars_cus_is_refused() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(Duration::from_secs(120), sidecar_undercount());
}

/// HAMi v2.10.0 counts a sidecar as an init-container peak, so a pod with a
/// sidecar and an app container at half a GPU each counts as half the GPU
/// while both run, and HAMi places a second half-GPU pod there. The plugin
/// gives no CU twice: the second pod's container is refused (CuConflict)
/// and its bind-phase says failed (docs/hami-protocol.md §7).
async fn sidecar_undercount() {
    let w = world().await;
    let g1 = &w.gpus[1];
    let hami = HamiEmulator {
        node: NODE.to_owned(),
    };
    let half = json!({"limits": {"amd.com/gpu": "1", "amd.com/gpucores": "50",
                                 "amd.com/gpumem": "65536"}});
    let pinned = json!({"amd.com/use-gpu-uuid": g1.id});
    let sidecar = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "with-sidecar", "annotations": pinned},
        "spec": {
            "initContainers": [{"name": "side", "image": "rocm", "restartPolicy": "Always",
                                "resources": half}],
            "containers": [{"name": "app", "image": "rocm", "resources": half}]}});
    let placed = hami
        .schedule(
            &w.api,
            &sidecar,
            700,
            tests::hami_emulator::request::GpuPolicy::Spread,
        )
        .unwrap();
    assert_eq!(placed.grants.len(), 2);
    settle().await;
    assert_eq!(mask(&w, g1, 0).await, "0:0-151", "the sidecar");
    assert_eq!(mask(&w, g1, 1).await, "0:152-303", "the app, beside it");
    let mut pod = w.api.get(Kind::Pod, "default", "with-sidecar").unwrap();
    pod["status"] = json!({"phase": "Running", "initContainerStatuses": [{
        "name": "side", "image": "rocm", "imageID": "", "ready": true, "restartCount": 0,
        "started": true, "state": {"running": {}}}]});
    w.api.put_pod(pod);

    let second = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "second", "annotations": pinned},
        "spec": {"containers": [{"name": "c", "image": "rocm", "resources": half}]}});
    hami.schedule(
        &w.api,
        &second,
        701,
        tests::hami_emulator::request::GpuPolicy::Spread,
    )
    .expect("HAMi v2.10.0 counts the GPU half used");
    settle().await;
    let refused = w.kubelet.allocate(vec![format!("{}#2", g1.id)]).await;
    let err = refused.unwrap_err().to_string();
    assert!(err.contains("second"), "{err}");
    assert_eq!(
        pod_annotation(&w.api, "second", "hami.io/bind-phase").as_deref(),
        Some("failed")
    );
    event_where(&w.api, "CuConflict about second", |e| {
        e["reason"] == "CuConflict" && e["regarding"]["name"] == "second"
    })
    .await;
}
