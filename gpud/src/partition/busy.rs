//! Who uses a GPU through KFD (docs/amd-hardware.md §7): `<sys>/class/kfd/kfd/proc/<pid>/`
//! exists for every process that opened `/dev/kfd`; per-GPU files are keyed by
//! KFD `gpu_id`. A process uses a GPU when it holds VRAM on it (`vram_<gpu_id>`
//! above 0) or has a queue on it (`queues/<qid>/gpuid`). The bare existence of
//! `vram_<gpu_id>` proves nothing: KFD creates it for every visible GPU.

use std::{fmt, fs, path::Path};

use crate::HostPaths;

/// A process found using one of the GPU's partitions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KfdUser {
    pub pid: u32,
    pub gpu_id: u64,
    /// What shows the use: `vram_<id> = <bytes>` or `queue <qid>`.
    pub evidence: String,
}

impl fmt::Display for KfdUser {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "process {} uses KFD gpu_id {} ({})",
            self.pid, self.gpu_id, self.evidence
        )
    }
}

fn read_u64(path: &Path) -> Option<u64> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Every process using one of `gpu_ids`, by pid.
pub fn kfd_users(paths: &HostPaths, gpu_ids: &[u64]) -> Vec<KfdUser> {
    let Ok(entries) = fs::read_dir(paths.kfd_proc()) else {
        return Vec::new();
    };
    let mut pids: Vec<u32> = entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort_unstable();
    let mut users = Vec::new();
    for pid in pids {
        let dir = paths.kfd_proc().join(pid.to_string());
        for &gpu_id in gpu_ids {
            let vram = read_u64(&dir.join(format!("vram_{gpu_id}"))).unwrap_or(0);
            if vram > 0 {
                users.push(KfdUser {
                    pid,
                    gpu_id,
                    evidence: format!("vram_{gpu_id} = {vram}"),
                });
            } else if let Some(qid) = queue_on(&dir, gpu_id) {
                users.push(KfdUser {
                    pid,
                    gpu_id,
                    evidence: format!("queue {qid}"),
                });
            }
        }
    }
    users
}

fn queue_on(dir: &Path, gpu_id: u64) -> Option<String> {
    fs::read_dir(dir.join("queues"))
        .ok()?
        .filter_map(Result::ok)
        .find(|q| read_u64(&q.path().join("gpuid")) == Some(gpu_id))
        .map(|q| q.file_name().to_string_lossy().into_owned())
}
