//! What pods and GPUs use, read where the truth is (root only): KFD's
//! per-process files (`<sys>/class/kfd/kfd/proc/<pid>/vram_<gpu_id>`,
//! docs/amd-hardware.md §7) mapped to pods and containers through
//! `<proc>/<pid>/cgroup` and kubelet's pod cgroups ([`cgroup`]), the CUs
//! their waves occupy (`stats_<gpu_id>/cu_occupancy`, read only where the
//! process holds VRAM on that GPU), each pod's
//! `dmem.current`, and each GPU's sysfs values ([`sysfs`]), VRAM used and
//! activity from AMD SMI where it answers ([`amdsmi`]); [`reader`] serves
//! `GetUsage` from these: one read at a time, within a deadline, cached.
//! Knows nothing of D-Bus; every count read
//! from the host is bounded ([`MAX_PROCESSES`], [`MAX_ENTRIES`],
//! [`sysfs::MAX_FILE`]).

pub(crate) mod amdsmi;
pub(crate) mod cache;
pub(crate) mod cgroup;
pub(crate) mod reader;
pub(crate) mod sysfs;

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
};

use ipc::usage::{ContainerCompute, ContainerVram, PodDmem, Usage};

use crate::{
    HostPaths,
    dmem::{
        DmemConfig,
        kubelet::KubeletCgroups,
        layout::{Driver, Layout},
        region,
    },
};

/// KFD processes looked at per read; more are left out (and counted).
pub const MAX_PROCESSES: usize = 4096;
/// Entries of each list of an answer.
pub const MAX_ENTRIES: usize = 16384;

/// What to read: the GPUs (PCI addresses) and the KFD `gpu_id`s of their
/// partitions, from the inventory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Targets {
    pub gpus: Vec<String>,
    pub gpu_ids: Vec<u64>,
}

/// One read, with what it left out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reading {
    pub usage: Usage,
    /// KFD processes past [`MAX_PROCESSES`].
    pub skipped: usize,
    /// KFD processes in no pod's cgroup (never attributed).
    pub outside: usize,
}

/// The pod cgroup layouts to recognise: kubelet's driver when the flags or
/// its config say it (both drivers otherwise), under its `cgroupRoot`.
pub fn layouts(paths: &HostPaths, config: &DmemConfig) -> Vec<Layout> {
    let kubelet = KubeletCgroups::read(&paths.kubelet_config()).unwrap_or_default();
    let root = config
        .cgroup_root
        .clone()
        .or(kubelet.root)
        .unwrap_or_else(|| "/".to_owned());
    let driver = config
        .driver
        .or_else(|| kubelet.driver.and_then(|d| d.parse().ok()));
    let drivers = match driver {
        Some(d) => vec![d],
        None => vec![Driver::Systemd, Driver::Cgroupfs],
    };
    drivers
        .into_iter()
        .filter_map(|d| Layout::new(d, &root).ok())
        .collect()
}

type Key = (String, String, u64);

/// Reads everything once (blocking I/O; run it off the executor, within a
/// deadline).
pub fn read(paths: &HostPaths, layouts: &[Layout], targets: &Targets) -> Reading {
    let mut reading = Reading::default();
    let mut sums = Sums::default();
    let mut pods: BTreeMap<String, PathBuf> = BTreeMap::new();
    for pid in kfd_pids(paths, &mut reading.skipped) {
        let cgroup = sysfs::read_small(&paths.proc.join(pid.to_string()).join("cgroup"));
        let pod = cgroup
            .as_deref()
            .and_then(cgroup::unified_path)
            .and_then(|p| cgroup::pod_of(p, layouts));
        let Some(pod) = pod else {
            reading.outside += 1;
            continue;
        };
        let dir = paths.kfd_proc().join(pid.to_string());
        for &gpu_id in &targets.gpu_ids {
            sums.add(&dir, (pod.uid.clone(), pod.container_id.clone(), gpu_id));
        }
        pods.insert(pod.uid, pod.cgroup);
    }
    (reading.usage.containers, reading.usage.compute) = sums.lists();
    reading.usage.dmem = dmem_current(paths, &pods);
    reading.usage.gpus = targets
        .gpus
        .iter()
        .take(MAX_ENTRIES)
        .map(|bdf| sysfs::gpu_use(paths, bdf))
        .collect();
    reading
}

