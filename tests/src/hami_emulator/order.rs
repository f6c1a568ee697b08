//! The order in which HAMi's Fit tries a node's devices for one container
//! (Project-HAMi/HAMi `pkg/scheduler/policy/gpu_policy.go`, `DeviceUsageList.
//! Less` and `DeviceListsScore.ComputeScore`; `pkg/scheduler/score.go`
//! `fitInDevices`).
//!
//! Per container, every device gets a score and the node's whole device list
//! is sorted in place; Fit then scans the AMD devices of the sorted list from
//! the end. Three facts of HAMi's code shape the result:
//!
//! - The score counts a request only on devices whose `type` equals the
//!   request's type. An AMD request's type is `AMD` and an AMD device's type
//!   is its product name (`AMD Instinct MI300X`), so for AMD the score is the
//!   device's current use alone: `10 × (used/count + cores/devcore +
//!   mem/devmem)`, in `float32`, and 0 for a device with a zero total.
//! - The policy string decides the keys: `binpack` (score ascending, then
//!   NUMA ascending), `mutex` (containers on it descending, then NUMA),
//!   anything else a single value (spread: score descending, then NUMA); a
//!   comma-separated list, or `numa` alone, chains `binpack`, `spread` and
//!   `numa` in the order written (spread when it names none) and breaks
//!   the last ties by `index`.
//! - The list is sorted in place and keeps its order from one container to
//!   the next of the same node copy, so devices whose keys tie stay in the
//!   order the previous sort left them. Go's `sort.Sort` is a stable
//!   insertion sort up to 12 elements, which is what a stable sort gives
//!   here; past 12 devices Go's pattern-defeating quicksort may order ties
//!   differently, which is the one place this model may part from HAMi.

use std::cmp::Ordering;

use super::filter::DeviceUsage;

/// HAMi's `util.Weight`.
const WEIGHT: f32 = 10.0;

/// One key of a comma-separated policy chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortKey {
    Binpack,
    Spread,
    Numa,
}

/// How the device list is sorted, from the pod's policy string.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum DeviceOrder {
    /// Emptiest first in the scan (HAMi's default `--gpu-scheduler-policy`).
    #[default]
    Spread,
    /// Fullest first in the scan.
    Binpack,
    /// `mutex` alone: idle devices first in the scan.
    Mutex,
    /// A comma-separated list or `numa`: the keys in the order written.
    Chain(Vec<SortKey>),
}

impl DeviceOrder {
    /// The order HAMi's `Less` applies for `policy` (trimmed, case kept:
    /// HAMi compares whole strings).
    pub fn of(policy: &str) -> Self {
        let policy = policy.trim();
        if policy.contains(',') || policy == "numa" {
            let mut keys = Vec::new();
            for token in policy.split(',').map(str::trim) {
                let key = match token {
                    "binpack" => SortKey::Binpack,
                    "spread" => SortKey::Spread,
                    "numa" => SortKey::Numa,
                    _ => continue,
                };
                if !keys.contains(&key) {
                    keys.push(key);
                }
            }
            if keys.is_empty() {
                keys.push(SortKey::Spread);
            }
            return Self::Chain(keys);
        }
        match policy {
            "binpack" => Self::Binpack,
            "mutex" => Self::Mutex,
            _ => Self::Spread,
        }
    }

    /// HAMi's `Less(a, b)` as an ordering (`Less` first).
    fn compare(&self, a: &Scored, b: &Scored) -> Ordering {
        let numa = a.numa.cmp(&b.numa);
        match self {
            Self::Binpack => a.score.total_cmp(&b.score).then(numa),
            Self::Spread => b.score.total_cmp(&a.score).then(numa),
            Self::Mutex => b.used.cmp(&a.used).then(numa),
            Self::Chain(keys) => keys
                .iter()
                .map(|key| match key {
                    SortKey::Binpack => a.score.total_cmp(&b.score),
                    SortKey::Spread => b.score.total_cmp(&a.score),
                    SortKey::Numa => numa,
                })
                .find(|o| o.is_ne())
                .unwrap_or_else(|| a.index.cmp(&b.index)),
        }
    }
}

/// What the comparison reads of one device.
struct Scored {
    score: f32,
    numa: i64,
    used: i64,
    index: u32,
}

