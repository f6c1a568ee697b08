//! CU occupancy of the node, rebuilt from the cached pods'
//! `hami.io/amd-cu-allocated` (docs/hami-protocol.md §5.1). Users can edit their own
//! pods, so a claim is trusted only within what HAMi granted the pod in
//! `hami.io/amd-devices-allocated` (the scheduler's, never modified): a claim
//! that does not parse, names a GPU the pod was not granted or this node does
//! not have, claims more CUs than granted or runs past the GPU's CUs is
//! skipped and reported, and never blocks other pods. A list is checked
//! against its GPU's CUs before anything expands it. A claim that overlaps
//! another still counts, together with it, and is reported: the watch cache
//! can hold pods that are gone, and dropping a live pod's claim because a
//! stale one got there first would hand its CUs out again (a claim is bounded
//! by its grant, so counting both never takes more than HAMi granted).
//! Claims this process wrote itself are applied first, so that an overlap is
//! reported on the other pod.

use std::{collections::HashMap, sync::Arc};

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use tracing::warn;

use super::{
    error::ClaimError,
    reuse::{self, SpareError},
    versions::ByVersion,
};
use crate::{
    cu::CuBitmap,
    hami::{
        ALLOCATED_KEY, CU_ALLOCATED_KEY, CuList, DevicesAnnotation, parse_cu_allocated,
        parse_pod_devices,
    },
    inventory::ids::{Aliases, Unresolved},
};

/// The GPUs of this node: CU count by current ID, and every older name of
/// each ([`Aliases`]), so that a record keyed by an older name (HAMi's Go
/// plugin's, an older amd-gpud's) counts on the device it names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Totals {
    pub(crate) cus: HashMap<String, u32>,
    /// CUs per allocation unit (2 on gfx10+) by current ID; 1 when absent.
    pub(crate) units: HashMap<String, u32>,
    pub(crate) aliases: Aliases,
}

impl Totals {
    /// The GPUs of `snapshot`, under their current IDs (and HAMi's
    /// `<node>-AMDGPU-<n>` over `split_count` slots a GPU).
    pub(crate) fn of(snapshot: &crate::inventory::Snapshot, split_count: u32) -> Self {
        let by_id = |value: fn(&crate::inventory::Device) -> u32| {
            snapshot
                .devices()
                .iter()
                .map(|g| (g.id.clone(), value(g)))
                .collect()
        };
        Self {
            cus: by_id(|g| g.compute_units),
            units: by_id(|g| g.cus_per_wgp.max(1)),
            aliases: Aliases::of(snapshot).with_hami_indices(snapshot, split_count),
        }
    }
}

impl FromIterator<(String, u32)> for Totals {
    /// CU counts by ID, without older names.
    fn from_iter<I: IntoIterator<Item = (String, u32)>>(iter: I) -> Self {
        Self {
            cus: iter.into_iter().collect(),
            units: HashMap::new(),
            aliases: Aliases::default(),
        }
    }
}

fn terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// Creation time and name, the order in which claims are trusted (older first).
fn age_key(pod: &Pod) -> (Option<&k8s_openapi::jiff::Timestamp>, Option<&str>) {
    (
        pod.metadata.creation_timestamp.as_ref().map(|t| &t.0),
        pod.metadata.name.as_deref(),
    )
}

/// CUs HAMi granted `pod` per current GPU id, summed over its containers.
fn granted_cus(pod: &Pod, aliases: &Aliases) -> HashMap<String, u32> {
    let mut granted = HashMap::new();
    let Some(value) = pod.annotations().get(ALLOCATED_KEY) else {
        return granted;
    };
    let Ok(containers) = parse_pod_devices(DevicesAnnotation::Allocated, value) else {
        return granted;
    };
    for device in containers.iter().flatten() {
        let sum: &mut u32 = granted
            .entry(aliases.current_or_same(&device.uuid))
            .or_default();
        *sum = sum.saturating_add(device.usedcores);
    }
    granted
}

