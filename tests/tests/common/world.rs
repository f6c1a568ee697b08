//! The stack of the Allocate end-to-end tests: amd-gpud on a private bus,
//! the plugin with the real kube-rs client against the fake API server, the
//! fake kubelet, and HAMi's scheduler emulated.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use serde_json::{Value, json};
use tests::{
    apiserver::{FakeApiServer, Kind},
    bus::{Policy, PrivateBus},
    hami_emulator::{Grant, HamiEmulator},
    kubelet::FakeKubelet,
    stack,
};

pub const NODE: &str = "gpu-node-1";
pub const LOCK: &str = "hami.io/mutex.lock";

#[derive(Debug, Clone)]
pub struct Gpu {
    pub id: String,
    pub device_type: String,
    pub rocr_uuid: String,
}

pub fn grant(g: &Gpu, mem_mib: u32, cus: u32) -> Grant {
    Grant {
        id: g.id.clone(),
        device_type: g.device_type.clone(),
        mem_mib,
        cus,
    }
}

/// HAMi's Filter and Bind for one container granted `devices`.
pub fn schedule(api: &FakeApiServer, name: &str, devices: &[(&Gpu, u32, u32)], bind_time: u64) {
    schedule_containers(api, name, &[devices], bind_time);
}

/// The same for several AMD containers, in order.
pub fn schedule_containers(
    api: &FakeApiServer,
    name: &str,
    containers: &[&[(&Gpu, u32, u32)]],
    bind_time: u64,
) {
    let grants: Vec<Vec<Grant>> = containers
        .iter()
        .map(|c| c.iter().map(|(g, mem, cus)| grant(g, *mem, *cus)).collect())
        .collect();
    let hami = HamiEmulator {
        node: NODE.to_owned(),
    };
    hami.bind(api, name, &grants, bind_time);
}

pub fn pod_annotation(api: &FakeApiServer, name: &str, key: &str) -> Option<String> {
    let pod = api.get(Kind::Pod, "default", name)?;
    pod["metadata"]["annotations"][key]
        .as_str()
        .map(str::to_owned)
}

pub fn lock(api: &FakeApiServer) -> Option<String> {
    api.get(Kind::Node, "", NODE)?["metadata"]["annotations"][LOCK]
        .as_str()
        .map(str::to_owned)
}

