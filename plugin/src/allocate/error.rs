//! Why an Allocate failed: one variant per cause, carrying what it is about
//! and its source, and the metric reason of each ([`AllocateError::reason`]);
//! and why a pod's CU claim is not trusted as written ([`ClaimError`]).

use std::{path::PathBuf, time::Duration};

use crate::{
    cu::CuError,
    hami::{HamiError, TO_ALLOCATE_KEY},
    inventory::ids::Unresolved,
};

use super::{pod::FindError, reuse::SpareError};

/// Why an Allocate failed, for metrics (`amdgpu_dp_allocate_total`'s
/// `reason` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reason {
    /// No pod being bound fits the request (cache and API server).
    NoPod,
    /// A HAMi annotation of the pod does not parse or has no entry left.
    Annotation,
    /// Kubelet asks for another number of devices than HAMi assigned.
    DeviceCount,
    /// HAMi assigned a GPU this node does not have.
    UnknownGpu,
    /// No CU slice or response could be built for the grant.
    Slice,
    /// Writing the pod back to the API server failed.
    ApiWrite,
    /// The Allocate did not finish within [`super::ALLOCATE_DEADLINE`].
    Deadline,
}

impl Reason {
    /// The metric label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::NoPod => "no_pod",
            Self::Annotation => "bad_annotation",
            Self::DeviceCount => "device_count",
            Self::UnknownGpu => "unknown_gpu",
            Self::Slice => "cu_slice",
            Self::ApiWrite => "api_write",
            Self::Deadline => "deadline",
        }
    }
}

/// Why no CU slice could be had for one device of a grant.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SliceError {
    #[error("no CU state for GPU {gpu}")]
    NoCuState { gpu: String },
    #[error("HAMi granted GPU {gpu} whole, but only {free} of its {total} CUs are free")]
    WholeNotFree {
        gpu: String,
        free: u32,
        total: u32,
        #[source]
        source: CuError,
    },
    #[error(transparent)]
    Cu(#[from] CuError),
}

/// Why kubelet's answer for the container cannot be built.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ResponseError {
    #[error(
        "the memory hook {} is missing (--hook-path, AMDGPU_DP_HOOK_PATH): a slice's memory \
         limit would silently not apply, so no slice is handed out; install the hook on the \
         node or request whole GPUs",
        hook.display()
    )]
    HookMissing { hook: PathBuf },
    #[error(transparent)]
    Environment(#[from] CuError),
}

/// Why the pod's annotations after this container cannot be written.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WriteBackError {
    #[error(
        "{key} of the pod claims CU {max} on GPU {gpu}, which has {cus} CUs \
         (the plugin never wrote that)",
        key = crate::hami::CU_ALLOCATED_KEY
    )]
    ForgedClaim { gpu: String, max: u32, cus: u32 },
    #[error(transparent)]
    Annotation(#[from] HamiError),
}

/// A failed Allocate; its text is what kubelet reports for the container.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AllocateError {
    #[error("{waiting} within {limit:?} (the API server does not answer in time)")]
    Deadline {
        waiting: &'static str,
        limit: Duration,
    },
    #[error(
        "the watch of the pods on node {node} has not listed them within {waited:?}: \
         without every pod's CU claims no slice is handed out"
    )]
    PodsNotListed { node: String, waited: Duration },
    #[error(transparent)]
    NoPod(#[from] FindError),
    #[error(transparent)]
    Annotation(#[from] HamiError),
    #[error("{TO_ALLOCATE_KEY} has no entry left")]
    NoEntryLeft,
    #[error("device number not matched: kubelet asks for {asked}, HAMi assigned {assigned}")]
    DeviceCount { asked: usize, assigned: usize },
    #[error("HAMi assigned {0}")]
    Unresolved(#[source] Unresolved),
    #[error("HAMi assigned GPU {gpu:?}, which this node does not have")]
    GpuNotHere { gpu: String },
    /// No slice on `gpu`; `holders` are the pods holding CUs there.
    #[error("{source}{}", held_by(holders))]
    Slice {
        gpu: String,
        holders: Vec<String>,
        #[source]
        source: Box<SliceError>,
    },
    #[error(transparent)]
    Response(#[from] ResponseError),
    #[error(transparent)]
    WriteBack(#[from] WriteBackError),
    #[error("patching the pod: {0}")]
    Patch(#[source] kube::Error),
    #[error("patching the pod timed out after {0:?}")]
    PatchTimeout(Duration),
    #[error("allocating AMD GPUs for {pod}: {source}")]
    ForPod {
        pod: String,
        #[source]
        source: Box<AllocateError>,
    },
}

impl AllocateError {
    /// The metric reason.
    pub(crate) fn reason(&self) -> Reason {
        match self {
            Self::Deadline { .. } => Reason::Deadline,
            Self::PodsNotListed { .. } | Self::NoPod(_) => Reason::NoPod,
            Self::Annotation(_) | Self::NoEntryLeft | Self::WriteBack(_) => Reason::Annotation,
            Self::DeviceCount { .. } => Reason::DeviceCount,
            Self::Unresolved(_) | Self::GpuNotHere { .. } => Reason::UnknownGpu,
            Self::Slice { .. } | Self::Response(_) => Reason::Slice,
            Self::Patch(_) | Self::PatchTimeout(_) => Reason::ApiWrite,
            Self::ForPod { source, .. } => source.reason(),
        }
    }
}

/// `; CUs held by <pods>` when any pod holds CUs on the GPU.
fn held_by(holders: &[String]) -> String {
    if holders.is_empty() {
        String::new()
    } else {
        format!("; CUs held by {}", holders.join(", "))
    }
}

/// Why a pod's CU claim, or its part on one GPU, does not count as written
/// (each is one part of the pod's `UntrustedCuClaim` Event).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ClaimError {
    /// The pod's spec asks for none of the count resource `resource`.
    #[error("its spec asks for no {resource}: HAMi grants only pods that do")]
    NoRequest { resource: String },
    /// The claim does not parse.
    #[error(transparent)]
    Unparsable(HamiError),
    /// The claim names a GPU by a name several devices share.
    #[error("it claims CUs on {0}")]
    Ambiguous(#[source] Unresolved),
    #[error("it claims CUs on GPU {gpu}, which this node does not have")]
    NotOnNode { gpu: String },
    #[error("it claims CU {max} on GPU {gpu}, which has {total} CUs")]
    PastEnd { gpu: String, max: u32, total: u32 },
    #[error("it claims CUs on GPU {gpu}, which HAMi did not grant the pod")]
    NotGranted { gpu: String },
    #[error("it claims {claimed} CUs on GPU {gpu}, HAMi granted the pod {allowed}")]
    MoreThanGranted {
        gpu: String,
        claimed: u64,
        allowed: u32,
    },
    /// The pod's spare set is not trusted: its whole claim on the GPU counts.
    #[error(transparent)]
    Spare(SpareError),
    /// The claim's CUs could not be laid on the GPU's bitmap.
    #[error(transparent)]
    Occupy(CuError),
    /// The claim counts, together with another pod's that holds `cu`.
    #[error(
        "CU {cu} of GPU {gpu} is also claimed by another pod (both claims count, so \
         neither pod's CUs are handed out again)"
    )]
    Shared { gpu: String, cu: u32 },
}
