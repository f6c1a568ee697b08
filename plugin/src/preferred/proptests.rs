//! Property tests of [`preferred`] over random topologies and requests.
//!
//! Invariants checked for every case (`A` = `available`, `M` =
//! `must_include` without repeats, `k = size - |M|`):
//! * it does not panic, and is deterministic;
//! * `len == min(size, |A ∪ M|)`, no ID twice, every ID from `A ∪ M`;
//! * if `size >= |M|` the answer starts with `M` in order, else it is `M[..size]`;
//! * if at least `k` known GPUs not named by `M` have a slot in `A \ M`, the
//!   `k` added IDs are slots of `k` distinct such GPUs, each the lowest slot of
//!   its GPU in `A \ M`, and the answer does not depend on the order of `A`;
//! * for `k = 2` and no `M`, the pair is the closest (best-effort) or the
//!   farthest (spread) candidate pair;
//! * on topologies of clean xGMI hives (exhaustive and greedy search alike),
//!   best-effort stays inside one hive whenever a hive has `k` candidates.

use std::collections::{BTreeSet, HashMap, HashSet};

use proptest::{prelude::*, sample::Index};

use super::{distance::Distances, *};

#[derive(Debug, Clone)]
struct Case {
    gpus: Vec<GpuTopology>,
    available: Vec<String>,
    shuffled: Vec<String>,
    must: Vec<String>,
    size: usize,
    policy: Policy,
}

fn policy() -> impl Strategy<Value = Policy> {
    prop_oneof![Just(Policy::BestEffort), Just(Policy::Spread)]
}

fn kind(k: u8) -> LinkKind {
    [
        LinkKind::Internal,
        LinkKind::Xgmi,
        LinkKind::Pcie,
        LinkKind::Other,
    ][usize::from(k % 4)]
}

/// GPUs `g0..`, all-to-all xGMI inside random hives, plus random extra links
/// (`extra`: false keeps hives clean), some to a GPU nobody lists.
fn topology(
    n: std::ops::RangeInclusive<usize>,
    extra: bool,
) -> impl Strategy<Value = Vec<GpuTopology>> {
    let gpu = (
        prop::option::of(0..4_u32),
        prop::option::of(0..3_u32),
        prop::collection::vec(
            (any::<Index>(), any::<u8>(), 0..5_u32),
            0..if extra { 5 } else { 1 },
        ),
    );
    prop::collection::vec(gpu, n).prop_map(move |raw| {
        let n = raw.len();
        let name = |i: usize| {
            if i < n {
                format!("g{i}")
            } else {
                "ghost".to_owned()
            }
        };
        raw.iter()
            .enumerate()
            .map(|(i, (hive, numa, links))| {
                let hive_links = (0..n)
                    .filter(|&j| j != i && hive.is_some() && raw[j].0 == *hive)
                    .map(|j| Link {
                        peer: name(j),
                        kind: LinkKind::Xgmi,
                        hops: 1,
                    });
                let other = links.iter().filter(|_| extra).map(|(peer, k, hops)| Link {
                    peer: name(peer.index(n + 1)),
                    kind: kind(*k),
                    hops: *hops,
                });
                GpuTopology {
                    id: name(i),
                    numa: *numa,
                    links: hive_links.chain(other).collect(),
                }
            })
            .collect()
    })
}

/// A request over `gpus`: random slot counts, a random shuffled subset of
/// their slots plus odd IDs, and a few `must_include` IDs, mostly from it.
fn request(gpus: Vec<GpuTopology>) -> impl Strategy<Value = Case> {
    let n = gpus.len();
    (prop::collection::vec(1..=4_u32, n), any::<u64>()).prop_flat_map(move |(counts, odd)| {
        let mut all: Vec<String> = (0..n)
            .flat_map(|g| (0..counts[g]).map(move |s| slot_id(&format!("g{g}"), s)))
            .collect();
        let junk = ["junk", "ghost#0", "g0#01", "g0#", "#2", "elsewhere#3"];
        all.extend(
            junk.iter()
                .filter(|_| odd % 3 == 0)
                .map(|s| (*s).to_owned()),
        );
        let len = all.len();
        let gpus = gpus.clone();
        prop::sample::subsequence(all, 0..=len)
            .prop_shuffle()
            .prop_flat_map(move |available| {
                let shuffled = Just(available.clone()).prop_shuffle();
                let must = prop::collection::vec((any::<Index>(), any::<u8>()), 0..=3);
                (
                    Just(gpus.clone()),
                    Just(available),
                    shuffled,
                    must,
                    0..=10_usize,
                    policy(),
                )
            })
            .prop_map(|(gpus, available, shuffled, picks, size, policy)| {
                let must = picks
                    .iter()
                    .filter_map(|(i, outside)| match (available.is_empty(), outside % 8) {
                        (_, 0) => Some("outside#0".to_owned()),
                        (true, _) => None,
                        (false, _) => Some(i.get(&available).clone()),
                    })
                    .collect();
                Case {
                    gpus,
                    available,
                    shuffled,
                    must,
                    size,
                    policy,
                }
            })
    })
}

fn dedup(ids: &[String]) -> Vec<String> {
    let mut seen = HashSet::new();
    ids.iter()
        .filter(|id| seen.insert(id.as_str()))
        .cloned()
        .collect()
}

fn gpu_of(id: &str) -> Option<&str> {
    parse_slot(id).map(|(gpu, _)| gpu)
}

