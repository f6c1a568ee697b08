//! The real kubelet (`k8s.io/kubernetes/cmd/kubelet`, the version
//! `tests/cluster/go.mod` pins) on this machine, with `recording-cri` (ours,
//! `tests/cluster/cmd/recording-cri`) as its container runtime: it pulls no
//! image and runs nothing, and records every RunPodSandbox and
//! CreateContainer request for the tests to read.
//!
//! The configuration, each setting with why it is there (measured on this
//! machine, whose PID 1 is not systemd and which mounts cgroup v1 with a v2
//! hierarchy at `/sys/fs/cgroup/unified`):
//! - `failCgroupV1: false`: from 1.35 kubelet otherwise exits with "kubelet
//!   is configured to not run on a host using cgroup v1";
//! - `containerRuntimeEndpoint`: some runtime must answer, or kubelet exits
//!   at once ("validate CRI v1 runtime API ... no such file or directory");
//!   the cgroup driver (cgroupfs) comes from the runtime;
//! - `cgroupsPerQOS: false` with `enforceNodeAllocatable: []` (one needs the
//!   other): no `kubepods` cgroups are made on the host;
//! - loopback addresses and free ports for the kubelet's API and healthz,
//!   no read-only port; the volume plugin and pod log directories, the root
//!   and the certificate directory in the scratch directory, so that
//!   nothing but the device-plugin directory is written outside it;
//! - the kubelet's API authenticates and authorizes through the API server
//!   (the defaults, written out).
//!
//! One thing cannot be moved by configuration: the device manager's
//! directory is `/var/lib/kubelet/device-plugins` whatever `--root-dir`
//! says. Each kubelet therefore runs in a mount namespace of its own
//! (`unshare --mount`, private propagation) in which its scratch
//! `device-plugins` directory is bind-mounted there: several kubelets (one
//! per node) run side by side, a device plugin outside the namespace finds
//! the kubelet's socket in [`RealKubelet::device_plugin_dir`], and
//! nothing of the host's real directory is touched. The namespace also
//! holds the bind mount kubelet makes of its root directory onto itself;
//! both go with the kubelet process. kubelet runs from an empty directory
//! of its own: its container cleanup removes files by log path patterns,
//! and a runtime bug there must not cost files anywhere else.

use std::{
    fs::{self, File},
    io,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use std::os::unix::fs::PermissionsExt;

use serde_json::Value;
use tempfile::TempDir;

use super::RealCluster;
use crate::stack::{Process, free_port};

/// The node a kubelet registers when no other is named.
pub const KUBELET_NODE: &str = "kubelet-node";
/// Where kubelet's device manager listens, inside its mount namespace.
const KUBELET_DEVICE_PLUGIN_DIR: &str = "/var/lib/kubelet/device-plugins";

/// The bearer token of the kubelet of `node` (user `system:node:<node>`,
/// group `system:nodes`, as the Node authorizer wants).
pub fn node_token(node: &str) -> String {
    format!("kubelet-token-for-{node}")
}

/// Which kubelet to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KubeletVersion {
    /// The release `tests/cluster/go.mod` pins (the control plane's).
    Pinned,
    /// The oldest minor still supported upstream
    /// (`tests/cluster/kubelet-skew/go.mod`).
    Oldest,
}

impl KubeletVersion {
    fn binary(self) -> &'static str {
        match self {
            Self::Pinned => "kubelet",
            Self::Oldest => "kubelet-oldest",
        }
    }
}
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// A running kubelet and its runtime; see the module documentation.
pub struct RealKubelet {
    /// kubelet's API port on 127.0.0.1.
    pub port: u16,
    /// The Node it registers.
    pub node: String,
    processes: Vec<(String, Process)>,
    bin: PathBuf,
    version: KubeletVersion,
    args: Vec<String>,
    /// recording-cri's arguments beyond its endpoint, directory and record.
    runtime_args: Vec<String>,
    dir: TempDir,
}

impl RealKubelet {
    /// Starts `recording-cri` and the pinned kubelet as [`KUBELET_NODE`]
    /// against `cluster`, and returns once the device manager listens.
    ///
    /// # Errors
    /// When a process cannot start or the device manager does not listen in
    /// time (the message ends with kubelet's log).
    pub fn start(cluster: &RealCluster) -> io::Result<Self> {
        Self::start_version(cluster, KubeletVersion::Pinned)
    }

    /// [`Self::start`] with the kubelet `version`.
    ///
    /// # Errors
    /// As [`Self::start`].
    pub fn start_version(cluster: &RealCluster, version: KubeletVersion) -> io::Result<Self> {
        Self::start_node(cluster, version, KUBELET_NODE)
    }

    /// [`Self::start_version`] registering `node` (whose token the cluster
    /// was started with, [`RealCluster::start_for_nodes`]).
    ///
    /// # Errors
    /// As [`Self::start`].
    pub fn start_node(
        cluster: &RealCluster,
        version: KubeletVersion,
        node: &str,
    ) -> io::Result<Self> {
        Self::start_node_with_runtime(cluster, version, node, &[])
    }

