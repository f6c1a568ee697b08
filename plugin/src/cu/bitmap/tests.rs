use std::ops::Range;

use proptest::prelude::*;

use super::*;

fn total_len(ranges: &[Range<u32>]) -> u32 {
    ranges.iter().map(|r| r.end - r.start).sum()
}

fn claim_all(map: &mut CuBitmap, ranges: &[Range<u32>]) {
    for r in ranges {
        map.claim(r.clone()).unwrap();
    }
}

#[test]
fn percent_examples_from_hami_protocol_4_2() {
    for (pct, cus) in [(25, 76), (33, 100), (67, 203), (1, 3), (100, 304)] {
        assert_eq!(cus_for_percent(304, pct), cus, "{pct} % of 304");
    }
    assert_eq!(cus_for_percent(60, 1), 1, "0 is clamped to 1");
    assert_eq!(cus_for_percent(0, 50), 0, "devcore 0 grants nothing");
    assert_eq!(cus_for_percent(60, 250), 60, "clamped to total");
}

#[test]
fn first_fit_takes_the_lowest_contiguous_range() {
    let mut map = CuBitmap::new("gpu", 304);
    assert_eq!(map.choose(76, 1).unwrap(), vec![0..76]);
    map.claim(0..76).unwrap();
    assert_eq!(map.choose(76, 1).unwrap(), vec![76..152]);
    assert_eq!(map.free_count(), 228);
    assert!(!map.is_free(75) && map.is_free(76) && !map.is_free(304));
}

#[test]
fn first_fit_reuses_a_hole_that_is_large_enough() {
    let mut map = CuBitmap::new("gpu", 64);
    map.claim(0..64).unwrap();
    map.release(8..16).unwrap();
    map.release(32..48).unwrap();
    assert_eq!(map.choose(8, 1).unwrap(), vec![8..16]);
    assert_eq!(map.choose(12, 1).unwrap(), vec![32..44]);
}

#[test]
fn fragmented_space_uses_the_fewest_ranges() {
    let mut map = CuBitmap::new("gpu", 40);
    map.claim(0..40).unwrap();
    for hole in [0..2, 5..15, 20..23, 30..38] {
        map.release(hole).unwrap();
    }
    // No single hole holds 15: the two longest (10 + 8) suffice, not 2 + 10 + 3.
    assert_eq!(map.choose(15, 1).unwrap(), vec![5..15, 30..35]);
    assert_eq!(
        map.choose(23, 1).unwrap(),
        vec![0..2, 5..15, 20..23, 30..38]
    );
    let err = map.choose(24, 1).unwrap_err();
    assert_eq!(
        err,
        CuError::NotEnoughFree {
            gpu: "gpu".into(),
            want: 24,
            free: 23
        }
    );
}

#[test]
fn wgp_rounds_down_to_whole_pairs() {
    let mut map = CuBitmap::new("gfx12", 64);
    assert_eq!(map.choose(5, 2).unwrap(), vec![0..4]);
    map.claim(0..1).unwrap(); // half of WGP 0 is taken: the whole pair is unusable
    assert_eq!(map.choose(5, 2).unwrap(), vec![2..6]);
    assert_eq!(
        map.choose(64, 2).unwrap_err().to_string(),
        "GPU gfx12: not enough free CUs: want 64, free 62"
    );
}

#[test]
fn wgp_request_below_one_pair_names_the_smallest_share() {
    let map = CuBitmap::new("gfx12", 64);
    let err = map.choose(1, 2).unwrap_err();
    assert!(matches!(
        err,
        CuError::BelowSmallestShare {
            want: 1,
            smallest: 2,
            ..
        }
    ));
    assert!(err.to_string().contains("smallest share"), "{err}");
    assert!(err.to_string().contains("2 CUs"), "{err}");
    assert!(map.choose(0, 1).is_err());
    assert!(matches!(
        map.choose(4, 3),
        Err(CuError::BadCusPerWgp { cus_per_wgp: 3, .. })
    ));
}

