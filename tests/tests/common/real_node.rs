//! A node of the real cluster (issue 18): the real kubelet with
//! `recording-cri`, and amd-gpud and the plugin on a fake host root, the
//! plugin holding the token of the chart's ServiceAccount bound to its pod.

use std::{
    ffi::OsString,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use serde_json::Value;
use tests::{
    bus::{Policy, PrivateBus},
    cluster::{
        RealCluster,
        chart::{self, NAMESPACE},
        kubelet::{KUBELET_NODE, KubeletVersion, RealKubelet},
    },
    stack,
};

use super::cluster::{add_pod, admin, apply_chart, eventually};

/// The Node's capacity of `resource`, once kubelet reports one.
pub async fn capacity(nodes: &Api<Node>, node: &str, resource: &str) -> Option<String> {
    let node = nodes.get(node).await.ok()?;
    let quantity = node.status?.capacity?.get(resource)?.0.clone();
    Some(quantity)
}

pub use tests::cluster::setup::node_ready as ready;

/// Who the plugin runs as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PluginUser {
    Root,
    /// Its own UID 60700, landlock as strict as this kernel allows: it
    /// gets into kubelet's root-owned directories only through the ACL
    /// entries amd-gpud gives it.
    Own,
}

/// What runs on the node besides kubelet.
#[derive(Debug, Clone)]
pub struct NodeSetup {
    /// The builder fixture of the fake host root.
    pub fixture: &'static str,
    pub user: PluginUser,
    /// After `gpud serve` (e.g. `--dmem-any-fs`).
    pub gpud_args: Vec<String>,
    /// After the plugin's own (e.g. `--dmem-backend on`, `--cdi`).
    pub plugin_args: Vec<String>,
}

impl NodeSetup {
    /// An 8 x MI300X (SPX) node, the plugin as root with its defaults.
    pub fn spx(user: PluginUser) -> Self {
        Self {
            fixture: "mi300x-8-spx",
            user,
            gpud_args: Vec::new(),
            plugin_args: Vec::new(),
        }
    }
}

/// amd-gpud and the plugin of one kubelet's node; dropped together, the
/// plugin first.
pub struct PluginNode {
    pub plugin: stack::Process,
    /// How the plugin was started, for [`Self::restart_plugin`].
    plugin_command: (PathBuf, Vec<OsString>),
    pub gpud: stack::Process,
    /// amd-gpud's arguments after `serve`, for [`Self::start_gpud`].
    gpud_args: Vec<String>,
    /// Where a plugin started from now on logs (stderr otherwise).
    plugin_log: Option<PathBuf>,
    pub bus: PrivateBus,
    _kubelet_dir: Option<KubeletDirInRoot>,
    /// The fake host root.
    pub root: tempfile::TempDir,
}

impl PluginNode {
    /// Kills the plugin (SIGKILL) and starts it again as before.
    pub fn restart_plugin(&mut self) {
        self.plugin.kill();
        self.plugin = spawn(&self.plugin_command, self.plugin_log.as_deref());
    }

    /// Plugins started from now on (by [`Self::restart_plugin`]) append
    /// their log to `path` instead of writing it to stderr.
    pub fn log_plugin_to(&mut self, path: &Path) {
        self.plugin_log = Some(path.to_owned());
    }

    /// Stops amd-gpud as `systemctl stop` does (SIGTERM) and waits for it
    /// to exit.
    pub fn stop_gpud(&mut self) {
        let pid = self.gpud.0.id().to_string();
        let status = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(status.success(), "kill -TERM {pid}");
        self.wait_gpud_exit();
    }

    /// Waits for amd-gpud to exit by itself (it does when it loses the bus).
    pub fn wait_gpud_exit(&mut self) {
        let exit = self.gpud.wait_exit(Duration::from_secs(30));
        assert!(exit.is_ok(), "amd-gpud did not exit: {exit:?}");
    }

    /// Starts amd-gpud again as before (after [`Self::stop_gpud`] or
    /// [`Self::wait_gpud_exit`], as the unit's `Restart=always` does);
    /// returns how long the new one took to own its name.
    pub fn start_gpud(&mut self) -> Duration {
        let start = Instant::now();
        let args: Vec<&str> = self.gpud_args.iter().map(String::as_str).collect();
        let exe = super::fake_node_exe();
        self.gpud = stack::gpud_with(&exe, &self.bus, self.root.path(), 0, &args).unwrap();
        start.elapsed()
    }
}