/// A claim that was not trusted: which pod, and why (for the Event).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Distrust {
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) uid: String,
    /// The annotation value judged, so that one forgery is reported once.
    pub(crate) value: String,
    pub(crate) reason: String,
}

/// The node's CU occupancy and the claims that were left out of it.
#[derive(Debug, Default)]
pub(crate) struct Occupancy {
    pub(crate) maps: HashMap<String, CuBitmap>,
    pub(crate) distrusted: Vec<Distrust>,
    /// The pods whose claims count, in the order they were laid down (named
    /// only when a grant does not fit: [`Occupancy::holders`]).
    counted: Vec<(Arc<Pod>, Arc<Judged>)>,
}

impl Occupancy {
    /// The pods (`namespace/name`) whose claims count on `gpu`.
    pub(crate) fn holders(&self, gpu: &str) -> Vec<String> {
        self.counted
            .iter()
            .filter(|(_, judged)| counted_gpus(&judged.claims).any(|g| g == gpu))
            .map(|(pod, _)| format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any()))
            .collect()
    }
}

/// One pod's claim on one GPU, judged against what HAMi granted the pod.
#[derive(Debug)]
enum GpuClaim {
    /// Left out whatever the node holds (not granted, more than granted).
    Refused(ClaimError),
    /// The CUs that count, and why the spare set was not trusted (then the
    /// whole claim counts).
    Counted {
        gpu: String,
        cus: CuList,
        spare_problem: Option<SpareError>,
    },
}

/// What one version of a pod claims, and what orders it among the others:
/// everything that depends on that pod alone.
#[derive(Debug)]
struct Judged {
    terminal: bool,
    age: (Option<k8s_openapi::jiff::Timestamp>, Option<String>),
    /// `hami.io/amd-cu-allocated`, when set.
    value: Option<String>,
    /// [`reuse::CU_SPARE_KEY`], when set.
    spare: Option<String>,
    claims: Result<Vec<GpuClaim>, ClaimError>,
}

impl Judged {
    /// True when `pod` carries the values of the two annotations the
    /// plugin's own record puts back on a pod version (`super::ours`): a
    /// judgement kept for the version serves it only then.
    fn fits(&self, pod: &Pod) -> bool {
        let annotations = pod.annotations();
        annotations.get(CU_ALLOCATED_KEY) == self.value.as_ref()
            && annotations.get(reuse::CU_SPARE_KEY) == self.spare.as_ref()
    }
}

/// The judgements kept, and the GPUs they were judged against.
#[derive(Debug, Default)]
struct Judgements {
    totals: Totals,
    judged: ByVersion<Arc<Judged>>,
    /// The count resource (`amd.com/gpu`): a pod whose spec asks for none
    /// was never granted any by HAMi, whatever its annotations say; its
    /// claims are refused. `None` (the default, unit tests): not checked.
    resource: Option<String>,
}

impl Judgements {
    /// The judgement of `pod`: the one kept for its version, or a new one.
    fn of(&mut self, pod: &Pod) -> Arc<Judged> {
        if let Some(judged) = self.judged.get(pod).filter(|j| j.fits(pod)) {
            return Arc::clone(judged);
        }
        let judged = Arc::new(judge(pod, &self.totals, self.resource.as_deref()));
        self.judged.insert(pod, Arc::clone(&judged));
        judged
    }
}

/// The bitmaps of every GPU in `totals`, with every live pod's claims.
/// Allocate rebuilds the occupancy over every cached pod; each pod version
/// (uid and resourceVersion, [`super::versions`]) is parsed and judged once
/// and looked up by that after, as long as it stays in the view (judged
/// again when the node's GPUs change).
#[derive(Debug, Default)]
pub(crate) struct Claims(std::sync::Mutex<Judgements>);

