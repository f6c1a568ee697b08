//! The container environment for one container's GPUs.
//!
//! * `ROCR_VISIBLE_DEVICES` (docs/amd-hardware.md §9.1, §9.2): the ROCr UUIDs
//!   (`GPU-` + 16 hex digits) in annotation order when every GPU has one and they
//!   are distinct. Otherwise (an APU with `unique_id` 0, i.e. `GPU-XX`; partitions
//!   of one GPU sharing a UUID) **all** tokens are container-local indices: index
//!   `k` is the `k`-th GPU of the container in KFD enumeration order, so the GPUs
//!   are listed by their rank among the container's KFD nodes, in annotation
//!   order. Either way the application's device `i` is annotation position `i`.
//!   Mixing UUIDs and indices is avoided: one bad token stops ROCr's parsing.
//! * `HSA_CU_MASK` (§9.3): ID-list form `i:a-b,c;j:…`, `i` the position in
//!   `ROCR_VISIBLE_DEVICES`, only for sliced GPUs; absent when none is sliced.
//!   Every emitted mask is parsed back by [`parse_cu_mask`] and compared.
//! * `HIP_DEVICE_MEMORY_LIMIT_<i>` (docs/hami-protocol.md §5.3): `<MiB>m` (binary
//!   multiples, `16384m` = 16 GiB) for every GPU with a limit. The unsuffixed
//!   `HIP_DEVICE_MEMORY_LIMIT` is the hook's fallback for *any* index, so it is
//!   set only when every GPU has the same limit (never the first GPU's value
//!   for all, the Go plugin's bug W8, docs/hami-protocol.md §7).

use std::{
    collections::{BTreeMap, BTreeSet},
    ops::Range,
};

use super::{
    CuError,
    mask::{GpuShape, format_id_list, normalize, parse_cu_mask},
};

/// One GPU of a container, in annotation order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GpuSlice {
    /// The ROCr UUID (`GPU-%016x` of KFD `unique_id`, §9.2), if it has one.
    pub(crate) rocr_uuid: Option<String>,
    /// The KFD topology node id; only its order among the container's GPUs is
    /// used (container-local indices, §9.1).
    pub(crate) kfd_node: u32,
    /// Logical active CUs of the GPU.
    pub(crate) cu_count: u32,
    /// 1 before gfx10, 2 on gfx10+.
    pub(crate) cus_per_wgp: u32,
    /// The CU slice; `None` = the whole GPU (no mask).
    pub(crate) cus: Option<Vec<Range<u32>>>,
    /// Memory limit in MiB; `None` or `Some(0)` = no limit.
    pub(crate) memory_mib: Option<u64>,
}

/// Environment variables, in a fixed order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct ContainerEnv {
    /// `(name, value)` pairs.
    pub(crate) vars: Vec<(String, String)>,
}

impl ContainerEnv {
    #[cfg(test)]
    /// The value of `name`, if set.
    #[must_use]
    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.vars
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn push(&mut self, name: impl Into<String>, value: impl Into<String>) {
        self.vars.push((name.into(), value.into()));
    }
}

/// Renders the environment for one container's GPUs (annotation order).
///
/// # Errors
/// [`CuError::NoGpus`], [`CuError::DuplicateKfdNode`], or a slice that does not
/// fit its GPU ([`CuError::EmptySlice`], [`CuError::OutOfRange`],
/// [`CuError::SplitWgp`], [`CuError::BadCusPerWgp`]).
pub(crate) fn render_env(gpus: &[GpuSlice]) -> Result<ContainerEnv, CuError> {
    if gpus.is_empty() {
        return Err(CuError::NoGpus);
    }
    let mut env = ContainerEnv::default();
    env.push("ROCR_VISIBLE_DEVICES", visible_devices(gpus)?);
    if let Some(mask) = cu_mask(gpus)? {
        env.push("HSA_CU_MASK", mask);
    }
    let limits: Vec<Option<u64>> = gpus
        .iter()
        .map(|g| g.memory_mib.filter(|&m| m > 0))
        .collect();
    if let Some(Some(first)) = limits.first()
        && limits.iter().all(|l| *l == Some(*first))
    {
        env.push("HIP_DEVICE_MEMORY_LIMIT", format!("{first}m"));
    }
    for (i, limit) in limits.iter().enumerate() {
        if let Some(mib) = limit {
            env.push(format!("HIP_DEVICE_MEMORY_LIMIT_{i}"), format!("{mib}m"));
        }
    }
    Ok(env)
}

