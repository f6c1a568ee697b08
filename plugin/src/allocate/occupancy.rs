//! CU occupancy of the node, rebuilt from the cached pods'
//! `hami.io/amd-cu-allocated` (hami-protocol §5.1). Users can edit their own
//! pods, so a claim is trusted only within what HAMi granted the pod in
//! `hami.io/amd-devices-allocated` (the scheduler's, never modified): a claim
//! that does not parse, names a GPU the pod was not granted or this node does
//! not have, claims more CUs than granted, runs past the GPU's CUs or overlaps
//! an older claim is skipped (the older claim wins) and reported, and never
//! blocks other pods.

use std::{collections::HashMap, sync::Arc};

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use tracing::warn;

use super::reuse;
use crate::{
    cu::CuBitmap,
    hami::{
        ALLOCATED_KEY, CU_ALLOCATED_KEY, DevicesAnnotation, parse_cu_allocated, parse_pod_devices,
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
}

/// The bitmaps of every GPU in `totals`, with every live pod's claims.
pub fn rebuild(pods: &[Arc<Pod>], totals: &Totals) -> Occupancy {
    let mut out = Occupancy {
        maps: totals
            .iter()
            .map(|(id, total)| (id.clone(), CuBitmap::new(id.clone(), *total)))
            .collect(),
        distrusted: Vec::new(),
    };
    let mut ordered: Vec<&Arc<Pod>> = pods.iter().filter(|p| !terminal(p)).collect();
    ordered.sort_by(|a, b| age_key(a).cmp(&age_key(b)));
    for pod in ordered {
        let Some(value) = pod.annotations().get(CU_ALLOCATED_KEY) else {
            continue;
        };
        let problems = add_pod(pod, value, &mut out.maps);
        if !problems.is_empty() {
            let reason = problems.join("; ");
            let who = format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any());
            warn!(pod = %who, "not trusting {CU_ALLOCATED_KEY}: {reason}");
            out.distrusted.push(Distrust {
                namespace: pod.namespace().unwrap_or_default(),
                name: pod.name_any(),
                uid: pod.uid().unwrap_or_default(),
                value: value.clone(),
                reason,
            });
        }
    }
    out
}

/// Claims `pod`'s CUs (`value`) in `maps`; returns why parts were left out.
fn add_pod(pod: &Pod, value: &str, maps: &mut HashMap<String, CuBitmap>) -> Vec<String> {
    let claims = match parse_cu_allocated(value) {
        Ok(c) => c,
        Err(err) => return vec![err.to_string()],
    };
    let granted = granted_cus(pod);
    let mut problems = Vec::new();
    for (gpu, list) in &claims.0 {
        let allowed = granted.get(gpu).copied().unwrap_or(0);
        let claimed = u32::try_from(list.iter().count()).unwrap_or(u32::MAX);
        if allowed == 0 {
            problems.push(format!(
                "it claims CUs on GPU {gpu}, which HAMi did not grant the pod"
            ));
            continue;
        }
        if claimed > allowed {
            problems.push(format!(
                "it claims {claimed} CUs on GPU {gpu}, HAMi granted the pod {allowed}"
            ));
            continue;
        }
        let Some(map) = maps.get_mut(gpu) else {
            problems.push(format!(
                "it claims CUs on GPU {gpu}, which this node does not have"
            ));
            continue;
        };
        let list = reuse::occupied(pod, gpu, list).unwrap_or_else(|why| {
            problems.push(why);
            list.clone()
        });
        let mut trial = map.clone();
        let overlap = list
            .ranges()
            .iter()
            .find_map(|r| trial.claim(r.start..r.end.saturating_add(1)).err());
        match overlap {
            Some(err) => problems.push(format!("{err} (an older pod's claim wins)")),
            None => *map = trial,
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

    fn free(maps: &HashMap<String, CuBitmap>) -> u32 {
        maps["A"].free_count()
    }

    #[test]
    fn honest_claims_count_and_forged_ones_do_not() {
        let totals: Totals = [("A".to_owned(), 304)].into_iter().collect();
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
        let rebuilt = rebuild(&[honest, greedy, stranger, overlap, garbage], &totals);
        let names: Vec<&str> = rebuilt.distrusted.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["b", "c", "d", "e"], "each forged claim is reported");
        let maps = rebuilt.maps;
        assert_eq!(free(&maps), 304 - 76, "only the honest claim counts");
        assert!(!maps["A"].is_free(0) && maps["A"].is_free(100) && maps["A"].is_free(200));
    }

    #[test]
    fn finished_pods_release_their_cus() {
        let totals: Totals = [("A".to_owned(), 304)].into_iter().collect();
        let done = pod(
            "a",
            "2026-11-29T08:00:00Z",
            "A,T,1024,76:;",
            r#"{"A":"0-75"}"#,
        );
        let mut finished = (*done).clone();
        finished.status.as_mut().unwrap().phase = Some("Succeeded".into());
        let maps = rebuild(&[Arc::new(finished)], &totals).maps;
        assert_eq!(free(&maps), 304);
    }
}