    /// [`Self::start_node`] with `runtime_args` added to recording-cri's
    /// (`-pod-ip`, `-exit-at-start`: see `tests/cluster/cmd/recording-cri`).
    ///
    /// # Errors
    /// As [`Self::start`].
    pub fn start_node_with_runtime(
        cluster: &RealCluster,
        version: KubeletVersion,
        node: &str,
        runtime_args: &[&str],
    ) -> io::Result<Self> {
        // The mount point of every kubelet's own device-plugin directory.
        fs::create_dir_all(KUBELET_DEVICE_PLUGIN_DIR)?;
        let dir = tempfile::Builder::new()
            .prefix("kubelet-")
            .tempdir_in("/dev/shm")?;
        for sub in ["cwd", "root/device-plugins", "cri"] {
            fs::create_dir_all(dir.path().join(sub))?;
        }
        // As kubelet makes the real one: root's, no access for others.
        let plugins = dir.path().join("root/device-plugins");
        fs::set_permissions(&plugins, fs::Permissions::from_mode(0o750))?;
        let port = free_port()?;
        let config = dir.path().join("kubelet.yaml");
        fs::write(&config, configuration(dir.path(), port, free_port()?))?;
        let kubeconfig = cluster.kubeconfig(&format!("kubelet-{node}"), &node_token(node))?;
        let mut kubelet = Self {
            port,
            node: node.to_owned(),
            processes: Vec::new(),
            bin: cluster.bin().to_owned(),
            version,
            args: Vec::new(),
            runtime_args: runtime_args.iter().map(|&a| a.to_owned()).collect(),
            dir,
        };
        let cri = kubelet.spawn("recording-cri", "recording-cri", &kubelet.cri_args())?;
        kubelet.processes.push(("recording-cri".into(), cri));
        kubelet.wait_for(&kubelet.dir.path().join("cri.sock"), "recording-cri")?;
        let root = kubelet.dir.path().join("root");
        kubelet.args = vec![
            "--config".to_owned(),
            config.display().to_string(),
            "--kubeconfig".to_owned(),
            kubeconfig.display().to_string(),
            "--root-dir".to_owned(),
            root.display().to_string(),
            "--cert-dir".to_owned(),
            root.join("pki").display().to_string(),
            "--hostname-override".to_owned(),
            node.to_owned(),
            "-v=2".to_owned(),
        ];
        kubelet.start_kubelet()?;
        Ok(kubelet)
    }

    /// Where kubelet's device manager listens (`kubelet.sock`) and device
    /// plugins of this node put their sockets: the directory kubelet sees as
    /// `/var/lib/kubelet/device-plugins`. It is in [`Self::root_dir`], so
    /// that directory looks like a host's `/var/lib/kubelet`.
    pub fn device_plugin_dir(&self) -> PathBuf {
        self.root_dir().join("device-plugins")
    }