#[test]
fn odd_cu_count_on_wgp_gpu_never_hands_out_the_last_cu() {
    let map = CuBitmap::new("odd", 7);
    assert_eq!(map.choose(7, 2).unwrap(), vec![0..6]);
    assert!(map.choose(8, 2).is_err());
}

#[test]
fn claim_and_release_are_all_or_nothing() {
    let mut map = CuBitmap::new("gpu", 16);
    map.claim(4..8).unwrap();
    assert_eq!(
        map.claim(0..5),
        Err(CuError::AlreadyClaimed {
            gpu: "gpu".into(),
            cu: 4
        })
    );
    assert!(map.is_free(0), "a failed claim changes nothing");
    assert_eq!(
        map.release(6..10),
        Err(CuError::NotClaimed {
            gpu: "gpu".into(),
            cu: 8
        })
    );
    assert!(!map.is_free(6), "a failed release changes nothing");
    assert!(matches!(
        map.claim(10..17),
        Err(CuError::OutOfRange { total: 16, .. })
    ));
    map.release(4..8).unwrap();
    assert_eq!(map.free_count(), 16);
}

#[test]
fn many_claims_and_releases_never_overlap() {
    let mut map = CuBitmap::new("gpu", 120);
    let mut held: Vec<Vec<Range<u32>>> = Vec::new();
    for step in 0..200_u32 {
        if step % 3 == 2 && !held.is_empty() {
            let idx = (step as usize * 7) % held.len();
            for r in held.swap_remove(idx) {
                map.release(r).unwrap();
            }
        } else if let Ok(ranges) = map.choose(1 + step % 17, 2) {
            claim_all(&mut map, &ranges); // claim fails on any overlap
            held.push(ranges);
        }
        let held_len: u32 = held.iter().map(|h| total_len(h)).sum();
        assert_eq!(map.free_count(), 120 - held_len);
    }
}

#[derive(Debug, Clone)]
enum Op {
    Choose(u32),
    Release(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..=160_u32).prop_map(Op::Choose),
        1 => any::<usize>().prop_map(Op::Release),
    ]
}

proptest! {
    #[test]
    fn random_sequences_keep_every_invariant(
        total in 2..=304_u32,
        unit in 1..=2_u32,
        ops in proptest::collection::vec(op(), 1..60),
    ) {
        let mut map = CuBitmap::new("p", total);
        let mut owner: Vec<Option<usize>> = vec![None; total as usize];
        let mut held: Vec<Vec<Range<u32>>> = Vec::new();
        for op in ops {
            match op {
                Op::Choose(want) => match map.choose(want, unit) {
                    Ok(ranges) => {
                        let got = total_len(&ranges);
                        prop_assert!(got <= want);
                        prop_assert_eq!(got, want / unit * unit);
                        for r in &ranges {
                            prop_assert!(r.start < r.end && r.end <= total);
                            if unit == 2 {
                                prop_assert!(r.start % 2 == 0 && r.end % 2 == 0);
                            }
                            for cu in r.clone() {
                                prop_assert!(owner[cu as usize].is_none(), "CU {} reused", cu);
                                owner[cu as usize] = Some(held.len());
                            }
                        }
                        claim_all(&mut map, &ranges);
                        held.push(ranges);
                    }
                    Err(CuError::BelowSmallestShare { .. }) => prop_assert!(want < unit),
                    Err(CuError::NotEnoughFree { free, .. }) => {
                        let whole = (0..total / unit)
                            .filter(|k| (k * unit..(k + 1) * unit).all(|cu| owner[cu as usize].is_none()))
                            .count();
                        let usable = u32::try_from(whole).unwrap() * unit;
                        prop_assert_eq!(free, usable);
                        prop_assert!(usable < want / unit * unit);
                    }
                    Err(e) => prop_assert!(false, "unexpected {}", e),
                },
                Op::Release(i) if !held.is_empty() => {
                    let n = held.len();
                    for r in held[i % n].drain(..) {
                        map.release(r.clone()).unwrap();
                        r.for_each(|cu| owner[cu as usize] = None);
                    }
                }
                Op::Release(_) => {}
            }
            for cu in 0..total {
                prop_assert_eq!(map.is_free(cu), owner[cu as usize].is_none());
            }
        }
    }
}
