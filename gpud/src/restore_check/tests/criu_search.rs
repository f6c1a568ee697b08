//! CRIU's search as CRIU 3.17.1 runs it, one hand-built case per fact; each
//! outcome is derived from checkpoint-restore/criu at 2cf8f13ca,
//! `plugins/amdgpu/amdgpu_plugin_topology.c` (`topology.c:<line>`) and
//! `include/common/list.h` (`list.h:<line>`).
//!
//! Slots: checkpoint GPUs `s0, s1, ...` and local GPUs `d0, d1, ...` in node
//! order; `gpu(id, cpu)` has gpu_id `0x1000 + id`. Lists are written front
//! first.

use super::{TopoBuilder, off, run};
use crate::restore_check::{
    Mode, Outcome, Request, RestoreCheckError, SearchTooLarge, Verdict, check,
    criu::CRIU_STEP_LIMIT,
    model::{Link, LinkKind, Topo},
    options::{Check, Options},
};

fn pairs(v: &Verdict) -> Vec<(u32, u32)> {
    v.mapping
        .iter()
        .map(|m| (m.checkpoint_gpu, m.local_gpu))
        .collect()
}

/// Point 1: the search is not exhaustive.
///
/// Checkpoint: s0 = 0x1002 and s1 = 0x1003 on CPU A, s2 = 0x1004 on CPU B.
/// Local: d0 = 0x1002 on CPU X, d1 = 0x1003 and d2 = 0x1004 on CPU Y.
/// Restorable by A→Y, B→X. No hives, so only the remaining phase runs; its
/// lists are built by prepending (topology.c:1428, :1433): src [s2, s1, s0],
/// dst [d2, d1, d0].
///
/// s2 (B) takes d2 (B→Y) and leaves [d1, d0], cached next d1. Deeper, s1
/// (A) cannot take d1 (Y is taken), takes d0 (A→X), then s0 (A) fits
/// neither d1 (on Y) nor anything else; d0 goes back at the head: [d0, d1].
/// Back at the top d2 goes back at the head (topology.c:1233): [d2, d0, d1].
/// The walk goes on from the cached d1 (list.h:231-234), whose next is now
/// the head. s2 takes d1 (B→Y again) and fails the same way, d1 goes back:
/// [d1, d2, d0]; the cached next was the head, so the walk ends. s2 never
/// tries d0: "Failed to match remaining nodes".
#[test]
fn criu_misses_a_mapping_of_two_plus_one_gpus_per_cpu_onto_one_plus_two() {
    let src = TopoBuilder::new()
        .cpu(0)
        .cpu(1)
        .gpu(2, 0)
        .gpu(3, 0)
        .gpu(4, 1)
        .build();
    let dst = TopoBuilder::new()
        .cpu(0)
        .cpu(1)
        .gpu(2, 0)
        .gpu(3, 1)
        .gpu(4, 1)
        .build();
    let criu = run(&src, &dst, Mode::Criu, Options::default());
    assert_eq!(criu.outcome, Outcome::Refused);
    assert_eq!(
        criu.reason.as_deref(),
        Some("Failed to match remaining nodes")
    );
    assert_eq!(criu.refusals[0].property, "criu_matching_order");
    let explain = run(&src, &dst, Mode::Explain, Options::default());
    assert_eq!(explain.outcome, Outcome::Restorable);
    assert_eq!(explain.criu_outcome, Some(Outcome::Refused));
    assert_eq!(
        pairs(&explain).iter().find(|p| p.0 == 0x1004),
        Some(&(0x1004, 0x1002)),
        "B's GPU goes to X's"
    );
    for v in [&criu, &explain] {
        let note = v.notes.iter().find(|n| n.contains("misses")).expect("note");
        assert!(note.contains("0x1004 -> 0x1002"), "{note}");
        assert!(note.contains("not exhaustive"), "{note}");
    }
    // Without the NUMA check every pair fits and d2 is taken at once.
    assert!(run(&src, &dst, Mode::Criu, off(&[Check::Numa])).restorable);
}

