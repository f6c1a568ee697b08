//! Hard VRAM caps end to end: amd-gpud with a fake dmem cgroup tree
//! (`--dmem-any-fs`), the plugin with `--dmem-backend on`, the fake kubelet
//! calling Allocate for two AMD containers of one pod and PreStartContainer
//! before each start (the pod cgroup exists by then), and kubelet's
//! pod-resources API for a plugin restarted in between. The pod's `dmem.max`
//! ends with one line per GPU holding what its containers that run at once
//! were granted (`gpumem`), never more than HAMi counts for the pod.
//! Needs root (private bus).

// An integration-test file is itself the test module, and a failed unwrap is a
// failed test here.
#![allow(clippy::tests_outside_test_module, clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::world::{Gpu, NODE, Setup, World, grant, schedule_containers, world_with};
use serde_json::json;
use tests::{
    apiserver::Kind,
    fixture::{
        self,
        cgroup::{CgroupDriver, QosClass, add_pod, write_dmem_cgroups},
    },
    hami_emulator::HamiEmulator,
    kubelet::pod_resources::FakePodResources,
};

const MIB: u64 = 1 << 20;

#[test]
fn a_pods_vram_cap_is_the_sum_of_its_containers() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(Duration::from_secs(120), two_containers_one_cap());
}

fn dmem_tree(root: &std::path::Path) {
    dmem_tree_of("mi300x-8-spx", root);
}

fn dmem_tree_of(name: &str, root: &std::path::Path) {
    let spec = fixture::named(name).unwrap();
    write_dmem_cgroups(&spec, root, CgroupDriver::Systemd).unwrap();
}

async fn capped_world(pod_resources: &FakePodResources, mode: &str) -> World {
    let plugin_args = [
        "--dmem-backend".to_owned(),
        mode.to_owned(),
        "--pod-resources-socket".to_owned(),
        pod_resources.socket().display().to_string(),
    ];
    world_with(&Setup {
        fixture: "mi300x-8-spx",
        devices: 80,
        gpud_args: &["--dmem-any-fs"],
        plugin_args: &plugin_args,
        prepare: &dmem_tree,
    })
    .await
}

fn uid_of(w: &World, pod: &str) -> String {
    let pod = w.api.get(Kind::Pod, "default", pod).unwrap();
    pod["metadata"]["uid"].as_str().unwrap().to_owned()
}

async fn two_containers_one_cap() {
    let pod_resources = FakePodResources::start().unwrap();
    let mut w = capped_world(&pod_resources, "on").await;
    let options = w.kubelet.options().await.unwrap();
    assert!(options.pre_start_required, "the backend is on: {options:?}");
    let g0: &Gpu = &w.gpus[0];
    let first: &[(&Gpu, u32, u32)] = &[(g0, 4096, 76)];
    let second: &[(&Gpu, u32, u32)] = &[(g0, 2048, 38)];
    schedule_containers(&w.api, "capped", &[first, second], 500);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let ids_a = vec![format!("{}#0", g0.id)];
    let ids_b = vec![format!("{}#1", g0.id)];
    w.kubelet.allocate(ids_a.clone()).await.unwrap();
    w.kubelet.allocate(ids_b.clone()).await.unwrap();

    // Kubelet creates the pod cgroup, then calls PreStartContainer.
    let uid = uid_of(&w, "capped");
    let cgroup = add_pod(w.root(), CgroupDriver::Systemd, QosClass::Burstable, &uid).unwrap();
    w.kubelet.pre_start(ids_a.clone()).await.unwrap();
    let bdf = "0000:05:00.0";
    let want = format!("drm/{bdf}/vram {}\n", 6144 * MIB);
    let dmem_max = cgroup.join("dmem.max");
    assert_eq!(std::fs::read_to_string(&dmem_max).unwrap(), want);

    // A restarted plugin finds the pod through kubelet's pod-resources API.
    pod_resources.assign("default", "capped", "c0", "amd.com/gpu", &ids_a);
    pod_resources.assign("default", "capped", "c1", "amd.com/gpu", &ids_b);
    w.restart_plugin().await;
    std::fs::write(&dmem_max, "").unwrap();
    w.kubelet.pre_start(ids_b).await.unwrap();
    assert_eq!(
        std::fs::read_to_string(&dmem_max).unwrap(),
        want,
        "the same pod total, written again after the restart"
    );
}

#[test]
fn a_cap_that_cannot_be_set_fails_the_start_only_when_required() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(Duration::from_secs(120), missing_cgroup());
}

