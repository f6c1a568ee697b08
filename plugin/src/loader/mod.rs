//! The loader check at PreStartContainer (`--loader-check`, the chart's
//! `dp.muslFailClosed.enabled`; docs/loader-check.md).
//!
//! Kubelet calls Allocate when it admits a pod, before it pulls the images;
//! PreStartContainer comes after the pull and before CreateContainer, which
//! is when the container's mounts are resolved. So Allocate cannot know the
//! image's loader. With the check on it mounts, instead of the hook itself,
//! a per-container directory of amd-gpud's ([`decide::staging_key`]); here,
//! with the image on the node, amd-gpud inspects it and the directory gets
//! the hook, stays empty, or the container start is refused:
//!
//! - glibc 2.34 or newer: the hook;
//! - musl, a static binary, or an older glibc: no hook when amd-gpud's dmem
//!   backend caps the slice (that cap is then mandatory), refused otherwise;
//! - a loader that cannot be told: refused.
//!
//! Each refusal is a Warning Event on the pod naming the image, what was
//! found and what would let it run.

pub(crate) mod decide;
pub(crate) mod gpud;
pub(crate) mod run;

use std::{fmt, future::Future, path::PathBuf, pin::Pin, sync::Arc};

use k8s_openapi::api::core::v1::{Container, Pod};
use kube::ResourceExt;
use tracing::{info, warn};

use crate::{
    kube::{Events, Regarding},
    vram::{
        CapError, PodLookup, PodLookupError, PodResourcesError,
        owners::{Owners, PodRef, holder_in, list_pod_resources},
    },
};
use decide::{Decision, Found, Inspected, decide, staging_key};
use run::ContainerRun;

/// Where the memory hook goes inside a container; its directory is what
/// Allocate mounts from the staged one.
pub(crate) const HOOK_DIR_IN_CONTAINER: &str = "/usr/local/vgpu";

/// Why amd-gpud could not answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SinkError {
    #[error("{0}")]
    NotPresent(String),
    #[error("{0}")]
    NoRuntime(String),
    #[error("{0}")]
    Pending(String),
    #[error("{0}")]
    Other(String),
}

/// amd-gpud's `InspectImage`/`InspectContainer` and `StageMemoryHook`.
pub(crate) trait LoaderSink: Send + Sync + fmt::Debug {
    /// The loader of the program `image` runs when started as `run` says.
    fn inspect(
        &self,
        image: String,
        run: ContainerRun,
    ) -> Pin<Box<dyn Future<Output = Result<Inspected, SinkError>> + Send>>;

    fn stage(
        &self,
        pod_uid: String,
        key: String,
        hook: bool,
    ) -> Pin<Box<dyn Future<Output = Result<String, SinkError>> + Send>>;
}

/// Why a container start is refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LoaderError {
    #[error(transparent)]
    Owner(#[from] CapError),
    #[error("pod {pod}: {source}")]
    Lookup {
        pod: String,
        #[source]
        source: PodLookupError,
    },
    #[error("pod {pod}: {source}")]
    Container {
        pod: String,
        #[source]
        source: ContainerError,
    },
    #[error("pod {pod}, image {image}: the loader check could not be made: {why}")]
    Inspect {
        pod: String,
        image: String,
        why: SinkError,
    },
    #[error(
        "pod {pod}, image {image}: the program it starts runs under {found} ({evidence}), which does \
         not load the memory hook, and nothing else would limit the slice's VRAM: {remedy}"
    )]
    Refused {
        pod: String,
        image: String,
        found: decide::Found,
        evidence: String,
        remedy: &'static str,
    },
    #[error("pod {pod}: staging the memory hook: {why}")]
    Stage { pod: String, why: SinkError },
}

/// Why the container holding a set of device ids cannot be told.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ContainerError {
    #[error("the pod has no spec")]
    NoSpec,
    #[error("kubelet names container {name:?}, which the pod does not have")]
    NotInPod { name: String },
    #[error(
        "cannot tell which container holds devices {ids:?} ({kubelet}, and the pod has not \
         exactly one container asking for {resource})"
    )]
    Ambiguous {
        ids: Vec<String>,
        kubelet: KubeletSaid,
        resource: String,
    },
}

/// What kubelet's pod-resources API said about a set of device ids.
#[derive(Debug, thiserror::Error)]
pub(crate) enum KubeletSaid {
    #[error("--pod-resources-socket is off")]
    NotAsked,
    #[error("kubelet's pod-resources API names no container")]
    NoContainer,
    #[error("{}: {source}", path.display())]
    Failed {
        path: PathBuf,
        #[source]
        source: PodResourcesError,
    },
}

impl LoaderError {
    /// The Event reason of this refusal.
    fn reason(&self) -> &'static str {
        match self {
            Self::Refused { .. } => "MemoryHookRefused",
            Self::Inspect {
                why: SinkError::Pending(_),
                ..
            } => "LoaderCheckPending",
            _ => "LoaderCheckFailed",
        }
    }
}

/// The check, as PreStartContainer runs it.
#[derive(Clone)]
pub(crate) struct LoaderCheck {
    pub(crate) sink: Arc<dyn LoaderSink>,
    pub(crate) owners: Arc<Owners>,
    pub(crate) pods: Arc<dyn PodLookup>,
    /// Kubelet's pod-resources socket, which names the container of a set
    /// of device ids; `None` leaves only a pod's single GPU container.
    pub(crate) pod_resources: Option<PathBuf>,
    pub(crate) resource_name: String,
    pub(crate) events: Option<Events>,
}

