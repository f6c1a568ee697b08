//! Why a VRAM cap was not applied at PreStartContainer: one enum per step
//! (finding the pod, reading its grants, asking amd-gpud), each variant
//! carrying the pod, GPU or value it is about and its source.

use std::{path::PathBuf, time::Duration};

use crate::{gpud::SessionError, hami::HamiError, inventory::ids::Unresolved};

/// Why a pod could not be found by name ([`super::PodLookup`]).
#[derive(Debug, thiserror::Error)]
pub(crate) enum PodLookupError {
    #[error("reading it from the API server: {0}")]
    Read(#[source] kube::Error),
    #[error("reading it from the API server timed out after {0:?}")]
    ReadTimeout(Duration),
    #[error("the API server has another pod of that name (uid {found}, not {wanted})")]
    OtherUid { found: String, wanted: String },
    /// Only the tests' pod tables say this; the product reads the API.
    #[cfg(test)]
    #[error("no such pod")]
    NotKnown,
}

/// Why kubelet's pod-resources API gave no list.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PodResourcesError {
    #[error("cannot connect: {0}")]
    Connect(#[source] tonic::transport::Error),
    #[error("List failed: {}", .0.message())]
    List(#[source] tonic::Status),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

/// Why the owner of a set of device ids could not be recovered after a
/// restart ([`super::Owners::recover`]).
#[derive(Debug, thiserror::Error)]
pub(crate) enum RecoverError {
    #[error("not allocated by this process, and --pod-resources-socket is off")]
    NoPodResources,
    #[error("{}: {source}", path.display())]
    PodResources {
        path: PathBuf,
        #[source]
        source: PodResourcesError,
    },
    #[error("kubelet's pod-resources API ({}) lists no container holding them", path.display())]
    NotListed { path: PathBuf },
    #[error("{pod}: {source}")]
    Lookup {
        pod: String,
        #[source]
        source: PodLookupError,
    },
    #[error("{pod} has no uid")]
    NoUid { pod: String },
}

/// Why a pod's VRAM limits cannot be read from its HAMi grants
/// ([`super::pod_limits`]).
#[derive(Debug, thiserror::Error)]
pub(crate) enum LimitsError {
    #[error("no {} annotation", crate::hami::ALLOCATED_KEY)]
    NoAnnotation,
    #[error(transparent)]
    Annotation(#[from] HamiError),
    #[error("{key} names {0}", key = crate::hami::ALLOCATED_KEY)]
    Unresolved(#[source] Unresolved),
    #[error("{} names GPU {gpu:?}, not on this node", crate::hami::ALLOCATED_KEY)]
    GpuNotHere { gpu: String },
    #[error("{mib} MiB does not fit in bytes")]
    TooLarge { mib: u32 },
    #[error("the VRAM sum on {region} overflows")]
    Overflow { region: String },
}

/// What was wrong with the pod whose cap was asked for.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BadPodError {
    #[error(transparent)]
    Lookup(#[from] PodLookupError),
    #[error(transparent)]
    Limits(#[from] LimitsError),
}

/// Why a cap was not applied.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CapError {
    #[error("no pod is known for devices {ids:?}: {source}")]
    NoPod {
        ids: Vec<String>,
        #[source]
        source: RecoverError,
    },
    #[error("pod {pod}: {source}")]
    BadPod {
        pod: String,
        #[source]
        source: BadPodError,
    },
    #[error("amd-gpud refused the VRAM cap of pod {pod}: {source}")]
    Refused {
        pod: String,
        #[source]
        source: SessionError,
    },
}

/// A cap that must hold and did not: the container start is refused.
#[derive(Debug, thiserror::Error)]
#[error("{cap} ({why})")]
pub(crate) struct PreStartError {
    #[source]
    pub(crate) cap: CapError,
    /// Why this cap is fatal here.
    pub(crate) why: &'static str,
}
