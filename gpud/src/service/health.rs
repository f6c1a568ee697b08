//! The service's side of health checks: what to probe (paths from
//! [`HostPaths`](crate::HostPaths)), folding a round of results into the
//! [`Monitor`](crate::health::Monitor), and the health each object shows.

use std::{collections::BTreeMap, sync::Arc};

use ipc::Health;

use super::{ObjectKey, Presence, Service, Update};
use crate::{
    health::{self, Check, ProbeError, Stats, Target},
    inventory::Partition,
    pci::PciAddress,
};

/// What a GPU or partition shows: its health and why it is not healthy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shown {
    /// Healthy, unhealthy or missing.
    pub health: Health,
    /// Empty while healthy.
    pub reason: String,
}

impl Service {
    /// Whether the last AMD SMI probe reported a fatal device state.
    pub(super) fn amdsmi_fatal(&self) -> bool {
        self.amdsmi
            .as_ref()
            .is_some_and(|r| !health::amdsmi::fatal_states(r).is_empty())
    }

    /// The counters of the health checks.
    pub fn health_stats(&self) -> Arc<Stats> {
        self.health.stats().clone()
    }

    /// The probes of one pulse: one per present partition (a GPU's health is
    /// that of its partitions).
    pub fn health_targets(&self) -> Vec<Target<ObjectKey>> {
        let fatal = self
            .amdsmi
            .as_ref()
            .map(health::amdsmi::fatal_states)
            .unwrap_or_default();
        let mut targets = Vec::new();
        for (gpu, presence) in self.registry.gpus() {
            if presence != Presence::Present {
                continue;
            }
            for index in self.registry.partition_indices(gpu.bdf) {
                let Some((part, Presence::Present)) = self.registry.partition(gpu.bdf, index)
                else {
                    continue;
                };
                targets.push(Target {
                    key: ObjectKey::Partition(gpu.bdf, index),
                    checks: self.checks(gpu.bdf, part, &fatal),
                });
            }
        }
        targets
    }

    fn checks(
        &self,
        gpu: PciAddress,
        part: &Partition,
        fatal: &BTreeMap<PciAddress, String>,
    ) -> Vec<Check> {
        let paths = &self.config.paths;
        let mut checks: Vec<Check> = [
            part.render_minor
                .map(|m| Check::Opens(paths.render_node(m))),
            part.card_minor.map(|m| Check::Opens(paths.card_node(m))),
        ]
        .into_iter()
        .flatten()
        .collect();
        checks.push(Check::Exists(paths.kfd_device()));
        checks.push(Check::KfdNode {
            dir: paths.kfd_node(part.kfd_node),
            gpu_id: part.gpu_id,
        });
        let smi = fatal.get(&gpu).or_else(|| fatal.get(&part.bdf));
        checks.extend(smi.map(|state| Check::AmdSmi(state.clone())));
        checks
    }

    /// Folds one round of partition results in (each GPU passes when all its
    /// probed partitions pass) and says which objects changed health.
    pub fn record_health(&mut self, results: Vec<(ObjectKey, Result<(), ProbeError>)>) -> Update {
        let mut gpus: BTreeMap<PciAddress, Result<(), String>> = BTreeMap::new();
        let mut all = Vec::with_capacity(results.len() * 2);
        for (key, result) in results {
            let result = result.map_err(|e| e.to_string());
            if let ObjectKey::Partition(bdf, index) = key {
                let gpu = gpus.entry(bdf).or_insert(Ok(()));
                if let (Ok(()), Err(why)) = (&gpu, &result) {
                    *gpu = Err(format!("partition {index}: {why}"));
                }
            }
            all.push((key, result));
        }
        all.extend(gpus.into_iter().map(|(bdf, r)| (ObjectKey::Gpu(bdf), r)));
        let changed = self.health.pulse(all);
        for key in &changed {
            let shown = self.health_of(*key, Presence::Present);
            tracing::warn!(object = ?key, health = shown.health.as_str(), reason = %shown.reason, "health changed");
        }
        if !changed.is_empty() {
            Arc::make_mut(&mut self.registry).note_change();
        }
        Update {
            changed,
            ..Update::default()
        }
    }

    /// What `key` shows, given its presence in the inventory.
    pub fn health_of(&self, key: ObjectKey, presence: Presence) -> Shown {
        if presence == Presence::Missing {
            return Shown {
                health: Health::Missing,
                reason: "no longer found in the KFD topology".to_owned(),
            };
        }
        if self.health.healthy(key) {
            Shown {
                health: Health::Healthy,
                reason: String::new(),
            }
        } else {
            Shown {
                health: Health::Unhealthy,
                reason: self.health.reason(key).to_owned(),
            }
        }
    }
}