/// Whether the node lock is gone within a few seconds (the plugin releases
/// it in the background once a pod is complete; kubelet does not wait).
pub async fn released(api: &FakeApiServer) -> bool {
    let start = Instant::now();
    while lock(api).is_some() {
        if start.elapsed() > Duration::from_secs(5) {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    true
}

/// The first Event on the fake API server that `matches`, waited for up to
/// 10 s (a test failure naming `what` and every Event after that).
pub async fn event_where(
    api: &FakeApiServer,
    what: &str,
    matches: impl Fn(&Value) -> bool,
) -> Value {
    let start = Instant::now();
    loop {
        if let Some(event) = api.events().into_iter().find(|e| matches(e)) {
            return event;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no Event {what}: {:?}",
            api.events()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The devices of the node's `hami.io/node-amd-register` (empty when absent).
pub fn registered(api: &FakeApiServer) -> Vec<Value> {
    api.get(Kind::Node, "", NODE)
        .and_then(|n| {
            n["metadata"]["annotations"]["hami.io/node-amd-register"]
                .as_str()
                .map(str::to_owned)
        })
        .and_then(|v| serde_json::from_str(&v).ok())
        .unwrap_or_default()
}

pub async fn gpus(api: &FakeApiServer) -> Vec<Gpu> {
    let start = Instant::now();
    loop {
        let value = api.get(Kind::Node, "", NODE).and_then(|n| {
            n["metadata"]["annotations"]["hami.io/node-amd-register"]
                .as_str()
                .map(str::to_owned)
        });
        if let Some(devices) = value.and_then(|v| serde_json::from_str::<Vec<Value>>(&v).ok()) {
            return devices
                .iter()
                .map(|d| Gpu {
                    id: d["id"].as_str().unwrap().to_owned(),
                    device_type: d["type"].as_str().unwrap().to_owned(),
                    // The ROCr UUID the plugin shows (not the id: that is
                    // AMD SMI's UUID); empty for GPUs selected by index.
                    rocr_uuid: d["custominfo"]["rocrVisibleDevice"]
                        .as_str()
                        .filter(|u| u.starts_with("GPU-"))
                        .unwrap_or_default()
                        .to_owned(),
                })
                .collect();
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the plugin did not register the node"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Everything the scenario runs on; dropped (and stopped) together.
pub struct World {
    pub api: FakeApiServer,
    pub kubelet: FakeKubelet,
    pub gpus: Vec<Gpu>,
    pub bus: PrivateBus,
    pub plugin: stack::Process,
    pub extra: Vec<String>,
    /// Extra `amd-gpud serve` arguments, for [`World::restart_both`].
    pub gpud_args: Vec<String>,
    /// Where the plugin serves /metrics, /healthz and /readyz.
    pub metrics: std::net::SocketAddr,
    /// Where the plugin serves /healthz and /readyz alone (`--probe-address`).
    pub probes: std::net::SocketAddr,
    /// The fake AMD SMI library's fixture amd-gpud reads, if it does.
    pub amdsmi: Option<PathBuf>,
    _keep: (tempfile::TempDir, stack::Process),
}

impl World {
    /// The memory hook's directory passed to the plugin.
    pub fn hook_dir(&self) -> std::path::PathBuf {
        self._keep.0.path().join("usr/local/vgpu")
    }

    /// The fake host root amd-gpud serves.
    pub fn root(&self) -> &std::path::Path {
        self._keep.0.path()
    }

    /// Stops amd-gpud and the plugin, then starts both again (kubelet and
    /// the API server keep running).
    pub async fn restart_both(&mut self) {
        self.plugin.kill();
        self._keep.1.kill();
        let args: Vec<&str> = self.gpud_args.iter().map(String::as_str).collect();
        self._keep.1 = start_gpud(
            &self.bus,
            self._keep.0.path(),
            self.amdsmi.as_deref(),
            &args,
        );
        self.restart_plugin().await;
    }

    /// GETs `path` from the plugin's metrics server: status and body.
    pub fn http(&self, path: &str) -> (u16, String) {
        stack::http_get(self.metrics, path).unwrap()
    }

    /// The devices of the register annotation, in its order (by PCI address).
    pub fn registered(&self) -> Vec<Value> {
        registered(&self.api)
    }

    /// Stops the plugin and starts a new one (kubelet keeps running).
    pub async fn restart_plugin(&mut self) {
        self.plugin.kill();
        let registrations = self.kubelet.registrations().len();
        let fake_node = super::fake_node_exe();
        self.plugin =
            stack::plugin(&fake_node, &self.bus, self.kubelet.dir(), &self.extra).unwrap();
        self.kubelet
            .wait_registrations(registrations + 1, Duration::from_secs(20))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await; // its caches fill
    }
}

pub async fn world() -> World {
    world_on("mi300x-8-spx", 80).await
}

/// The stack on builder fixture `fixture`, once kubelet lists `devices` slots.
pub async fn world_on(fixture: &str, devices: usize) -> World {
    world_with(&Setup {
        fixture,
        devices,
        gpud_args: &[],
        plugin_args: &[],
        prepare: &|_| {},
    })
    .await
}

/// The memory hook's directory on the fake host (Allocate refuses slices
/// without it); a placeholder file is enough for the plugin.
pub fn install_hook(root: &std::path::Path) -> String {
    let dir = root.join("usr/local/vgpu");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("libamvgpu.so"), b"placeholder").unwrap();
    dir.display().to_string()
}

/// What [`world_with`] varies.
pub struct Setup<'a> {
    pub fixture: &'a str,
    /// Kubelet devices to wait for.
    pub devices: usize,
    /// Extra `amd-gpud serve` arguments.
    pub gpud_args: &'a [&'a str],
    /// Extra plugin arguments.
    pub plugin_args: &'a [String],
    /// Changes the host root before amd-gpud starts.
    pub prepare: &'a dyn Fn(&std::path::Path),
}

/// The stack as `setup` says.
pub async fn world_with(setup: &Setup<'_>) -> World {
    let root = super::build_fixture(setup.fixture);
    start_world(setup, root, None).await
}

/// As [`world_with`], amd-gpud loading the fake AMD SMI library (ABI 7.0),
/// whose fixture `smi` may change first.
pub async fn world_with_amdsmi(setup: &Setup<'_>, smi: &dyn Fn(&mut Value)) -> World {
    let root = super::build_fixture_with(setup.fixture, Some("7.0"));
    let path = root.path().join(tests::fixture::FIXTURE_FILE);
    let mut fixture: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    smi(&mut fixture);
    std::fs::write(&path, serde_json::to_vec_pretty(&fixture).unwrap()).unwrap();
    start_world(setup, root, Some(path)).await
}

/// amd-gpud on `root`, with the fake AMD SMI reading `amdsmi` if given.
fn start_gpud(
    bus: &PrivateBus,
    root: &Path,
    amdsmi: Option<&Path>,
    args: &[&str],
) -> stack::Process {
    let fake_node = super::fake_node_exe();
    match amdsmi {
        None => stack::gpud_with(&fake_node, bus, root, 0, args).unwrap(),
        Some(fixture) => {
            let library = tests::fake_amdsmi::library_for("7.0");
            stack::gpud_with_amdsmi_and(&fake_node, bus, root, (library, fixture), args).unwrap()
        }
    }
}

async fn start_world(setup: &Setup<'_>, root: tempfile::TempDir, amdsmi: Option<PathBuf>) -> World {
    (setup.prepare)(root.path());
    let hook_dir = install_hook(root.path());
    let bus = PrivateBus::start(Policy::Shipped).unwrap();
    let fake_node = super::fake_node_exe();
    let gpud = start_gpud(&bus, root.path(), amdsmi.as_deref(), setup.gpud_args);
    let api = FakeApiServer::start().unwrap();
    api.put_node(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}));
    let kubeconfig = api.kubeconfig(root.path()).display().to_string();
    let kubelet = FakeKubelet::start().await.unwrap();
    let metrics = std::net::SocketAddr::from(([127, 0, 0, 1], stack::free_port().unwrap()));
    let metrics_arg = metrics.to_string();
    let probes = std::net::SocketAddr::from(([127, 0, 0, 1], stack::free_port().unwrap()));
    let probes_arg = probes.to_string();
    let extra = [
        "--kube",
        kubeconfig.as_str(),
        "--node-name",
        NODE,
        "--hook-path",
        hook_dir.as_str(),
        "--sandbox",
        super::sandbox_mode(),
        "--metrics-address",
        metrics_arg.as_str(),
        "--probe-address",
        probes_arg.as_str(),
    ];
    let mut extra: Vec<String> = extra.iter().map(ToString::to_string).collect();
    extra.extend_from_slice(setup.plugin_args);
    let plugin = stack::plugin(&fake_node, &bus, kubelet.dir(), &extra).unwrap();
    kubelet
        .wait_devices(Duration::from_secs(20), |d| d.len() == setup.devices)
        .await
        .unwrap();
    let gpus = gpus(&api).await;
    World {
        api,
        kubelet,
        gpus,
        bus,
        plugin,
        extra,
        gpud_args: setup.gpud_args.iter().map(ToString::to_string).collect(),
        metrics,
        probes,
        amdsmi,
        _keep: (root, gpud),
    }
}
