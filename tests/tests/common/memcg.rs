//! A cgroup-v1 memory cgroup around a process under attack (the chart's
//! memory limit), and the process's memory figures from /proc.

use std::{
    path::PathBuf,
    sync::atomic::{AtomicUsize, Ordering},
};

/// The chart's memory limit of the plugin (helm/amd-gpu values.yaml).
pub const CHART_LIMIT: u64 = 128 * 1024 * 1024;

const ROOT: &str = "/sys/fs/cgroup/memory";

/// A memory cgroup of ours, removed on drop (its tasks moved back first).
pub struct MemCg {
    dir: PathBuf,
}

impl MemCg {
    /// A new cgroup limited to `limit` bytes (swap included where the kernel
    /// accounts it); `None` without a cgroup-v1 memory hierarchy.
    pub fn new(limit: u64) -> Option<Self> {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        if !std::path::Path::new(ROOT)
            .join("memory.limit_in_bytes")
            .exists()
        {
            eprintln!("no cgroup-v1 memory controller: running without a memory limit");
            return None;
        }
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = PathBuf::from(ROOT).join(format!("hostile-{}-{n}", std::process::id()));
        std::fs::create_dir(&dir).unwrap();
        let cg = Self { dir };
        cg.write("memory.limit_in_bytes", &limit.to_string());
        if cg.dir.join("memory.memsw.limit_in_bytes").exists() {
            cg.write("memory.memsw.limit_in_bytes", &limit.to_string());
        }
        // Pages the task already has are charged here too, where the kernel
        // still offers it (deprecated; the limit then holds from the move on).
        let _ = std::fs::write(cg.dir.join("memory.move_charge_at_immigrate"), "3");
        Some(cg)
    }

    fn write(&self, file: &str, value: &str) {
        std::fs::write(self.dir.join(file), value)
            .unwrap_or_else(|e| panic!("{}/{file}: {e}", self.dir.display()));
    }

    fn read(&self, file: &str) -> String {
        std::fs::read_to_string(self.dir.join(file)).unwrap_or_default()
    }

    /// Moves process `pid` into the cgroup.
    pub fn add(&self, pid: u32) {
        self.write("cgroup.procs", &pid.to_string());
    }

    /// Processes the kernel's OOM killer killed in the cgroup.
    pub fn oom_kills(&self) -> u64 {
        self.read("memory.oom_control")
            .lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    }

    /// The cgroup's peak memory use, bytes.
    pub fn max_usage(&self) -> u64 {
        self.read("memory.max_usage_in_bytes")
            .trim()
            .parse()
            .unwrap_or(0)
    }
}

impl Drop for MemCg {
    fn drop(&mut self) {
        for pid in self.read("cgroup.procs").lines() {
            let _ = std::fs::write(PathBuf::from(ROOT).join("cgroup.procs"), pid);
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// A `kB` field of /proc/`pid`/status (`VmHWM`, `VmRSS`), KiB.
pub fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Whether `pid` still runs (not gone, not a zombie).
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("State:"))
            .is_some_and(|state| !state.trim_start().starts_with('Z'))
    })
}
