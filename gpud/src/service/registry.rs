//! What the service publishes, independent of the transport: every GPU ever
//! seen since start, whether it is still present, and what changed between
//! two reads of the inventory.
//!
//! A GPU (or partition) that disappears is kept with health `Missing`, so
//! that clients see it go rather than find it silently gone; it becomes
//! `Healthy` again if it comes back.

use std::collections::BTreeMap;

use crate::{
    inventory::{Gpu, Inventory, Partition},
    pci::PciAddress,
};

/// Identity of a published object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ObjectKey {
    Gpu(PciAddress),
    Partition(PciAddress, u32),
}

/// Presence of a published device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Presence {
    Present,
    Missing,
}

/// The outcome of [`Registry::apply`]: objects to create, objects whose
/// device vanished, objects whose properties changed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Update {
    pub added: Vec<ObjectKey>,
    pub missing: Vec<ObjectKey>,
    pub changed: Vec<ObjectKey>,
}

impl Update {
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.missing.is_empty() && self.changed.is_empty()
    }
}

#[derive(Debug, Clone)]
struct Tracked {
    gpu: Gpu,
    presence: Presence,
    /// Partitions ever seen, by index, with their presence.
    partitions: BTreeMap<u32, (Partition, Presence)>,
}

/// Every GPU published since start.
#[derive(Debug, Default, Clone)]
pub struct Registry {
    gpus: BTreeMap<PciAddress, Tracked>,
    generation: u64,
}

impl Registry {
    /// Counts the changes published: reads that changed something, and
    /// health transitions.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Counts a change made outside [`Registry::apply`] (a health transition).
    pub fn note_change(&mut self) {
        self.generation += 1;
    }

    /// Folds a fresh inventory in and says what changed.
    pub fn apply(&mut self, inventory: &Inventory) -> Update {
        let mut update = Update::default();
        for gpu in &inventory.gpus {
            self.apply_gpu(gpu, &mut update);
        }
        for (bdf, tracked) in &mut self.gpus {
            if tracked.presence == Presence::Present && inventory.gpu(*bdf).is_none() {
                tracked.presence = Presence::Missing;
                update.missing.push(ObjectKey::Gpu(*bdf));
                for (index, (_, presence)) in &mut tracked.partitions {
                    if *presence == Presence::Present {
                        *presence = Presence::Missing;
                        update.missing.push(ObjectKey::Partition(*bdf, *index));
                    }
                }
            }
        }
        if !update.is_empty() {
            self.generation += 1;
        }
        update
    }

    /// Whether [`Registry::apply`] would find nothing to change: every GPU
    /// read is present here and equal (its partitions with it), and no GPU
    /// present here is missing from the read.
    pub fn unchanged_by(&self, inventory: &Inventory) -> bool {
        let present = self
            .gpus
            .values()
            .filter(|t| t.presence == Presence::Present)
            .count();
        present == inventory.gpus.len()
            && inventory.gpus.iter().all(|gpu| {
                self.gpus
                    .get(&gpu.bdf)
                    .is_some_and(|t| t.presence == Presence::Present && t.gpu == *gpu)
            })
    }

