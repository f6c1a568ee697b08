//! The second test of `real_kubelet_faults.rs`: amd-gpud, then the bus
//! broker, restarted while pods run.

use std::time::{Duration, Instant};

use serde_json::Value;
use tests::cluster::kubelet::KUBELET_NODE;

use super::{
    cap_line, capped_scene, cgroup_of,
    common::{
        cluster::eventually,
        real_node::{Scene, created_for, registered, wait_running},
    },
    place, pod_spec,
};

/// The plugin's `amdgpu_dp_gpud_connected` (`None` while `/metrics` does
/// not answer).
fn gpud_connected(metrics: std::net::SocketAddr) -> Option<bool> {
    let (code, body) = tests::stack::http_get(metrics, "/metrics").ok()?;
    let value = body
        .lines()
        .find_map(|l| l.strip_prefix("amdgpu_dp_gpud_connected "))?;
    (code == 200).then(|| value.trim() == "1")
}

/// Waits until the plugin says it is (or is not) connected to amd-gpud.
async fn connected_is(metrics: std::net::SocketAddr, want: bool) {
    let what = format!("amdgpu_dp_gpud_connected {}", u8::from(want));
    let seen = || async { (gpud_connected(metrics)? == want).then_some(()) };
    eventually(Duration::from_secs(60), &what, seen).await;
}

/// A pod of the node with its cap.
struct Running {
    name: String,
    uid: String,
    cap: String,
}

/// Places `name` on `gpu`, waits until it runs with its cap.
async fn admit(scene: &Scene, name: &str, gpu: &Value) -> Running {
    let root = scene.node.root.path();
    let uid = place(&scene.cluster, root, name, gpu, &pod_spec(None));
    wait_running(&scene.pods, name, &scene.kubelet).await;
    let cap = std::fs::read_to_string(cgroup_of(root, &uid).join("dmem.max")).unwrap();
    assert_eq!(cap, cap_line(gpu), "{name}: its VRAM cap");
    Running {
        name: name.to_owned(),
        uid,
        cap,
    }
}

/// Every pod still Running, never restarted nor created again, its cap
/// as it was; every device healthy in the register annotation.
async fn undisturbed(scene: &Scene, running: &[Running], after: &str) {
    let created = scene.kubelet.requests("CreateContainer");
    for pod in running {
        let name = &pod.name;
        let status = scene.pods.get(name).await.unwrap().status.unwrap();
        assert_eq!(status.phase.as_deref(), Some("Running"), "{after}: {name}");
        let restarts: i32 = status
            .container_statuses
            .iter()
            .flatten()
            .map(|c| c.restart_count)
            .sum();
        assert_eq!(restarts, 0, "{after}: {name} {status:?}");
        assert_eq!(created_for(&created, name).len(), 1, "{after}: {name}");
        let root = scene.node.root.path();
        let cap = std::fs::read_to_string(cgroup_of(root, &pod.uid).join("dmem.max"));
        assert_eq!(cap.unwrap(), pod.cap, "{after}: {name}'s cap");
    }
    let healthy = || async {
        let devices = registered(&scene.nodes, KUBELET_NODE).await;
        devices.iter().all(|d| d["health"] == true).then_some(())
    };
    eventually(Duration::from_secs(60), "every device healthy", healthy).await;
}

/// Pods running with their caps; amd-gpud restarted, then the bus: each
/// time no pod is disturbed and a new pod is admitted with its cap.
pub async fn restarts() {
    let port = tests::stack::free_port().unwrap();
    let metrics = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut scene = capped_scene(&["--metrics-address".into(), metrics.to_string()]).await;
    let devices = registered(&scene.nodes, KUBELET_NODE).await;
    let mut running = Vec::new();
    for (i, name) in ["r0", "r1", "r2"].into_iter().enumerate() {
        running.push(admit(&scene, name, &devices[i]).await);
    }
    connected_is(metrics, true).await;

    // amd-gpud restarted (systemctl restart): no cap is rewritten or lost.
    scene.node.stop_gpud();
    connected_is(metrics, false).await;
    let start = Instant::now();
    let gpud_floor = scene.node.start_gpud();
    connected_is(metrics, true).await;
    let gpud_back = start.elapsed();
    undisturbed(&scene, &running, "after amd-gpud's restart").await;
    running.push(admit(&scene, "after-gpud", &devices[3]).await);

    // The broker restarted: amd-gpud exits (it lost the bus) and is started
    // again; the plugin reconnects by itself.
    scene.node.bus.kill();
    scene.node.wait_gpud_exit();
    connected_is(metrics, false).await;
    let start = Instant::now();
    scene.node.bus.restart().unwrap();
    let bus_up = start.elapsed();
    scene.node.start_gpud();
    let bus_floor = start.elapsed();
    connected_is(metrics, true).await;
    let bus_back = start.elapsed();
    undisturbed(&scene, &running, "after the bus's restart").await;
    admit(&scene, "after-bus", &devices[4]).await;
    println!(
        "amd-gpud restarted: the plugin connected again {:.2} s after its start (amd-gpud \
         owned its name after {:.2} s); the bus restarted: the plugin connected again after \
         {:.2} s (the bus accepted after {:.2} s, amd-gpud owned its name after {:.2} s)",
        gpud_back.as_secs_f64(),
        gpud_floor.as_secs_f64(),
        bus_back.as_secs_f64(),
        bus_up.as_secs_f64(),
        bus_floor.as_secs_f64(),
    );
}
