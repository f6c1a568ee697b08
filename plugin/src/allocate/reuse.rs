//! A pod's init-container CUs, reused by its app containers on the same GPU
//! (docs/hami-protocol.md §4.2). HAMi counts a pod's CUs per GPU as `max(init peak,
//! sum of app containers)` and shrinks to the app containers once the init
//! containers have succeeded; reserving `init + app` for ever (what the Go
//! plugin did) makes later pods fail Allocate on a node the scheduler
//! considers free.
//!
//! Regular init containers run one after another and finish before any app
//! container starts, so:
//! - an init container takes the pod's spare init CUs on the GPU first (they
//!   share), and its new CUs become spare too;
//! - an app container (or a sidecar, an init container with `restartPolicy:
//!   Always`, which keeps running beside the app) takes spare CUs first and
//!   removes them from the spare set, so two running containers never share;
//! - once every regular init container has succeeded, the CUs still spare are
//!   dropped from the pod's occupancy.
//!
//! The spare set is kept in the pod annotation [`CU_SPARE_KEY`] (same format
//! as `hami.io/amd-cu-allocated`, always a subset of it) so that a restarted
//! plugin continues where it stopped. When the container being admitted
//! cannot be told apart (the pod spec's AMD containers do not match HAMi's
//! entries), it is treated as an app container: no reuse, never a shared CU.

use std::{collections::BTreeMap, ops::Range};

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use tracing::warn;

use crate::{
    cu::{CuBitmap, CuError, mask::normalize},
    hami::{
        CU_ALLOCATED_KEY, CuAllocated, CuList, DevicesAnnotation, HamiError,
        containers::{Stage, is_sidecar, next_container, non_empty_entries},
        parse_cu_allocated,
    },
};

/// The pod's init-container CUs not (yet) handed to an app container.
pub(crate) const CU_SPARE_KEY: &str = "hami.io/amd-cu-init-spare";

/// What the container kubelet is admitting is, for CU reuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// A regular init container: runs alone, before the app containers.
    Init,
    /// An app container or a sidecar: runs beside the others.
    App,
}

/// The role of the container whose entry is next in the pod's to-allocate
/// annotation; an app container when that cannot be told.
pub(crate) fn next_role(pod: &Pod, resource: &str) -> Role {
    match next_container(pod, resource) {
        Some(c) if c.stage == Stage::Init => Role::Init,
        _ => Role::App,
    }
}

/// True once every regular init container of `pod` has exited with 0.
pub(crate) fn init_done(pod: &Pod) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return true;
    };
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.init_container_statuses.as_ref());
    spec.init_containers
        .iter()
        .flatten()
        .filter(|c| !is_sidecar(c))
        .all(|c| {
            statuses
                .into_iter()
                .flatten()
                .find(|s| s.name == c.name)
                .and_then(|s| s.state.as_ref()?.terminated.as_ref())
                .is_some_and(|t| t.exit_code == 0)
        })
}

/// The spare set written on `pod`, if it parses.
pub(crate) fn spare_of(pod: &Pod) -> Option<Result<CuAllocated, HamiError>> {
    pod.annotations()
        .get(CU_SPARE_KEY)
        .map(|v| parse_cu_allocated(v))
}

/// The choices of one container, with the pod's spare set as it goes.
#[derive(Debug)]
pub(crate) struct Reuse {
    role: Role,
    spare: BTreeMap<String, CuList>,
    changed: bool,
}

impl Reuse {
    /// For the next container of `pod` (a spare set that does not parse is
    /// treated as empty: no reuse).
    pub(crate) fn for_pod(pod: &Pod, resource: &str) -> Self {
        let spare = spare_of(pod)
            .and_then(Result::ok)
            .map(|s| s.0)
            .unwrap_or_default();
        Self {
            role: next_role(pod, resource),
            spare,
            changed: false,
        }
    }

    /// The role this container was given.
    pub(crate) fn role(&self) -> Role {
        self.role
    }