/// HAMi's device score for an AMD request: the device's current use.
pub fn score(d: &DeviceUsage) -> f32 {
    let (dev, usage) = (&d.device, &d.usage);
    if dev.count == 0 || dev.devcore == 0 || dev.devmem == 0 {
        return 0.0;
    }
    // float32 as HAMi computes it: the order of ties depends on the rounding.
    #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation)]
    let fraction = |used: i64, total: i32| used as f32 / total as f32;
    WEIGHT
        * (fraction(usage.used, dev.count)
            + fraction(usage.cores, dev.devcore)
            + fraction(usage.mem_mib, dev.devmem))
}

/// Sorts the node copy `devices` in place as HAMi does before one
/// container's Fit (stable, so ties keep the order they had).
pub fn sort(devices: &mut [DeviceUsage], order: &DeviceOrder) {
    let mut keyed: Vec<(Scored, DeviceUsage)> = devices
        .iter()
        .map(|d| {
            let scored = Scored {
                score: score(d),
                numa: d.device.numa,
                used: d.usage.used,
                index: d.device.index,
            };
            (scored, d.clone())
        })
        .collect();
    keyed.sort_by(|a, b| order.compare(&a.0, &b.0));
    for (slot, (_, d)) in devices.iter_mut().zip(keyed) {
        *slot = d;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hami_emulator::filter::{NodeDevice, Usage};

    fn dev(id: &str, index: u32, numa: i64, used: i64, cores: i64) -> DeviceUsage {
        DeviceUsage {
            device: NodeDevice {
                id: id.into(),
                index,
                count: 10,
                devmem: 1000,
                devcore: 100,
                device_type: "AMD Instinct MI300X".into(),
                numa,
                health: true,
                ..NodeDevice::default()
            },
            usage: Usage {
                used,
                mem_mib: 0,
                cores,
            },
        }
    }

    fn sorted(mut devices: Vec<DeviceUsage>, policy: &str) -> Vec<String> {
        sort(&mut devices, &DeviceOrder::of(policy));
        devices.into_iter().map(|d| d.device.id).collect()
    }

    #[test]
    fn policy_strings_pick_hamis_branches() {
        assert_eq!(DeviceOrder::of(" binpack "), DeviceOrder::Binpack);
        assert_eq!(DeviceOrder::of("mutex"), DeviceOrder::Mutex);
        assert_eq!(DeviceOrder::of("Binpack"), DeviceOrder::Spread);
        assert_eq!(
            DeviceOrder::of("numa"),
            DeviceOrder::Chain(vec![SortKey::Numa])
        );
        assert_eq!(
            DeviceOrder::of("mutex, binpack,numa,binpack"),
            DeviceOrder::Chain(vec![SortKey::Binpack, SortKey::Numa])
        );
        assert_eq!(
            DeviceOrder::of("mutex,topology-aware"),
            DeviceOrder::Chain(vec![SortKey::Spread])
        );
    }

    #[test]
    fn the_score_is_the_use_alone_and_zero_for_empty_totals() {
        let d = dev("a", 0, 0, 1, 50);
        assert!((score(&d) - 6.0).abs() < 1e-6, "{}", score(&d));
        let mut empty = dev("z", 0, 0, 3, 3);
        empty.device.devcore = 0;
        assert!(score(&empty).abs() < f32::EPSILON);
    }

    #[test]
    fn ties_go_by_numa_then_keep_their_order() {
        let devices = vec![
            dev("b1", 0, 1, 0, 0),
            dev("a0", 1, 0, 0, 0),
            dev("busy", 2, 0, 1, 10),
            dev("c0", 3, 0, 0, 0),
        ];
        assert_eq!(
            sorted(devices.clone(), "spread"),
            ["busy", "a0", "c0", "b1"]
        );
        assert_eq!(
            sorted(devices.clone(), "binpack"),
            ["a0", "c0", "b1", "busy"]
        );
        assert_eq!(sorted(devices.clone(), "mutex"), ["busy", "a0", "c0", "b1"]);
        // A chain breaks the last ties by index, not by the order it found.
        let mut by_index = devices.clone();
        by_index.swap(1, 3);
        assert_eq!(sorted(by_index, "numa,binpack"), ["a0", "c0", "busy", "b1"]);
    }
}
