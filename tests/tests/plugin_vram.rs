//! Hard VRAM caps end to end: amd-gpud with a fake dmem cgroup tree
//! (`--dmem-any-fs`), the plugin with `--dmem-backend on`, the fake kubelet
//! calling Allocate for two AMD containers of one pod and PreStartContainer
//! before each start (the pod cgroup exists by then), and kubelet's
//! pod-resources API for a plugin restarted in between. The pod's `dmem.max`
//! ends with one line per GPU holding the sum of its containers' `gpumem`.
//! Needs root (private bus).

// An integration-test file is itself the test module, and a failed unwrap is a
// failed test here.
#![allow(clippy::tests_outside_test_module, clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::world::{Gpu, Setup, World, schedule_containers, world_with};
use tests::{
    apiserver::Kind,
    fixture::{
        self,
        cgroup::{CgroupDriver, QosClass, add_pod, write_dmem_cgroups},
    },
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
    let spec = fixture::named("mi300x-8-spx").unwrap();
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
    let start = std::time::Instant::now();
    while !w
        .api
        .events()
        .iter()
        .any(|e| e["reason"] == "VramCapNotApplied" && e["regarding"]["name"] == "no-cgroup")
    {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{:?}",
            w.api.events()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
