//! Who holds what on each registered device: slots, memory and CUs from
//! HAMi's `hami.io/amd-devices-allocated`, CU positions from the plugin's
//! `hami.io/amd-cu-allocated`, drawn as a bar of cells, one letter per pod.

use std::collections::HashMap;

use serde::Serialize;

use super::report::{PodReport, id_ranges};
use crate::hami_emulator::filter::{NodeDevice, decode_devices};

/// The widest bar, in cells.
pub const BAR_CELLS: u32 = 38;
/// A cell no pod holds.
pub const FREE: char = '·';

/// One registered device.
#[derive(Debug, Clone, Serialize)]
pub struct DeviceOccupancy {
    /// `GPU<i>` for a whole GPU, `P<i>` for a compute partition (register order).
    pub label: String,
    pub id: String,
    pub device_type: String,
    pub devcore: i32,
    pub devmem: i32,
    pub count: i32,
    pub health: bool,
    pub slots_used: i64,
    pub used_cus: i64,
    pub used_mem_mib: i64,
    pub holders: Vec<Holder>,
    /// One cell per `cus_per_cell` CUs (the same for every device of the
    /// node, so that bars compare): the letter of the pod holding most of
    /// them, [`FREE`] when none.
    pub bar: String,
    pub cus_per_cell: u32,
}

/// One pod's share of a device.
#[derive(Debug, Clone, Serialize)]
pub struct Holder {
    pub pod: String,
    pub letter: Option<char>,
    /// Its containers on the device.
    pub containers: i64,
    pub cus: i64,
    pub mem_mib: i64,
    /// The CUs the plugin gave it (`None`: the whole device, no mask).
    pub cu_ranges: Option<String>,
}

/// The device labels of a register list, by id.
pub fn labels(devices: &[NodeDevice]) -> HashMap<String, String> {
    devices
        .iter()
        .map(|d| d.id.clone())
        .zip(label_list(devices))
        .collect()
}

/// Per device in register order: `GPU<g>` for a whole GPU, `GPU<g>.<k>` for
/// partition `k` of GPU `g` (the plugin's partition ids are
/// `<gpu id>-<mode><k>`), `P<i>` for a partition id of another shape; `g`
/// counts GPUs in order of first appearance.
pub fn label_list(devices: &[NodeDevice]) -> Vec<String> {
    let mut gpus: Vec<&str> = Vec::new();
    let mut ordinal = |base| match gpus.iter().position(|g| *g == base) {
        Some(i) => i,
        None => {
            gpus.push(base);
            gpus.len() - 1
        }
    };
    devices
        .iter()
        .enumerate()
        .map(|(i, d)| {
            if d.mode.is_empty() {
                return format!("GPU{}", ordinal(d.id.as_str()));
            }
            let split =
                d.id.rsplit_once(&format!("-{}", d.mode))
                    .filter(|(_, k)| !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit()));
            match split {
                Some((base, k)) => format!("GPU{}.{k}", ordinal(base)),
                None => format!("P{i}"),
            }
        })
        .collect()
}

/// The occupancy of every device of `devices` by the admitted pods of `pods`
/// on `node`.
pub fn occupancy(devices: &[NodeDevice], pods: &[PodReport], node: &str) -> Vec<DeviceOccupancy> {
    let live: Vec<&PodReport> = pods
        .iter()
        .filter(|p| p.node == node && p.admitted())
        .collect();
    let widest = devices.iter().map(|d| d.devcore).max().unwrap_or(1);
    let cus_per_cell = u32::try_from(widest.max(1))
        .unwrap_or(1)
        .div_ceil(BAR_CELLS);
    devices
        .iter()
        .zip(label_list(devices))
        .map(|(d, label)| {
            let holders: Vec<Holder> = live.iter().filter_map(|p| holder(p, &d.id)).collect();
            DeviceOccupancy {
                label,
                id: d.id.clone(),
                device_type: d.device_type.clone(),
                devcore: d.devcore,
                devmem: d.devmem,
                count: d.count,
                health: d.health,
                slots_used: holders.iter().map(|h| h.containers).sum(),
                used_cus: holders.iter().map(|h| h.cus).sum(),
                used_mem_mib: holders.iter().map(|h| h.mem_mib).sum(),
                bar: bar(d.devcore, cus_per_cell, &holders),
                cus_per_cell,
                holders,
            }
        })
        .collect()
}

