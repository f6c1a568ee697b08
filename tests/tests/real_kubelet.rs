//! The real kubelet (issue 18): kubelet v1.36.3 built by
//! `tests/cluster/build.sh`, with `recording-cri` as its runtime, registers
//! its Node in the real API server; the plugin registers with it, kubelet
//! publishes the plugin's devices as the Node's capacity, and a pod HAMi
//! placed is admitted by kubelet, which calls Allocate itself, and created
//! by the runtime with what the plugin answered. Needs root.

// An integration-test file is itself the test module, and a failed unwrap is a
// failed test here.
#![allow(clippy::tests_outside_test_module, clippy::unwrap_used)]

mod common;

use std::time::Duration;

use serde_json::Value;

use tests::cluster::kubelet::{KUBELET_NODE, KubeletVersion, RealKubelet, container_env};

use common::{
    cluster::{LIMIT, eventually, hami_binds},
    real_node::{
        PluginUser, Scene, capacity, container_paths, created_for, registered, scene, wait_running,
    },
};

/// What the runtime was asked to give `job`'s container: 76 CUs and 4 GiB
/// of `gpu` (its register entry: ROCr selects it by the ROCr UUID the entry
/// shows, not by its id, AMD SMI's UUID), the memory hook, `/dev/kfd`.
fn check_created(kubelet: &RealKubelet, gpu: &Value) {
    let gpu = gpu["custominfo"]["rocrVisibleDevice"].as_str().unwrap();
    let created = kubelet.requests("CreateContainer");
    let job = *created_for(&created, "job")
        .first()
        .unwrap_or_else(|| panic!("no CreateContainer for job: {created:?}"));
    let env = container_env(job);
    let value = |key: &str| env.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
    assert_eq!(value("HSA_CU_MASK"), Some("0:0-75"), "{env:?}");
    assert_eq!(value("HIP_DEVICE_MEMORY_LIMIT_0"), Some("4096m"), "{env:?}");
    assert_eq!(value("ROCR_VISIBLE_DEVICES"), Some(gpu), "{env:?}");
    let hook = "/usr/local/vgpu/libamvgpu.so";
    assert_eq!(value("LD_AUDIT"), Some(hook), "{env:?}");
    let mounts = container_paths(job, "mounts");
    assert!(mounts.contains(&hook), "{mounts:?}");
    let devices = container_paths(job, "devices");
    assert!(devices.contains(&"/dev/kfd"), "{devices:?}");
}

#[test]
fn the_real_kubelet_admits_a_pod_through_the_plugin() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(LIMIT, admits_a_pod(KubeletVersion::Pinned));
}

/// The same with the oldest kubelet minor still supported upstream (1.35)
/// against the 1.36 control plane: version skew the plugin must live with.
#[test]
fn the_oldest_supported_kubelet_admits_a_pod_through_the_plugin() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(LIMIT, admits_a_pod(KubeletVersion::Oldest));
}

async fn admits_a_pod(version: KubeletVersion) {
    let Scene {
        cluster,
        kubelet,
        nodes,
        pods,
        node: _node,
    } = scene(version, PluginUser::Root).await;
    let node = nodes.get(KUBELET_NODE).await.unwrap();
    let info = node
        .status
        .clone()
        .unwrap_or_default()
        .node_info
        .unwrap_or_default();
    let expected = match version {
        KubeletVersion::Pinned => "v1.36.",
        KubeletVersion::Oldest => "v1.35.",
    };
    assert!(info.kubelet_version.starts_with(expected), "{info:?}");
    let devices = registered(&nodes, KUBELET_NODE).await;
    hami_binds(&cluster, "job", KUBELET_NODE, &devices[0], (76, 4096));
    wait_running(&pods, "job", &kubelet).await;
    check_created(&kubelet, &devices[0]);
    let pod = pods.get("job").await.unwrap();
    assert_eq!(
        pod.metadata.annotations.unwrap()["hami.io/bind-phase"],
        "success"
    );
}

/// Kubelet's log line when a device plugin registers.
const REGISTERED: &str = "Got registration request from device plugin";

/// Restarts kubelet; how long until its device manager listened again (the
/// floor: nothing can register before) and until the plugin had registered.
async fn restart_and_time(kubelet: &mut RealKubelet) -> (Duration, Duration) {
    let start = std::time::Instant::now();
    kubelet.restart().unwrap();
    let listening = start.elapsed();
    while kubelet.log_count(REGISTERED) == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the plugin did not register with the restarted kubelet\n{}",
            kubelet.log_tail("kubelet")
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (listening, start.elapsed())
}