impl fmt::Debug for LoaderCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoaderCheck")
            .field("sink", &self.sink)
            .finish_non_exhaustive()
    }
}

impl LoaderCheck {
    /// Checks the container holding `ids` and stages its hook; `capped`:
    /// whether the dmem backend caps it. Returns whether the container goes
    /// without the hook (its VRAM cap is then mandatory).
    ///
    /// # Errors
    /// [`LoaderError`], for kubelet; also sent as an Event on the pod.
    pub(crate) async fn pre_start(
        &self,
        ids: &[String],
        capped: bool,
    ) -> Result<bool, LoaderError> {
        if self.owners.hooked(ids) == Some(false) {
            return Ok(false);
        }
        let owner = match self.owners.get(ids) {
            Some(owner) => owner,
            None => self.owners.recover(ids, self.pods.as_ref()).await?,
        };
        let checked = self.check(&owner, ids, capped).await;
        if let Err(err) = &checked {
            warn!("PreStartContainer refused: {err}");
            self.tell(&owner, true, err.reason(), err.to_string());
        }
        checked
    }

    async fn check(
        &self,
        owner: &PodRef,
        ids: &[String],
        capped: bool,
    ) -> Result<bool, LoaderError> {
        let who = format!("{}/{}", owner.namespace, owner.name);
        let pod = self
            .pods
            .find(&owner.namespace, &owner.name, Some(&owner.uid))
            .await
            .map_err(|source| LoaderError::Lookup {
                pod: who.clone(),
                source,
            })?;
        let container =
            self.container_of(&pod, ids)
                .await
                .map_err(|source| LoaderError::Container {
                    pod: who.clone(),
                    source,
                })?;
        let image = container.image.clone().unwrap_or_default();
        let inspected =
            match ContainerRun::of(container) {
                Ok(run) => self.sink.inspect(image.clone(), run).await.map_err(|why| {
                    LoaderError::Inspect {
                        pod: who.clone(),
                        image: image.clone(),
                        why,
                    }
                })?,
                // The pod names its program through values the plugin cannot
                // read: as a loader that cannot be told.
                Err(why) => Inspected {
                    found: Found::Unknown,
                    digest: String::new(),
                    evidence: why,
                },
            };
        let decision = decide(&inspected.found, capped);
        if let Decision::Refuse { remedy } = decision {
            return Err(LoaderError::Refused {
                pod: who,
                image,
                found: inspected.found,
                evidence: inspected.evidence,
                remedy,
            });
        }
        let hook = decision == Decision::Hook;
        let dir = self
            .sink
            .stage(owner.uid.clone(), staging_key(ids), hook)
            .await
            .map_err(|why| LoaderError::Stage {
                pod: who.clone(),
                why,
            })?;
        info!(pod = %who, image, loader = %inspected.found, hook, dir, "memory hook staged");
        if !hook {
            let note = format!(
                "image {image} runs under {} ({}): the memory hook is left out of container {}, \
                 and the dmem controller caps its VRAM",
                inspected.found, inspected.evidence, container.name
            );
            self.tell(owner, false, "MemoryHookLeftOut", note);
        }
        Ok(!hook)
    }

    /// The container of `pod` holding `ids`: as kubelet's pod-resources API
    /// says, else (no answer from it) the pod's one container asking for
    /// our resource.
    async fn container_of<'p>(
        &self,
        pod: &'p Pod,
        ids: &[String],
    ) -> Result<&'p Container, ContainerError> {
        let spec = pod.spec.as_ref().ok_or(ContainerError::NoSpec)?;
        let all = || {
            spec.init_containers
                .iter()
                .flatten()
                .chain(&spec.containers)
        };
        let mut kubelet = KubeletSaid::NotAsked;
        if let Some(path) = &self.pod_resources {
            match list_pod_resources(path).await {
                Ok(list) => {
                    let held =
                        holder_in(&list, &self.resource_name, ids).filter(|(ns, name, _)| {
                            Some(ns.as_str()) == pod.namespace().as_deref()
                                && *name == pod.name_any()
                        });
                    if let Some((_, _, name)) = held {
                        return all()
                            .find(|c| c.name == name)
                            .ok_or(ContainerError::NotInPod { name });
                    }
                    kubelet = KubeletSaid::NoContainer;
                }
                Err(source) => {
                    kubelet = KubeletSaid::Failed {
                        path: path.clone(),
                        source,
                    }
                }
            }
        }
        let mut asking = all()
            .filter(|c| crate::kube::container_asks(c, &self.resource_name).is_some_and(|n| n > 0));
        match (asking.next(), asking.next()) {
            (Some(only), None) => Ok(only),
            _ => Err(ContainerError::Ambiguous {
                ids: ids.to_vec(),
                kubelet,
                resource: self.resource_name.clone(),
            }),
        }
    }

    fn tell(&self, owner: &PodRef, warning: bool, reason: &str, note: String) {
        let Some(events) = &self.events else {
            return;
        };
        let regarding = Regarding::Pod {
            namespace: owner.namespace.clone(),
            name: owner.name.clone(),
            uid: owner.uid.clone(),
        };
        if warning {
            events.warning(&regarding, reason, "PreStartContainer", note);
        } else {
            events.normal(&regarding, reason, "PreStartContainer", note);
        }
    }
}

#[cfg(test)]
mod tests;
