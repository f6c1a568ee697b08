//! Property: whatever the topologies, `--mode criu` never says
//! "restorable" where `--mode explain` finds no mapping, and what it
//! restores with is a one-to-one mapping of every checkpoint GPU.

use std::collections::BTreeSet;

use proptest::{prelude::*, test_runner::Config};

use super::{TopoBuilder, off, run};
use crate::restore_check::{
    Mode, Outcome,
    model::Topo,
    options::{Check, Options},
};

/// One side: per GPU its CPU and whether its firmware is one older, and
/// the sizes of up to two hives over the first GPUs.
#[derive(Debug, Clone)]
struct Shape {
    cpus: u32,
    gpus: Vec<(u32, bool)>,
    hives: (usize, usize),
}

fn shape(n: usize) -> impl Strategy<Value = Shape> {
    (1u32..=3).prop_flat_map(move |cpus| {
        (
            Just(cpus),
            proptest::collection::vec((0..cpus, any::<bool>()), n),
            (0..=n, 0..=n),
        )
            .prop_map(|(cpus, gpus, hives)| Shape { cpus, gpus, hives })
    })
}

/// Two sides with the same number of GPUs, one to five.
fn sides() -> impl Strategy<Value = (Shape, Shape)> {
    (1usize..=5).prop_flat_map(|n| (shape(n), shape(n)))
}

fn build(s: &Shape) -> Topo {
    let mut b = TopoBuilder::new();
    for c in 0..s.cpus {
        b = b.cpu(c);
    }
    let first = s.cpus;
    for (i, &(cpu, older)) in (0u32..).zip(&s.gpus) {
        b = b.gpu(first + i, cpu);
        if older {
            b = b.tweak(first + i, |p| p.fw_version -= 1);
        }
    }
    let n = s.gpus.len();
    let a = s.hives.0.min(n);
    let z = (a + s.hives.1).min(n);
    for range in [0..a, a..z] {
        let ids: Vec<u32> = (0u32..)
            .zip(0..n)
            .filter(|(_, i)| range.contains(i))
            .map(|(id, _)| first + id)
            .collect();
        if ids.len() >= 2 {
            b = b.hive(&ids);
        }
    }
    b.build()
}

proptest! {
    #![proptest_config(Config { cases: 512, ..Config::default() })]

    #[test]
    fn criu_restores_only_where_a_mapping_exists(
        (src, dst) in sides(),
        numa in any::<bool>(),
    ) {
        let options = if numa { Options::default() } else { off(&[Check::Numa]) };
        let (src, dst) = (build(&src), build(&dst));
        let criu = run(&src, &dst, Mode::Criu, options.clone());
        let explain = run(&src, &dst, Mode::Explain, options);
        prop_assert_eq!(explain.criu_outcome, Some(criu.outcome));
        prop_assert_eq!(criu.restorable, criu.outcome == Outcome::Restorable);
        if criu.restorable {
            prop_assert!(explain.restorable, "criu: {:#?}\nexplain: {:#?}", criu, explain);
            let local: BTreeSet<u32> = criu.mapping.iter().map(|m| m.local_gpu).collect();
            prop_assert_eq!(criu.mapping.len(), src.gpu_count());
            prop_assert_eq!(local.len(), src.gpu_count());
        }
    }
}
