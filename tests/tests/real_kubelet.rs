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

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use serde_json::Value;
use tests::{
    bus::{Policy, PrivateBus},
    cluster::{
        RealCluster,
        chart::{self, NAMESPACE},
        kubelet::{DEVICE_PLUGIN_DIR, KUBELET_NODE, KubeletVersion, RealKubelet, container_env},
    },
    stack,
};

use common::cluster::{LIMIT, add_pod, admin, apply_chart, eventually, hami_binds};

/// The Node's capacity of `resource`, once kubelet reports one.
async fn capacity(nodes: &Api<Node>, resource: &str) -> Option<String> {
    let node = nodes.get(KUBELET_NODE).await.ok()?;
    let quantity = node.status?.capacity?.get(resource)?.0.clone();
    Some(quantity)
}

async fn ready(nodes: &Api<Node>) -> Option<()> {
    let node = nodes.get(KUBELET_NODE).await.ok()?;
    let conditions = node.status?.conditions?;
    conditions
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True")
        .then_some(())
}

/// Who the plugin runs as.
#[derive(Clone, Copy, PartialEq, Eq)]
enum PluginUser {
    Root,
    /// Its own UID 60700, landlock as strict as this kernel allows: it
    /// gets into kubelet's root-owned directory only through the ACL entries
    /// amd-gpud gives it.
    Own,
}

/// amd-gpud and the plugin on the kubelet's node, the plugin with the
/// token of the chart's ServiceAccount bound to its pod; dropped together.
struct PluginNode {
    _plugin: stack::Process,
    _gpud: stack::Process,
    _bus: PrivateBus,
    _kubelet_dir: Option<KubeletDirInRoot>,
    _root: tempfile::TempDir,
}