fn spawn((program, args): &(PathBuf, Vec<OsString>), log: Option<&Path>) -> stack::Process {
    let mut command = Command::new(program);
    command
        .args(args)
        .env("AMDGPU_DP_METRICS_ADDRESS", "none")
        .env("AMDGPU_DP_PROBE_ADDRESS", "none");
    if let Some(log) = log {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap();
        command.stderr(file);
    }
    stack::Process(command.spawn().unwrap())
}

/// Builds the node's host root, starts its bus, amd-gpud and the plugin
/// registered with `kubelet`.
pub fn plugin_node(cluster: &RealCluster, kubelet: &RealKubelet, setup: &NodeSetup) -> PluginNode {
    plugin_node_prepared(cluster, kubelet, setup, &|_| {})
}

/// [`plugin_node`], `prepare` run on the host root before amd-gpud starts
/// (e.g. to add the dmem cgroup tree).
pub fn plugin_node_prepared(
    cluster: &RealCluster,
    kubelet: &RealKubelet,
    setup: &NodeSetup,
    prepare: &dyn Fn(&Path),
) -> PluginNode {
    let root = super::build_fixture(setup.fixture);
    prepare(root.path());
    let kubelet_dir = (setup.user == PluginUser::Own).then(|| {
        // The plugin's UID must reach the hook and its kubeconfig under it.
        std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        KubeletDirInRoot::mount(root.path(), &kubelet.root_dir())
    });
    let bus = PrivateBus::start(Policy::Shipped).unwrap();
    let exe = super::fake_node_exe();
    let gpud_args: Vec<&str> = setup.gpud_args.iter().map(String::as_str).collect();
    let gpud = stack::gpud_with(&exe, &bus, root.path(), 0, &gpud_args).unwrap();
    let kubeconfig = plugin_kubeconfig(cluster, root.path(), &kubelet.node);
    let hook = super::world::install_hook(root.path());
    let mut args: Vec<OsString> = vec![
        "plugin".into(),
        "--kube".into(),
        kubeconfig.into(),
        "--node-name".into(),
        kubelet.node.clone().into(),
        "--bus-address".into(),
        // As a node's: no GUID, so the plugin reconnects to a restarted bus.
        bus.path_address().into(),
        "--kubelet-dir".into(),
        kubelet.device_plugin_dir().into(),
        "--pod-resources-socket".into(),
        kubelet.pod_resources_socket().into(),
        "--hook-path".into(),
        hook.into(),
        "--sandbox".into(),
    ];
    args.push(match setup.user {
        PluginUser::Root => "best-effort".into(),
        PluginUser::Own => super::sandbox_mode().into(),
    });
    args.extend(setup.plugin_args.iter().map(OsString::from));
    let plugin_command = match setup.user {
        PluginUser::Root => (exe, args),
        PluginUser::Own => {
            let uid = tests::bus::PLUGIN_UID.to_string();
            let mut setpriv: Vec<OsString> = ["--reuid", &uid, "--regid", &uid, "--clear-groups"]
                .map(OsString::from)
                .into();
            setpriv.extend(["--".into(), exe.into_os_string()]);
            setpriv.extend(args);
            ("setpriv".into(), setpriv)
        }
    };
    PluginNode {
        plugin: spawn(&plugin_command, None),
        plugin_command,
        gpud,
        gpud_args: setup.gpud_args.clone(),
        plugin_log: None,
        bus,
        _kubelet_dir: kubelet_dir,
        root,
    }
}

