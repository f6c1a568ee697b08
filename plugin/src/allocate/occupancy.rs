//! CU occupancy of the node, rebuilt from the cached pods'
//! `hami.io/amd-cu-allocated` (hami-protocol §5.1). Users can edit their own
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

use super::reuse;
use crate::{
    cu::CuBitmap,
    hami::{
        ALLOCATED_KEY, CU_ALLOCATED_KEY, CuList, DevicesAnnotation, parse_cu_allocated,
        parse_pod_devices,
    },
};

/// GPU id -> (CU count) of the GPUs on this node.
pub type Totals = HashMap<String, u32>;

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

/// CUs HAMi granted `pod` per GPU id, summed over its containers.
fn granted_cus(pod: &Pod) -> HashMap<String, u32> {
    let mut granted = HashMap::new();
    let Some(value) = pod.annotations().get(ALLOCATED_KEY) else {
        return granted;
    };
    let Ok(containers) = parse_pod_devices(DevicesAnnotation::Allocated, value) else {
        return granted;
    };
    for device in containers.iter().flatten() {
        let sum: &mut u32 = granted.entry(device.uuid.clone()).or_default();
        *sum = sum.saturating_add(device.usedcores);
    }
    granted
}

/// A claim that was not trusted: which pod, and why (for the Event).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Distrust {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// The annotation value judged, so that one forgery is reported once.
    pub value: String,
    pub reason: String,
}

/// The node's CU occupancy and the claims that were left out of it.
#[derive(Debug, Default)]
pub struct Occupancy {
    pub maps: HashMap<String, CuBitmap>,
    pub distrusted: Vec<Distrust>,
    /// The pods whose claims count, in the order they were laid down (named
    /// only when a grant does not fit: [`Occupancy::holders`]).
    counted: Vec<(Arc<Pod>, Arc<Judged>)>,
}

