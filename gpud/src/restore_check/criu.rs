//! CRIU's own GPU mapping at restore, reproduced step for step so that its
//! accept/refuse answer is CRIU's, known quirk included.
//!
//! 1. GPU counts must be equal; the checkpoint may not have more XGMI hives.
//! 2. Hive phase: the first checkpoint hive tries each local hive in list
//!    order, with the GPU search restricted to the two hives' members; on
//!    success both hives leave the lists and the rest is matched the same
//!    way. **Quirk:** when a later hive fails, the local hive is put back but
//!    the GPU and CPU pairs already made stay, so every further attempt for
//!    the hive hits "GPU mapping already exists". Checkpoint hives of sizes
//!    (2, 4) thus restore onto local hives listed as (2, 4) but not (4, 2).
//! 3. Remaining phase: the checkpoint GPUs not mapped yet against the local
//!    GPUs not mapped yet (unused members of local hives included).
//! 4. The GPU search takes the first checkpoint GPU of its list, tries every
//!    local GPU of its list, recurses, and undoes the pair on failure; the
//!    first complete assignment wins, with the CPU map it built.
//!
//! Order, as the spec gives it: checkpoint GPUs in image order, local GPUs in
//! sysfs listing order, hives in the order they are found; the lists the GPU
//! search walks are built by prepending, so it walks them in reverse. Order
//! only changes the answer through the hive phase (and the CPU map the first
//! successful hive match leaves behind); it always changes the mapping.
//!
//! The search is exhaustive, so it is pruned: before a search step goes
//! deeper it checks that the GPUs left can still all be matched one pair at a
//! time under the CPU map so far (a maximum bipartite matching). That only
//! cuts branches that cannot succeed, so the first assignment found, and with
//! it the answer, is unchanged. A step budget bounds what is left.

use super::{
    bipartite,
    pairing::{CpuMap, Pairing},
};

/// Search steps before giving up.
pub const STEP_LIMIT: u64 = 20_000;

/// The search ran out of steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the GPU search gave up after {steps} steps")]
pub struct SearchTooLarge {
    pub steps: u64,
}

/// Counts search steps against [`STEP_LIMIT`].
#[derive(Debug, Default)]
pub struct Budget {
    steps: u64,
}

impl Budget {
    /// One more step.
    ///
    /// # Errors
    /// Past [`STEP_LIMIT`].
    pub fn step(&mut self) -> Result<(), SearchTooLarge> {
        self.steps += 1;
        if self.steps > STEP_LIMIT {
            return Err(SearchTooLarge { steps: self.steps });
        }
        Ok(())
    }
}

/// Where CRIU stops, with its log message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
    /// "Number of devices mismatch".
    DeviceCount { checkpoint: usize, local: usize },
    /// "Number of xgmi groups mismatch".
    HiveCount { checkpoint: usize, local: usize },
    /// "Failed to match all GPU groups": checkpoint hive `hive` found no
    /// local hive; `stuck` tells whether pairs from an abandoned attempt were
    /// left behind (the quirk).
    Hives { hive: usize, stuck: bool },
    /// "Failed to match remaining nodes".
    Remaining,
}

impl Stop {
    /// CRIU's log line for it.
    pub fn message(&self) -> String {
        match self {
            Self::DeviceCount { checkpoint, local } => {
                format!("Number of devices mismatch (checkpointed:{checkpoint} local:{local})")
            }
            Self::HiveCount { checkpoint, local } => {
                format!("Number of xgmi groups mismatch (checkpointed:{checkpoint} local:{local})")
            }
            Self::Hives { .. } => "Failed to match all GPU groups".to_owned(),
            Self::Remaining => "Failed to match remaining nodes".to_owned(),
        }
    }
}

/// GPU and CPU pairs made so far.
#[derive(Debug, Clone, Default)]
struct Maps {
    gpus: Vec<(usize, usize)>,
    cpus: CpuMap,
}

impl Maps {
    fn has_src(&self, s: usize) -> bool {
        self.gpus.iter().any(|(a, _)| *a == s)
    }

    fn has_dst(&self, d: usize) -> bool {
        self.gpus.iter().any(|(_, b)| *b == d)
    }
}

struct Search<'p, 'a> {
    pairing: &'p Pairing<'a>,
    budget: Budget,
    /// Set when a hive attempt left its pairs behind.
    stuck: bool,
    /// The deepest checkpoint hive the hive phase failed on.
    failed_hive: Option<usize>,
}

