//! Choosing `k` GPUs among the candidates under a [`Policy`].
//!
//! Exact (every `k`-subset, in lexicographic order) while there are at most
//! [`EXACT_LIMIT`] subsets; otherwise greedy: from every candidate as a seed,
//! repeatedly add the candidate that scores best, keep the best result, and
//! polish it by swapping one chosen GPU for an unchosen one while that helps.
//! With `m` candidates, `f` fixed GPUs and `k` to choose, the greedy costs
//! `O(m² · k · (k + f))` (64 GPUs, `k` = 8: about half a million steps).

use super::{Policy, distance::Distances, pool::Candidate};

/// Largest number of subsets searched exhaustively (C(16, 8) = 12870 fits).
const EXACT_LIMIT: u64 = 20_000;
/// Most improvement passes after the greedy (each tries every single swap).
const IMPROVE_PASSES: usize = 8;

/// Score of a set of GPUs; smaller is better.
type Score = [i64; 3];

/// Running totals over the pairs that involve a chosen GPU.
#[derive(Debug, Clone, Copy, Default)]
struct Acc {
    /// Farthest pair (best-effort) or closest pair (spread).
    worst: Option<u32>,
    sum: u64,
    free: u64,
}

struct Scorer<'a, 'c> {
    policy: Policy,
    dist: &'a Distances,
    fixed: &'a [usize],
    cands: &'a [Candidate<'c>],
}

impl Scorer<'_, '_> {
    /// `acc` (the totals of `chosen`) with candidate `c` added.
    fn add(&self, mut acc: Acc, chosen: &[usize], c: usize) -> Acc {
        let gpu = self.cands[c].gpu;
        let others = chosen.iter().map(|&o| self.cands[o].gpu);
        for other in self.fixed.iter().copied().chain(others) {
            let d = self.dist.get(gpu, other);
            acc.sum += u64::from(d);
            acc.worst = Some(match (acc.worst, self.policy) {
                (None, _) => d,
                (Some(w), Policy::BestEffort) => w.max(d),
                (Some(w), Policy::Spread) => w.min(d),
            });
        }
        acc.free += u64::try_from(self.cands[c].free).unwrap_or(u64::MAX);
        acc
    }

    fn totals(&self, set: &[usize]) -> Acc {
        (0..set.len()).fold(Acc::default(), |acc, i| self.add(acc, &set[..i], set[i]))
    }

    fn score(&self, acc: Acc) -> Score {
        let clamp = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let key = [
            i64::from(acc.worst.unwrap_or(0)),
            clamp(acc.sum),
            clamp(acc.free),
        ];
        match self.policy {
            Policy::BestEffort => key,
            Policy::Spread => key.map(|v| -v),
        }
    }

    fn rate(&self, set: &[usize]) -> (Score, Vec<usize>) {
        let mut sorted = set.to_vec();
        sorted.sort_unstable();
        (self.score(self.totals(&sorted)), sorted)
    }
}

/// Chooses `k` of `cands` (indices into it, ascending), `k < cands.len()`.
pub(super) fn select(
    policy: Policy,
    dist: &Distances,
    fixed: &[usize],
    cands: &[Candidate<'_>],
    k: usize,
) -> Vec<usize> {
    let m = cands.len();
    if k >= m {
        return (0..m).collect();
    }
    let scorer = Scorer {
        policy,
        dist,
        fixed,
        cands,
    };
    if subsets(m, k) <= EXACT_LIMIT {
        exact(&scorer, k)
    } else {
        improve(&scorer, &greedy(&scorer, k))
    }
}

/// C(m, k), or anything above [`EXACT_LIMIT`] once it is that large.
fn subsets(m: usize, k: usize) -> u64 {
    let k = k.min(m - k);
    let mut r: u64 = 1;
    for i in 0..k {
        let Some(next) = u64::try_from(m - i).ok().and_then(|f| r.checked_mul(f)) else {
            return u64::MAX;
        };
        r = next / u64::try_from(i + 1).unwrap_or(u64::MAX);
        if r > EXACT_LIMIT {
            return r;
        }
    }
    r
}

fn exact(scorer: &Scorer<'_, '_>, k: usize) -> Vec<usize> {
    let m = scorer.cands.len();
    let mut set: Vec<usize> = (0..k).collect();
    let mut best = scorer.rate(&set);
    loop {
        // Next combination in lexicographic order.
        let Some(i) = (0..k).rev().find(|&i| set[i] < m - k + i) else {
            return best.1;
        };
        set[i] += 1;
        for j in i + 1..k {
            set[j] = set[j - 1] + 1;
        }
        let rated = scorer.rate(&set);
        if rated < best {
            best = rated;
        }
    }
}

fn greedy(scorer: &Scorer<'_, '_>, k: usize) -> Vec<usize> {
    let m = scorer.cands.len();
    let mut best: Option<(Score, Vec<usize>)> = None;
    for seed in 0..m {
        let mut set = vec![seed];
        let mut acc = scorer.add(Acc::default(), &[], seed);
        while set.len() < k {
            let next = (0..m)
                .filter(|c| !set.contains(c))
                .map(|c| (scorer.score(scorer.add(acc, &set, c)), c))
                .min();
            let Some((_, c)) = next else { break };
            acc = scorer.add(acc, &set, c);
            set.push(c);
        }
        let rated = scorer.rate(&set);
        if best.as_ref().is_none_or(|b| rated < *b) {
            best = Some(rated);
        }
    }
    best.map(|(_, set)| set).unwrap_or_default()
}

/// Swaps one chosen candidate for an unchosen one while the score improves.
fn improve(scorer: &Scorer<'_, '_>, set: &[usize]) -> Vec<usize> {
    let m = scorer.cands.len();
    let mut best = scorer.rate(set);
    for _ in 0..IMPROVE_PASSES {
        let mut improved = false;
        for i in 0..best.1.len() {
            let outside: Vec<usize> = (0..m).filter(|c| !best.1.contains(c)).collect();
            for c in outside {
                let mut trial = best.1.clone();
                trial[i] = c;
                let rated = scorer.rate(&trial);
                if rated < best {
                    best = rated;
                    improved = true;
                }
            }
        }
        if !improved {
            break;
        }
    }
    best.1
}
