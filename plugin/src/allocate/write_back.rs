//! What Allocate writes on the pod after one container (docs/hami-protocol.md
//! §3.5, §5.1): the entry consumed, the pod's CU record, and the bind phase
//! once nothing is left to allocate.

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use serde_json::{Value, json};

use super::{error::WriteBackError, pod, response};
use crate::hami::{
    CU_ALLOCATED_KEY, CuAllocated, CuList, DevicesAnnotation, TO_ALLOCATE_KEY, has_pending,
    parse_cu_allocated, parse_pod_devices,
};

/// The pod annotations to write after one container: the entry erased, the
/// pod's CU record (one per pod: a second container on the same GPU adds to
/// it), and `bind-phase: success` when nothing is left to allocate. Returns
/// whether the pod is complete.
pub(super) fn write_back(
    pod: &Pod,
    slices: &[response::Slice],
    rest: String,
) -> Result<(Value, bool), WriteBackError> {
    let mut claims = pod
        .annotations()
        .get(CU_ALLOCATED_KEY)
        .and_then(|v| parse_cu_allocated(v).ok())
        .unwrap_or_else(|| CuAllocated(Default::default()));
    for s in slices.iter().filter(|s| !s.claimed.is_empty()) {
        let earlier = claims.0.get(&s.id).cloned().unwrap_or_default();
        // The pod's own value may be forged (its manifest can set it): bounded
        // by the GPU, and merged as ranges.
        if let Some(max) = earlier.max().filter(|max| *max >= s.env.cu_count) {
            return Err(WriteBackError::ForgedClaim {
                gpu: s.id.clone(),
                max,
                cus: s.env.cu_count,
            });
        }
        let chosen = CuList::from_indices(s.claimed.iter().flat_map(Clone::clone));
        claims.0.insert(s.id.clone(), earlier.union(&chosen));
    }
    let remaining = parse_pod_devices(DevicesAnnotation::ToAllocate, &rest)?;
    let complete = !other_vendor_pending(pod) && !has_pending(&remaining);
    let mut annotations = json!({ TO_ALLOCATE_KEY: rest });
    if !claims.0.is_empty() {
        annotations[CU_ALLOCATED_KEY] = Value::String(claims.encode()?);
    }
    if complete {
        annotations[pod::BIND_PHASE_KEY] = Value::String("success".to_owned());
    }
    Ok((annotations, complete))
}

/// Whether another vendor's HAMi to-allocate annotation on `pod` still holds
/// a device entry (then the pod is not complete yet).
fn other_vendor_pending(pod: &Pod) -> bool {
    pod.annotations().iter().any(|(key, value)| {
        key != TO_ALLOCATE_KEY
            && key.starts_with("hami.io/")
            && key.ends_with("-devices-to-allocate")
            && value.contains(',')
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(annotations: Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p", "annotations": annotations}}))
            .unwrap()
    }

    #[test]
    fn another_vendors_entry_keeps_the_pod_incomplete() {
        let nvidia = pod(json!({"hami.io/vgpu-devices-to-allocate": "GPU-1,NVIDIA,1024,10:;"}));
        assert!(other_vendor_pending(&nvidia));
        let done = pod(json!({"hami.io/vgpu-devices-to-allocate": ";"}));
        assert!(!other_vendor_pending(&done));
        let ours = pod(json!({TO_ALLOCATE_KEY: "A,T,1,1:;"}));
        assert!(
            !other_vendor_pending(&ours),
            "our own key is judged by its entries"
        );
        let (annotations, complete) = write_back(&nvidia, &[], ";".to_owned()).unwrap();
        assert!(!complete);
        assert!(annotations.get(pod::BIND_PHASE_KEY).is_none());
        let (annotations, complete) = write_back(&done, &[], ";".to_owned()).unwrap();
        assert!(complete);
        assert_eq!(annotations[pod::BIND_PHASE_KEY], "success");
    }
}