/// The chart's ServiceAccount, a pod of it on `node`, and a kubeconfig
/// under `root` with that pod's token, readable by the plugin's UID.
fn plugin_kubeconfig(cluster: &RealCluster, root: &Path, node: &str) -> PathBuf {
    apply_chart(cluster);
    let pod = format!("plugin-{node}");
    add_pod(cluster, NAMESPACE, &pod, node, chart::RELEASE);
    let token = cluster.pod_token(NAMESPACE, chart::RELEASE, &pod).unwrap();
    let shared = root.join("plugin-config");
    std::fs::create_dir_all(&shared).unwrap();
    let kubeconfig = cluster.kubeconfig_in(&shared, "plugin", &token).unwrap();
    for file in [&kubeconfig, &shared.join("apiserver.crt")] {
        std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    kubeconfig
}

/// Waits until kubelet reports `default/<name>` Running.
pub async fn wait_running(pods: &Api<Pod>, name: &str, kubelet: &RealKubelet) {
    let start = Instant::now();
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
pub fn container_paths<'a>(request: &'a Value, field: &str) -> Vec<&'a str> {
    request["config"][field]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["containerPath"].as_str())
        .collect()
}

/// The CreateContainer requests for pod `name`.
pub fn created_for<'a>(created: &'a [Value], name: &str) -> Vec<&'a Value> {
    created
        .iter()
        .filter(|r| r["sandboxConfig"]["metadata"]["name"] == name)
        .collect()
}

/// A control plane, a kubelet of `version` whose Node is Ready, and the
/// plugin registered with it (the Node lists its devices).
pub struct Scene {
    pub cluster: RealCluster,
    pub kubelet: RealKubelet,
    pub nodes: Api<Node>,
    pub pods: Api<Pod>,
    pub node: PluginNode,
}

/// [`Scene`] for an SPX node whose plugin runs as `user`.
pub async fn scene(version: KubeletVersion, user: PluginUser) -> Scene {
    scene_with(version, &NodeSetup::spx(user), "80").await
}

/// [`Scene`] for `setup`, once kubelet publishes `devices` as the Node's
/// `amd.com/gpu` capacity.
pub async fn scene_with(version: KubeletVersion, setup: &NodeSetup, devices: &str) -> Scene {
    scene_prepared(version, setup, devices, &|_| {}).await
}

/// [`scene_with`], `prepare` run on the node's host root before amd-gpud
/// starts ([`plugin_node_prepared`]).
pub async fn scene_prepared(
    version: KubeletVersion,
    setup: &NodeSetup,
    devices: &str,
    prepare: &dyn Fn(&Path),
) -> Scene {
    let cluster = RealCluster::start().unwrap();
    let client = admin(&cluster).await;
    let kubelet = RealKubelet::start_version(&cluster, version).unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    let limit = Duration::from_secs(60);
    let node_ready = || ready(&nodes, KUBELET_NODE);
    eventually(limit, "the kubelet's Node Ready", node_ready).await;
    let node = plugin_node_prepared(&cluster, &kubelet, setup, prepare);
    // kubelet publishes what ListAndWatch lists.
    let gpus = || capacity(&nodes, KUBELET_NODE, "amd.com/gpu");
    let count = eventually(limit, "amd.com/gpu capacity", gpus).await;
    assert_eq!(count, devices, "{}", kubelet.log_tail("kubelet"));
    Scene {
        cluster,
        kubelet,
        nodes,
        pods: Api::namespaced(client, "default"),
        node,
    }
}

/// The devices of the plugin's register annotation on `node`.
pub async fn registered(nodes: &Api<Node>, node: &str) -> Vec<Value> {
    let node = nodes.get(node).await.unwrap();
    let register = &node.metadata.annotations.unwrap()["hami.io/node-amd-register"];
    serde_json::from_str(register).unwrap()
}

/// kubelet's directory (its `--root-dir`, which holds `device-plugins` and
/// `pod-resources` as a host's `/var/lib/kubelet` does) bind-mounted into
/// the fixture's host root, where amd-gpud (`--host-root`) looks for it;
/// unmounted when dropped.
struct KubeletDirInRoot(PathBuf);

impl KubeletDirInRoot {
    fn mount(root: &Path, kubelet_root: &Path) -> Self {
        let at = root.join("var/lib/kubelet");
        std::fs::create_dir_all(&at).unwrap();
        let status = Command::new("mount")
            .arg("--bind")
            .arg(kubelet_root)
            .arg(&at)
            .status()
            .unwrap();
        assert!(
            status.success(),
            "mount --bind {} {}",
            kubelet_root.display(),
            at.display()
        );
        Self(at)
    }
}

impl Drop for KubeletDirInRoot {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}