/// The basic invariants; returns the added IDs if the distinct case applies.
fn check_basics(case: &Case, answer: &[String]) -> Option<Vec<String>> {
    let must = dedup(&case.must);
    let pool: HashSet<&String> = case.available.iter().chain(&case.must).collect();
    assert_eq!(answer.len(), case.size.min(pool.len()), "{answer:?}");
    assert_eq!(
        answer.iter().collect::<HashSet<_>>().len(),
        answer.len(),
        "{answer:?}"
    );
    assert!(answer.iter().all(|id| pool.contains(id)), "{answer:?}");
    if case.size < must.len() {
        assert_eq!(answer, &must[..case.size]);
        return None;
    }
    assert_eq!(&answer[..must.len()], &must[..], "must_include first");
    let known: HashSet<&str> = case.gpus.iter().map(|g| g.id.as_str()).collect();
    let taken: HashSet<&str> = must.iter().filter_map(|id| gpu_of(id)).collect();
    let free: HashSet<&str> = case
        .available
        .iter()
        .filter(|id| !must.contains(id))
        .filter_map(|id| gpu_of(id))
        .filter(|gpu| known.contains(gpu) && !taken.contains(gpu))
        .collect();
    let k = case.size - must.len();
    (free.len() >= k).then(|| answer[must.len()..].to_vec())
}

/// Added IDs: distinct free known GPUs, lowest slot each.
fn check_distinct(case: &Case, added: &[String]) {
    let must = dedup(&case.must);
    let mut lowest: HashMap<&str, u32> = HashMap::new();
    for (gpu, slot) in case
        .available
        .iter()
        .filter(|id| !must.contains(id))
        .filter_map(|id| parse_slot(id))
    {
        let low = lowest.entry(gpu).or_insert(slot);
        *low = (*low).min(slot);
    }
    let taken: HashSet<&str> = must.iter().filter_map(|id| gpu_of(id)).collect();
    let mut gpus = HashSet::new();
    for id in added {
        let (gpu, slot) = parse_slot(id).expect("a scored ID parses");
        assert!(
            case.gpus.iter().any(|g| g.id == gpu),
            "{id} is on a known GPU"
        );
        assert!(
            !taken.contains(gpu) && gpus.insert(gpu),
            "{id}: GPU chosen twice"
        );
        assert_eq!(
            lowest.get(gpu),
            Some(&slot),
            "{id} is its GPU's lowest free slot"
        );
    }
}

/// For two added GPUs and no must_include: the best pair by distance.
fn check_pair(case: &Case, added: &[String]) {
    let index: HashMap<&str, usize> = case
        .gpus
        .iter()
        .enumerate()
        .map(|(i, g)| (g.id.as_str(), i))
        .collect();
    let at = |id: &String| gpu_of(id).and_then(|g| index.get(g).copied());
    let cands: BTreeSet<usize> = case.available.iter().filter_map(at).collect();
    let d = Distances::new(&case.gpus);
    let pairs = cands
        .iter()
        .flat_map(|&a| cands.iter().filter(move |&&b| b > a).map(move |&b| (a, b)));
    let dists = pairs.map(|(a, b)| d.get(a, b));
    let (best, got) = match case.policy {
        Policy::BestEffort => (
            dists.min(),
            d.get(at(&added[0]).unwrap(), at(&added[1]).unwrap()),
        ),
        Policy::Spread => (
            dists.max(),
            d.get(at(&added[0]).unwrap(), at(&added[1]).unwrap()),
        ),
    };
    assert_eq!(Some(got), best, "{added:?}");
}

/// Clean hives: best-effort stays in one hive when a hive can hold the request.
fn check_hive(case: &Case, answer: &[String]) {
    let hive: HashMap<&str, BTreeSet<&str>> = case
        .gpus
        .iter()
        .map(|g| {
            let peers = g
                .links
                .iter()
                .filter(|l| l.kind == LinkKind::Xgmi)
                .map(|l| l.peer.as_str());
            (g.id.as_str(), peers.chain([g.id.as_str()]).collect())
        })
        .collect();
    let cands: BTreeSet<&str> = case
        .available
        .iter()
        .filter_map(|id| gpu_of(id))
        .filter(|g| hive.contains_key(g))
        .collect();
    let fits = hive
        .values()
        .any(|h| h.len() > 1 && h.intersection(&cands).count() >= case.size);
    if case.policy == Policy::BestEffort && case.must.is_empty() && case.size >= 2 && fits {
        let first = &hive[gpu_of(&answer[0]).unwrap()];
        assert!(
            answer.iter().all(|id| first.contains(gpu_of(id).unwrap())),
            "{answer:?}"
        );
    }
}

fn check(case: &Case, clean: bool) {
    let answer = preferred(
        case.policy,
        &case.gpus,
        &case.available,
        &case.must,
        case.size,
    );
    assert_eq!(
        answer,
        preferred(
            case.policy,
            &case.gpus,
            &case.available,
            &case.must,
            case.size
        )
    );
    if let Some(added) = check_basics(case, &answer) {
        check_distinct(case, &added);
        let reordered = preferred(
            case.policy,
            &case.gpus,
            &case.shuffled,
            &case.must,
            case.size,
        );
        assert_eq!(answer, reordered, "the order of available does not matter");
        if case.must.is_empty() && added.len() == 2 {
            check_pair(case, &added);
        }
        if clean {
            check_hive(case, &answer);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn random_topologies(case in topology(1..=16, true).prop_flat_map(request)) {
        check(&case, false);
    }

    #[test]
    fn clean_hives(case in topology(1..=16, false).prop_flat_map(request)) {
        check(&case, true);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Up to 48 GPUs: past the exhaustive search.
    #[test]
    fn clean_hives_greedy(case in topology(20..=48, false).prop_flat_map(request)) {
        check(&case, true);
    }
}
