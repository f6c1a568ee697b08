//! Memory and idle CPU of the whole node side on the 8 x MI300X CPX fixture
//! (64 partitions) with 110 pods bound to the node: peak RSS of amd-gpud and
//! of the plugin (release builds, default pulses, the plugin caching the
//! pods), then the CPU time both use while idle for a minute. Floors from the
//! same run: the peak RSS of the same binary printing its version, and the
//! CPU time of the private dbus-daemon (a process that only waits) over the
//! same minute.
//!
//! Run (as root: the private bus loads the shipped policy):
//! `cargo bench -p tests --bench footprint` (`FOOTPRINT_IDLE_SECS` shortens
//! the idle minute).

use std::{path::Path, process::Command, time::Duration};

use serde_json::json;
use tests::{
    apiserver::FakeApiServer,
    bus::{self, Policy, PrivateBus},
    fixture::{self, BuildOptions},
    hami_emulator::{Grant, encode},
    kubelet::FakeKubelet,
    stack,
};

const NODE: &str = "footprint-node";
const PODS: usize = 110;

fn main() -> anyhow::Result<()> {
    bus::ensure_plugin_user()?;
    let idle = std::env::var("FOOTPRINT_IDLE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60_u64);
    let fake_node = Path::new(env!("CARGO_BIN_EXE_fake-node"));
    let root = fixture::scratch_dir()?;
    let spec = fixture::named("mi300x-8-cpx").ok_or_else(|| anyhow::anyhow!("no fixture"))?;
    fixture::build(
        &spec,
        root.path(),
        &BuildOptions {
            drm: true,
            amdsmi_abi: None,
        },
    )?;
    let bus = PrivateBus::start(Policy::Shipped)?;
    let gpud = stack::gpud_with(fake_node, &bus, root.path(), 30, &["--log", "warn"])?;
    let api = FakeApiServer::start()?;
    api.put_node(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let kubelet = rt.block_on(FakeKubelet::start())?;
    let kubeconfig = api.kubeconfig(root.path()).display().to_string();
    let args = ["--kube", &kubeconfig, "--node-name", NODE, "--log", "warn"].map(str::to_owned);
    let plugin = stack::plugin(fake_node, &bus, kubelet.dir(), &args)?;
    rt.block_on(kubelet.wait_devices(Duration::from_secs(60), |d| d.len() == 80))
        .map_err(anyhow::Error::msg)?;
    let ids = registered_ids(&api)?;
    for i in 0..PODS {
        api.put_pod(bound_pod(i, &ids[i % ids.len()]));
    }
    std::thread::sleep(Duration::from_secs(5)); // the watches deliver, caches settle
    let (gpud_pid, plugin_pid) = (gpud.0.id(), plugin.0.id());
    let (_, gpud_peak) = memory_of(gpud_pid)?;
    let (_, plugin_peak) = memory_of(plugin_pid)?;
    let floor_peak = version_peak_rss(fake_node)?;
    let before = [
        cpu_ticks(gpud_pid)?,
        cpu_ticks(plugin_pid)?,
        cpu_ticks(bus.pid())?,
    ];
    std::thread::sleep(Duration::from_secs(idle));
    let after = [
        cpu_ticks(gpud_pid)?,
        cpu_ticks(plugin_pid)?,
        cpu_ticks(bus.pid())?,
    ];
    let used: Vec<u64> = after.iter().zip(before).map(|(a, b)| a - b).collect();
    let mib = |kib: u64| format!("{:.1} MiB", kib as f64 / 1024.0);
    println!("| measure (mi300x-8-cpx: 64 partitions, 80 devices; {PODS} pods) | value |");
    println!("|---|---|");
    println!(
        "| floor: peak RSS of the same binary printing its version | {} |",
        mib(floor_peak)
    );
    println!("| amd-gpud peak RSS | {} |", mib(gpud_peak));
    println!("| amd-device-plugin peak RSS | {} |", mib(plugin_peak));
    println!(
        "| floor: dbus-daemon CPU over {idle} s idle (ticks of 10 ms) | {} |",
        used[2]
    );
    println!("| amd-gpud CPU over {idle} s idle (ticks) | {} |", used[0]);
    println!(
        "| amd-device-plugin CPU over {idle} s idle (ticks) | {} |",
        used[1]
    );
    drop(kubelet);
    Ok(())
}

/// The register annotation's device ids.
fn registered_ids(api: &FakeApiServer) -> anyhow::Result<Vec<(String, String)>> {
    for _ in 0..300 {
        let node = api.get(tests::apiserver::Kind::Node, "", NODE);
        let value = node.as_ref().and_then(|n| {
            n["metadata"]["annotations"]["hami.io/node-amd-register"]
                .as_str()
                .map(str::to_owned)
        });
        if let Some(devices) =
            value.and_then(|v| serde_json::from_str::<Vec<serde_json::Value>>(&v).ok())
        {
            return Ok(devices
                .iter()
                .map(|d| {
                    (
                        d["id"].as_str().unwrap_or_default().to_owned(),
                        d["type"].as_str().unwrap_or_default().to_owned(),
                    )
                })
                .collect());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    anyhow::bail!("the plugin did not register the node")
}

/// A running pod holding 24 CUs of a GPU, as HAMi and the plugin leave it.
fn bound_pod(i: usize, gpu: &(String, String)) -> serde_json::Value {
    let entry = encode(&[vec![Grant {
        id: gpu.0.clone(),
        device_type: gpu.1.clone(),
        mem_mib: 8192,
        cus: 24,
    }]]);
    let first = u32::try_from(i / 8).unwrap_or(0) * 24;
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("pod-{i}"), "namespace": "default",
            "labels": {"app": "trainer"},
            "annotations": {
                "hami.io/vgpu-node": NODE,
                "hami.io/amd-devices-allocated": entry,
                "hami.io/amd-devices-to-allocate": ";",
                "hami.io/bind-phase": "success",
                "hami.io/amd-cu-allocated": format!("{{\"{}\":\"{}-{}\"}}", gpu.0, first, first + 23),
            }},
        "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": "rocm/pytorch",
            "resources": {"limits": {"amd.com/gpu": "1"}}}]},
        "status": {"phase": "Running"}
    })
}

fn status_field(pid: u32, key: &str) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no {key} for pid {pid}"))
}

/// (VmRSS, VmHWM) in KiB.
fn memory_of(pid: u32) -> anyhow::Result<(u64, u64)> {
    Ok((status_field(pid, "VmRSS:")?, status_field(pid, "VmHWM:")?))
}

/// utime + stime of `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let field = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Ok(field(11) + field(12))
}

/// Peak RSS (KiB) of `fake-node plugin --version`, from a child's rusage.
fn version_peak_rss(fake_node: &Path) -> anyhow::Result<u64> {
    let status = Command::new(fake_node)
        .args(["plugin", "--version"])
        .output()?
        .status;
    anyhow::ensure!(status.success(), "--version failed");
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN)?;
    Ok(u64::try_from(usage.max_rss()).unwrap_or(0))
}
