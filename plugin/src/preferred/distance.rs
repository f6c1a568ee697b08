//! Pairwise distance between GPUs, from their links and NUMA nodes.

use std::collections::HashMap;

use super::{GpuTopology, Link, LinkKind};

/// Width of a tier: hop counts are clamped below it, so a farther tier always
/// costs more than a nearer one, whatever the hops.
const TIER: u32 = 1000;
/// Tiers, closest first.
const TIER_INTERNAL: u32 = 0;
const TIER_XGMI: u32 = 1;
const TIER_HOST_LOCAL: u32 = 2;
const TIER_HOST_REMOTE: u32 = 3;

/// Symmetric distance matrix over the topology (indices as in `gpus`).
#[derive(Debug, Clone)]
pub(super) struct Distances {
    n: usize,
    cost: Vec<u32>,
}

impl Distances {
    pub(super) fn new(gpus: &[GpuTopology]) -> Self {
        let n = gpus.len();
        let mut index: HashMap<&str, usize> = HashMap::with_capacity(n);
        for (i, gpu) in gpus.iter().enumerate() {
            index.entry(gpu.id.as_str()).or_insert(i);
        }
        let mut linked: Vec<Option<u32>> = vec![None; n * n];
        for (i, gpu) in gpus.iter().enumerate() {
            if index.get(gpu.id.as_str()) != Some(&i) {
                continue; // a duplicate entry: the first one wins
            }
            for link in &gpu.links {
                let Some(&j) = index.get(link.peer.as_str()).filter(|&&j| j != i) else {
                    continue;
                };
                let c = link_cost(link, same_numa(&gpus[i], &gpus[j]));
                for cell in [i * n + j, j * n + i] {
                    linked[cell] = Some(linked[cell].map_or(c, |old| old.min(c)));
                }
            }
        }
        let cost = linked
            .iter()
            .enumerate()
            .map(|(cell, c)| {
                let (i, j) = (cell / n, cell % n);
                match c {
                    _ if i == j => 0,
                    Some(c) => *c,
                    None => unlinked_cost(same_numa(&gpus[i], &gpus[j])),
                }
            })
            .collect();
        Self { n, cost }
    }

    /// Distance between GPUs `a` and `b` (0 for `a == b`).
    pub(super) fn get(&self, a: usize, b: usize) -> u32 {
        self.cost[a * self.n + b]
    }
}

fn same_numa(a: &GpuTopology, b: &GpuTopology) -> bool {
    a.numa.is_some() && a.numa == b.numa
}

fn host_tier(same_numa: bool) -> u32 {
    if same_numa {
        TIER_HOST_LOCAL
    } else {
        TIER_HOST_REMOTE
    }
}

fn link_cost(link: &Link, same_numa: bool) -> u32 {
    let tier = match link.kind {
        LinkKind::Internal => TIER_INTERNAL,
        LinkKind::Xgmi => TIER_XGMI,
        LinkKind::Pcie | LinkKind::Other => host_tier(same_numa),
    };
    tier * TIER + link.hops.clamp(1, TIER - 2)
}

/// No link listed: through the host, and farther than any listed host path.
fn unlinked_cost(same_numa: bool) -> u32 {
    host_tier(same_numa) * TIER + (TIER - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(id: &str, numa: Option<u32>, links: &[(&str, LinkKind, u32)]) -> GpuTopology {
        GpuTopology {
            id: id.into(),
            numa,
            links: links
                .iter()
                .map(|&(peer, kind, hops)| Link {
                    peer: peer.into(),
                    kind,
                    hops,
                })
                .collect(),
        }
    }

    #[test]
    fn tiers_order_links_whatever_the_hops() {
        let gpus = [
            gpu("a", Some(0), &[("b", LinkKind::Xgmi, 50_000)]),
            gpu("b", Some(0), &[("c", LinkKind::Pcie, 0)]),
            gpu("c", Some(0), &[("d", LinkKind::Internal, 7)]),
            gpu("d", Some(1), &[("a", LinkKind::Pcie, 1)]),
            gpu("a", Some(1), &[("c", LinkKind::Internal, 1)]), // duplicate: ignored
        ];
        let d = Distances::new(&gpus);
        let (internal, xgmi) = (d.get(2, 3), d.get(0, 1));
        let (local, unlinked_local, remote) = (d.get(1, 2), d.get(0, 2), d.get(0, 3));
        assert!(internal < xgmi, "{internal} {xgmi}");
        assert!(xgmi < local, "{xgmi} {local}");
        assert!(local < unlinked_local, "{local} {unlinked_local}");
        assert!(unlinked_local < remote, "{unlinked_local} {remote}");
        for i in 0..4 {
            assert_eq!(d.get(i, i), 0);
            for j in 0..4 {
                assert_eq!(d.get(i, j), d.get(j, i), "{i} {j}");
            }
        }
    }

    #[test]
    fn best_link_wins_and_unknown_peers_are_ignored() {
        let gpus = [
            gpu(
                "a",
                None,
                &[
                    ("b", LinkKind::Pcie, 2),
                    ("b", LinkKind::Xgmi, 3),
                    ("zz", LinkKind::Internal, 1),
                    ("a", LinkKind::Internal, 1),
                ],
            ),
            gpu("b", None, &[("a", LinkKind::Xgmi, 1)]),
        ];
        let d = Distances::new(&gpus);
        assert_eq!(d.get(0, 1), TIER_XGMI * TIER + 1);
        assert_eq!(d.get(0, 0), 0);
    }
}
