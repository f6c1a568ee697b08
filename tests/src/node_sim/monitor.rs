//! Each simulated node's monitor: its plugin serves HAMi's vGPU series on
//! port [`PORT`], as the Go plugin's monitor and HAMi's do, at a loopback
//! address of its own (the nodes share one network namespace; on Linux all
//! of 127/8 is local): the first of 127.0.0.2 to 127.0.0.254 that no other
//! node, of this run or a concurrent one, holds. A node holds its address
//! with a lock file for its lifetime. The fake host also gets each GPU's
//! activity, temperature and power in sysfs, and a KFD process per started
//! container that fills the CUs it was granted, so that the series have
//! values.

use std::{
    collections::HashMap,
    fs::{self, File},
    io,
    net::{Ipv4Addr, SocketAddr, TcpListener},
    path::{Path, PathBuf},
    sync::atomic::{AtomicU32, Ordering},
};

use serde_json::Value;

use super::report::PodReport;
use crate::fixture::cgroup::CGROUP_MOUNT;

/// HAMi's monitor port (Project-HAMi/HAMi:cmd/vGPUmonitor/main.go).
pub const PORT: u16 = 9394;

/// What a node shows the plugin as its GPUs' use.
pub const BUSY_PERCENT: u32 = 42;
pub const TEMPERATURE_MILLICELSIUS: u32 = 45_000;
pub const POWER_MICROWATTS: u64 = 300_000_000;

/// A node's monitor address, held while this lives.
#[derive(Debug)]
pub struct Monitor {
    pub address: SocketAddr,
    _lock: File,
}

impl Monitor {
    /// The first free address, `None` when every one is taken.
    pub fn claim() -> Option<Self> {
        (2..=254).find_map(|last| {
            let ip = Ipv4Addr::new(127, 0, 0, last);
            let lock = open_lock(&lock_path(ip))?;
            lock.try_lock().ok()?;
            let address = SocketAddr::from((ip, PORT));
            // Free of anything else (a real monitor, another tool) too.
            drop(TcpListener::bind(address).ok()?);
            Some(Self {
                address,
                _lock: lock,
            })
        })
    }

    /// `http://<address>/metrics`.
    pub fn url(&self) -> String {
        format!("http://{}/metrics", self.address)
    }
}

/// The lock file, made if missing; read-only when another user made it (a
/// lock holds on any open file).
fn open_lock(path: &Path) -> Option<File> {
    let made = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path);
    made.or_else(|_| File::open(path)).ok()
}

fn lock_path(ip: Ipv4Addr) -> PathBuf {
    std::env::temp_dir().join(format!("node-sim-monitor-{ip}.lock"))
}

/// Writes [`BUSY_PERCENT`], a temperature and a power into each amdgpu PCI
/// device of the fake host at `root` (those with `mem_info_vram_total`).
///
/// # Errors
/// When a file cannot be written.
pub fn show_use(root: &Path) -> io::Result<()> {
    let devices = root.join("sys/bus/pci/devices");
    let Ok(entries) = fs::read_dir(&devices) else {
        return Ok(());
    };
    for entry in entries.filter_map(Result::ok) {
        let dir = entry.path();
        if !dir.join("mem_info_vram_total").is_file() {
            continue;
        }
        fs::write(dir.join("gpu_busy_percent"), format!("{BUSY_PERCENT}\n"))?;
        let hwmon = dir.join("hwmon/hwmon0");
        fs::create_dir_all(&hwmon)?;
        let temp = format!("{TEMPERATURE_MILLICELSIUS}\n");
        fs::write(hwmon.join("temp1_input"), temp)?;
        let power = format!("{POWER_MICROWATTS}\n");
        fs::write(hwmon.join("power1_average"), power)?;
    }
    Ok(())
}

/// PIDs of the fake KFD processes, unique within this process.
static NEXT_PID: AtomicU32 = AtomicU32::new(50_000);

/// Starts, on the fake host at `root`, one KFD process per container of
/// `report` given GPUs, in the pod cgroup `pod_cgroup` (absolute): on each
/// of its devices (found by the register's `pciBDF` in KFD's topology) it
/// holds half its VRAM grant (1 MiB without one) and its waves fill the CUs
/// granted (`cu_occupancy`; none for a grant without a CU count, such as a
/// whole GPU), so the monitor's per-container series show use. A device KFD
/// does not list gets no file.
///
/// # Errors
/// When a file cannot be written.
pub fn run_processes(
    root: &Path,
    register: &Value,
    pod_cgroup: &Path,
    report: &PodReport,
) -> io::Result<()> {
    let gpu_ids = kfd_gpu_ids(root);
    let bdf_of = |id: &str| {
        register.as_array().into_iter().flatten().find_map(|d| {
            (d["id"] == id).then(|| d["custominfo"]["pciBDF"].as_str().map(str::to_lowercase))?
        })
    };
    let cgroup = pod_cgroup
        .strip_prefix(root.join(CGROUP_MOUNT))
        .unwrap_or(pod_cgroup);
    for container in report.containers.iter().filter(|c| !c.gpus.is_empty()) {
        let pid = NEXT_PID.fetch_add(1, Ordering::Relaxed);
        let dir = root.join(format!("sys/class/kfd/kfd/proc/{pid}"));
        fs::create_dir_all(root.join(format!("proc/{pid}")))?;
        fs::write(
            root.join(format!("proc/{pid}/cgroup")),
            format!("0::/{}\n", cgroup.display()),
        )?;
        for gpu in &container.gpus {
            let Some(gpu_id) = bdf_of(&gpu.id).and_then(|b| gpu_ids.get(&b).copied()) else {
                continue;
            };
            let bytes = gpu.vram_limit_mib.map_or(1, |m| (m / 2).max(1)) << 20;
            fs::create_dir_all(dir.join(format!("stats_{gpu_id}")))?;
            fs::write(dir.join(format!("vram_{gpu_id}")), format!("{bytes}\n"))?;
            let cus = gpu.cu_count.unwrap_or(0);
            let occupancy = dir.join(format!("stats_{gpu_id}/cu_occupancy"));
            fs::write(occupancy, format!("{cus}\n"))?;
        }
    }
    Ok(())
}

/// KFD `gpu_id` by PCI address (`dddd:bb:dd.f`), from the fake host's
/// topology nodes (`domain`, `location_id` in `properties`).
fn kfd_gpu_ids(root: &Path) -> HashMap<String, u64> {
    let nodes = root.join("sys/class/kfd/kfd/topology/nodes");
    let mut ids = HashMap::new();
    for node in fs::read_dir(nodes)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
    {
        let read = |name: &str| fs::read_to_string(node.path().join(name)).unwrap_or_default();
        let Ok(gpu_id) = read("gpu_id").trim().parse::<u64>() else {
            continue;
        };
        let properties = read("properties");
        let field = |key: &str| {
            properties.lines().find_map(|l| {
                let (k, v) = l.split_once(' ')?;
                (k == key).then(|| v.trim().parse::<u64>().ok())?
            })
        };
        if let (Some(location), Some(domain), true) =
            (field("location_id"), field("domain"), gpu_id != 0)
        {
            let (bus, dev, func) = (location >> 8, (location >> 3) & 0x1f, location & 7);
            ids.insert(format!("{domain:04x}:{bus:02x}:{dev:02x}.{func:x}"), gpu_id);
        }
    }
    ids
}