impl Occupancy {
    /// The pods (`namespace/name`) whose claims count on `gpu`.
    pub fn holders(&self, gpu: &str) -> Vec<String> {
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
    Refused(String),
    /// The CUs that count, and why the spare set was not trusted (then the
    /// whole claim counts).
    Counted {
        gpu: String,
        cus: CuList,
        spare_problem: Option<String>,
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
    claims: Result<Vec<GpuClaim>, String>,
}

/// A cached pod version (by address) and its judgement.
#[derive(Debug)]
struct Kept {
    address: usize,
    /// Held so that the address cannot be reused by another pod while the
    /// entry lives.
    _held: Arc<Pod>,
    judged: Arc<Judged>,
}

/// The judgements kept, and the GPUs they were judged against.
#[derive(Debug, Default)]
struct Judgements {
    totals: Totals,
    kept: Vec<Kept>,
    /// The count resource (`amd.com/gpu`): a pod whose spec asks for none
    /// was never granted any by HAMi, whatever its annotations say; its
    /// claims are refused. `None` (the default, unit tests): not checked.
    resource: Option<String>,
}

/// The bitmaps of every GPU in `totals`, with every live pod's claims.
/// Allocate rebuilds the occupancy over every cached pod; each pod version
/// (one `Arc` of the watch cache, whose contents never change) is parsed and
/// judged once and looked up by address after that (judged again when the
/// node's GPUs change).
#[derive(Debug, Default)]
pub struct Claims(std::sync::Mutex<Judgements>);

impl Claims {
    /// Claims judged for pods that ask for `resource` in their spec.
    pub fn for_resource(resource: &str) -> Self {
        Self(std::sync::Mutex::new(Judgements {
            resource: Some(resource.to_owned()),
            ..Judgements::default()
        }))
    }

    pub fn rebuild(
        &self,
        pods: &[Arc<Pod>],
        totals: &Totals,
        ours: &dyn Fn(&Pod) -> bool,
    ) -> Occupancy {
        let mut cache = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if cache.totals != *totals {
            cache.totals.clone_from(totals);
            cache.kept.clear();
        }
        let resource = cache.resource.clone();
        let kept = &mut cache.kept;
        // Sorted by address; an entry moves on to `kept` when its pod is still cached.
        let mut earlier: Vec<(usize, Option<Kept>)> = std::mem::take(kept)
            .into_iter()
            .map(|k| (k.address, Some(k)))
            .collect();
        let mut ordered = Vec::with_capacity(pods.len());
        for pod in pods {
            let address = Arc::as_ptr(pod).addr();
            let found = earlier
                .binary_search_by_key(&address, |(a, _)| *a)
                .ok()
                .and_then(|i| earlier[i].1.take());
            let entry = found.unwrap_or_else(|| Kept {
                address,
                _held: Arc::clone(pod),
                judged: Arc::new(judge(pod, totals, resource.as_deref())),
            });
            let judged = Arc::clone(&entry.judged);
            kept.push(entry);
            if !judged.terminal && judged.value.is_some() {
                ordered.push((!ours(pod), judged.age.0, pod, judged));
            }
        }
        kept.sort_unstable_by_key(|k| k.address);
        // Ours first, then older first; the name breaks ties (the time has
        // whole seconds).
        ordered.sort_by(|a, b| (a.0, a.1, &a.3.age.1).cmp(&(b.0, b.1, &b.3.age.1)));
        let mut maps: Vec<(String, CuBitmap)> = totals
            .iter()
            .map(|(id, total)| (id.clone(), CuBitmap::new(id.clone(), *total)))
            .collect();
        let mut distrusted = Vec::new();
        let mut counted = Vec::with_capacity(ordered.len());
        for (_, _, pod, judged) in ordered {
            let problems = apply(&judged.claims, &mut maps);
            if let (false, Some(value)) = (problems.is_empty(), &judged.value) {
                distrusted.push(distrust(pod, value, problems.join("; ")));
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
        Some(_) if !asks => Err(format!(
            "its spec asks for no {}: HAMi grants only pods that do",
            resource.unwrap_or_default()
        )),
        Some(value) => parse_cu_allocated(value)
            .map_err(|err| err.to_string())
            .map(|claims| {
                let granted = granted_cus(pod);
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
        claims,
    }
}

fn judge_gpu(
    pod: &Pod,
    totals: &Totals,
    granted: &HashMap<String, u32>,
    gpu: &str,
    list: &CuList,
) -> GpuClaim {
    let Some(&total) = totals.get(gpu) else {
        return GpuClaim::Refused(format!(
            "it claims CUs on GPU {gpu}, which this node does not have"
        ));
    };
    if let Some(max) = list.max().filter(|max| *max >= total) {
        return GpuClaim::Refused(format!(
            "it claims CU {max} on GPU {gpu}, which has {total} CUs"
        ));
    }
    let allowed = granted.get(gpu).copied().unwrap_or(0);
    let claimed = list.len();
    if allowed == 0 {
        return GpuClaim::Refused(format!(
            "it claims CUs on GPU {gpu}, which HAMi did not grant the pod"
        ));
    }
    if claimed > u64::from(allowed) {
        return GpuClaim::Refused(format!(
            "it claims {claimed} CUs on GPU {gpu}, HAMi granted the pod {allowed}"
        ));
    }
    let (cus, spare_problem) = match reuse::occupied(pod, gpu, list) {
        Ok(cus) => (cus, None),
        Err(why) => (list.clone(), Some(why)),
    };
    GpuClaim::Counted {
        gpu: gpu.to_owned(),
        cus,
        spare_problem,
    }
}

/// The GPUs on which a judged claim counts.
fn counted_gpus(claims: &Result<Vec<GpuClaim>, String>) -> impl Iterator<Item = &str> {
    claims.iter().flatten().filter_map(|claim| match claim {
        GpuClaim::Counted { gpu, cus, .. } if !cus.is_empty() => Some(gpu.as_str()),
        _ => None,
    })
}

/// Claims a judged claim's CUs in `maps`; returns why parts were left out.
fn apply(claims: &Result<Vec<GpuClaim>, String>, maps: &mut [(String, CuBitmap)]) -> Vec<String> {
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
            problems.push(format!(
                "it claims CUs on GPU {gpu}, which this node does not have"
            ));
            continue;
        };
        problems.extend(spare_problem.iter().cloned());
        let mut shared = None;
        for r in cus.ranges() {
            match map.occupy(r.start..r.end.saturating_add(1)) {
                Ok(first) => shared = shared.or(first),
                Err(err) => problems.push(err.to_string()),
            }
        }
        if let Some(cu) = shared {
            problems.push(format!(
                "CU {cu} of GPU {gpu} is also claimed by another pod (both claims count, so \
                 neither pod's CUs are handed out again)"
            ));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Pod;

    use super::*;

    fn pod(name: &str, created: &str, allocated: &str, claimed: &str) -> Arc<Pod> {
        let value = serde_json::json!({
            "metadata": {
                "name": name, "namespace": "default", "creationTimestamp": created,
                "annotations": {ALLOCATED_KEY: allocated, CU_ALLOCATED_KEY: claimed}
            },
            "status": {"phase": "Running"}
        });
        Arc::new(serde_json::from_value(value).unwrap())
    }

    /// One GPU `A` of 304 CUs (an MI300X).
    fn one_gpu() -> Totals {
        [("A".to_owned(), 304)].into_iter().collect()
    }

    fn free(maps: &HashMap<String, CuBitmap>) -> u32 {
        maps["A"].free_count()
    }

    #[test]
    fn honest_claims_count_and_forged_ones_do_not() {
        let totals = one_gpu();
        let honest = pod(
            "a",
            "2026-11-29T08:00:00Z",
            "A,T,1024,76:;",
            r#"{"A":"0-75"}"#,
        );
        // Claims more than granted, a GPU not granted, and an overlap with an older pod.
        let greedy = pod(
            "b",
            "2026-11-29T08:01:00Z",
            "A,T,1024,10:;",
            r#"{"A":"100-199"}"#,
        );
        let stranger = pod(
            "c",
            "2026-11-29T08:02:00Z",
            "B,T,1024,10:;",
            r#"{"A":"200-209"}"#,
        );
        let overlap = pod(
            "d",
            "2026-11-29T08:03:00Z",
            "A,T,1024,10:;",
            r#"{"A":"70-79"}"#,
        );
        let garbage = pod("e", "2026-11-29T08:04:00Z", "A,T,1024,10:;", "not json");
        let rebuilt = Claims::default().rebuild(
            &[honest, greedy, stranger, overlap, garbage],
            &totals,
            &|_| false,
        );
        let names: Vec<&str> = rebuilt.distrusted.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["b", "c", "d", "e"], "each forged claim is reported");
        let maps = rebuilt.maps;
        assert_eq!(
            free(&maps),
            304 - 80,
            "the honest claim and the overlap's union"
        );
        assert!(!maps["A"].is_free(0) && maps["A"].is_free(100) && maps["A"].is_free(200));
    }

    #[test]
    fn a_kept_judgement_serves_only_the_same_pod_version() {
        let totals = one_gpu();
        let claims = Claims::default();
        let first = pod(
            "a",
            "2026-11-29T08:00:00Z",
            "A,T,1024,76:;",
            r#"{"A":"0-75"}"#,
        );
        let rebuilt = claims.rebuild(&[Arc::clone(&first)], &totals, &|_| false);
        assert_eq!(free(&rebuilt.maps), 304 - 76);
        let rebuilt = claims.rebuild(&[Arc::clone(&first)], &totals, &|_| false);
        assert_eq!(free(&rebuilt.maps), 304 - 76, "kept, same answer");
        // Another version (a new object), even with the same resourceVersion
        // (the plugin's record puts values back that way), is judged again.
        let mut edited = (*first).clone();
        edited
            .annotations_mut()
            .insert(CU_ALLOCATED_KEY.into(), r#"{"A":"0-199"}"#.into());
        let rebuilt = claims.rebuild(&[Arc::new(edited)], &totals, &|_| false);
        assert_eq!(rebuilt.distrusted.len(), 1, "more than granted");
        assert_eq!(free(&rebuilt.maps), 304);
        assert_eq!(claims.0.lock().unwrap().kept.len(), 1, "one per cached pod");
        claims.rebuild(&[], &totals, &|_| false);
        assert!(
            claims.0.lock().unwrap().kept.is_empty(),
            "gone with the pod"
        );
    }

    #[test]
    fn a_claim_that_overlaps_another_counts_with_it_and_is_reported() {
        let totals = one_gpu();
        let older = pod(
            "g",
            "2026-11-29T08:00:00Z",
            "A,T,1024,6:;",
            r#"{"A":"250-255"}"#,
        );
        let newer = pod(
            "f",
            "2026-11-29T08:01:00Z",
            "A,T,1024,20:;",
            r#"{"A":"200-209,250-259"}"#,
        );
        let pods = [Arc::clone(&newer), Arc::clone(&older)];
        let rebuilt = Claims::default().rebuild(&pods, &totals, &|_| false);
        assert_eq!(rebuilt.distrusted.len(), 1);
        assert_eq!(
            rebuilt.distrusted[0].name, "f",
            "the newer claim is reported"
        );
        let map = &rebuilt.maps["A"];
        assert!(!map.is_free(200) && !map.is_free(259), "both claims count");
        assert_eq!(map.free_count(), 304 - 20);
        // A stale pod (gone from the API, still cached) overlapping a claim of
        // ours: ours comes first, the other is the one reported.
        let ours = |p: &Pod| p.metadata.name.as_deref() == Some("f");
        let rebuilt = Claims::default().rebuild(&pods, &totals, &ours);
        assert_eq!(rebuilt.distrusted[0].name, "g");
        assert_eq!(rebuilt.maps["A"].free_count(), 304 - 20);
    }

    #[test]
    fn finished_pods_release_their_cus() {
        let totals = one_gpu();
        let done = pod(
            "a",
            "2026-11-29T08:00:00Z",
            "A,T,1024,76:;",
            r#"{"A":"0-75"}"#,
        );
        let mut finished = (*done).clone();
        finished.status.as_mut().unwrap().phase = Some("Succeeded".into());
        let maps = Claims::default()
            .rebuild(&[Arc::new(finished)], &totals, &|_| false)
            .maps;
        assert_eq!(free(&maps), 304);
    }
}

#[cfg(test)]
#[path = "occupancy_forged_tests.rs"]
mod forged_tests;
