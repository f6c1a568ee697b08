//! CRIU's XGMI groups as `topology_determine_iolinks` builds them
//! (checkpoint-restore/criu at 2cf8f13ca, `plugins/amdgpu/
//! amdgpu_plugin_topology.c`, `topology.c:<line>`): over every node, CPUs
//! included, with members found by `gpu_id`, and one list entry per node.
//! Each outcome below was also checked against that file compiled as in
//! CRIU's own unit test (`plugins/amdgpu/Makefile`, `test_topology_remap`).

use super::{TopoBuilder, off, run};
use crate::restore_check::{
    Mode, Outcome, Verdict,
    model::{Link, LinkKind, Topo},
    options::{Check, Options},
};

fn pairs(v: &Verdict) -> Vec<(u32, u32)> {
    let mut p: Vec<(u32, u32)> = v
        .mapping
        .iter()
        .map(|m| (m.checkpoint_gpu, m.local_gpu))
        .collect();
    p.sort_unstable();
    p
}

fn xgmi(topo: &mut Topo, a: u32, b: u32) {
    for (from, to) in [(a, b), (b, a)] {
        let node = topo.nodes.iter_mut().find(|n| n.id == from).expect("node");
        node.links.push(Link {
            kind: LinkKind::Xgmi,
            to,
        });
    }
}

/// Two CPU sockets joined by an XGMI link both ways (as some kernels list
/// inter-socket links), both GPUs on CPU 0 in the checkpoint and on CPU 1
/// here. topology.c:871-887: CPU 0's link starts a group {CPU 0}; CPU 1's
/// `gpu_id` 0 is found in it (`p2pgroup_get_node_by_gpu_id` compares
/// `gpu_id`s), so it stays out. One group a side, so :1406 passes and
/// `match_xgmi_groups` maps CPU 0 onto local CPU 0 with `map_device`: CPU
/// 0 has 3 valid links (two GPUs, CPU 1) and local CPU 0 one (CPU 1), and
/// :1073 refuses. No other local group: "Failed to match all GPU groups"
/// (:1415), NUMA check or not. Without the groups the GPUs map across the
/// sockets (CPU 0 -> CPU 1), which the exhaustive search finds.
#[test]
fn cpu_nodes_with_xgmi_links_form_a_group_criu_cannot_match() {
    let mut src = TopoBuilder::new().cpu(0).cpu(1).gpu(2, 0).gpu(3, 0).build();
    xgmi(&mut src, 0, 1);
    let mut dst = TopoBuilder::new().cpu(0).cpu(1).gpu(2, 1).gpu(3, 1).build();
    xgmi(&mut dst, 0, 1);
    for options in [Options::default(), off(&[Check::Numa])] {
        let criu = run(&src, &dst, Mode::Criu, options.clone());
        assert_eq!(criu.outcome, Outcome::Refused, "{criu:#?}");
        assert_eq!(
            criu.reason.as_deref(),
            Some("Failed to match all GPU groups")
        );
        let explain = run(&src, &dst, Mode::Explain, options);
        assert_eq!(explain.outcome, Outcome::Restorable);
        assert_eq!(explain.criu_outcome, Some(Outcome::Refused));
        assert!(
            explain
                .notes
                .iter()
                .any(|n| n.contains("CPU nodes with XGMI links")),
            "{:?}",
            explain.notes
        );
    }
    // Onto itself the group {CPU 0} maps onto {CPU 0} (both all zeros, 3
    // links each), its pair 0 -> 0 goes into the GPU maps and the GPUs
    // follow in the remaining phase: CRIU restores, GPUs onto themselves.
    let criu = run(&src, &src, Mode::Criu, Options::default());
    assert_eq!(criu.outcome, Outcome::Restorable);
    assert_eq!(pairs(&criu), [(0x1002, 0x1002), (0x1003, 0x1003)]);
}

/// GPUs 1 and 2 each linked by XGMI to GPU 3 only, all three on CPU 0.
fn peer_of_two(order: &[u32]) -> Topo {
    let mut b = TopoBuilder::new().cpu(0);
    for &id in order {
        b = b.gpu(id, 0);
    }
    let mut t = b.build();
    xgmi(&mut t, 1, 3);
    xgmi(&mut t, 2, 3);
    t
}

