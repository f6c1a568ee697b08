use std::collections::{BTreeSet, HashSet};

use super::*;

/// MI210-like: GPUs g0..g7, hives {g0..g3} on NUMA 0 and {g4..g7} on NUMA 1,
/// all-to-all xGMI (1 hop) inside a hive, PCIe across.
fn mi210() -> Vec<GpuTopology> {
    (0..8)
        .map(|i| GpuTopology {
            id: format!("g{i}"),
            numa: Some(i / 4),
            links: (0..8)
                .filter(|&j| j != i)
                .map(|j| Link {
                    peer: format!("g{j}"),
                    kind: if i / 4 == j / 4 {
                        LinkKind::Xgmi
                    } else {
                        LinkKind::Pcie
                    },
                    hops: if i / 4 == j / 4 { 1 } else { 3 },
                })
                .collect(),
        })
        .collect()
}

/// Every slot of the given GPUs, slot-major like a ListAndWatch listing.
fn slots(gpus: &[u32], count: u32) -> Vec<String> {
    (0..count)
        .flat_map(|s| gpus.iter().map(move |g| slot_id(&format!("g{g}"), s)))
        .collect()
}

fn all_free() -> Vec<String> {
    slots(&[0, 1, 2, 3, 4, 5, 6, 7], 10)
}

/// Sorted GPU numbers of an answer.
fn gpu_numbers(answer: &[String]) -> Vec<u32> {
    let mut out: Vec<u32> = answer
        .iter()
        .map(|id| parse_slot(id).unwrap().0[1..].parse().unwrap())
        .collect();
    out.sort_unstable();
    out
}

fn hives(answer: &[String]) -> BTreeSet<u32> {
    gpu_numbers(answer).iter().map(|g| g / 4).collect()
}

