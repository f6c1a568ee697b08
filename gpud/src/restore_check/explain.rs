//! The same question without CRIU's search: does any mapping exist that
//! CRIU's rules allow? And if not, what stands in the way.
//!
//! The rules are CRIU's (docs/criu-restore.md §1–2): equal GPU counts, no more
//! checkpoint hives than local ones, every checkpoint hive inside one local
//! hive of its own, the per-pair checks, and with the NUMA check one CPU map,
//! one-to-one, that every pair respects. The search is exhaustive over the
//! CPU map and the hive assignment; the GPUs themselves are matched with a
//! maximum bipartite matching, so order plays no part.

use super::{
    bipartite,
    criu::{Budget, SearchTooLarge},
    options::Check,
    pairing::{CpuMap, Failure, Pairing, Value},
};

/// (checkpoint slot, local slot) pairs.
pub type Pairs = Vec<(usize, usize)>;

/// One reason for a refusal: the failure, and the GPUs it concerns when it
/// is about a pair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnosis {
    pub src: Option<usize>,
    pub dst: Option<usize>,
    pub failure: Failure,
}

/// A mapping that satisfies every rule, if there is one.
///
/// # Errors
/// When the search needs more than the step limit.
pub fn search(pairing: &Pairing<'_>) -> Result<Option<Pairs>, SearchTooLarge> {
    if pairing.src_len() != pairing.dst_len() || pairing.src.hives.len() > pairing.dst.hives.len() {
        return Ok(None);
    }
    let src_cpus = pairing.src_cpus();
    let dst_cpus = pairing.dst_cpus();
    let mut budget = Budget::default();
    if !pairing.options.is_on(Check::Numa) {
        return assign_hives(
            pairing,
            &CpuMap::default(),
            &mut vec![None; pairing.src.hives.len()],
            &mut budget,
        );
    }
    let mut sigma = CpuMap::default();
    sigmas(pairing, &src_cpus, &dst_cpus, &mut sigma, &mut budget)
}

/// Tries every one-to-one map of the checkpoint CPUs left onto local CPUs.
fn sigmas(
    pairing: &Pairing<'_>,
    src_cpus: &[usize],
    dst_cpus: &[usize],
    sigma: &mut CpuMap,
    budget: &mut Budget,
) -> Result<Option<Pairs>, SearchTooLarge> {
    let Some((&cpu, rest)) = src_cpus.split_first() else {
        let mut hives = vec![None; pairing.src.hives.len()];
        return assign_hives(pairing, sigma, &mut hives, budget);
    };
    for &target in dst_cpus.iter().filter(|&&d| !sigma.is_target(d)) {
        budget.step()?;
        let mut next = sigma.clone();
        next.insert(cpu, target);
        if let Some(pairs) = sigmas(pairing, rest, dst_cpus, &mut next, budget)? {
            return Ok(Some(pairs));
        }
    }
    Ok(None)
}

/// Gives each checkpoint hive from the first unassigned one on a local hive of
/// its own, pruning with a matching where unassigned hives may go anywhere.
fn assign_hives(
    pairing: &Pairing<'_>,
    sigma: &CpuMap,
    hives: &mut Vec<Option<usize>>,
    budget: &mut Budget,
) -> Result<Option<Pairs>, SearchTooLarge> {
    budget.step()?;
    let Some(pairs) = matching(pairing, sigma, hives) else {
        return Ok(None);
    };
    let Some(k) = hives.iter().position(Option::is_none) else {
        return Ok(Some(pairs));
    };
    let size = pairing.src.hives[k].len();
    for (j, members) in pairing.dst.hives.iter().enumerate() {
        if members.len() < size || hives.contains(&Some(j)) {
            continue;
        }
        hives[k] = Some(j);
        if let Some(pairs) = assign_hives(pairing, sigma, hives, budget)? {
            return Ok(Some(pairs));
        }
        hives[k] = None;
    }
    Ok(None)
}

/// A complete matching under `sigma` and the hives assigned so far.
fn matching(pairing: &Pairing<'_>, sigma: &CpuMap, hives: &[Option<usize>]) -> Option<Pairs> {
    let edge = |s: usize, d: usize| {
        let hive_ok = match pairing.src.hive_of[s].and_then(|h| hives[h]) {
            Some(j) => pairing.dst.hive_of[d] == Some(j),
            None => true,
        };
        hive_ok && pairing.fits_sigma(s, d, sigma)
    };
    let m = bipartite::max_matching(pairing.src_len(), pairing.dst_len(), edge);
    m.iter()
        .enumerate()
        .map(|(s, d)| d.map(|d| (s, d)))
        .collect()
}