/// A GPU that is the XGMI peer of two groups. In the order 1, 2, 3:
/// GPU 1's link makes the group {1, 3} (:877-887); GPU 2 is in no group,
/// starts {2} and appends GPU 3 with `list_add_tail` (:887), which relinks
/// GPU 3's one `listm_p2pgroup` into the second group: the first group's
/// list now runs 1, 3, into the second group's ring, and never back to its
/// head. GPU 3's own lookups find what they look for in that ring (GPUs 1
/// and 2), so `topology_determine_iolinks` returns; `topology_print`
/// (:1382) then prints the first group with `list_for_each_entry` (:725),
/// which never ends and writes on past its buffer until it faults.
/// With a fourth GPU linked to GPU 3 after them, GPU 3 looks the fourth
/// GPU's `gpu_id` up in the broken group (:886) and goes round for ever.
/// Listed 3, 1, 2, the same links make one group {3, 1, 2}: restorable.
#[test]
fn a_gpu_that_is_the_peer_of_two_groups_crashes_or_stalls_criu() {
    let t = peer_of_two(&[1, 2, 3]);
    let criu = run(&t, &t, Mode::Criu, Options::default());
    assert_eq!(criu.outcome, Outcome::CriuWouldCrash);
    assert!(
        criu.reason
            .as_deref()
            .is_some_and(|r| r.contains("checkpoint node 3 is the XGMI peer of two groups")),
        "{:?}",
        criu.reason
    );
    let explain = run(&t, &t, Mode::Explain, Options::default());
    assert_eq!(explain.criu_outcome, Some(Outcome::CriuWouldCrash));

    let mut four = TopoBuilder::new()
        .cpu(0)
        .gpu(1, 0)
        .gpu(2, 0)
        .gpu(3, 0)
        .gpu(4, 0)
        .build();
    xgmi(&mut four, 1, 3);
    xgmi(&mut four, 2, 3);
    xgmi(&mut four, 3, 4);
    let criu = run(&four, &four, Mode::Criu, Options::default());
    assert_eq!(criu.outcome, Outcome::CriuWouldNotFinish);
    assert!(
        criu.reason.as_deref().is_some_and(|r| r.contains("0x1004")),
        "{:?}",
        criu.reason
    );

    let t = peer_of_two(&[3, 1, 2]);
    let criu = run(&t, &t, Mode::Criu, Options::default());
    assert_eq!(criu.outcome, Outcome::Restorable);
    assert_eq!(
        pairs(&criu),
        [(0x1001, 0x1001), (0x1002, 0x1002), (0x1003, 0x1003)]
    );
    // The checkpoint in the good order onto a node listing the bad one:
    // CRIU builds the local groups too, and crashes printing them.
    let criu = run(&t, &peer_of_two(&[1, 2, 3]), Mode::Criu, Options::default());
    assert_eq!(criu.outcome, Outcome::CriuWouldCrash);
    assert!(
        criu.reason
            .as_deref()
            .is_some_and(|r| r.starts_with("local node 3"))
    );
}

/// A whole node of 8 GPUs in CPX4: 32 partitions, the first 16 on CPU 0,
/// all in one XGMI hive (every partition linked to every other, as in the
/// MI300X CPX capture of `tests/fixtures/kfd`), listed in `order` with each
/// node's links in `link_order(node)` order.
fn cpx32(order: &[u32], link_seed: Option<u64>) -> Topo {
    let mut t = Topo::default();
    for &id in order {
        let mut b = TopoBuilder::new().cpu(0).cpu(1);
        if id >= 2 {
            b = b.gpu(id, u32::from(id >= 18));
        }
        let built = b.build();
        let node = built.nodes.into_iter().find(|n| n.id == id).expect("node");
        t.nodes.push(node);
    }
    for node in &mut t.nodes {
        node.links.clear();
        if node.id < 2 {
            let first = if node.id == 0 { 2 } else { 18 };
            node.links = (first..first + 16)
                .map(|to| Link {
                    kind: LinkKind::Pcie,
                    to,
                })
                .collect();
        } else {
            node.links.push(Link {
                kind: LinkKind::Pcie,
                to: u32::from(node.id >= 18),
            });
            node.links
                .extend((2..34).filter(|&to| to != node.id).map(|to| Link {
                    kind: LinkKind::Xgmi,
                    to,
                }));
            node.props.io_links_count = 32;
        }
        if let Some(seed) = link_seed {
            // A fixed hash-like permutation, as sysfs lists io_links.
            let key = |l: &Link| (u64::from(l.to) * 2_654_435_761 + seed * 97) % 1009;
            node.links.sort_by_key(key);
        }
    }
    t
}

/// The whole-node checkpoint of a CPX node: the hive's name takes 235 bytes
/// and its search lists 225 (`printbuf`), past their buffers but onto
/// nothing CRIU reads, so the outcome is that of the search: in numeric
/// order each partition onto itself; listed in a hash-like order, the same,
/// and from one order onto another a mapping that keeps every partition on
/// its CPU. Checked against topology.c compiled as CRIU's unit test:
/// restorable, with the same pairs, NUMA check on and off.
#[test]
fn a_whole_node_cpx_checkpoint_restores_as_criu_restores_it() {
    let numeric: Vec<u32> = (0..34).collect();
    let mut hashed = numeric.clone();
    hashed.sort_by_key(|&id| (id * 40_503) % 61);
    let mut other = numeric.clone();
    other.sort_by_key(|&id| (id * 7_919) % 37);
    let cases = [
        (cpx32(&numeric, None), cpx32(&numeric, None), true),
        (cpx32(&hashed, Some(1)), cpx32(&hashed, Some(1)), true),
        (cpx32(&hashed, Some(1)), cpx32(&other, Some(2)), false),
    ];
    for (src, dst, same) in &cases {
        for options in [Options::default(), off(&[Check::Numa])] {
            let numa = options.is_on(Check::Numa);
            let criu = run(src, dst, Mode::Criu, options);
            assert_eq!(criu.outcome, Outcome::Restorable, "{:?}", criu.reason);
            let p = pairs(&criu);
            assert_eq!(p.len(), 32);
            if *same {
                assert!(p.iter().all(|(s, d)| s == d), "{p:?}");
            } else if numa {
                // The CPUs map one to one: a checkpoint CPU's 16 partitions
                // all go to one local CPU's.
                let cpu = |gpu_id: u32| gpu_id >= 0x1000 + 18;
                let first = p.iter().find(|(s, _)| !cpu(*s)).map(|(_, d)| cpu(*d));
                assert!(
                    p.iter()
                        .all(|&(s, d)| (cpu(s) == cpu(d)) != first.unwrap_or(false)),
                    "{p:?}"
                );
            }
            assert!(
                criu.notes.iter().any(|n| n.contains("takes 235 bytes")),
                "{:?}",
                criu.notes
            );
            assert!(criu.notes.iter().all(|n| !n.contains("may not be CRIU's")));
        }
    }
}