    /// Chooses `want` CUs (whole units of `unit`) on `map`'s GPU: the pod's
    /// spare units first, lowest first, then free ones, which are claimed.
    ///
    /// # Errors
    /// As [`CuBitmap::choose`] for the part that spare units do not cover.
    pub(crate) fn choose(
        &mut self,
        map: &mut CuBitmap,
        want: u32,
        unit: u32,
    ) -> Result<Vec<Range<u32>>, CuError> {
        if !matches!(unit, 1 | 2) || want / unit == 0 {
            return map.choose(want, unit);
        }
        let gpu = map.gpu().to_owned();
        let spare = self.spare_on(&gpu, map.total());
        let reused: Vec<Range<u32>> = (0..map.total() / unit)
            .map(|k| k * unit..(k + 1) * unit)
            .filter(|r| r.clone().all(|cu| spare.contains(cu)))
            .take(usize::try_from(want / unit).unwrap_or(usize::MAX))
            .collect();
        let missing = want / unit - u32::try_from(reused.len()).unwrap_or(u32::MAX);
        let fresh = if missing > 0 {
            map.choose(missing * unit, unit)?
        } else {
            Vec::new()
        };
        for range in &fresh {
            map.claim(range.clone())?;
        }
        let next: Vec<u32> = match self.role {
            Role::Init => spare
                .iter()
                .chain(fresh.iter().flat_map(Clone::clone))
                .collect(),
            Role::App => spare
                .iter()
                .filter(|cu| !reused.iter().any(|r| r.contains(cu)))
                .collect(),
        };
        let next = CuList::from_indices(next);
        if next != spare {
            self.changed = true;
            if next.is_empty() {
                self.spare.remove(&gpu);
            } else {
                self.spare.insert(gpu, next);
            }
        }
        Ok(normalize(&[reused, fresh].concat()))
    }

    /// The spare set on `gpu`; one that runs past the GPU's `total` CUs was
    /// not written by the plugin and is dropped before anything expands it.
    fn spare_on(&mut self, gpu: &str, total: u32) -> CuList {
        match self.spare.get(gpu) {
            Some(list) if list.max().is_some_and(|max| max >= total) => {
                warn!(
                    gpu,
                    total, "{CU_SPARE_KEY} runs past the GPU's CUs: not reused"
                );
                self.spare.remove(gpu);
                self.changed = true;
                CuList::default()
            }
            Some(list) => list.clone(),
            None => CuList::default(),
        }
    }

    /// The new value of [`CU_SPARE_KEY`] when it changed.
    ///
    /// # Errors
    /// When a GPU id cannot be written (never for registered ids).
    pub(crate) fn annotation(&self) -> Result<Option<String>, HamiError> {
        if !self.changed {
            return Ok(None);
        }
        CuAllocated(self.spare.clone()).encode().map(Some)
    }
}

/// Why a pod's spare set is not trusted (its whole claim counts then).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SpareError {
    #[error("{CU_SPARE_KEY}: {0}")]
    Unparsable(#[source] HamiError),
    /// The spare set names `count` CUs on `gpu` outside the claim.
    #[error(
        "{CU_SPARE_KEY} names {count} CUs on {gpu} that {CU_ALLOCATED_KEY} does not claim \
         (the first is CU {first})"
    )]
    NotClaimed { gpu: String, count: u64, first: u32 },
}

/// `claimed` without the pod's spare CUs on `gpu` once its init containers
/// are done and nothing is left to allocate; unchanged otherwise.
///
/// # Errors
/// When the spare set does not parse or is not a subset of the claim (then
/// it is not trusted).
pub(crate) fn occupied(pod: &Pod, gpu: &str, claimed: &CuList) -> Result<CuList, SpareError> {
    let pending = non_empty_entries(pod, DevicesAnnotation::ToAllocate).unwrap_or(0) > 0;
    if pending || !init_done(pod) {
        return Ok(claimed.clone());
    }
    let spare = match spare_of(pod) {
        None => return Ok(claimed.clone()),
        Some(Err(err)) => return Err(SpareError::Unparsable(err)),
        Some(Ok(spare)) => spare,
    };
    let Some(list) = spare.0.get(gpu) else {
        return Ok(claimed.clone());
    };
    // On the ranges: neither list is expanded (the spare set is not bounded
    // by the GPU yet).
    let outside = list.difference(claimed);
    if let Some(first) = outside.ranges().first() {
        return Err(SpareError::NotClaimed {
            gpu: gpu.to_owned(),
            count: outside.len(),
            first: first.start,
        });
    }
    Ok(claimed.difference(list))
}

#[cfg(test)]
mod tests;