    fn apply_gpu(&mut self, gpu: &Gpu, update: &mut Update) {
        let Some(tracked) = self.gpus.get_mut(&gpu.bdf) else {
            update.added.push(ObjectKey::Gpu(gpu.bdf));
            let partitions = gpu
                .partitions
                .iter()
                .map(|p| {
                    update.added.push(ObjectKey::Partition(gpu.bdf, p.index));
                    (p.index, (p.clone(), Presence::Present))
                })
                .collect();
            self.gpus.insert(
                gpu.bdf,
                Tracked {
                    gpu: gpu.clone(),
                    presence: Presence::Present,
                    partitions,
                },
            );
            return;
        };
        if tracked.gpu != *gpu || tracked.presence != Presence::Present {
            update.changed.push(ObjectKey::Gpu(gpu.bdf));
        }
        tracked.gpu = gpu.clone();
        tracked.presence = Presence::Present;
        for part in &gpu.partitions {
            let key = ObjectKey::Partition(gpu.bdf, part.index);
            match tracked.partitions.get_mut(&part.index) {
                None => update.added.push(key),
                Some((old, presence)) if old != part || *presence != Presence::Present => {
                    update.changed.push(key);
                }
                Some(_) => {}
            }
            tracked
                .partitions
                .insert(part.index, (part.clone(), Presence::Present));
        }
        for (index, (_, presence)) in &mut tracked.partitions {
            let gone = !gpu.partitions.iter().any(|p| p.index == *index);
            if gone && *presence == Presence::Present {
                *presence = Presence::Missing;
                update.missing.push(ObjectKey::Partition(gpu.bdf, *index));
            }
        }
    }

    /// Every GPU ever seen, ordered by PCI address.
    pub fn gpus(&self) -> impl Iterator<Item = (&Gpu, Presence)> {
        self.gpus.values().map(|t| (&t.gpu, t.presence))
    }

    /// The GPU at `bdf`, with its presence.
    pub fn gpu(&self, bdf: PciAddress) -> Option<(&Gpu, Presence)> {
        self.gpus.get(&bdf).map(|t| (&t.gpu, t.presence))
    }

    /// Partition `index` of the GPU at `bdf`, with its presence.
    pub fn partition(&self, bdf: PciAddress, index: u32) -> Option<(&Partition, Presence)> {
        let (part, presence) = self.gpus.get(&bdf)?.partitions.get(&index)?;
        Some((part, *presence))
    }