impl Claims {
    /// Claims judged for pods that ask for `resource` in their spec.
    pub(crate) fn for_resource(resource: &str) -> Self {
        Self(std::sync::Mutex::new(Judgements {
            resource: Some(resource.to_owned()),
            ..Judgements::default()
        }))
    }

    /// The occupancy over `pods`: claims this process wrote (`ours`) first,
    /// then the others, older first. Only pods `admitted` (kubelet gave them
    /// our devices, or the record is ours) count; another pod's claim is
    /// reported, whatever it says.
    pub(crate) fn rebuild(
        &self,
        pods: &[Arc<Pod>],
        totals: &Totals,
        ours: &dyn Fn(&Pod) -> bool,
        admitted: &dyn Fn(&Pod) -> bool,
    ) -> Occupancy {
        let mut cache = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if cache.totals != *totals {
            cache.totals.clone_from(totals);
            cache.judged.clear();
        }
        let mut ordered = Vec::with_capacity(pods.len());
        let mut not_admitted = Vec::new();
        for pod in pods {
            let judged = cache.of(pod);
            if judged.terminal || judged.value.is_none() {
                continue;
            }
            if admitted(pod) {
                ordered.push((!ours(pod), judged.age.0, pod, judged));
            } else if let Some(value) = &judged.value {
                not_admitted.push(distrust(pod, value, NOT_ADMITTED.to_owned()));
            }
        }
        cache.judged.end_pass();
        // Ours first, then older first; the name breaks ties (the time has
        // whole seconds).
        ordered.sort_by(|a, b| (a.0, a.1, &a.3.age.1).cmp(&(b.0, b.1, &b.3.age.1)));
        let mut maps: Vec<(String, CuBitmap)> = totals
            .cus
            .iter()
            .map(|(id, total)| (id.clone(), CuBitmap::new(id.clone(), *total)))
            .collect();
        let mut distrusted = not_admitted;
        let mut counted = Vec::with_capacity(ordered.len());
        for (_, _, pod, judged) in ordered {
            let problems = apply(&judged.claims, &mut maps);
            if let (false, Some(value)) = (problems.is_empty(), &judged.value) {
                distrusted.push(distrust(pod, value, joined(&problems)));
            }
            counted.push((Arc::clone(pod), judged));
        }
        Occupancy {
            maps: maps.into_iter().collect(),
            distrusted,
            counted,
        }
    }
}

/// Why the claim of a pod kubelet did not admit with our devices is left out.
const NOT_ADMITTED: &str = "kubelet's pod-resources lists no AMD device for the pod: kubelet \
     did not admit it with one, so its grant and CUs are not its own";

fn distrust(pod: &Pod, value: &str, reason: String) -> Distrust {
    let who = format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any());
    warn!(pod = %who, "not trusting {CU_ALLOCATED_KEY}: {reason}");
    Distrust {
        namespace: pod.namespace().unwrap_or_default(),
        name: pod.name_any(),
        uid: pod.uid().unwrap_or_default(),
        value: value.to_owned(),
        reason,
    }
}

/// Judges `pod`'s claim against the node's GPUs, its grant and its spare
/// set; a pod whose spec asks for no `resource` has no grant to claim from.
fn judge(pod: &Pod, totals: &Totals, resource: Option<&str>) -> Judged {
    let value = pod.annotations().get(CU_ALLOCATED_KEY).cloned();
    let asks = resource.is_none_or(|r| super::pod::asks_for_any(pod, r));
    let claims = match &value {
        None => Ok(Vec::new()),
        Some(_) if !asks => Err(ClaimError::NoRequest {
            resource: resource.unwrap_or_default().to_owned(),
        }),
        Some(value) => parse_cu_allocated(value)
            .map_err(ClaimError::Unparsable)
            .map(|claims| {
                let granted = granted_cus(pod, &totals.aliases);
                claims
                    .0
                    .iter()
                    .map(|(gpu, list)| judge_gpu(pod, totals, &granted, gpu, list))
                    .collect()
            }),
    };
    let (created, name) = age_key(pod);
    Judged {
        terminal: terminal(pod),
        age: (created.copied(), name.map(str::to_owned)),
        value,
        spare: pod.annotations().get(reuse::CU_SPARE_KEY).cloned(),
        claims,
    }
}

