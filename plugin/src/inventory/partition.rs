//! Partition mode (docs/hami-protocol.md §1.6): every compute partition of a GPU is
//! registered as a device of its own, allocated whole, replacing its parent
//! GPU. The unchanged scheduler cannot repartition on demand; the only
//! representation it understands is one DeviceInfo per partition.
//!
//! Done as a view of amd-gpud's snapshot: each partitioned GPU becomes one
//! device per live partition, keyed by the partition's own PCI address (from
//! KFD), with the GPU's CUs and VRAM divided by the partition count (rounded
//! down), no ROCr UUID (partitions share their GPU's, so a container selects
//! them by container-local index), and an id `<gpu id>-<mode><index>`, stable
//! while the mode stays. Everything downstream (kubelet's devices, the
//! register annotation, Allocate, VRAM caps) works on the view unchanged.
//! GPUs without compute partitions (RDNA, SR-IOV VFs, APUs) stay CU-maskable.

use std::str::FromStr;

use ipc::Health;
use tokio::sync::watch;

use super::{Device, Snapshot};

/// The node annotation that chooses the operating mode (it wins over the flag).
pub(crate) const MODE_ANNOTATION: &str = "hami.io/amd-operating-mode";

/// How the node's GPUs are offered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum OperatingMode {
    /// Whole GPUs shared by CU masks (the default).
    #[default]
    Cu,
    /// Compute partitions as whole devices.
    Partition,
}

impl FromStr for OperatingMode {
    type Err = crate::choice::InvalidChoice;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value.trim() {
            "cu" => Ok(Self::Cu),
            "partition" => Ok(Self::Partition),
            other => Err(Self::Err::new("operating mode", "cu or partition", other)),
        }
    }
}

/// The mode from the node annotation when it is set and valid, else `flag`.
/// An unknown annotation value is logged and `cu` is used.
pub(crate) fn resolve(annotation: Option<&str>, flag: OperatingMode) -> OperatingMode {
    match annotation.map(str::parse::<OperatingMode>) {
        None => flag,
        Some(Ok(mode)) => mode,
        Some(Err(why)) => {
            tracing::warn!("{MODE_ANNOTATION} on the node: {why}; using cu");
            OperatingMode::Cu
        }
    }
}

/// `snapshot` as the scheduler sees it in `mode`.
pub(crate) fn view(snapshot: &Snapshot, mode: OperatingMode) -> Snapshot {
    if mode == OperatingMode::Cu {
        return snapshot.clone();
    }
    let mut devices = Vec::new();
    let mut partitions = std::collections::BTreeMap::new();
    for gpu in snapshot.devices() {
        let listed = snapshot.partitions.get(&gpu.bdf);
        let parts: Vec<_> = listed
            .into_iter()
            .flatten()
            .filter(|p| p.health_status() != Health::Missing)
            .collect();
        let Some(gpu_mode) = gpu.compute_mode.as_ref().filter(|_| !parts.is_empty()) else {
            partitions.insert(gpu.bdf.clone(), listed.cloned().unwrap_or_default());
            devices.push(gpu.clone());
            continue;
        };
        let count = partitions_of_mode(gpu, listed.map_or(0, Vec::len));
        for part in parts {
            partitions.insert(part.bdf.clone(), vec![part.clone()]);
            devices.push(Device::partition(gpu, gpu_mode, part, count));
        }
    }
    Snapshot::new(
        devices,
        partitions,
        snapshot.connected,
        snapshot.dmem.clone(),
    )
}

/// How many partitions `gpu`'s current compute mode makes: from its profile
/// menu where the mode is listed, else every partition amd-gpud lists
/// (missing ones included). Shares are the whole GPU divided by this, so a
/// partition that vanished never makes its siblings advertise more than
/// they have: under-commit, never over-commit.
fn partitions_of_mode(gpu: &Device, listed: usize) -> u32 {
    gpu.partition_profiles
        .iter()
        .find(|p| p.compute_mode().is(gpu.compute_mode_str()))
        .map(|p| p.partitions)
        .filter(|&n| n > 0)
        .unwrap_or_else(|| u32::try_from(listed).unwrap_or(u32::MAX))
        .max(1)
}

/// Follows `raw` snapshots and the operating `mode`, publishing the view
/// of the one in the other; a closed `mode` channel leaves the last mode.
pub(crate) fn follow(
    mut raw: watch::Receiver<Snapshot>,
    mut mode: watch::Receiver<OperatingMode>,
) -> watch::Receiver<Snapshot> {
    let first = view(&raw.borrow_and_update(), *mode.borrow_and_update());
    let (tx, rx) = watch::channel(first);
    tokio::spawn(async move {
        // Without a follower of the mode annotation (no Kubernetes API) the
        // mode's sender is gone: the mode is fixed, the snapshots go on.
        let mut mode_open = true;
        loop {
            tokio::select! {
                changed = raw.changed() => if changed.is_err() { return },
                changed = mode.changed(), if mode_open => {
                    if changed.is_err() {
                        mode_open = false;
                        continue;
                    }
                }
            }
            let next = view(&raw.borrow_and_update(), *mode.borrow_and_update());
            tx.send_if_modified(|s| {
                let changed = *s != next;
                *s = next;
                changed
            });
        }
    });
    rx
}

#[cfg(test)]
mod tests;
