//! Warning Events of Allocate: a grant that cannot be had without other
//! pods' CUs, and claims that are not trusted as written.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use super::{Allocator, occupancy};
use crate::{hami::CU_ALLOCATED_KEY, kube::Regarding};

impl Allocator {
    /// A Warning Event on `pod` when its grant cannot be had without CUs
    /// other pods hold (HAMi counted the node otherwise): the container does
    /// not start rather than share CUs.
    pub(super) fn report_conflict(&self, pod: &Pod, message: &str) {
        let regarding = Regarding::Pod {
            namespace: pod.namespace().unwrap_or_default(),
            name: pod.name_any(),
            uid: pod.uid().unwrap_or_default(),
        };
        let note = format!("not started rather than share CUs: {message}");
        self.events
            .warning(&regarding, "CuConflict", "Allocate", note);
    }

    /// A Warning Event on the node when kubelet's Allocate names no pod
    /// being bound here: the pod kubelet admits is not known to us, so the
    /// Event cannot be on it.
    pub(super) fn report_no_pod(&self, message: &str) {
        let regarding = Regarding::node_of(&self.caches);
        let note = format!("an Allocate was refused: {message}");
        self.events
            .warning(&regarding, "AllocateRefused", "Allocate", note);
    }

    /// A Warning Event on `pod` when its Allocate failed for another reason
    /// than a CU conflict (reported by [`Self::report_conflict`]).
    pub(super) fn report_failed(&self, pod: &Pod, message: &str) {
        let regarding = Regarding::Pod {
            namespace: pod.namespace().unwrap_or_default(),
            name: pod.name_any(),
            uid: pod.uid().unwrap_or_default(),
        };
        let note = format!("the container was refused its devices: {message}");
        self.events
            .warning(&regarding, "AllocateFailed", "Allocate", note);
    }

    /// One Warning Event per forged claim (pod and value) on the pod; `live`
    /// are the pods whose reports are remembered.
    pub(super) fn report_distrust(&self, distrusted: Vec<occupancy::Distrust>, live: &[Arc<Pod>]) {
        let mut reported = self
            .reported
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for d in distrusted {
            if !reported.first_time(&d.uid, &d.value, live) {
                continue;
            }
            let note = format!(
                "{CU_ALLOCATED_KEY} of {}/{} is not trusted as written: {}",
                d.namespace, d.name, d.reason
            );
            let regarding = Regarding::Pod {
                namespace: d.namespace,
                name: d.name,
                uid: d.uid,
            };
            self.events
                .warning(&regarding, "UntrustedCuClaim", "Allocate", note);
        }
    }
}