/// Per (pod, container, gpu_id): processes and VRAM, processes and CUs.
#[derive(Default)]
struct Sums {
    vram: BTreeMap<Key, (u32, u64)>,
    compute: BTreeMap<Key, (u32, u32)>,
}

impl Sums {
    /// One process's files in its KFD directory `dir` for `key`'s gpu_id:
    /// its VRAM there, and, only where it holds some, its occupied CUs.
    fn add(&mut self, dir: &Path, key: Key) {
        let gpu_id = key.2;
        let bytes = sysfs::read_u64(&dir.join(format!("vram_{gpu_id}"))).unwrap_or(0);
        if bytes == 0 || (self.vram.len() >= MAX_ENTRIES && !self.vram.contains_key(&key)) {
            return;
        }
        if let Some(cus) = cu_occupancy(dir, gpu_id)
            && (self.compute.len() < MAX_ENTRIES || self.compute.contains_key(&key))
        {
            let entry = self.compute.entry(key.clone()).or_default();
            entry.0 += 1;
            entry.1 = entry.1.saturating_add(cus);
        }
        let entry = self.vram.entry(key).or_default();
        entry.0 += 1;
        entry.1 = entry.1.saturating_add(bytes);
    }

    fn lists(self) -> (Vec<ContainerVram>, Vec<ContainerCompute>) {
        let vram = self.vram.into_iter().map(
            |((pod_uid, container_id, gpu_id), (processes, vram_bytes))| ContainerVram {
                pod_uid,
                container_id,
                gpu_id,
                processes,
                vram_bytes,
            },
        );
        let compute =
            self.compute
                .into_iter()
                .map(
                    |((pod_uid, container_id, gpu_id), (processes, cus))| ContainerCompute {
                        pod_uid,
                        container_id,
                        gpu_id,
                        processes,
                        cus,
                    },
                );
        (vram.collect(), compute.collect())
    }
}

/// The CUs a process's waves occupy on `gpu_id`, from its KFD directory
/// `dir`; `None` where the file is missing or fails to read (the kernel
/// answers EINVAL on GPUs without the counter) or holds no number. A count
/// above [`MAX_CUS`] is no GPU's: left out.
fn cu_occupancy(dir: &Path, gpu_id: u64) -> Option<u32> {
    let path = dir.join(format!("stats_{gpu_id}")).join("cu_occupancy");
    let cus = u32::try_from(sysfs::read_u64(&path)?).ok()?;
    (cus <= MAX_CUS).then_some(cus)
}

/// More CUs than any GPU or partition has (an MI300X has 304).
pub const MAX_CUS: u32 = 4096;

/// The PIDs of KFD's per-process directories, at most [`MAX_PROCESSES`]
/// (the rest counted in `skipped`), in order.
fn kfd_pids(paths: &HostPaths, skipped: &mut usize) -> Vec<u32> {
    crate::deadline::reading(&paths.kfd_proc());
    let Ok(entries) = fs::read_dir(paths.kfd_proc()) else {
        return Vec::new();
    };
    let mut pids = BTreeSet::new();
    for entry in entries.filter_map(Result::ok) {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if pids.len() < MAX_PROCESSES {
            pids.insert(pid);
        } else {
            *skipped += 1;
        }
    }
    pids.into_iter().collect()
}

/// Each pod's `dmem.current`, for the pods seen holding VRAM.
fn dmem_current(paths: &HostPaths, pods: &BTreeMap<String, PathBuf>) -> Vec<PodDmem> {
    let mut out = Vec::new();
    for (uid, rel) in pods {
        let Some(text) = sysfs::read_small(&paths.cgroup.join(rel).join("dmem.current")) else {
            continue;
        };
        for (bdf, bytes) in region::amdgpu_capacity(&text) {
            if out.len() < MAX_ENTRIES {
                out.push(PodDmem {
                    pod_uid: uid.clone(),
                    bdf: bdf.to_string(),
                    current_bytes: bytes,
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;