fn judge_gpu(
    pod: &Pod,
    totals: &Totals,
    granted: &HashMap<String, u32>,
    named: &str,
    list: &CuList,
) -> GpuClaim {
    let gpu = match totals.aliases.resolve(named) {
        Ok(current) => current,
        Err(err @ Unresolved::Ambiguous { .. }) => {
            return GpuClaim::Refused(ClaimError::Ambiguous(err));
        }
        Err(Unresolved::Unknown { .. }) => named.to_owned(),
    };
    let Some(&total) = totals.cus.get(&gpu) else {
        return GpuClaim::Refused(ClaimError::NotOnNode { gpu });
    };
    if let Some(max) = list.max().filter(|max| *max >= total) {
        return GpuClaim::Refused(ClaimError::PastEnd { gpu, max, total });
    }
    // A grant below one WGP gets one whole WGP (cu::smallest_share).
    let unit = totals.units.get(&gpu).copied().unwrap_or(1);
    let allowed = crate::cu::smallest_share(granted.get(&gpu).copied().unwrap_or(0), unit);
    let claimed = list.len();
    if allowed == 0 {
        return GpuClaim::Refused(ClaimError::NotGranted { gpu });
    }
    if claimed > u64::from(allowed) {
        return GpuClaim::Refused(ClaimError::MoreThanGranted {
            gpu,
            claimed,
            allowed,
        });
    }
    let (cus, spare_problem) = match reuse::occupied(pod, &gpu, list) {
        Ok(cus) => (cus, None),
        Err(why) => (list.clone(), Some(why)),
    };
    GpuClaim::Counted {
        gpu,
        cus,
        spare_problem,
    }
}

/// The GPUs on which a judged claim counts.
fn counted_gpus(claims: &Result<Vec<GpuClaim>, ClaimError>) -> impl Iterator<Item = &str> {
    claims.iter().flatten().filter_map(|claim| match claim {
        GpuClaim::Counted { gpu, cus, .. } if !cus.is_empty() => Some(gpu.as_str()),
        _ => None,
    })
}

/// Claims a judged claim's CUs in `maps`; returns why parts were left out
/// (or count only with another pod's).
fn apply(
    claims: &Result<Vec<GpuClaim>, ClaimError>,
    maps: &mut [(String, CuBitmap)],
) -> Vec<ClaimError> {
    let claims = match claims {
        Ok(claims) => claims,
        Err(err) => return vec![err.clone()],
    };
    let mut problems = Vec::new();
    for claim in claims {
        let (gpu, cus, spare_problem) = match claim {
            GpuClaim::Refused(why) => {
                problems.push(why.clone());
                continue;
            }
            GpuClaim::Counted {
                gpu,
                cus,
                spare_problem,
            } => (gpu, cus, spare_problem),
        };
        let Some((_, map)) = maps.iter_mut().find(|(id, _)| id == gpu) else {
            problems.push(ClaimError::NotOnNode { gpu: gpu.clone() });
            continue;
        };
        problems.extend(spare_problem.iter().cloned().map(ClaimError::Spare));
        let mut shared = None;
        for r in cus.ranges() {
            match map.occupy(r.start..r.end.saturating_add(1)) {
                Ok(first) => shared = shared.or(first),
                Err(err) => problems.push(ClaimError::Occupy(err)),
            }
        }
        if let Some(cu) = shared {
            problems.push(ClaimError::Shared {
                gpu: gpu.clone(),
                cu,
            });
        }
    }
    problems
}

/// The reason of a claim's Event: each of its problems, in order.
fn joined(problems: &[ClaimError]) -> String {
    let texts: Vec<String> = problems.iter().map(ToString::to_string).collect();
    texts.join("; ")
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod forged_tests;