/// Runs CRIU's mapping: `Ok(Ok(pairs))` with (checkpoint slot, local slot)
/// pairs when it succeeds, `Ok(Err(stop))` where CRIU would stop.
///
/// # Errors
/// When the search needs more than [`STEP_LIMIT`] steps.
pub fn run(pairing: &Pairing<'_>) -> Result<Result<Vec<(usize, usize)>, Stop>, SearchTooLarge> {
    let (n, m) = (pairing.src_len(), pairing.dst_len());
    if n != m {
        return Ok(Err(Stop::DeviceCount {
            checkpoint: n,
            local: m,
        }));
    }
    let (src_hives, dst_hives) = (&pairing.src.hives, &pairing.dst.hives);
    if src_hives.len() > dst_hives.len() {
        return Ok(Err(Stop::HiveCount {
            checkpoint: src_hives.len(),
            local: dst_hives.len(),
        }));
    }
    let mut search = Search {
        pairing,
        budget: Budget::default(),
        stuck: false,
        failed_hive: None,
    };
    let mut maps = Maps::default();
    let src_lists: Vec<Vec<usize>> = src_hives.iter().map(|h| reversed(h)).collect();
    let dst_lists: Vec<Vec<usize>> = dst_hives.iter().map(|h| reversed(h)).collect();
    if !search.match_hives(&src_lists, 0, dst_lists, &mut maps)? {
        return Ok(Err(Stop::Hives {
            hive: search.failed_hive.unwrap_or(0),
            stuck: search.stuck,
        }));
    }
    let rest_src: Vec<usize> = (0..n).rev().filter(|&s| !maps.has_src(s)).collect();
    let rest_dst: Vec<usize> = (0..m).rev().filter(|&d| !maps.has_dst(d)).collect();
    if !search.map_devices(&rest_src, &rest_dst, &mut maps)? {
        return Ok(Err(Stop::Remaining));
    }
    maps.gpus.sort_unstable();
    Ok(Ok(maps.gpus))
}

fn reversed(list: &[usize]) -> Vec<usize> {
    list.iter().rev().copied().collect()
}

impl Search<'_, '_> {
    /// Matches checkpoint hive `k` and the ones after it. Pairs of a hive
    /// whose later hives fail are not taken back (the quirk).
    fn match_hives(
        &mut self,
        src: &[Vec<usize>],
        k: usize,
        dst: Vec<Vec<usize>>,
        maps: &mut Maps,
    ) -> Result<bool, SearchTooLarge> {
        let Some(hive) = src.get(k) else {
            return Ok(true);
        };
        for i in 0..dst.len() {
            self.budget.step()?;
            if !self.map_devices(hive, &dst[i], maps)? {
                continue;
            }
            let mut rest = dst.clone();
            rest.remove(i);
            if self.match_hives(src, k + 1, rest, maps)? {
                return Ok(true);
            }
            // The local hive goes back into the list, the pairs stay.
            self.stuck = true;
        }
        self.failed_hive.get_or_insert(k);
        Ok(false)
    }

    /// CRIU's GPU search over `src` and `dst` (slots, in walking order). On
    /// success `maps` holds the new pairs; on failure it is unchanged.
    fn map_devices(
        &mut self,
        src: &[usize],
        dst: &[usize],
        maps: &mut Maps,
    ) -> Result<bool, SearchTooLarge> {
        self.budget.step()?;
        let Some((&s, rest)) = src.split_first() else {
            return Ok(true);
        };
        if !self.feasible(src, dst, maps) {
            return Ok(false);
        }
        for (i, &d) in dst.iter().enumerate() {
            let mut trial = maps.clone();
            if !self.pairing.map_device(s, d, &mut trial.cpus) {
                continue;
            }
            if trial.has_src(s) || trial.has_dst(d) {
                // "GPU mapping already exists": the search gives up here.
                return Ok(false);
            }
            trial.gpus.push((s, d));
            let others: Vec<usize> = dst
                .iter()
                .enumerate()
                .filter(|&(j, _)| j != i)
                .map(|(_, &x)| x)
                .collect();
            if self.map_devices(rest, &others, &mut trial)? {
                *maps = trial;
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Whether every GPU of `src` can still get its own GPU of `dst`.
    fn feasible(&self, src: &[usize], dst: &[usize], maps: &Maps) -> bool {
        if src.iter().any(|&s| maps.has_src(s)) {
            return false;
        }
        bipartite::saturates_left(src.len(), dst.len(), |a, b| {
            self.pairing.possible_under(src[a], dst[b], &maps.cpus)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_stops_a_search_past_the_limit() {
        let mut budget = Budget::default();
        for _ in 0..STEP_LIMIT {
            budget.step().unwrap();
        }
        assert_eq!(
            budget.step(),
            Err(SearchTooLarge {
                steps: STEP_LIMIT + 1
            })
        );
    }

    #[test]
    fn stops_carry_criu_log_lines() {
        let stop = Stop::DeviceCount {
            checkpoint: 1,
            local: 2,
        };
        assert_eq!(
            stop.message(),
            "Number of devices mismatch (checkpointed:1 local:2)"
        );
        let stop = Stop::Hives {
            hive: 0,
            stuck: true,
        };
        assert_eq!(stop.message(), "Failed to match all GPU groups");
        assert_eq!(Stop::Remaining.message(), "Failed to match remaining nodes");
    }
}
