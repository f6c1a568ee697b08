//! The request, parsed: the answer being built, the GPUs to choose from, and
//! the order-based fill used when the policy cannot fill the answer.

use std::collections::{HashMap, HashSet};

use super::{GpuTopology, parse_slot};

/// What a device ID belongs to: a GPU (`<gpu>#<slot>`), or only itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Group<'a> {
    Gpu(&'a str),
    Whole(&'a str),
}

impl<'a> Group<'a> {
    fn of(id: &'a str) -> Self {
        parse_slot(id).map_or(Self::Whole(id), |(gpu, _)| Self::Gpu(gpu))
    }
}

/// The answer under construction: at most `size` distinct IDs.
#[derive(Debug)]
pub(super) struct Answer<'a> {
    size: usize,
    ids: Vec<&'a str>,
    seen: HashSet<&'a str>,
    groups: HashSet<Group<'a>>,
}

impl<'a> Answer<'a> {
    pub(super) fn new(size: usize) -> Self {
        Self {
            size,
            ids: Vec::new(),
            seen: HashSet::new(),
            groups: HashSet::new(),
        }
    }

    /// Appends `id` unless the answer is full or already holds it.
    pub(super) fn push(&mut self, id: &'a str) {
        if !self.is_full() && self.seen.insert(id) {
            self.ids.push(id);
            self.groups.insert(Group::of(id));
        }
    }

    pub(super) fn is_full(&self) -> bool {
        self.ids.len() >= self.size
    }

    /// How many more IDs fit.
    pub(super) fn room(&self) -> usize {
        self.size.saturating_sub(self.ids.len())
    }

    pub(super) fn into_ids(self) -> Vec<String> {
        self.ids.into_iter().map(str::to_owned).collect()
    }
}

/// A known GPU with at least one available slot, not already chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Candidate<'a> {
    /// Index into the topology.
    pub(crate) gpu: usize,
    /// Its lowest available slot.
    pub(crate) id: &'a str,
    /// How many of its slots are available.
    pub(crate) free: usize,
}

/// The IDs left to choose from once `must_include` is in the answer.
#[derive(Debug)]
pub(super) struct Pool<'a> {
    /// `available` without duplicates nor IDs already in the answer, in order.
    ids: Vec<&'a str>,
    /// Known GPUs the answer already covers (topology indices, ascending).
    pub(crate) fixed: Vec<usize>,
    /// Known GPUs to choose from, in topology order.
    pub(crate) candidates: Vec<Candidate<'a>>,
}

impl<'a> Pool<'a> {
    pub(super) fn new(gpus: &[GpuTopology], available: &'a [String], answer: &Answer<'a>) -> Self {
        let mut index: HashMap<&str, usize> = HashMap::with_capacity(gpus.len());
        for (i, gpu) in gpus.iter().enumerate() {
            index.entry(gpu.id.as_str()).or_insert(i);
        }
        let mut is_fixed = vec![false; gpus.len()];
        let named = answer.groups.iter().filter_map(|group| match group {
            Group::Gpu(gpu) => index.get(gpu),
            Group::Whole(_) => None,
        });
        for &i in named {
            is_fixed[i] = true;
        }
        let mut seen: HashSet<&str> = HashSet::with_capacity(available.len());
        let ids: Vec<&str> = available
            .iter()
            .map(String::as_str)
            .filter(|id| !answer.seen.contains(id) && seen.insert(id))
            .collect();
        let mut lowest: Vec<Option<(u32, &str)>> = vec![None; gpus.len()];
        let mut free = vec![0_usize; gpus.len()];
        for &id in &ids {
            let Some((gpu, slot)) = parse_slot(id) else {
                continue;
            };
            let Some(&i) = index.get(gpu).filter(|&&i| !is_fixed[i]) else {
                continue;
            };
            free[i] += 1;
            if lowest[i].is_none_or(|(best, _)| slot < best) {
                lowest[i] = Some((slot, id));
            }
        }
        let candidates = lowest
            .iter()
            .enumerate()
            .filter_map(|(gpu, low)| {
                low.map(|(_, id)| Candidate {
                    gpu,
                    id,
                    free: free[gpu],
                })
            })
            .collect();
        let fixed = (0..gpus.len()).filter(|&i| is_fixed[i]).collect();
        Self {
            ids,
            fixed,
            candidates,
        }
    }

    /// Fills the answer by order: one ID (the lowest slot) per group not yet
    /// covered, groups in order of first appearance; then every other ID.
    pub(super) fn fill(&self, answer: &mut Answer<'a>) {
        let mut firsts: Vec<(Group<'a>, Option<u32>, &'a str)> = Vec::new();
        let mut at: HashMap<Group<'a>, usize> = HashMap::new();
        for &id in &self.ids {
            let group = Group::of(id);
            let slot = parse_slot(id).map(|(_, slot)| slot);
            if let Some(&i) = at.get(&group) {
                if slot < firsts[i].1 {
                    firsts[i] = (group, slot, id);
                }
            } else {
                at.insert(group, firsts.len());
                firsts.push((group, slot, id));
            }
        }
        for (group, _, id) in firsts {
            if !answer.groups.contains(&group) {
                answer.push(id);
            }
        }
        for &id in &self.ids {
            answer.push(id);
        }
    }
}
