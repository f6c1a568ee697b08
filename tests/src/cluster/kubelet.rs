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
//! Two things cannot be moved: the device manager's directory is
//! `/var/lib/kubelet/device-plugins` whatever `--root-dir` says (so one
//! kubelet runs at a time on the machine, under a lock), and kubelet
//! bind-mounts its root directory onto itself (unmounted when dropped).
//! kubelet runs from an empty directory of its own: its container cleanup
//! removes files by log path patterns, and a runtime bug there must not
//! cost files anywhere else.

use std::{
    fs::{self, File},
    io,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;
use tempfile::TempDir;

use super::RealCluster;
use crate::stack::{Process, free_port};

/// The node the kubelet registers (its token names it, group
/// `system:nodes`).
pub const KUBELET_NODE: &str = "kubelet-node";
/// The kubelet's bearer token.
pub const KUBELET_TOKEN: &str = "kubelet-token-for-tests";
/// Where the device manager listens and device plugins put their sockets.
pub const DEVICE_PLUGIN_DIR: &str = "/var/lib/kubelet/device-plugins";

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
const LOCK: &str = "/tmp/amd-gpu-real-kubelet.lock";
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// A running kubelet and its runtime; see the module documentation.
pub struct RealKubelet {
    /// kubelet's API port on 127.0.0.1.
    pub port: u16,
    processes: Vec<(String, Process)>,
    bin: PathBuf,
    version: KubeletVersion,
    args: Vec<String>,
    dir: TempDir,
    _lock: File,
}

/// Holds the machine-wide lock until dropped (waits for another test's
/// kubelet to go).
fn lock_machine() -> io::Result<File> {
    let file = File::create(LOCK)?;
    file.lock()?;
    Ok(file)
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
        let lock = lock_machine()?;
        // A checkpoint of an earlier kubelet names pods of another cluster.
        let _ = fs::remove_dir_all(DEVICE_PLUGIN_DIR);
        let dir = tempfile::Builder::new()
            .prefix("kubelet-")
            .tempdir_in("/dev/shm")?;
        for sub in ["cwd", "root", "cri"] {
            fs::create_dir_all(dir.path().join(sub))?;
        }
        let port = free_port()?;
        let config = dir.path().join("kubelet.yaml");
        fs::write(&config, configuration(dir.path(), port, free_port()?))?;
        let kubeconfig = cluster.kubeconfig("kubelet", KUBELET_TOKEN)?;
        let mut kubelet = Self {
            port,
            processes: Vec::new(),
            bin: cluster.bin().to_owned(),
            version,
            args: Vec::new(),
            dir,
            _lock: lock,
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
            KUBELET_NODE.to_owned(),
            "-v=2".to_owned(),
        ];
        kubelet.start_kubelet()?;
        Ok(kubelet)
    }

    fn start_kubelet(&mut self) -> io::Result<()> {
        let process = self.spawn(self.version.binary(), "kubelet", &self.args)?;
        self.processes.insert(0, ("kubelet".into(), process));
        self.wait_for(
            &Path::new(DEVICE_PLUGIN_DIR).join("kubelet.sock"),
            "kubelet",
        )
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
        let _ = fs::remove_file(Path::new(DEVICE_PLUGIN_DIR).join("kubelet.sock"));
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
        vec![
            "-endpoint".into(),
            format!("unix://{}", dir.join("cri.sock").display()),
            "-dir".into(),
            dir.join("cri").display().to_string(),
            "-record".into(),
            dir.join("cri-requests.jsonl").display().to_string(),
        ]
    }

    /// Runs `exe` of the built binaries, logging to `<name>.log`.
    fn spawn(&self, exe: &str, name: &str, args: &[String]) -> io::Result<Process> {
        let log = File::create(self.dir.path().join(format!("{name}.log")))?;
        let child = Command::new(self.bin.join(exe))
            .args(args)
            .current_dir(self.dir.path().join("cwd"))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .map_err(|e| io::Error::other(format!("starting {exe}: {e}")))?;
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

    /// The last lines of `kubelet`'s or `recording-cri`'s log.
    pub fn log_tail(&self, name: &str) -> String {
        let log = self.dir.path().join(format!("{name}.log"));
        let tail = crate::node_sim::node::tail(&log, 30);
        format!("the end of {}:\n{tail}", log.display())
    }

    /// The requests the runtime got for `call` (`RunPodSandbox`,
    /// `CreateContainer`), in order, as CRI's JSON.
    pub fn requests(&self, call: &str) -> Vec<Value> {
        let path = self.dir.path().join("cri-requests.jsonl");
        let text = fs::read_to_string(path).unwrap_or_default();
        text.lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v["call"] == call)
            .map(|v| v["request"].clone())
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
        let root = self.dir.path().join("root");
        let _ = Command::new("umount")
            .arg("-l")
            .arg(&root)
            .stderr(Stdio::null())
            .status();
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