    /// Partition indices ever seen for the GPU at `bdf`.
    pub fn partition_indices(&self, bdf: PciAddress) -> Vec<u32> {
        self.gpus
            .get(&bdf)
            .map(|t| t.partitions.keys().copied().collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::inventory::{AmdSmiSummary, RestoreProps};

    pub(in crate::service) fn part(index: u32, cus: u32) -> Partition {
        Partition {
            index,
            kfd_node: 2 + index,
            gpu_id: Some(100 + u64::from(index)),
            render_minor: Some(128 + index),
            card_minor: None,
            bdf: "0000:05:00.0".parse().unwrap(),
            compute_units: cus,
            num_xcc: 1,
            vram_bytes: 1 << 30,
            xcp: None,
            restore: RestoreProps::default(),
        }
    }

    pub(in crate::service) fn gpu(bdf: &str, parts: Vec<Partition>) -> Gpu {
        Gpu {
            bdf: bdf.parse().unwrap(),
            rocr_uuid: None,
            unique_id: 1,
            gfx: None,
            compute_units: parts.iter().map(|p| p.compute_units).sum(),
            cus_per_wgp: 1,
            vram_bytes: 1 << 30,
            numa_node: None,
            market_name: None,
            amdsmi_uuid: None,
            derived_uuid: None,
            published_id: None,
            compute_partition: None,
            memory_partition: None,
            available_compute_partitions: vec![],
            supported_compute_partitions: vec![],
            available_memory_partitions: vec![],
            vendor_id: 4098,
            device_id: 1,
            revision: None,
            hive_id: 0,
            partition_profile: None,
            partition_profiles: vec![],
            partitions: parts,
            links: vec![],
        }
    }

    pub(in crate::service) fn inventory(gpus: Vec<Gpu>) -> Inventory {
        Inventory {
            gpus,
            cpus: vec![],
            generation_id: None,
            amdsmi: AmdSmiSummary::default(),
            product_names: None,
            warnings: vec![],
        }
    }

    #[test]
    fn first_read_adds_everything_and_a_repeat_changes_nothing() {
        let mut reg = Registry::default();
        let inv = inventory(vec![gpu("0000:05:00.0", vec![part(0, 38), part(1, 38)])]);
        let bdf = "0000:05:00.0".parse().unwrap();
        let update = reg.apply(&inv);
        assert_eq!(
            update.added,
            [
                ObjectKey::Gpu(bdf),
                ObjectKey::Partition(bdf, 0),
                ObjectKey::Partition(bdf, 1)
            ]
        );
        assert_eq!(reg.generation(), 1);
        assert!(reg.apply(&inv).is_empty());
        assert_eq!(reg.generation(), 1, "nothing changed, no new generation");
    }

    #[test]
    fn a_vanished_gpu_is_kept_as_missing_and_can_come_back() {
        let mut reg = Registry::default();
        let a = gpu("0000:05:00.0", vec![part(0, 38)]);
        let b = gpu("0000:15:00.0", vec![part(0, 38)]);
        reg.apply(&inventory(vec![a.clone(), b.clone()]));
        let update = reg.apply(&inventory(vec![a.clone()]));
        let bdf_b = b.bdf;
        assert_eq!(
            update.missing,
            [ObjectKey::Gpu(bdf_b), ObjectKey::Partition(bdf_b, 0)]
        );
        assert_eq!(reg.gpu(bdf_b).map(|(_, p)| p), Some(Presence::Missing));
        assert_eq!(reg.gpus().count(), 2);
        let update = reg.apply(&inventory(vec![a, b]));
        assert_eq!(
            update.changed,
            [ObjectKey::Gpu(bdf_b), ObjectKey::Partition(bdf_b, 0)]
        );
        assert_eq!(reg.gpu(bdf_b).map(|(_, p)| p), Some(Presence::Present));
    }

    #[test]
    fn changed_partitions_are_reported_individually() {
        let mut reg = Registry::default();
        reg.apply(&inventory(vec![gpu(
            "0000:05:00.0",
            vec![part(0, 38), part(1, 38)],
        )]));
        let update = reg.apply(&inventory(vec![gpu("0000:05:00.0", vec![part(0, 76)])]));
        let bdf = "0000:05:00.0".parse().unwrap();
        assert_eq!(
            update.changed,
            [ObjectKey::Gpu(bdf), ObjectKey::Partition(bdf, 0)]
        );
        assert_eq!(update.missing, [ObjectKey::Partition(bdf, 1)]);
        assert_eq!(reg.partition_indices(bdf), [0, 1]);
        assert_eq!(reg.generation(), 2);
    }

    /// `unchanged_by` is the service's shortcut past `apply`: it must say
    /// "unchanged" exactly when `apply` would report nothing, over a
    /// sequence of reads that adds, changes, loses and restores devices.
    #[test]
    fn unchanged_by_agrees_with_apply_on_every_kind_of_change() {
        let a = gpu("0000:05:00.0", vec![part(0, 38), part(1, 38)]);
        let b = gpu("0000:15:00.0", vec![part(0, 38)]);
        let a_one_part = gpu("0000:05:00.0", vec![part(0, 76)]);
        let reads = [
            inventory(vec![]),
            inventory(vec![a.clone()]),
            inventory(vec![a.clone()]),
            inventory(vec![a.clone(), b.clone()]),
            inventory(vec![a.clone(), b.clone()]),
            inventory(vec![a_one_part.clone(), b.clone()]),
            inventory(vec![a.clone(), b.clone()]),
            inventory(vec![b.clone()]),
            inventory(vec![b.clone()]),
            inventory(vec![a.clone(), b.clone()]),
            inventory(vec![]),
            inventory(vec![]),
        ];
        let mut reg = Registry::default();
        let mut verdicts = Vec::new();
        for (n, read) in reads.iter().enumerate() {
            let predicted = reg.unchanged_by(read);
            let applied = reg.apply(read);
            assert_eq!(predicted, applied.is_empty(), "read {n}: {applied:?}");
            verdicts.push(predicted);
        }
        assert_eq!(
            verdicts,
            [
                true, false, true, false, true, false, false, false, true, false, false, true
            ]
        );
    }
}