/// Point 2: the search can go round for ever.
///
/// Checkpoint: s0..s2 (0x1002-0x1004) on CPU A, s3 (0x1005) on CPU B.
/// Local: d0 (0x1002) and d3 (0x1005) on X, d1 and d2 on Y. No mapping
/// keeps A's three GPUs together. Lists: src [s3, s2, s1, s0], dst
/// [d3, d2, d1, d0]. Every try of s3 fails deeper, and every failed GPU goes
/// back at the head (topology.c:1233) while the walk follows its cached
/// next (list.h:231-234). The top walk, with no pair made, is at d3 (next
/// d2) over [d1, d0, d3, d2]; it visits d2 over [d3, d1, d2, d0], d0 over
/// [d2, d3, d0, d1], d1 over [d0, d2, d1, d3], and is at d3 (next d2) over
/// [d1, d0, d3, d2] again: the same state, so CRIU never returns.
#[test]
fn criu_would_not_finish_when_its_walk_comes_back_to_the_same_state() {
    let src = TopoBuilder::new()
        .cpu(0)
        .cpu(1)
        .gpu(2, 0)
        .gpu(3, 0)
        .gpu(4, 0)
        .gpu(5, 1)
        .build();
    let dst = TopoBuilder::new()
        .cpu(0)
        .cpu(1)
        .gpu(2, 0)
        .gpu(3, 1)
        .gpu(4, 1)
        .gpu(5, 0)
        .build();
    let criu = run(&src, &dst, Mode::Criu, Options::default());
    assert_eq!(criu.outcome, Outcome::CriuWouldNotFinish);
    assert!(!criu.restorable);
    assert!(
        criu.reason
            .as_deref()
            .is_some_and(|r| r.contains("for ever")),
        "{:?}",
        criu.reason
    );
    // No mapping exists at all: the refusal says why.
    assert_eq!(criu.refusals[0].property, "numa_node");
    let explain = run(&src, &dst, Mode::Explain, Options::default());
    assert_eq!(explain.outcome, Outcome::Refused);
    assert_eq!(explain.criu_outcome, Some(Outcome::CriuWouldNotFinish));
    let mut text = Vec::new();
    criu.write_text(&mut text).unwrap();
    let text = String::from_utf8(text).unwrap();
    assert!(
        text.starts_with("CRIU would not finish (criu mode, CRIU 3.17.1): "),
        "{text}"
    );
    let json = serde_json::to_value(&criu).unwrap();
    assert_eq!(json["outcome"], "criu-would-not-finish");
    assert_eq!(json["criu_version"], "3.17.1");
}

/// Checkpoint: a hive of s0, s1 (fw 176) and s2 (fw 177) alone. Local: a
/// hive of d0 (fw 176), d1, d2 (fw 177), all on one CPU.
fn hive_then_single() -> (Topo, Topo) {
    let src = TopoBuilder::new()
        .cpu(0)
        .gpu(1, 0)
        .gpu(2, 0)
        .gpu(3, 0)
        .tweak(1, |p| p.fw_version = 176)
        .tweak(2, |p| p.fw_version = 176)
        .hive(&[1, 2])
        .build();
    let dst = TopoBuilder::new()
        .cpu(0)
        .gpu(2, 0)
        .gpu(3, 0)
        .gpu(4, 0)
        .tweak(2, |p| p.fw_version = 176)
        .hive(&[2, 3, 4])
        .build();
    (src, dst)
}

/// Point 3: hive lists are built front to back (topology.c:1309, :1312).
///
/// The hive try runs the search on [s0, s1] against [d0, d1, d2]: s0 takes
/// d0, s1 takes d1. The remaining phase has s2 (fw 177) and d2 (fw 177):
/// restorable. Built by prepending instead, s1 would take d2 and s0 d1,
/// leaving d0 (fw 176) for s2 (fw 177): refused.
#[test]
fn hive_members_are_tried_front_to_back() {
    let (src, dst) = hive_then_single();
    let criu = run(&src, &dst, Mode::Criu, off(&[Check::Numa]));
    assert_eq!(criu.outcome, Outcome::Restorable, "{criu:#?}");
    assert_eq!(
        pairs(&criu),
        [(0x1001, 0x1002), (0x1002, 0x1003), (0x1003, 0x1004)]
    );
}

