//! GetPreferredAllocation's allocator on 64 partitions x 10 slots (640
//! device IDs): each policy and request size next to its floor, parsing the
//! same 640 IDs into (GPU, slot) pairs once, measured interleaved in one run.
//!
//! Run: `cargo bench -p plugin --bench allocator`.

use std::{
    hint::black_box,
    time::{Duration, Instant},
};

use plugin::testing::preferred::{self, GpuTopology, Link, LinkKind, Policy};

const ROUNDS: usize = 301;

/// 8 GPUs in one xGMI hive, each in CPX (8 partitions), NUMA 0/1 by halves.
fn topology() -> Vec<GpuTopology> {
    let id = |g: usize, p: usize| format!("gpu{g}p{p}");
    let mut out = Vec::new();
    for g in 0..8 {
        for p in 0..8 {
            let links = (0..8)
                .flat_map(|og| (0..8).map(move |op| (og, op)))
                .filter(|&(og, op)| (og, op) != (g, p))
                .map(|(og, op)| Link {
                    peer: id(og, op),
                    kind: if og == g {
                        LinkKind::Internal
                    } else {
                        LinkKind::Xgmi
                    },
                    hops: 1,
                })
                .collect();
            out.push(GpuTopology {
                id: id(g, p),
                numa: Some(u32::from(g >= 4)),
                links,
            });
        }
    }
    out
}

fn main() {
    let gpus = topology();
    let available: Vec<String> = gpus
        .iter()
        .flat_map(|g| (0..10).map(|s| preferred::slot_id(&g.id, s)))
        .collect();
    println!(
        "| measure (64 partitions x 10 slots = {} IDs, {ROUNDS} rounds) | median | p99 |",
        available.len()
    );
    println!("|---|---|---|");
    let mut floor = Vec::with_capacity(ROUNDS);
    let mut rows: Vec<(String, Vec<Duration>)> = Vec::new();
    for policy in [Policy::BestEffort, Policy::Spread] {
        for size in [1_usize, 2, 4, 8] {
            rows.push((
                format!("`preferred` {policy}, size {size}"),
                Vec::with_capacity(ROUNDS),
            ));
        }
    }
    for _ in 0..ROUNDS {
        let t = Instant::now();
        let parsed: Vec<_> = available
            .iter()
            .filter_map(|id| preferred::parse_slot(id))
            .collect();
        black_box(parsed);
        floor.push(t.elapsed());
        let mut row = rows.iter_mut();
        for policy in [Policy::BestEffort, Policy::Spread] {
            for size in [1_usize, 2, 4, 8] {
                let t = Instant::now();
                let ids = preferred::preferred(policy, &gpus, &available, &[], size);
                let took = t.elapsed();
                assert_eq!(ids.len(), size);
                if let Some((_, times)) = row.next() {
                    times.push(took);
                }
            }
        }
    }
    let (f50, f99) = stats(&mut floor);
    println!(
        "| floor: parse the {} IDs once | {} | {} |",
        available.len(),
        us(f50),
        us(f99)
    );
    for (name, mut times) in rows {
        let (m, p) = stats(&mut times);
        println!(
            "| {name} | {} ({:.0}x floor) | {} |",
            us(m),
            m.as_secs_f64() / f50.as_secs_f64(),
            us(p)
        );
    }
}

fn stats(v: &mut [Duration]) -> (Duration, Duration) {
    v.sort_unstable();
    (v[v.len() / 2], v[v.len() * 99 / 100])
}

fn us(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}
