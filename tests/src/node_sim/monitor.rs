//! Each simulated node's monitor: its plugin serves HAMi's vGPU series on
//! port [`PORT`], as the Go plugin's monitor and HAMi's do, at a loopback
//! address of its own (the nodes share one network namespace; on Linux all
//! of 127/8 is local): the first of 127.0.0.2 to 127.0.0.254 that no other
//! node, of this run or a concurrent one, holds. A node holds its address
//! with a lock file for its lifetime. The fake host also gets each GPU's
//! activity, temperature and power in sysfs, so that the host series have
//! values.

use std::{
    fs::{self, File},
    io,
    net::{Ipv4Addr, SocketAddr, TcpListener},
    path::{Path, PathBuf},
};

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