/// `ROCR_VISIBLE_DEVICES`: UUIDs, or container-local KFD ranks for all.
fn visible_devices(gpus: &[GpuSlice]) -> Result<String, CuError> {
    let uuids: Option<Vec<&str>> = gpus
        .iter()
        .map(|g| g.rocr_uuid.as_deref().filter(|u| is_rocr_uuid(u)))
        .collect();
    if let Some(uuids) = uuids {
        let distinct: BTreeSet<String> = uuids.iter().map(|u| u.to_ascii_uppercase()).collect();
        if distinct.len() == uuids.len() {
            return Ok(uuids.join(","));
        }
    }
    let mut order: Vec<u32> = gpus.iter().map(|g| g.kfd_node).collect();
    order.sort_unstable();
    if let Some(w) = order.windows(2).find(|w| w[0] == w[1]) {
        return Err(CuError::DuplicateKfdNode { node: w[0] });
    }
    let ranks: Vec<String> = gpus
        .iter()
        .map(|g| order.partition_point(|&n| n < g.kfd_node).to_string())
        .collect();
    Ok(ranks.join(","))
}

/// A selectable ROCr UUID: `GPU-` and 16 hex digits (§9.2; `GPU-XX` is not).
pub(crate) fn is_rocr_uuid(uuid: &str) -> bool {
    uuid.len() == 20 && uuid.starts_with("GPU-") && uuid[4..].bytes().all(|b| b.is_ascii_hexdigit())
}

/// `HSA_CU_MASK`, validated by parsing it back; `None` when nothing is sliced.
fn cu_mask(gpus: &[GpuSlice]) -> Result<Option<String>, CuError> {
    let mut sets = Vec::new();
    let mut expected = BTreeMap::new();
    for (i, gpu) in (0u32..).zip(gpus) {
        let Some(cus) = &gpu.cus else { continue };
        let ranges = checked_slice(i, gpu, cus)?;
        sets.push(format!("{i}:{}", format_id_list(&ranges)));
        expected.insert(i, ranges.into_iter().flatten().collect::<BTreeSet<u32>>());
    }
    if sets.is_empty() {
        return Ok(None);
    }
    let mask = sets.join(";");
    let shapes: Vec<GpuShape> = gpus
        .iter()
        .map(|g| GpuShape {
            cu_count: g.cu_count,
            cus_per_wgp: g.cus_per_wgp,
        })
        .collect();
    if parse_cu_mask(&mask, &shapes)? != expected {
        return Err(CuError::malformed(
            &mask,
            "does not parse back to the slices",
        ));
    }
    Ok(Some(mask))
}

/// Normalises one GPU's slice and checks it against the GPU.
fn checked_slice(i: u32, gpu: &GpuSlice, cus: &[Range<u32>]) -> Result<Vec<Range<u32>>, CuError> {
    let label = || gpu.rocr_uuid.clone().unwrap_or_else(|| format!("#{i}"));
    if !matches!(gpu.cus_per_wgp, 1 | 2) {
        return Err(CuError::BadCusPerWgp {
            gpu: label(),
            cus_per_wgp: gpu.cus_per_wgp,
        });
    }
    let ranges = normalize(cus);
    let (Some(first), Some(last)) = (ranges.first(), ranges.last()) else {
        return Err(CuError::EmptySlice { gpu: label() });
    };
    if last.end > gpu.cu_count {
        return Err(CuError::OutOfRange {
            gpu: label(),
            start: first.start,
            end: last.end,
            total: gpu.cu_count,
        });
    }
    if gpu.cus_per_wgp == 2 {
        let odd = ranges.iter().find_map(|r| {
            (r.start % 2 == 1)
                .then_some(r.start)
                .or((r.end % 2 == 1).then(|| r.end - 1))
        });
        if let Some(cu) = odd {
            return Err(CuError::SplitWgp { gpu: label(), cu });
        }
    }
    Ok(ranges)
}

#[cfg(test)]
mod tests;