/// Point 4: the order of a GPU's links is the order its `io_links` were
/// listed (topology.c:628), and it sets the order of hive members
/// (topology.c:882-887): the first GPU found starts the hive and its peers
/// join in its link order.
///
/// Local node 2 lists its XGMI links to 4 before 3 (as kernfs may): the hive
/// is [d0, d2, d1]. The checkpoint hive [s0, s1, s2] is matched front to
/// back: s0 → d0 (0x1002), s1 → d2 (0x1004), s2 → d1 (0x1003).
#[test]
fn listing_order_of_links_sets_the_hive_order_and_the_mapping() {
    let src = TopoBuilder::new()
        .cpu(0)
        .gpu(2, 0)
        .gpu(3, 0)
        .gpu(4, 0)
        .hive(&[2, 3, 4])
        .build();
    let dst = TopoBuilder::new()
        .cpu(0)
        .gpu(2, 0)
        .gpu(3, 0)
        .gpu(4, 0)
        .hive(&[2, 4, 3])
        .build();
    let criu = run(&src, &dst, Mode::Criu, Options::default());
    assert_eq!(
        pairs(&criu),
        [(0x1002, 0x1002), (0x1003, 0x1004), (0x1004, 0x1003)]
    );
    let numeric = run(&src, &src, Mode::Criu, Options::default());
    assert_eq!(
        pairs(&numeric),
        [(0x1002, 0x1002), (0x1003, 0x1003), (0x1004, 0x1004)]
    );
}

/// Point 5: a failed candidate goes back at the head (topology.c:1233) and
/// the search goes on in that order.
///
/// One CPU. Checkpoint s0, s1 (fw 177), s2 (fw 176); local d0 (fw 176),
/// d1, d2 (fw 177). Lists: src [s2, s1, s0], dst [d2, d1, d0]. s2 takes d2;
/// s1 takes d1 and s0 (fw 177) does not fit d0 (fw 176); d2 goes back:
/// [d2, d1, d0]. s2 takes the cached d1: s1 takes d2, s0 fails on d0; d1
/// goes back at the head: [d1, d2, d0]. s2 takes the cached d0, leaving
/// [d1, d2]: s1 takes d1 first (not d2, as the original order would have
/// it) and s0 takes d2.
#[test]
fn failed_candidates_move_to_the_head_and_the_search_goes_on_from_there() {
    let src = TopoBuilder::new()
        .cpu(0)
        .gpu(1, 0)
        .gpu(2, 0)
        .gpu(3, 0)
        .tweak(3, |p| p.fw_version = 176)
        .build();
    let dst = TopoBuilder::new()
        .cpu(0)
        .gpu(1, 0)
        .gpu(2, 0)
        .gpu(3, 0)
        .tweak(1, |p| p.fw_version = 176)
        .build();
    let criu = run(&src, &dst, Mode::Criu, Options::default());
    assert_eq!(
        pairs(&criu),
        [(0x1001, 0x1003), (0x1002, 0x1002), (0x1003, 0x1001)]
    );
}

/// Point 6: a checkpoint link to a node the image lacks has no target, and
/// `map_device` reads the target of every checkpoint link once the
/// properties and link counts fit: CRIU crashes. With a property that does
/// not fit, it never gets there and refuses.
#[test]
fn a_checkpoint_link_to_a_missing_node_crashes_criu_once_it_is_read() {
    let mut src = TopoBuilder::new().cpu(0).gpu(1, 0).build();
    src.nodes[1].links.push(Link {
        kind: LinkKind::Xgmi,
        to: 9,
    });
    let dst = TopoBuilder::new().cpu(0).gpu(1, 0).build();
    let criu = run(&src, &dst, Mode::Criu, Options::default());
    assert_eq!(criu.outcome, Outcome::CriuWouldCrash);
    assert!(
        criu.reason.as_deref().is_some_and(|r| r.contains("node 1")),
        "{:?}",
        criu.reason
    );
    let older = TopoBuilder::new()
        .cpu(0)
        .gpu(1, 0)
        .tweak(1, |p| p.fw_version -= 1)
        .build();
    let criu = run(&src, &older, Mode::Criu, Options::default());
    assert_eq!(criu.outcome, Outcome::Refused);
}

/// One hive of `n` GPUs on one CPU, or `n` GPUs without XGMI.
fn many(n: u32, hive: bool) -> Topo {
    let mut b = TopoBuilder::new().cpu(0);
    for id in 1..=n {
        b = b.gpu(id, 0);
    }
    if hive {
        let ids: Vec<u32> = (1..=n).collect();
        b = b.hive(&ids);
    }
    b.build()
}