    /// kubelet's `--root-dir`.
    pub fn root_dir(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    /// kubelet's pod-resources API socket.
    pub fn pod_resources_socket(&self) -> PathBuf {
        self.root_dir().join("pod-resources/kubelet.sock")
    }

    fn start_kubelet(&mut self) -> io::Result<()> {
        let process = self.spawn_kubelet()?;
        self.processes.insert(0, ("kubelet".into(), process));
        self.wait_for(&self.device_plugin_dir().join("kubelet.sock"), "kubelet")
    }

    /// kubelet in a mount namespace of its own, its device-plugin
    /// directory bind-mounted where it looks for it. `unshare` and the
    /// shell exec, so the process is kubelet's.
    fn spawn_kubelet(&self) -> io::Result<Process> {
        let script = format!("mount --bind \"$0\" {KUBELET_DEVICE_PLUGIN_DIR} && exec \"$@\"");
        let mut args = vec![
            "--mount".to_owned(),
            "--propagation".to_owned(),
            "private".to_owned(),
            "--".to_owned(),
            "sh".to_owned(),
            "-c".to_owned(),
            script,
            self.device_plugin_dir().display().to_string(),
            self.bin.join(self.version.binary()).display().to_string(),
        ];
        args.extend(self.args.iter().cloned());
        self.spawn_program(Path::new("unshare"), "kubelet", &args)
    }

    /// Stops kubelet (SIGKILL: nothing of it runs on) and starts it again
    /// with the same configuration, root and runtime; returns once its
    /// device manager listens again. The runtime keeps its pods.
    ///
    /// # Errors
    /// As [`Self::start`].
    pub fn restart(&mut self) -> io::Result<()> {
        if let Some(i) = self.processes.iter().position(|(n, _)| n == "kubelet") {
            let (_, mut process) = self.processes.remove(i);
            process.kill();
        }
        // kubelet removes and makes its socket anew; wait for the new one.
        let _ = fs::remove_file(self.device_plugin_dir().join("kubelet.sock"));
        self.start_kubelet()
    }

    /// How many times kubelet's current run has logged `line`.
    pub fn log_count(&self, line: &str) -> usize {
        let log = self.dir.path().join("kubelet.log");
        fs::read_to_string(log)
            .unwrap_or_default()
            .matches(line)
            .count()
    }

    fn cri_args(&self) -> Vec<String> {
        let dir = self.dir.path();
        let mut args = vec![
            "-endpoint".into(),
            format!("unix://{}", dir.join("cri.sock").display()),
            "-dir".into(),
            dir.join("cri").display().to_string(),
            "-record".into(),
            dir.join("cri-requests.jsonl").display().to_string(),
        ];
        args.extend(self.runtime_args.iter().cloned());
        args
    }

    /// Runs `exe` of the built binaries, logging to `<name>.log`.
    fn spawn(&self, exe: &str, name: &str, args: &[String]) -> io::Result<Process> {
        self.spawn_program(&self.bin.join(exe), name, args)
    }

    fn spawn_program(&self, exe: &Path, name: &str, args: &[String]) -> io::Result<Process> {
        let log = File::create(self.dir.path().join(format!("{name}.log")))?;
        let child = Command::new(exe)
            .args(args)
            .current_dir(self.dir.path().join("cwd"))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .map_err(|e| io::Error::other(format!("starting {}: {e}", exe.display())))?;
        Ok(Process(child))
    }

    fn wait_for(&self, socket: &Path, name: &str) -> io::Result<()> {
        let start = Instant::now();
        while !socket.exists() {
            if start.elapsed() > READY_TIMEOUT {
                return Err(io::Error::other(format!(
                    "{name} did not create {} within {READY_TIMEOUT:?}; {}",
                    socket.display(),
                    self.log_tail(name)
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    /// kubelet's log file.
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("kubelet.log")
    }

    /// The last lines of `kubelet`'s or `recording-cri`'s log.
    pub fn log_tail(&self, name: &str) -> String {
        let log = self.dir.path().join(format!("{name}.log"));
        let tail = crate::node_sim::node::tail(&log, 30);
        format!("the end of {}:\n{tail}", log.display())
    }

    /// The requests the runtime got for `call` (`RunPodSandbox`,
    /// `CreateContainer`), in order, as CRI's JSON.
    pub fn requests(&self, call: &str) -> Vec<Value> {
        self.timed_requests(call)
            .into_iter()
            .map(|(_, r)| r)
            .collect()
    }

    /// [`Self::requests`], each with when the runtime got it (Unix
    /// nanoseconds).
    pub fn timed_requests(&self, call: &str) -> Vec<(u64, Value)> {
        let path = self.dir.path().join("cri-requests.jsonl");
        let text = fs::read_to_string(path).unwrap_or_default();
        text.lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v["call"] == call)
            .map(|v| (v["at"].as_u64().unwrap_or_default(), v["request"].clone()))
            .collect()
    }
}

/// The environment of a recorded CreateContainer request (CRI's values are
/// bytes, base64 in its JSON), in order.
pub fn container_env(request: &Value) -> Vec<(String, String)> {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    request["config"]["envs"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            let key = e["key"].as_str().unwrap_or_default().to_owned();
            let raw = e["value"].as_str().unwrap_or_default();
            let value = b64.decode(raw).map_or_else(
                |_| raw.to_owned(),
                |v| String::from_utf8_lossy(&v).into_owned(),
            );
            (key, value)
        })
        .collect()
}

impl Drop for RealKubelet {
    fn drop(&mut self) {
        for (_, process) in &mut self.processes {
            process.kill();
        }
    }
}

/// The KubeletConfiguration; why each setting: the module documentation.
fn configuration(dir: &Path, port: u16, healthz: u16) -> String {
    let at = |sub: &str| PathBuf::from(dir).join(sub).display().to_string();
    format!(
        "apiVersion: kubelet.config.k8s.io/v1beta1\n\
         kind: KubeletConfiguration\n\
         failCgroupV1: false\n\
         containerRuntimeEndpoint: unix://{cri}\n\
         cgroupsPerQOS: false\n\
         enforceNodeAllocatable: []\n\
         address: 127.0.0.1\n\
         port: {port}\n\
         readOnlyPort: 0\n\
         healthzBindAddress: 127.0.0.1\n\
         healthzPort: {healthz}\n\
         volumePluginDir: {plugins}\n\
         podLogsDir: {logs}\n\
         authentication:\n  anonymous:\n    enabled: false\n  webhook:\n    enabled: true\n\
         authorization:\n  mode: Webhook\n",
        cri = at("cri.sock"),
        plugins = at("volume-plugins"),
        logs = at("pod-logs"),
    )
}