async fn missing_cgroup() {
    let pod_resources = FakePodResources::start().unwrap();
    let w = capped_world(&pod_resources, "on").await;
    let g1 = &w.gpus[1];
    let only: &[(&Gpu, u32, u32)] = &[(g1, 1024, 38)];
    schedule_containers(&w.api, "no-cgroup", &[only], 501);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let ids = vec![format!("{}#0", g1.id)];
    w.kubelet.allocate(ids.clone()).await.unwrap();
    // No pod cgroup: amd-gpud answers NotFound, and `on` fails the start.
    let err = w.kubelet.pre_start(ids).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("no-cgroup"), "{err:?}");
    drop(w);

    // With `auto` the container starts, and a Warning Event says why. The
    // plugin registers before it has heard from amd-gpud, and again (asking
    // for PreStartContainer) once amd-gpud reports its backend on.
    let w = capped_world(&pod_resources, "auto").await;
    let start = std::time::Instant::now();
    while !w
        .kubelet
        .options()
        .await
        .is_ok_and(|o| o.pre_start_required)
    {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "never asked for PreStartContainer"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let g1 = &w.gpus[1];
    let only: &[(&Gpu, u32, u32)] = &[(g1, 1024, 38)];
    schedule_containers(&w.api, "no-cgroup", &[only], 502);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let ids = vec![format!("{}#0", g1.id)];
    w.kubelet.allocate(ids.clone()).await.unwrap();
    w.kubelet.pre_start(ids).await.unwrap();
    common::world::event_where(&w.api, "VramCapNotApplied about no-cgroup", |e| {
        e["reason"] == "VramCapNotApplied" && e["regarding"]["name"] == "no-cgroup"
    })
    .await;
}

#[test]
fn caps_on_a_16_gib_gpu_add_up_to_at_most_the_gpu() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(Duration::from_secs(120), sixteen_gib());
}

/// The one capped region of a pod cgroup's `dmem.max` (the others `max`).
fn capped_bytes(cgroup: &std::path::Path) -> u64 {
    let text = std::fs::read_to_string(cgroup.join("dmem.max")).unwrap();
    let capped: Vec<u64> = text
        .lines()
        .filter_map(|l| l.rsplit_once(' ')?.1.parse().ok())
        .collect();
    assert_eq!(capped.len(), 1, "one capped region: {text}");
    capped[0]
}

/// Issue 35, point 3, as HAMi v2.10.0 placed it on an RX 9070 XT (16 GiB):
/// pod A's init container 12 GiB and its app 4 GiB; once A's init container
/// succeeded HAMi counts A at 4 GiB and places B with 12 GiB. The caps were
/// 16 + 12 = 28 GiB; now 4 + 12, the GPU.
async fn sixteen_gib() {
    let pod_resources = FakePodResources::start().unwrap();
    let plugin_args = [
        "--dmem-backend".to_owned(),
        "on".to_owned(),
        "--pod-resources-socket".to_owned(),
        pod_resources.socket().display().to_string(),
    ];
    let w = world_with(&Setup {
        fixture: "rx9070xt-igpu",
        devices: 3,
        gpud_args: &["--dmem-any-fs"],
        plugin_args: &plugin_args,
        prepare: &|root| dmem_tree_of("rx9070xt-igpu", root),
    })
    .await;
    let dgpu = w.gpus.iter().find(|g| !g.rocr_uuid.is_empty()).unwrap();
    let hami = HamiEmulator {
        node: NODE.to_owned(),
    };
    let init = vec![vec![grant(dgpu, 12 * 1024, 48)]];
    let app = vec![vec![grant(dgpu, 4 * 1024, 16)]];
    hami.bind_staged(&w.api, "a", &init, &app, 600);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (a_init, a_app) = (
        vec![format!("{}#0", dgpu.id)],
        vec![format!("{}#1", dgpu.id)],
    );
    w.kubelet.allocate(a_init.clone()).await.unwrap();
    w.kubelet.allocate(a_app.clone()).await.unwrap();
    let a = add_pod(
        w.root(),
        CgroupDriver::Systemd,
        QosClass::Burstable,
        &uid_of(&w, "a"),
    )
    .unwrap();
    w.kubelet.pre_start(a_init).await.unwrap();
    assert_eq!(
        capped_bytes(&a),
        12 * 1024 * MIB,
        "while A's init container runs"
    );
    let mut pod = w.api.get(Kind::Pod, "default", "a").unwrap();
    pod["status"] = json!({"phase": "Pending", "initContainerStatuses": [{
        "name": "init-0", "image": "rocm", "imageID": "", "ready": false, "restartCount": 0,
        "state": {"terminated": {"exitCode": 0}}}]});
    w.api.put_pod(pod);
    w.kubelet.pre_start(a_app).await.unwrap();
    assert_eq!(
        capped_bytes(&a),
        4 * 1024 * MIB,
        "from A's app container on"
    );

    schedule_containers(&w.api, "b", &[&[(dgpu, 12 * 1024, 48)]], 601);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let b_ids = vec![format!("{}#2", dgpu.id)];
    w.kubelet.allocate(b_ids.clone()).await.unwrap();
    let b = add_pod(
        w.root(),
        CgroupDriver::Systemd,
        QosClass::Burstable,
        &uid_of(&w, "b"),
    )
    .unwrap();
    w.kubelet.pre_start(b_ids).await.unwrap();
    assert_eq!(capped_bytes(&b), 12 * 1024 * MIB);
    assert_eq!(
        capped_bytes(&a) + capped_bytes(&b),
        16 * 1024 * MIB,
        "the two pods' caps add up to the GPU, as HAMi counts them"
    );
}
