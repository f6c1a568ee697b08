//! Whether one checkpoint GPU may be mapped onto one local GPU: the property
//! comparison, the link count, and the links to CPU nodes (the NUMA rule).
//!
//! GPUs are named by slot: their position in [`Side::gpus`].

use std::fmt;

use serde::Serialize;

use super::{
    model::{LinkKind, Side, SideLink, Topo},
    options::{Check, Options},
    props,
};

/// A mapping of checkpoint CPU nodes to local CPU nodes (indices into each
/// side's [`Topo::nodes`]), one-to-one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CpuMap(Vec<(usize, usize)>);

impl CpuMap {
    pub fn get(&self, src: usize) -> Option<usize> {
        self.0.iter().find(|(s, _)| *s == src).map(|(_, d)| *d)
    }

    pub fn is_target(&self, dst: usize) -> bool {
        self.0.iter().any(|(_, d)| *d == dst)
    }

    pub fn insert(&mut self, src: usize, dst: usize) {
        self.0.push((src, dst));
    }
}

/// A value in a refusal: a number, or a description.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Value {
    Number(u64),
    Text(String),
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Number(n) => write!(f, "{n}"),
            Self::Text(t) => f.write_str(t),
        }
    }
}

/// Why a checkpoint GPU cannot take a local GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub property: &'static str,
    pub checkpoint: Value,
    pub local: Value,
    /// The option that would relax it; `None` when none can.
    pub option: Option<Check>,
}

/// Both sides and the options, with the option-independent part of every
/// pair worked out once.
#[derive(Debug)]
pub struct Pairing<'a> {
    pub src: Side<'a>,
    pub dst: Side<'a>,
    pub options: &'a Options,
    /// `fixed[s * dst_gpus + d]`: properties, link count and CPU links
    /// without the CPU map.
    fixed: Vec<bool>,
}

impl<'a> Pairing<'a> {
    pub fn new(src: &'a Topo, dst: &'a Topo, options: &'a Options) -> Self {
        let mut pairing = Self {
            src: Side::new(src),
            dst: Side::new(dst),
            options,
            fixed: Vec::new(),
        };
        let (n, m) = (pairing.src.gpus.len(), pairing.dst.gpus.len());
        pairing.fixed = (0..n * m)
            .map(|i| pairing.compute_fixed(i / m.max(1), i % m.max(1)))
            .collect();
        pairing
    }

    /// Checkpoint GPUs.
    pub fn src_len(&self) -> usize {
        self.src.gpus.len()
    }

    /// Local GPUs.
    pub fn dst_len(&self) -> usize {
        self.dst.gpus.len()
    }

    fn compute_fixed(&self, s: usize, d: usize) -> bool {
        props::matches(
            &self.src.node(s).props,
            &self.dst.node(d).props,
            self.options,
        ) && self.src.valid_link_count(s) <= self.dst.valid_link_count(d)
            && self.cpu_links_served(s, d)
    }

    /// Everything but the CPU map: properties, link count, CPU link kinds.
    pub fn fixed(&self, s: usize, d: usize) -> bool {
        self.fixed
            .get(s * self.dst_len() + d)
            .copied()
            .unwrap_or(false)
    }

    /// CRIU's link rule: an invalid checkpoint link always matches, an invalid
    /// local one never does; both must point at the same kind of node; XGMI
    /// cannot be served by PCIe; bidirectional needs bidirectional.
    pub(crate) fn iolink_match(src: &SideLink, dst: &SideLink) -> bool {
        if src.target.is_none() {
            return true;
        }
        dst.target.is_some()
            && src.to_gpu == dst.to_gpu
            && !(src.kind == LinkKind::Xgmi && dst.kind == LinkKind::Pcie)
            && (!src.bidirectional || dst.bidirectional)
    }

    /// Without the NUMA check: every checkpoint link to a CPU has some local
    /// link that matches it.
    fn cpu_links_served(&self, s: usize, d: usize) -> bool {
        self.src.cpu_links(s).all(|sl| {
            self.dst
                .all_links(d)
                .iter()
                .any(|dl| Self::iolink_match(sl, dl))
        })
    }

    /// The pair under a complete CPU assignment `sigma`: each checkpoint CPU
    /// link needs a matching local link to the CPU `sigma` gives it.
    pub fn fits_sigma(&self, s: usize, d: usize, sigma: &CpuMap) -> bool {
        if !self.fixed(s, d) {
            return false;
        }
        if !self.options.is_on(Check::Numa) {
            return true;
        }
        self.src.cpu_links(s).all(|sl| {
            let want = sl.target.and_then(|c| sigma.get(c));
            self.dst
                .all_links(d)
                .iter()
                .any(|dl| dl.target.is_some() && dl.target == want && Self::iolink_match(sl, dl))
        })
    }

    /// Checkpoint CPU nodes the checkpoint GPUs link to, in order.
    pub fn src_cpus(&self) -> Vec<usize> {
        let mut cpus = Vec::new();
        for s in 0..self.src_len() {
            for cpu in self.src.cpu_links(s).filter_map(|l| l.target) {
                if !cpus.contains(&cpu) {
                    cpus.push(cpu);
                }
            }
        }
        cpus
    }

    /// Local CPU nodes, in order.
    pub fn dst_cpus(&self) -> Vec<usize> {
        (0..self.dst.topo.nodes.len())
            .filter(|&i| !self.dst.topo.nodes[i].is_gpu())
            .collect()
    }

    /// Every reason, besides the CPU map, why `s` cannot take `d`.
    pub fn failures(&self, s: usize, d: usize) -> Vec<Failure> {
        let (sp, dp) = (&self.src.node(s).props, &self.dst.node(d).props);
        let mut out: Vec<Failure> = props::mismatches(sp, dp, self.options)
            .into_iter()
            .map(|m| Failure {
                property: m.property,
                checkpoint: Value::Number(m.checkpoint),
                local: Value::Number(m.local),
                option: m.option,
            })
            .collect();
        let (sv, dv) = (self.src.valid_link_count(s), self.dst.valid_link_count(d));
        if sv > dv {
            out.push(Failure {
                property: "valid_io_links",
                checkpoint: Value::Number(count(sv)),
                local: Value::Number(count(dv)),
                option: None,
            });
        }
        if !self.cpu_links_served(s, d) {
            out.push(Failure {
                property: "cpu_links",
                checkpoint: Value::Text(describe_cpu_links(&self.src, s)),
                local: Value::Text(describe_cpu_links(&self.dst, d)),
                option: None,
            });
        }
        out
    }
}

fn count(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// `pcie to CPU node 0 (bidirectional), ...`.
fn describe_cpu_links(side: &Side<'_>, slot: usize) -> String {
    let text: Vec<String> = side
        .cpu_links(slot)
        .map(|l| {
            let kind = match l.kind {
                LinkKind::Pcie => "pcie".to_owned(),
                LinkKind::Xgmi => "xgmi".to_owned(),
                LinkKind::Other(t) => format!("type {t}"),
            };
            let node = l.target.map_or(0, |t| side.topo.nodes[t].id);
            let dir = if l.bidirectional {
                "bidirectional"
            } else {
                "one-way"
            };
            format!("{kind} to CPU node {node} ({dir})")
        })
        .collect();
    if text.is_empty() {
        "no link to a CPU".to_owned()
    } else {
        text.join(", ")
    }
}
