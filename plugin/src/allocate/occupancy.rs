//! CU occupancy of the node, rebuilt from the cached pods'
//! `hami.io/amd-cu-allocated` (hami-protocol §5.1). A claim that does not
//! parse, names an unknown GPU, runs past the GPU's CUs or overlaps an older
//! claim is not trusted: it is skipped (the older claim wins) and reported,
//! and never blocks other pods.

use std::{collections::HashMap, sync::Arc};

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use tracing::warn;

use crate::{
    cu::CuBitmap,
    hami::{CU_ALLOCATED_KEY, parse_cu_allocated},
};

/// GPU id -> (CU count) of the GPUs on this node.
pub type Totals = HashMap<String, u32>;

fn terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

fn created(pod: &Pod) -> String {
    pod.metadata
        .creation_timestamp
        .as_ref()
        .map(|t| format!("{:?}", t.0))
        .unwrap_or_default()
}

/// The bitmaps of every GPU in `totals`, with every live pod's claims.
pub fn rebuild(pods: &[Arc<Pod>], totals: &Totals) -> HashMap<String, CuBitmap> {
    let mut maps: HashMap<String, CuBitmap> = totals
        .iter()
        .map(|(id, total)| (id.clone(), CuBitmap::new(id.clone(), *total)))
        .collect();
    let mut ordered: Vec<&Arc<Pod>> = pods.iter().filter(|p| !terminal(p)).collect();
    ordered.sort_by_key(|p| (created(p), p.name_any()));
    for pod in ordered {
        let Some(value) = pod.annotations().get(CU_ALLOCATED_KEY) else {
            continue;
        };
        let who = format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any());
        let claims = match parse_cu_allocated(value) {
            Ok(c) => c,
            Err(err) => {
                warn!(pod = %who, "ignoring {CU_ALLOCATED_KEY}: {err}");
                continue;
            }
        };
        for (gpu, list) in &claims.0 {
            let Some(map) = maps.get_mut(gpu) else {
                warn!(pod = %who, gpu, "ignoring a CU claim on a GPU this node does not have");
                continue;
            };
            for range in list.ranges() {
                if let Err(err) = map.claim(range.start..range.end.saturating_add(1)) {
                    warn!(pod = %who, gpu, "ignoring a CU claim: {err}");
                }
            }
        }
    }
    maps
}
