//! CRIU's `map_device` and its `device_maps`, as CRIU 3.17.1 runs them
//! (checkpoint-restore/criu:plugins/amdgpu/amdgpu_plugin_topology.c, the
//! functions `map_device`, `maps_push` and `maps_pop`).

use super::super::{options::Check, pairing::Pairing, props};

/// `map_device` reads `node_to` of a checkpoint link whose target is not in
/// the image: that pointer was never set (a NULL dereference).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NullLink {
    /// The checkpoint GPU (slot).
    pub(crate) src: usize,
}

/// The pairs made so far: GPUs by slot, CPUs by node index. CRIU splices a
/// new sub-map in front and cuts it off again on backtracking; a stack with
/// the newest last is the same list read backwards.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Maps {
    pub(crate) gpus: Vec<(usize, usize)>,
    pub(crate) cpus: Vec<(usize, usize)>,
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
        if new.cpus.iter().any(|&p| clash(&self.cpus, p)) || clash(&self.gpus, new.gpu) {
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

/// `map_device(src, dst)` under `maps`: `Ok(None)` when the pair does not
/// fit, the new pairs when it does. The checks, in CRIU's order: the
/// properties, the valid link counts, then each checkpoint link in order;
/// a link to a GPU is skipped, a link to a CPU must be served (with the
/// NUMA check, by the CPU it is mapped to, or by a local CPU not mapped
/// yet, the first in link order), and a link to a node the image lacks is
/// the NULL dereference.
pub(crate) fn map_device(
    pairing: &Pairing<'_>,
    maps: &Maps,
    s: usize,
    d: usize,
) -> Result<Option<NewMaps>, NullLink> {
    let (src, dst) = (&pairing.src, &pairing.dst);
    if !props::matches(&src.node(s).props, &dst.node(d).props, pairing.options)
        || src.valid_link_count(s) > dst.valid_link_count(d)
    {
        return Ok(None);
    }
    let numa = pairing.options.is_on(Check::Numa);
    let mut new = NewMaps {
        gpu: (s, d),
        cpus: Vec::new(),
    };
    let local = dst.all_links(d);
    for sl in src.all_links(s) {
        let Some(src_cpu) = sl.target else {
            return Err(NullLink { src: s });
        };
        if sl.to_gpu {
            continue;
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

/// Characters `"0x%04X "` prints for `gpu_id`.
pub(crate) fn printed_id_len(gpu_id: u32) -> usize {
    let digits = (32 - gpu_id.leading_zeros()).div_ceil(4).max(4);
    usize::try_from(digits).unwrap_or(8) + 3
}

/// The length (with its terminating NUL) of what `p2pgroup_to_str` writes
/// for a hive of `gpu_ids`: `"type:XGMI:"` and each member.
pub(crate) fn hive_name_len(gpu_ids: impl Iterator<Item = u32>) -> usize {
    "type:XGMI:".len() + gpu_ids.map(printed_id_len).sum::<usize>() + 1
}

/// The size of the static buffers `p2pgroup_to_str` and
/// `mapping_list_to_str` write into.
pub(crate) const PRINT_BUFFER: usize = 200;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_push_refuses_a_pair_sharing_an_end_and_pop_undoes_it() {
        let mut maps = Maps::default();
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
        maps.pop(&a);
        assert_eq!(maps, Maps::default());
    }

    #[test]
    fn printed_names_overflow_from_28_hive_members() {
        // "type:XGMI:" (10) + 7 per 16-bit id + NUL: 27 fit in 200 bytes.
        assert_eq!(hive_name_len((0..27).map(|i| 0x1000 + i)), 200);
        assert_eq!(hive_name_len((0..28).map(|i| 0x1000 + i)), 207);
        assert_eq!(printed_id_len(0x12), 7, "%04X pads to four digits");
        assert_eq!(printed_id_len(0x1_2345), 8);
    }
}
