//! One simulated node: a fake host root, a private bus, amd-gpud, the plugin
//! and a fake kubelet, registered on the session's fake API server. Every
//! process is killed when the node is dropped.

use std::{
    collections::HashSet,
    ffi::OsString,
    fs::{self, File},
    io,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::{Value, json};

use super::{
    Host, Progress, Session,
    error::SimError,
    monitor::Monitor,
    options::{Mode, fixture_name},
};
use crate::{
    apiserver::Kind,
    bus::PrivateBus,
    fake_amdsmi,
    fixture::{
        self, BuildOptions,
        cgroup::{CgroupDriver, write_dmem_cgroups},
    },
    hami_emulator::{HamiEmulator, filter::REGISTER_KEY},
    kubelet::FakeKubelet,
    stack::{self, Process},
};

/// How long each start-up step may take.
const STEP_TIMEOUT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(25);

/// A running simulated node. Fields drop in order: the plugin first, the
/// bus last.
pub struct SimNode {
    /// Its name on the API server (`<fixture>-<mode>`).
    pub name: String,
    pub fixture: String,
    pub mode: Mode,
    /// The AMD SMI ABI the fake library mimics, if amd-gpud loaded one.
    pub amdsmi: Option<String>,
    pub hami: HamiEmulator,
    /// Kubelet device ids handed to containers so far.
    pub used: HashSet<String>,
    /// The fake host root.
    pub root: PathBuf,
    /// Where the processes' logs are.
    pub dir: PathBuf,
    plugin: Process,
    /// Where the plugin serves its metrics; `None` when no address was free.
    pub monitor: Option<Monitor>,
    pub kubelet: FakeKubelet,
    host: NodeHost,
}

/// What a node runs below the plugin: its fake host root, a private bus and
/// amd-gpud on it. Fields drop in order: amd-gpud first, the bus last.
pub struct NodeHost {
    /// `<fixture>-<mode>`.
    pub name: String,
    pub fixture: String,
    /// The AMD SMI ABI the fake library mimics, if amd-gpud loaded one.
    pub amdsmi: Option<String>,
    /// The fake host root.
    pub root: PathBuf,
    /// Where the processes' logs are.
    pub dir: PathBuf,
    pub gpud: Process,
    pub bus: PrivateBus,
}

impl NodeHost {
    /// Builds the fake host root of `--node` `node` for `mode` (with the
    /// dmem cgroup tree, the memory hook and the fake AMD SMI library of
    /// `amdsmi`, or none) and starts its bus and amd-gpud.
    ///
    /// # Errors
    /// An unknown node, a fixture that cannot be written, a process that
    /// cannot start, exits, or does not get ready in time.
    pub async fn start(
        host: &Host,
        node: &str,
        mode: Mode,
        amdsmi: &str,
    ) -> Result<Self, SimError> {
        let fixture = fixture_name(node).to_owned();
        let spec = fixture::named(&fixture).ok_or_else(|| SimError::UnknownNode {
            name: node.to_owned(),
            known: fixture::names().join(", "),
        })?;
        let name = format!("{fixture}-{}", mode.as_str());
        let dir = host.dir.path().join(&name);
        let root = dir.join("root");
        let say = |msg: &str| host.progress.step(&name, msg);
        say(&format!("building the fake {fixture} host root"));
        let abi = (amdsmi != "none").then(|| amdsmi.to_owned());
        let fixture_error = |source| SimError::Fixture {
            fixture: fixture.clone(),
            root: root.clone(),
            source,
        };
        let options = BuildOptions {
            drm: true,
            amdsmi_abi: abi.clone(),
        };
        let built = fixture::build(&spec, &root, &options).map_err(fixture_error)?;
        write_dmem_cgroups(&spec, &root, CgroupDriver::Systemd).map_err(fixture_error)?;
        install_hook(&root).map_err(fixture_error)?;
        super::monitor::show_use(&root).map_err(fixture_error)?;
        let library = match (abi, built.amdsmi_fixture) {
            (Some(abi), Some(json)) => fake_library(&host.progress, &name, abi, json).await,
            _ => None,
        };
        let bus = PrivateBus::start(host.bus_policy).map_err(SimError::start("dbus-daemon"))?;
        say(&format!("private D-Bus up ({:?} policy)", host.bus_policy));
        let gpud = start_gpud(host, &bus, &dir, &root, library.as_ref()).await?;
        let amdsmi = library.map(|(abi, _, _)| abi);
        say(&format!(
            "amd-gpud owns io.hami.AmdGpu1 ({})",
            amdsmi
                .as_ref()
                .map_or("sysfs only".to_owned(), |abi| format!("fake AMD SMI {abi}"))
        ));
        Ok(Self {
            name,
            fixture,
            amdsmi,
            root,
            dir,
            gpud,
            bus,
        })
    }

    /// The plugin's and amd-gpud's log files.
    pub fn logs(&self) -> [PathBuf; 2] {
        [self.dir.join("plugin.log"), self.dir.join("amd-gpud.log")]
    }

    /// Fails when amd-gpud has exited.
    ///
    /// # Errors
    /// [`SimError::Exited`] with the end of its log.
    pub fn check_gpud(&mut self) -> Result<(), SimError> {
        exited("amd-gpud", &mut self.gpud, &self.dir.join("amd-gpud.log"))
    }
}

/// Where the plugin finds kubelet and the API server.
pub struct PluginPlaces {
    /// Its `--kubelet-dir`.
    pub kubelet_dir: PathBuf,
    pub kubeconfig: PathBuf,
    /// kubelet's pod-resources socket, when there is a kubelet that serves it.
    pub pod_resources: Option<PathBuf>,
    /// Its `--metrics-address`; `None`: no metrics listener.
    pub monitor: Option<SocketAddr>,
}

impl SimNode {
    /// Builds the node for `--node` `node` in `mode` and starts its stack.
    ///
    /// # Errors
    /// An unknown node, a fixture that cannot be written, a process that
    /// cannot start, exits, or does not get ready in time.
    pub async fn start(
        session: &Session,
        node: &str,
        mode: Mode,
        amdsmi: &str,
    ) -> Result<Self, SimError> {
        let host = NodeHost::start(&session.host, node, mode, amdsmi).await?;
        let name = host.name.clone();
        session
            .api
            .put_node(json!({"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, "node-sim/fixture": host.fixture,
                       "node-sim/mode": mode.as_str()}}}));
        let kubelet = FakeKubelet::start()
            .await
            .map_err(SimError::start("the fake kubelet"))?;
        let monitor = Monitor::claim();
        let places = Self::places(session, &kubelet, monitor.as_ref());
        let plugin = start_plugin(&session.host, &host, &places, mode)?;
        let mut node = Self {
            hami: HamiEmulator { node: name.clone() },
            name,
            fixture: host.fixture.clone(),
            mode,
            amdsmi: host.amdsmi.clone(),
            used: HashSet::new(),
            root: host.root.clone(),
            dir: host.dir.clone(),
            plugin,
            monitor,
            kubelet,
            host,
        };
        let devices = node.wait_registered(session).await?;
        node.set_capacity(session, devices);
        session.host.progress.step(
            &node.name,
            &format!("plugin registered: {devices} kubelet devices, {REGISTER_KEY} published"),
        );
        Ok(node)
    }

    fn places(session: &Session, kubelet: &FakeKubelet, monitor: Option<&Monitor>) -> PluginPlaces {
        PluginPlaces {
            kubelet_dir: kubelet.dir().to_path_buf(),
            kubeconfig: session.kubeconfig.clone(),
            pod_resources: None,
            monitor: monitor.map(|m| m.address),
        }
    }

    /// Kills the plugin and starts a new one (amd-gpud, kubelet and the API
    /// server keep running); returns once kubelet accepted its registration
    /// and has the new plugin's list of as many healthy devices as before.
    ///
    /// # Errors
    /// When the new plugin cannot start, exits, or does not register in time.
    pub async fn restart_plugin(&mut self, session: &Session) -> Result<(), SimError> {
        self.plugin.kill();
        let registered = self.kubelet.registrations().len();
        let updates = self.kubelet.list_and_watch_updates();
        let devices = self.kubelet.devices().len();
        let places = Self::places(session, &self.kubelet, self.monitor.as_ref());
        self.plugin = start_plugin(&session.host, &self.host, &places, self.mode)?;
        let log = self.dir.join("plugin.log");
        self.kubelet
            .wait_registrations(registered + 1, STEP_TIMEOUT)
            .await
            .map_err(|_| timeout("the restarted plugin's registration", &log))?;
        let start = Instant::now();
        loop {
            let listed = self.kubelet.devices();
            let healthy = listed.iter().all(|d| d.health == "Healthy");
            let newer = self.kubelet.list_and_watch_updates() > updates;
            if newer && listed.len() == devices && healthy {
                return Ok(());
            }
            exited("the plugin", &mut self.plugin, &log)?;
            if start.elapsed() > STEP_TIMEOUT {
                return Err(timeout("the restarted plugin's device list", &log));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits until kubelet lists the plugin's devices and the node carries a
    /// register annotation whose every device kubelet offers; their number.
    async fn wait_registered(&mut self, session: &Session) -> Result<usize, SimError> {
        let start = Instant::now();
        let log = self.dir.join("plugin.log");
        loop {
            let devices = self.kubelet.devices();
            let offered: HashSet<&str> = devices
                .iter()
                .filter_map(|d| d.id.rsplit_once('#').map(|(gpu, _)| gpu))
                .collect();
            let registered = register(session, &self.name);
            if let Some(ids) = registered.as_ref().and_then(|r| r.as_array()) {
                let all = ids
                    .iter()
                    .all(|d| d["id"].as_str().is_some_and(|id| offered.contains(id)));
                if all && !ids.is_empty() {
                    return Ok(devices.len());
                }
            }
            exited("the plugin", &mut self.plugin, &log)?;
            self.host.check_gpud()?;
            if start.elapsed() > STEP_TIMEOUT {
                return Err(timeout("the plugin's registration", &log));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// What kubelet would report: `amd.com/gpu` capacity, the node Ready.
    fn set_capacity(&self, session: &Session, devices: usize) {
        if let Some(mut node) = session.api.get(Kind::Node, "", &self.name) {
            let count = devices.to_string();
            node["status"] = json!({
                "capacity": {"amd.com/gpu": count},
                "allocatable": {"amd.com/gpu": count},
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
            });
            session.api.put_node(node);
        }
    }

    /// The plugin's and amd-gpud's log files.
    pub fn logs(&self) -> [PathBuf; 2] {
        self.host.logs()
    }

    /// The bus amd-gpud is on.
    pub fn bus_address(&self) -> &str {
        &self.host.bus.address
    }
}

/// The node's register annotation, parsed.
pub fn register(session: &Session, node: &str) -> Option<Value> {
    let node = session.api.get(Kind::Node, "", node)?;
    serde_json::from_str(node["metadata"]["annotations"][REGISTER_KEY].as_str()?).ok()
}

/// The memory hook's directory on the fake host; the plugin refuses CU
/// slices without the library, and a placeholder is enough for it.
fn install_hook(root: &Path) -> io::Result<()> {
    let dir = hook_dir(root);
    fs::create_dir_all(&dir)?;
    fs::write(
        dir.join("libamvgpu.so"),
        b"placeholder for the HAMi memory hook\n",
    )
}

/// Where the memory hook is on the fake host root `root`.
fn hook_dir(root: &Path) -> PathBuf {
    root.join("usr/local/vgpu")
}

/// The fake `libamd_smi.so` for `abi` (built by cargo on first use) and its
/// fixture; `None`, said, when it cannot be built.
async fn fake_library(
    progress: &Progress,
    node: &str,
    abi: String,
    fixture: PathBuf,
) -> Option<(String, PathBuf, PathBuf)> {
    progress.step(
        node,
        "fake libamd_smi.so (cargo build: slow only the first time)",
    );
    let wanted = abi.clone();
    let built = tokio::task::spawn_blocking(move || {
        fake_amdsmi::try_library_for(&wanted).map(Path::to_path_buf)
    })
    .await
    .unwrap_or_else(|e| Err(e.to_string()));
    match built {
        Ok(library) => Some((abi, library, fixture)),
        Err(err) => {
            let first = err.lines().next().unwrap_or_default();
            progress.step(
                node,
                &format!("no fake AMD SMI ({first}): amd-gpud reads sysfs only"),
            );
            None
        }
    }
}

async fn start_gpud(
    host: &Host,
    bus: &PrivateBus,
    dir: &Path,
    root: &Path,
    library: Option<&(String, PathBuf, PathBuf)>,
) -> Result<Process, SimError> {
    let log_path = dir.join("amd-gpud.log");
    let log = File::create(&log_path).map_err(SimError::start("amd-gpud's log"))?;
    let mut cmd = Command::new(&host.exe);
    cmd.args(["gpud", "--log", "info", "serve", "--bus-address"])
        .arg(&bus.address)
        .arg("--host-root")
        .arg(root)
        .args(["--rescan-interval", "0", "--kubelet-socket-access", "off"])
        .args(["--dmem-any-fs", "--plugin-uid"])
        .arg(host.uid.to_string())
        .arg("--amdsmi");
    match library {
        Some((_, lib, fixture)) => {
            cmd.arg(lib).env("FAKE_AMDSMI_FIXTURE", fixture);
        }
        None => {
            cmd.arg("none");
        }
    }
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .map_err(SimError::start("amd-gpud"))?;
    let mut gpud = Process(child);
    let start = Instant::now();
    while !stack::name_has_owner(bus).map_err(SimError::start("busctl"))? {
        exited("amd-gpud", &mut gpud, &log_path)?;
        if start.elapsed() > STEP_TIMEOUT {
            return Err(timeout("amd-gpud taking io.hami.AmdGpu1", &log_path));
        }
        tokio::time::sleep(POLL).await;
    }
    Ok(gpud)
}

/// Starts the plugin of `node` in `mode`, its log appended to
/// `<node dir>/plugin.log`.
///
/// # Errors
/// When the log cannot be opened or the plugin cannot be spawned.
pub fn start_plugin(
    host: &Host,
    node: &NodeHost,
    places: &PluginPlaces,
    mode: Mode,
) -> Result<Process, SimError> {
    let log = File::options()
        .create(true)
        .append(true)
        .open(node.dir.join("plugin.log"))
        .map_err(SimError::start("the plugin's log"))?;
    let pod_resources = places
        .pod_resources
        .as_ref()
        .map_or_else(|| "none".into(), |p| p.clone().into_os_string());
    let args: Vec<OsString> = vec![
        "plugin".into(),
        "--bus-address".into(),
        node.bus.address.clone().into(),
        "--kubelet-dir".into(),
        places.kubelet_dir.clone().into(),
        "--kube".into(),
        places.kubeconfig.clone().into(),
        "--node-name".into(),
        node.name.clone().into(),
        "--hook-path".into(),
        hook_dir(&node.root).into(),
        "--operating-mode".into(),
        mode.as_str().into(),
        "--dmem-backend".into(),
        "on".into(),
        "--pod-resources-socket".into(),
        pod_resources,
        "--sandbox".into(),
        "best-effort".into(),
        "--cdi".into(),
        host.cdi.to_string().into(),
        // Nodes run side by side: each monitor at a loopback address of its
        // own, no probe port.
        "--metrics-address".into(),
        places
            .monitor
            .map_or_else(|| "none".to_owned(), |a| a.to_string())
            .into(),
        "--probe-address".into(),
        "none".into(),
    ];
    let child = Command::new(&host.exe)
        .args(args)
        .env("AMDGPU_DP_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .map_err(SimError::start("the plugin"))?;
    Ok(Process(child))
}

/// An error when `process` has exited, with the end of its log.
pub fn exited(what: &str, process: &mut Process, log: &Path) -> Result<(), SimError> {
    match process.0.try_wait() {
        Ok(Some(status)) => Err(SimError::Exited {
            what: what.to_owned(),
            status: status.to_string(),
            log: log.to_path_buf(),
            tail: tail(log, 15),
        }),
        _ => Ok(()),
    }
}

fn timeout(what: &str, log: &Path) -> SimError {
    SimError::Timeout {
        what: what.to_owned(),
        secs: STEP_TIMEOUT.as_secs(),
        log: log.to_path_buf(),
    }
}

/// The last `n` lines of a log file.
pub fn tail(path: &Path, n: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