/// `pod`'s share of device `id`, if any.
fn holder(pod: &PodReport, id: &str) -> Option<Holder> {
    let grants = decode_devices(pod.devices_allocated.as_deref()?).ok()?;
    let mine: Vec<_> = grants.iter().flatten().filter(|g| g.id == id).collect();
    if mine.is_empty() {
        return None;
    }
    Some(Holder {
        pod: pod.name.clone(),
        letter: pod.letter,
        containers: i64::try_from(mine.len()).unwrap_or(i64::MAX),
        cus: mine.iter().map(|g| i64::from(g.cus)).sum(),
        mem_mib: mine.iter().map(|g| i64::from(g.mem_mib)).sum(),
        cu_ranges: pod
            .cu_allocated
            .as_ref()
            .and_then(|c| c[id].as_str())
            .map(str::to_owned),
    })
}

/// The cells of one device: each CU's holder (by its ranges, or every CU for
/// a holder of the whole device), then per cell the most frequent.
fn bar(devcore: i32, cus_per_cell: u32, holders: &[Holder]) -> String {
    let total = u32::try_from(devcore).unwrap_or(0);
    let mut owner: Vec<Option<char>> = vec![None; usize::try_from(total).unwrap_or(0)];
    for h in holders {
        let letter = h.letter.unwrap_or('?');
        match &h.cu_ranges {
            Some(list) => {
                for (a, b) in id_ranges(list) {
                    for cu in a..=b.min(total.saturating_sub(1)) {
                        if let Some(slot) = usize::try_from(cu).ok().and_then(|c| owner.get_mut(c))
                        {
                            *slot = Some(letter);
                        }
                    }
                }
            }
            None if h.cus >= i64::from(devcore) => owner.fill(Some(letter)),
            None => {}
        }
    }
    let per = usize::try_from(cus_per_cell.max(1)).unwrap_or(1);
    owner
        .chunks(per)
        .map(|cell| {
            let mut counts: Vec<(char, usize)> = Vec::new();
            for c in cell.iter().flatten() {
                match counts.iter_mut().find(|(x, _)| x == c) {
                    Some((_, n)) => *n += 1,
                    None => counts.push((*c, 1)),
                }
            }
            counts
                .iter()
                .max_by_key(|(_, n)| *n)
                .map_or(FREE, |(c, _)| *c)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(letter: char, cus: i64, ranges: Option<&str>) -> Holder {
        Holder {
            pod: letter.to_string(),
            letter: Some(letter),
            containers: 1,
            cus,
            mem_mib: 1,
            cu_ranges: ranges.map(str::to_owned),
        }
    }

    #[test]
    fn bars_scale_to_the_widest_cell_count() {
        assert_eq!(
            bar(8, 1, &[h('A', 2, Some("0-1")), h('B', 1, Some("5"))]),
            "AA···B··"
        );
        assert_eq!(
            bar(8, 4, &[h('A', 2, Some("0-1")), h('B', 3, Some("4-6"))]),
            "AB"
        );
        assert_eq!(bar(4, 1, &[h('W', 4, None)]), "WWWW");
        assert_eq!(304_u32.div_ceil(BAR_CELLS), 8);
    }

    #[test]
    fn labels_name_gpus_and_their_partitions() {
        let d = |id: &str, mode: &str| NodeDevice {
            id: id.into(),
            mode: mode.into(),
            ..NodeDevice::default()
        };
        let devices = [
            d("radeon", ""),
            d("mi-dpx0", "dpx"),
            d("mi-dpx1", "dpx"),
            d("odd", "cpx"),
        ];
        assert_eq!(label_list(&devices), ["GPU0", "GPU1.0", "GPU1.1", "P3"]);
    }
}