fn ids(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

/// Checks the invariants every answer must hold, and returns the answer.
fn valid(answer: Vec<String>, available: &[String], must: &[String], size: usize) -> Vec<String> {
    let pool: HashSet<&String> = available.iter().chain(must).collect();
    assert_eq!(answer.len(), size.min(pool.len()), "{answer:?}");
    assert_eq!(answer.iter().collect::<HashSet<_>>().len(), answer.len());
    assert!(answer.iter().all(|id| pool.contains(id)), "{answer:?}");
    assert!(must.iter().all(|id| answer.contains(id)), "{answer:?}");
    answer
}

#[test]
fn slot_ids_round_trip_and_split_on_the_last_hash() {
    assert_eq!(slot_id("0000:03:00.0", 3), "0000:03:00.0#3");
    assert_eq!(parse_slot("0000:03:00.0#3"), Some(("0000:03:00.0", 3)));
    assert_eq!(parse_slot("a#b#12"), Some(("a#b", 12)));
    assert_eq!(parse_slot(&slot_id("x", u32::MAX)), Some(("x", u32::MAX)));
    for bad in [
        "",
        "g",
        "g#",
        "#1",
        "g#01",
        "g#+1",
        "g#-1",
        "g#1a",
        "g#4294967296",
    ] {
        assert_eq!(parse_slot(bad), None, "{bad}");
    }
}

#[test]
fn policies_parse_and_name_bad_values() {
    assert_eq!("besteffort".parse(), Ok(Policy::BestEffort));
    assert_eq!("binpack".parse(), Ok(Policy::BestEffort));
    assert_eq!("Spread".parse(), Ok(Policy::Spread));
    assert_eq!(Policy::Spread.to_string().parse(), Ok(Policy::Spread));
    assert_eq!(Policy::default(), Policy::BestEffort);
    let err = "pack-tight".parse::<Policy>().unwrap_err();
    assert_eq!(err.value(), "pack-tight");
    assert!(err.to_string().contains("\"pack-tight\""), "{err}");
}

#[test]
fn best_effort_keeps_small_requests_inside_one_hive() {
    let (gpus, free) = (mi210(), all_free());
    for size in 2..=4 {
        let answer = valid(
            preferred(Policy::BestEffort, &gpus, &free, &[], size),
            &free,
            &[],
            size,
        );
        assert_eq!(hives(&answer).len(), 1, "{size}: {answer:?}");
        assert_eq!(gpu_numbers(&answer).len(), size);
        assert!(answer.iter().all(|id| id.ends_with("#0")), "{answer:?}");
    }
    // Five cannot fit a hive: four in one, one in the other.
    let answer = preferred(Policy::BestEffort, &gpus, &free, &[], 5);
    assert_eq!(gpu_numbers(&answer), [0, 1, 2, 3, 4]);
}

#[test]
fn spread_puts_one_gpu_in_each_hive() {
    let (gpus, free) = (mi210(), all_free());
    let answer = valid(
        preferred(Policy::Spread, &gpus, &free, &[], 2),
        &free,
        &[],
        2,
    );
    assert_eq!(hives(&answer), BTreeSet::from([0, 1]), "{answer:?}");
    let answer = preferred(Policy::Spread, &gpus, &free, &[], 4);
    let per_hive: Vec<usize> = (0..2)
        .map(|h| gpu_numbers(&answer).iter().filter(|&&g| g / 4 == h).count())
        .collect();
    assert_eq!(per_hive, [2, 2], "{answer:?}");
}

#[test]
fn every_size_gives_distinct_gpus() {
    let (gpus, free) = (mi210(), all_free());
    for policy in [Policy::BestEffort, Policy::Spread] {
        for size in 1..=8 {
            let answer = valid(preferred(policy, &gpus, &free, &[], size), &free, &[], size);
            let distinct: BTreeSet<u32> = gpu_numbers(&answer).into_iter().collect();
            assert_eq!(distinct.len(), size, "{policy} {size}: {answer:?}");
        }
    }
}

#[test]
fn impossible_requests_still_get_a_valid_answer() {
    let (gpus, free) = (mi210(), all_free());
    for policy in [Policy::BestEffort, Policy::Spread] {
        // Nine devices from eight GPUs: all eight, then one extra slot.
        let answer = valid(preferred(policy, &gpus, &free, &[], 9), &free, &[], 9);
        let distinct: BTreeSet<u32> = gpu_numbers(&answer).into_iter().collect();
        assert_eq!(distinct.len(), 8, "{answer:?}");
        // Six GPUs fully used: the two left, then more of their slots.
        let left = slots(&[2, 6], 10);
        let answer = valid(preferred(policy, &gpus, &left, &[], 4), &left, &[], 4);
        assert_eq!(gpu_numbers(&answer), [2, 2, 6, 6], "{answer:?}");
        assert_eq!(answer[..2], ids(&["g2#0", "g6#0"]), "{answer:?}");
    }
}

#[test]
fn degenerate_requests() {
    let (gpus, free) = (mi210(), all_free());
    let must = ids(&["g5#3"]);
    assert!(preferred(Policy::BestEffort, &gpus, &free, &[], 0).is_empty());
    assert!(preferred(Policy::Spread, &gpus, &free, &must, 0).is_empty());
    assert_eq!(preferred(Policy::BestEffort, &gpus, &[], &must, 4), must);
    assert_eq!(
        preferred(Policy::BestEffort, &[], &[], &[], 4),
        Vec::<String>::new()
    );
    let two = ids(&["g1#1", "g1#1", "g0#0"]);
    assert_eq!(
        preferred(Policy::Spread, &gpus, &free, &two, 1),
        ids(&["g1#1"])
    );
}

#[test]
fn best_effort_prefers_the_fuller_hive() {
    let gpus = mi210();
    // g0 and g1 have five slots in use, g6 one: hive A is fuller.
    let mut free = all_free();
    free.retain(|id| !matches!(id.as_str(), "g0#0" | "g0#1" | "g0#4" | "g0#7" | "g0#9"));
    free.retain(|id| !["g1#0", "g1#2", "g1#3", "g1#5", "g1#8", "g6#0"].contains(&id.as_str()));
    let answer = valid(
        preferred(Policy::BestEffort, &gpus, &free, &[], 2),
        &free,
        &[],
        2,
    );
    assert_eq!(
        answer,
        ids(&["g0#2", "g1#1"]),
        "lowest free slot of the fullest GPUs"
    );
    // A single device goes to the fullest GPU; spread goes to an empty one.
    assert_eq!(
        preferred(Policy::BestEffort, &gpus, &free, &[], 1),
        ids(&["g0#2"])
    );
    assert_eq!(
        preferred(Policy::Spread, &gpus, &free, &[], 1),
        ids(&["g2#0"])
    );
    // Spread for two avoids the used GPUs in both hives.
    assert_eq!(
        preferred(Policy::Spread, &gpus, &free, &[], 2),
        ids(&["g2#0", "g4#0"])
    );
}

#[test]
fn must_include_is_honoured_and_steers_the_rest() {
    let (gpus, free) = (mi210(), all_free());
    let must = ids(&["g5#7"]);
    let answer = valid(
        preferred(Policy::BestEffort, &gpus, &free, &must, 3),
        &free,
        &must,
        3,
    );
    assert_eq!(answer[0], "g5#7");
    assert_eq!(hives(&answer), BTreeSet::from([1]), "{answer:?}");
    assert_eq!(gpu_numbers(&answer), [4, 5, 6]);
    // A must_include in each hive: best-effort adds where it is closest.
    let must = ids(&["g1#2", "g6#4"]);
    let answer = valid(
        preferred(Policy::BestEffort, &gpus, &free, &must, 4),
        &free,
        &must,
        4,
    );
    assert_eq!(answer[..2], must[..]);
    assert_eq!(gpu_numbers(&answer).len(), 4);
    let answer = valid(
        preferred(Policy::Spread, &gpus, &free, &must, 3),
        &free,
        &must,
        3,
    );
    assert_eq!(
        gpu_numbers(&answer).iter().collect::<BTreeSet<_>>().len(),
        3
    );
}

#[test]
fn two_must_include_slots_of_one_gpu_count_it_once() {
    let (gpus, free) = (mi210(), all_free());
    let must = ids(&["g2#5", "g2#6"]);
    let answer = valid(
        preferred(Policy::BestEffort, &gpus, &free, &must, 3),
        &free,
        &must,
        3,
    );
    assert_eq!(answer[..2], must[..]);
    let third = parse_slot(&answer[2]).unwrap().0;
    assert!(["g0", "g1", "g3"].contains(&third), "{answer:?}");
}

#[test]
fn unknown_and_malformed_ids_are_only_a_fallback() {
    let gpus = mi210();
    let free = ids(&["junk", "g9#0", "g3#4", "g3#2", "g9#1", "x#07"]);
    // Enough known GPUs: only they are scored.
    assert_eq!(
        preferred(Policy::BestEffort, &gpus, &free, &[], 1),
        ids(&["g3#2"])
    );
    // Not enough: known GPU first, then one ID per other group, then the rest.
    let answer = valid(
        preferred(Policy::Spread, &gpus, &free, &[], 5),
        &free,
        &[],
        5,
    );
    assert_eq!(answer, ids(&["g3#2", "junk", "g9#0", "x#07", "g3#4"]));
}

/// 64 partitions: 8 hives of 8 on 2 NUMA nodes, all-to-all xGMI in a hive:
/// C(64, 4) subsets is beyond the exhaustive search.
fn hives_of_eight() -> Vec<GpuTopology> {
    (0..64_u32)
        .map(|i| GpuTopology {
            id: format!("g{i}"),
            numa: Some(i / 32),
            links: (0..64)
                .filter(|&j| j != i && j / 8 == i / 8)
                .map(|j| Link {
                    peer: format!("g{j}"),
                    kind: LinkKind::Xgmi,
                    hops: 1,
                })
                .collect(),
        })
        .collect()
}

#[test]
fn the_greedy_search_keeps_hives_together_and_apart() {
    let gpus = hives_of_eight();
    let free = slots(&(0..64).collect::<Vec<_>>(), 10);
    let start = std::time::Instant::now();
    let packed = valid(
        preferred(Policy::BestEffort, &gpus, &free, &[], 8),
        &free,
        &[],
        8,
    );
    let spread = valid(
        preferred(Policy::Spread, &gpus, &free, &[], 8),
        &free,
        &[],
        8,
    );
    assert!(start.elapsed().as_secs() < 2, "{:?}", start.elapsed());
    let hive_of =
        |a: &[String]| -> BTreeSet<u32> { gpu_numbers(a).iter().map(|g| g / 8).collect() };
    assert_eq!(hive_of(&packed).len(), 1, "{packed:?}");
    assert_eq!(hive_of(&spread).len(), 8, "{spread:?}");
    let numa: Vec<usize> = (0..2)
        .map(|n| {
            gpu_numbers(&spread)
                .iter()
                .filter(|&&g| g / 32 == n)
                .count()
        })
        .collect();
    assert_eq!(numa, [4, 4], "{spread:?}");
}

#[test]
fn the_greedy_search_looks_past_the_first_gpus() {
    // Hive 0 has three GPUs left, each partly used: four GPUs fit only in the
    // other hives, even though hive 0's GPUs are fuller and come first.
    let gpus = hives_of_eight();
    let mut free = slots(&(0..3).collect::<Vec<_>>(), 5);
    free.extend(slots(&(8..64).collect::<Vec<_>>(), 10));
    let answer = valid(
        preferred(Policy::BestEffort, &gpus, &free, &[], 4),
        &free,
        &[],
        4,
    );
    assert_eq!(gpu_numbers(&answer), [8, 9, 10, 11], "{answer:?}");
    let answer = valid(
        preferred(Policy::BestEffort, &gpus, &free, &[], 3),
        &free,
        &[],
        3,
    );
    assert_eq!(gpu_numbers(&answer), [0, 1, 2], "{answer:?}");
}
