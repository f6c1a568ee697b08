//! CRIU's `map_device` and its `device_maps`, as CRIU 3.17.1 runs them
//! (checkpoint-restore/criu:plugins/amdgpu/amdgpu_plugin_topology.c, the
//! functions `map_device`, `maps_push` and `maps_pop`).

use super::super::{options::Check, pairing::Pairing, props};

/// Where `map_device` stops the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DeviceCrash {
    /// It reads `node_to` of a checkpoint link whose target is not in the
    /// image: that pointer was never set (a NULL dereference). The
    /// checkpoint member.
    NullLink { src: usize },
    /// It walks `restore_maps.cpu_maps`, whose head a list name overwrote.
    CpuMaps,
}

/// The GPUs and CPUs CRIU's search lists hold, by member: GPU slots first
/// (member `s` < GPU count is slot `s`), then the CPU nodes XGMI groups
/// hold. Entries are node indices.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Members {
    pub(crate) src: Vec<usize>,
    pub(crate) dst: Vec<usize>,
}

/// The pairs made so far: GPUs by member, CPUs by node index. CRIU splices
/// a new sub-map in front and cuts it off again on backtracking; a stack
/// with the newest last is the same list read backwards.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Maps {
    pub(crate) gpus: Vec<(usize, usize)>,
    pub(crate) cpus: Vec<(usize, usize)>,
    /// Members from these on are CPUs: their `gpu_id` is 0, one value for
    /// all of them.
    pub(crate) src_cpus_from: usize,
    pub(crate) dst_cpus_from: usize,
}

/// What one successful `map_device` adds (`new_maps`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NewMaps {
    pub(crate) gpu: (usize, usize),
    pub(crate) cpus: Vec<(usize, usize)>,
}

impl Maps {
    pub(crate) fn has_src(&self, s: usize) -> bool {
        self.gpus.iter().any(|(a, _)| *a == s)
    }

    pub(crate) fn has_dst(&self, d: usize) -> bool {
        self.gpus.iter().any(|(_, b)| *b == d)
    }

    fn dest_cpu(&self, src: usize) -> Option<usize> {
        self.cpus.iter().find(|(s, _)| *s == src).map(|(_, d)| *d)
    }

    fn dest_cpu_mapped(&self, dst: usize) -> bool {
        self.cpus.iter().any(|(_, d)| *d == dst)
    }

    /// `maps_push`: refused ("mapping already exists") when any new pair
    /// shares its source or its destination with one already made.
    pub(crate) fn push(&mut self, new: &NewMaps) -> bool {
        let clash = |old: &[(usize, usize)], (s, d): (usize, usize)| {
            old.iter().any(|&(a, b)| a == s || b == d)
        };
        // GPU pairs compare gpu_ids: two CPU members are the same 0.
        let (sc, dc) = (self.src_cpus_from, self.dst_cpus_from);
        let same = |a: usize, b: usize, from: usize| a == b || (a >= from && b >= from);
        let gpu_clash = self
            .gpus
            .iter()
            .any(|&(a, b)| same(a, new.gpu.0, sc) || same(b, new.gpu.1, dc));
        if new.cpus.iter().any(|&p| clash(&self.cpus, p)) || gpu_clash {
            return false;
        }
        self.cpus.extend_from_slice(&new.cpus);
        self.gpus.push(new.gpu);
        true
    }

    /// `maps_pop`: takes the pairs of `new` off again.
    pub(crate) fn pop(&mut self, new: &NewMaps) {
        self.cpus.retain(|p| !new.cpus.contains(p));
        self.gpus.retain(|p| *p != new.gpu);
    }
}

/// `map_device(src, dst)` under `maps` (members `s` and `d`): `Ok(None)`
/// when the pair does not fit, the new pairs when it does. The checks, in
/// CRIU's order: the properties, the valid link counts, then each
/// checkpoint link in order; a link to a GPU is skipped, a link to a CPU
/// must be served (with the NUMA check, by the CPU it is mapped to, or by a
/// local CPU not mapped yet, the first in link order), and a link to a node
/// the image lacks is the NULL dereference. `cpu_maps_lost`: a list name
/// overwrote the head of the CPU pairs, which the NUMA check walks.
pub(crate) fn map_device(
    pairing: &Pairing<'_>,
    members: &Members,
    maps: &Maps,
    (s, d): (usize, usize),
    cpu_maps_lost: bool,
) -> Result<Option<NewMaps>, DeviceCrash> {
    let (src, dst) = (&pairing.src, &pairing.dst);
    let (sn, dn) = (members.src[s], members.dst[d]);
    if !props::matches(
        &src.topo.nodes[sn].props,
        &dst.topo.nodes[dn].props,
        pairing.options,
    ) || src.valid_links[sn] > dst.valid_links[dn]
    {
        return Ok(None);
    }
    let numa = pairing.options.is_on(Check::Numa);
    let mut new = NewMaps {
        gpu: (s, d),
        cpus: Vec::new(),
    };
    let local = &dst.links[dn];
    for sl in &src.links[sn] {
        let Some(src_cpu) = sl.target else {
            return Err(DeviceCrash::NullLink { src: s });
        };
        if sl.to_gpu {
            continue;
        }
        if numa && cpu_maps_lost {
            return Err(DeviceCrash::CpuMaps);
        }
        let matched = if !numa {
            local.iter().any(|dl| Pairing::iolink_match(sl, dl))
        } else if let Some(dst_cpu) = maps.dest_cpu(src_cpu).or_else(|| new_cpu(&new, src_cpu)) {
            // The first local link of the same type to that CPU.
            local
                .iter()
                .find(|dl| dl.kind == sl.kind && dl.target == Some(dst_cpu))
                .is_some_and(|dl| Pairing::iolink_match(sl, dl))
        } else {
            let free = local.iter().find_map(|dl| {
                let cpu = dl.target?;
                (Pairing::iolink_match(sl, dl)
                    && !maps.dest_cpu_mapped(cpu)
                    && !new.cpus.iter().any(|(_, c)| *c == cpu))
                .then_some(cpu)
            });
            free.inspect(|&cpu| new.cpus.push((src_cpu, cpu))).is_some()
        };
        if !matched {
            return Ok(None);
        }
    }
    Ok(Some(new))
}

fn new_cpu(new: &NewMaps, src: usize) -> Option<usize> {
    new.cpus.iter().find(|(s, _)| *s == src).map(|(_, d)| *d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_push_refuses_a_pair_sharing_an_end_and_pop_undoes_it() {
        let mut maps = Maps {
            src_cpus_from: 3,
            dst_cpus_from: 3,
            ..Maps::default()
        };
        let a = NewMaps {
            gpu: (0, 1),
            cpus: vec![(10, 20)],
        };
        assert!(maps.push(&a));
        let same_dst = NewMaps {
            gpu: (2, 1),
            cpus: Vec::new(),
        };
        assert!(!maps.push(&same_dst));
        assert!(maps.has_src(0) && maps.has_dst(1));
        // Two CPU members of XGMI groups are both gpu_id 0.
        let cpu = NewMaps {
            gpu: (3, 4),
            cpus: Vec::new(),
        };
        assert!(maps.push(&cpu));
        assert!(!maps.push(&NewMaps {
            gpu: (4, 2),
            cpus: Vec::new()
        }));
        maps.pop(&cpu);
        maps.pop(&a);
        assert!(maps.gpus.is_empty() && maps.cpus.is_empty());
    }
}