/// Point 6: names printed into 200-byte static buffers, and on past them.
/// `p2pgroup_to_str` writes "type:XGMI:" (10 bytes), "0x%04X " (7) per
/// member and a NUL, `topology_print` for every hive before anything is
/// compared (topology.c:716-729, :787-789); `mapping_list_to_str` 7 bytes
/// per member of a search list and a NUL, at every `map_devices` call
/// (topology.c:731-742, :1199-1200). Where the bytes past the buffers land
/// is the plugin's `.bss` as its Makefile builds it (`criu::printbuf`):
/// names ending by byte 456 change nothing CRIU reads, so a hive of 32
/// (235 bytes) and its list (225 bytes from byte 224) restore as if the
/// buffers were larger, with a note. A list of 61 GPUs (428 bytes) ends at
/// byte 652 and covers `restore_maps.cpu_maps`, which `map_device` walks
/// under the NUMA check (topology.c:1097): a crash; without that check
/// `maps_push` walks `restore_maps.gpu_maps` (topology.c:353), which a
/// list of 63 (442 bytes, to byte 666) covers. A hive of 65 (466 bytes)
/// covers `src_topology.nodes`, walked at topology.c:1392.
#[test]
fn names_past_the_print_buffers_land_where_the_plugin_layout_puts_them() {
    for n in [28, 32] {
        let t = many(n, true);
        let v = run(&t, &t, Mode::Criu, Options::default());
        assert_eq!(v.outcome, Outcome::Restorable, "hive of {n}");
        assert!(pairs(&v).iter().all(|(s, d)| s == d), "{v:#?}");
        let name = 10 + 7 * n as usize + 1;
        assert!(
            v.notes.iter().any(
                |x| x.contains(&format!("takes {name} bytes")) && x.contains("changes nothing")
            ),
            "{:?}",
            v.notes
        );
    }
    let t = many(33, false);
    let v = run(&t, &t, Mode::Criu, Options::default());
    assert_eq!(v.outcome, Outcome::Restorable);
    assert!(
        v.notes.iter().any(|x| x.contains("232 bytes")),
        "{:?}",
        v.notes
    );
    let t = many(61, false);
    let v = run(&t, &t, Mode::Criu, Options::default());
    assert_eq!(v.outcome, Outcome::CriuWouldCrash);
    assert!(
        v.reason
            .as_deref()
            .is_some_and(|r| r.contains("restore_maps.cpu_maps")),
        "{:?}",
        v.reason
    );
    // Without the NUMA check the 61 get through, but the heads they cover
    // are read later: restorable, with a note that CRIU may do otherwise.
    let v = run(&t, &t, Mode::Criu, off(&[Check::Numa]));
    assert_eq!(v.outcome, Outcome::Restorable);
    assert!(
        v.notes.iter().any(|x| x.contains("may not be CRIU's")),
        "{:?}",
        v.notes
    );
    let t = many(63, false);
    let v = run(&t, &t, Mode::Criu, off(&[Check::Numa]));
    assert!(
        v.reason
            .as_deref()
            .is_some_and(|r| r.contains("restore_maps.gpu_maps")),
        "{:?}",
        v.reason
    );
    let t = many(65, true);
    let v = run(&t, &t, Mode::Criu, Options::default());
    assert_eq!(v.outcome, Outcome::CriuWouldCrash);
    assert!(
        v.reason
            .as_deref()
            .is_some_and(|r| r.contains("466 bytes") && r.contains("src_topology.nodes")),
        "{:?}",
        v.reason
    );
    let v = run(&t, &t, Mode::Explain, Options::default());
    assert_eq!(v.outcome, Outcome::Restorable);
    assert_eq!(v.criu_outcome, Some(Outcome::CriuWouldCrash));
    assert!(v.notes.iter().any(|n| n.contains("CRIU crashes")));
}

/// Twenty identical GPUs and one local GPU with older firmware: CRIU's
/// walk tries every ordering of the others before it gives up (about 19!
/// map_device calls) and repeats no state. Past the step limit no verdict
/// is given.
#[test]
fn a_search_too_long_to_follow_is_an_error_not_a_verdict() {
    let src = many(20, false);
    let mut dst = many(20, false);
    dst.nodes[20].props.fw_version -= 1;
    let request = Request {
        mode: Mode::Criu,
        ..Request::default()
    };
    let err = check(&super::image(src), &super::local(dst), &request).unwrap_err();
    assert!(
        matches!(err, RestoreCheckError::TooLarge(SearchTooLarge { steps }) if steps > CRIU_STEP_LIMIT),
        "{err}"
    );
    assert!(!err.is_invalid_input());
}