/// Why no mapping exists, most basic reason first.
///
/// # Errors
/// When a search needs more than the step limit.
pub fn diagnose(pairing: &Pairing<'_>) -> Result<Vec<Diagnosis>, SearchTooLarge> {
    let (n, m) = (pairing.src_len(), pairing.dst_len());
    if n != m {
        return Ok(vec![structural("gpu_count", count(n), count(m))]);
    }
    let (sh, dh) = (pairing.src.hives.len(), pairing.dst.hives.len());
    if sh > dh {
        return Ok(vec![structural("xgmi_hives", count(sh), count(dh))]);
    }
    let single = bipartite::max_matching(n, m, |s, d| pairing.fixed(s, d));
    if single.iter().any(Option::is_none) {
        return Ok(pair_failures(pairing, &single));
    }
    let no_numa_options = pairing.options.clone().with(Check::Numa, false);
    let no_numa = Pairing::new(pairing.src.topo, pairing.dst.topo, &no_numa_options);
    match search(&no_numa)? {
        None => Ok(vec![hive_failure(pairing)]),
        Some(pairs) => Ok(vec![numa_failure(pairing, &pairs)]),
    }
}

fn count(n: usize) -> Value {
    Value::Number(u64::try_from(n).unwrap_or(u64::MAX))
}

fn structural(property: &'static str, checkpoint: Value, local: Value) -> Diagnosis {
    Diagnosis {
        src: None,
        dst: None,
        failure: Failure {
            property,
            checkpoint,
            local,
            option: None,
        },
    }
}

/// Pairs each checkpoint GPU left unmatched with the unmatched local GPU it
/// fails on least, and lists those failures.
fn pair_failures(pairing: &Pairing<'_>, single: &[Option<usize>]) -> Vec<Diagnosis> {
    let mut free: Vec<usize> = (0..pairing.dst_len())
        .filter(|d| !single.contains(&Some(*d)))
        .collect();
    let mut out = Vec::new();
    for s in (0..single.len()).filter(|&s| single[s].is_none()) {
        let best = free
            .iter()
            .enumerate()
            .map(|(i, &d)| (pairing.failures(s, d), i))
            .min_by_key(|(f, _)| f.len());
        let Some((failures, i)) = best else { break };
        let d = free.remove(i);
        out.extend(failures.into_iter().map(|failure| Diagnosis {
            src: Some(s),
            dst: Some(d),
            failure,
        }));
    }
    out
}

/// The first checkpoint hive that fits no local hive on its own, else the
/// first hive: they cannot all be placed at once.
fn hive_failure(pairing: &Pairing<'_>) -> Diagnosis {
    let fits_alone =
        |h: &Vec<usize>| {
            pairing.dst.hives.iter().any(|j| {
                bipartite::saturates_left(h.len(), j.len(), |a, b| pairing.fixed(h[a], j[b]))
            })
        };
    let k = pairing
        .src
        .hives
        .iter()
        .position(|h| !fits_alone(h))
        .unwrap_or(0);
    let sizes: Vec<String> = pairing
        .dst
        .hives
        .iter()
        .map(|h| h.len().to_string())
        .collect();
    let src = pairing.src.hives.get(k);
    Diagnosis {
        src: src.and_then(|h| h.first().copied()),
        dst: None,
        failure: Failure {
            property: "xgmi_hive",
            checkpoint: Value::Text(format!("hive of {} GPUs", src.map_or(0, Vec::len))),
            local: Value::Text(format!("hives of [{}] GPUs", sizes.join(", "))),
            option: None,
        },
    }
}

/// Walks a mapping found without the NUMA check and reports the first pair
/// that breaks the CPU grouping.
fn numa_failure(pairing: &Pairing<'_>, pairs: &Pairs) -> Diagnosis {
    let mut map = CpuMap::default();
    for &(s, d) in pairs {
        let local_cpu = pairing.dst.cpu_links(d).find_map(|l| l.target);
        for src_cpu in pairing.src.cpu_links(s).filter_map(|l| l.target) {
            let Some(local_cpu) = local_cpu else { continue };
            let broken = match map.get(src_cpu) {
                Some(mapped) => mapped != local_cpu,
                None => map.is_target(local_cpu),
            };
            if broken {
                return Diagnosis {
                    src: Some(s),
                    dst: Some(d),
                    failure: Failure {
                        property: "numa_node",
                        checkpoint: Value::Number(u64::from(pairing.src.topo.nodes[src_cpu].id)),
                        local: Value::Number(u64::from(pairing.dst.topo.nodes[local_cpu].id)),
                        option: Some(Check::Numa),
                    },
                };
            }
            if map.get(src_cpu).is_none() {
                map.insert(src_cpu, local_cpu);
            }
        }
    }
    Diagnosis {
        src: None,
        dst: None,
        failure: Failure {
            property: "numa_node",
            checkpoint: Value::Text("CPU grouping of the checkpoint".to_owned()),
            local: Value::Text("no one-to-one CPU map fits".to_owned()),
            option: Some(Check::Numa),
        },
    }
}