/// The median and the slowest of `times`, in seconds.
fn median_max(mut times: Vec<Duration>) -> (f64, f64) {
    times.sort_unstable();
    let at = |i: usize| times.get(i).map_or(0.0, Duration::as_secs_f64);
    (at(times.len() / 2), at(times.len().saturating_sub(1)))
}

/// 20 kubelet restarts (`KUBELET_RESTARTS` for another number): the plugin
/// registers with each new kubelet, the running pod keeps its container
/// (never created again, never failed by admission), and a pod placed
/// after the last restart is admitted through the plugin.
#[test]
fn kubelet_restarts_keep_running_pods_and_the_plugin_registers_again() {
    if !common::can_run_bus_tests() {
        return;
    }
    let restarts: usize = std::env::var("KUBELET_RESTARTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    common::run_async(LIMIT, async move {
        let Scene {
            cluster,
            mut kubelet,
            nodes,
            pods,
            node: _node,
        } = scene(KubeletVersion::Pinned, PluginUser::Root).await;
        let devices = registered(&nodes, KUBELET_NODE).await;
        hami_binds(&cluster, "job", KUBELET_NODE, &devices[0], (76, 4096));
        wait_running(&pods, "job", &kubelet).await;

        let mut floors = Vec::with_capacity(restarts);
        let mut times = Vec::with_capacity(restarts);
        let mut last_kill = std::time::Instant::now();
        for _ in 0..restarts {
            last_kill = std::time::Instant::now();
            let (floor, time) = restart_and_time(&mut kubelet).await;
            floors.push(floor);
            times.push(time);
        }
        let ((f50, fmax), (t50, tmax)) = (median_max(floors), median_max(times));
        println!(
            "{restarts} kubelet restarts, from the kill: the plugin registered again after \
             {t50:.2} s median, {tmax:.2} s slowest; kubelet's device manager listened \
             after {f50:.2} s median, {fmax:.2} s slowest"
        );
        let job = pods.get("job").await.unwrap().status.unwrap_or_default();
        assert_eq!(job.phase.as_deref(), Some("Running"), "{job:?}");
        assert_eq!(job.reason, None, "{job:?}");
        assert_eq!(
            created_for(&kubelet.requests("CreateContainer"), "job").len(),
            1,
            "the container is not created again"
        );

        hami_binds(&cluster, "after", KUBELET_NODE, &devices[1], (76, 4096));
        wait_running(&pods, "after", &kubelet).await;
        let created = kubelet.requests("CreateContainer");
        assert_eq!(created_for(&created, "after").len(), 1);
        // kubelet's first status after a start counts no device of a
        // plugin that has not registered yet (0, which HAMi reads as
        // unhealthy); the next one counts them again.
        let since = last_kill.elapsed();
        let back = || async {
            let count = capacity(&nodes, KUBELET_NODE, "amd.com/gpu").await?;
            (count == "80").then_some(())
        };
        eventually(Duration::from_secs(30), "amd.com/gpu capacity 80", back).await;
        println!(
            "the Node's amd.com/gpu capacity was 80 again {:.1} s after the last kill \
             (the pod placed after it took {:.1} s of that)",
            last_kill.elapsed().as_secs_f64(),
            since.as_secs_f64()
        );
    });
}

/// The plugin as its own UID 60700 (landlock as strict as this kernel
/// allows) registers with the real kubelet: amd-gpud gives the UID its ACL
/// entries on kubelet's real, root-owned directories, and a pod is admitted.
#[test]
fn the_plugin_as_its_own_uid_registers_with_the_real_kubelet() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(LIMIT, async {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let Scene {
            cluster,
            kubelet,
            nodes,
            pods,
            node: _node,
        } = scene(KubeletVersion::Pinned, PluginUser::Own).await;
        let mode = std::fs::metadata(kubelet.device_plugin_dir())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(
            mode & 0o002,
            0,
            "kubelet's directory: only an ACL lets the plugin in"
        );
        let socket = kubelet.device_plugin_dir().join("amd.com_gpu.sock");
        let owner = std::fs::metadata(&socket).unwrap().uid();
        assert_eq!(owner, tests::bus::PLUGIN_UID, "made by the plugin's UID");
        let devices = registered(&nodes, KUBELET_NODE).await;
        hami_binds(&cluster, "job", KUBELET_NODE, &devices[0], (76, 4096));
        wait_running(&pods, "job", &kubelet).await;
        check_created(&kubelet, &devices[0]);
    });
}