fn plugin_node(cluster: &RealCluster, user: PluginUser) -> PluginNode {
    use std::os::unix::fs::PermissionsExt;
    let root = common::build_fixture("mi300x-8-spx");
    let kubelet_dir = (user == PluginUser::Own).then(|| {
        // The plugin's UID must reach the hook and its kubeconfig under it.
        std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        KubeletDirInRoot::mount(root.path())
    });
    let bus = PrivateBus::start(Policy::Shipped).unwrap();
    let gpud = stack::gpud(&common::fake_node_exe(), &bus, root.path(), 0).unwrap();
    apply_chart(cluster);
    add_pod(cluster, NAMESPACE, "plugin", KUBELET_NODE, chart::RELEASE);
    let token = cluster
        .pod_token(NAMESPACE, chart::RELEASE, "plugin")
        .unwrap();
    let shared = root.path().join("plugin-config");
    std::fs::create_dir_all(&shared).unwrap();
    let kubeconfig = cluster.kubeconfig_in(&shared, "plugin", &token).unwrap();
    for file in [&kubeconfig, &shared.join("apiserver.crt")] {
        std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let hook = common::world::install_hook(root.path());
    let plugin = match user {
        PluginUser::Root => {
            let args = [
                "--kube".as_ref(),
                kubeconfig.as_os_str(),
                "--node-name".as_ref(),
                KUBELET_NODE.as_ref(),
                "--hook-path".as_ref(),
                hook.as_ref(),
                "--sandbox".as_ref(),
                "best-effort".as_ref(),
            ];
            let dir = Path::new(DEVICE_PLUGIN_DIR);
            stack::plugin(&common::fake_node_exe(), &bus, dir, args).unwrap()
        }
        PluginUser::Own => plugin_as_own_uid(&bus, &kubeconfig, &hook),
    };
    PluginNode {
        _plugin: plugin,
        _gpud: gpud,
        _bus: bus,
        _kubelet_dir: kubelet_dir,
        _root: root,
    }
}

fn plugin_as_own_uid(bus: &PrivateBus, kubeconfig: &Path, hook: &str) -> stack::Process {
    let uid = tests::bus::PLUGIN_UID.to_string();
    let child = std::process::Command::new("setpriv")
        .args(["--reuid", &uid, "--regid", &uid, "--clear-groups", "--"])
        .arg(common::fake_node_exe())
        .args(["plugin", "--kube"])
        .arg(kubeconfig)
        .args(["--node-name", KUBELET_NODE, "--bus-address", &bus.address])
        .args(["--kubelet-dir", DEVICE_PLUGIN_DIR, "--hook-path", hook])
        .args([
            "--metrics-address",
            "none",
            "--sandbox",
            common::sandbox_mode(),
        ])
        .spawn()
        .unwrap();
    stack::Process(child)
}

/// Waits until kubelet reports `default/<name>` Running.
async fn wait_running(pods: &Api<Pod>, name: &str, kubelet: &RealKubelet) {
    let start = std::time::Instant::now();
    loop {
        let pod = pods.get(name).await.unwrap();
        let status = pod.status.unwrap_or_default();
        if status.phase.as_deref() == Some("Running") {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "pod {name} not Running: {status:?}\n{}",
            kubelet.log_tail("kubelet")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The container paths of a CreateContainer request's `field` (`mounts`,
/// `devices`).
fn container_paths<'a>(request: &'a Value, field: &str) -> Vec<&'a str> {
    request["config"][field]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["containerPath"].as_str())
        .collect()
}

/// What the runtime was asked to give `job`'s container: 76 CUs and 4 GiB
/// of `gpu`, the memory hook, `/dev/kfd`.
fn check_created(kubelet: &RealKubelet, gpu: &str) {
    let created = kubelet.requests("CreateContainer");
    let job = created
        .iter()
        .find(|r| r["sandboxConfig"]["metadata"]["name"] == "job")
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

/// A control plane, a kubelet of `version` whose Node is Ready, and the
/// plugin registered with it (the Node lists its 80 devices).
struct Scene {
    cluster: RealCluster,
    kubelet: RealKubelet,
    nodes: Api<Node>,
    pods: Api<Pod>,
    _node: PluginNode,
}

async fn scene(version: KubeletVersion, user: PluginUser) -> Scene {
    let cluster = RealCluster::start().unwrap();
    let client = admin(&cluster).await;
    let kubelet = RealKubelet::start_version(&cluster, version).unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    let node_ready = || ready(&nodes);
    let limit = Duration::from_secs(60);
    eventually(limit, "the kubelet's Node Ready", node_ready).await;
    let node = plugin_node(&cluster, user);
    // kubelet publishes what ListAndWatch lists: 8 GPUs x 10 slots.
    let gpus = || capacity(&nodes, "amd.com/gpu");
    let count = eventually(limit, "amd.com/gpu capacity", gpus).await;
    assert_eq!(count, "80", "{}", kubelet.log_tail("kubelet"));
    Scene {
        cluster,
        kubelet,
        nodes,
        pods: Api::namespaced(client, "default"),
        _node: node,
    }
}

/// The devices of the plugin's register annotation.
async fn registered(nodes: &Api<Node>) -> Vec<Value> {
    let node = nodes.get(KUBELET_NODE).await.unwrap();
    let register = &node.metadata.annotations.unwrap()["hami.io/node-amd-register"];
    serde_json::from_str(register).unwrap()
}

async fn admits_a_pod(version: KubeletVersion) {
    let Scene {
        cluster,
        kubelet,
        nodes,
        pods,
        _node,
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
    let devices = registered(&nodes).await;
    hami_binds(&cluster, "job", KUBELET_NODE, &devices[0], (76, 4096));
    wait_running(&pods, "job", &kubelet).await;
    check_created(&kubelet, devices[0]["id"].as_str().unwrap());
    let pod = pods.get("job").await.unwrap();
    assert_eq!(
        pod.metadata.annotations.unwrap()["hami.io/bind-phase"],
        "success"
    );
}

/// Kubelet's log line when a device plugin registers.
const REGISTERED: &str = "Got registration request from device plugin";

/// The CreateContainer requests for pod `name`.
fn created_for(kubelet: &RealKubelet, name: &str) -> usize {
    kubelet
        .requests("CreateContainer")
        .iter()
        .filter(|r| r["sandboxConfig"]["metadata"]["name"] == name)
        .count()
}

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
            _node,
        } = scene(KubeletVersion::Pinned, PluginUser::Root).await;
        let devices = registered(&nodes).await;
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
            created_for(&kubelet, "job"),
            1,
            "the container is not created again"
        );

        hami_binds(&cluster, "after", KUBELET_NODE, &devices[1], (76, 4096));
        wait_running(&pods, "after", &kubelet).await;
        assert_eq!(created_for(&kubelet, "after"), 1);
        // kubelet's first status after a start counts no device of a
        // plugin that has not registered yet (0, which HAMi reads as
        // unhealthy); the next one counts them again.
        let since = last_kill.elapsed();
        let back = || async {
            let count = capacity(&nodes, "amd.com/gpu").await?;
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

/// `/var/lib/kubelet` bind-mounted into the fixture's host root, where
/// amd-gpud (`--host-root`) looks for kubelet's directories; unmounted
/// when dropped.
struct KubeletDirInRoot(std::path::PathBuf);

impl KubeletDirInRoot {
    fn mount(root: &Path) -> Self {
        let at = root.join("var/lib/kubelet");
        std::fs::create_dir_all(&at).unwrap();
        let status = std::process::Command::new("mount")
            .args(["--bind", "/var/lib/kubelet"])
            .arg(&at)
            .status()
            .unwrap();
        assert!(
            status.success(),
            "mount --bind /var/lib/kubelet {}",
            at.display()
        );
        Self(at)
    }
}

impl Drop for KubeletDirInRoot {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
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
            _node,
        } = scene(KubeletVersion::Pinned, PluginUser::Own).await;
        let mode = std::fs::metadata(DEVICE_PLUGIN_DIR)
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(
            mode & 0o002,
            0,
            "kubelet's directory: only an ACL lets the plugin in"
        );
        let socket = Path::new(DEVICE_PLUGIN_DIR).join("amd.com_gpu.sock");
        let owner = std::fs::metadata(&socket).unwrap().uid();
        assert_eq!(owner, tests::bus::PLUGIN_UID, "made by the plugin's UID");
        let devices = registered(&nodes).await;
        hami_binds(&cluster, "job", KUBELET_NODE, &devices[0], (76, 4096));
        wait_running(&pods, "job", &kubelet).await;
        check_created(&kubelet, devices[0]["id"].as_str().unwrap());
    });
}
