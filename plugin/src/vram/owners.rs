//! Which pod a set of kubelet device ids belongs to. Kubelet's
//! PreStartContainer names only device ids: Allocate records the pod it gave
//! them to; after a plugin restart the record is rebuilt from kubelet's
//! pod-resources API (which names the pod but not its UID; the UID comes from
//! the pod as [`super::PodLookup`] finds it).

use std::{
    collections::{BTreeSet, HashMap},
    path::PathBuf,
    sync::{Mutex, PoisonError},
};

use kube::ResourceExt;
use proto::podresources::v1::{
    ListPodResourcesRequest, ListPodResourcesResponse,
    pod_resources_lister_client::PodResourcesListerClient,
};
use tracing::info;

use super::{CapError, PodLookup, PodResourcesError, RecoverError};
use crate::kube::CALL_TIMEOUT;

/// A pod, as Events and amd-gpud need it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PodRef {
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) uid: String,
}

/// Device ids -> the pod they were allocated to, and the record's size
/// at which entries of pods that are gone are next dropped.
#[derive(Debug, Default)]
struct Record {
    by_ids: HashMap<BTreeSet<String>, PodRef>,
    /// Whether Allocate mounted a staged memory hook for the ids (the
    /// loader check); pruned with `by_ids`.
    hooked: HashMap<BTreeSet<String>, bool>,
    /// The container of the pod the ids went to, when known; pruned with
    /// `by_ids`.
    containers: HashMap<BTreeSet<String>, String>,
    prune_at: usize,
}

/// Device ids -> the pod they were allocated to.
#[derive(Debug)]
pub(crate) struct Owners {
    record: Mutex<Record>,
    /// Kubelet's pod-resources socket; `None` disables recovery.
    pod_resources: Option<PathBuf>,
    resource_name: String,
}

impl Owners {
    pub(crate) fn new(pod_resources: Option<PathBuf>, resource_name: &str) -> Self {
        Self {
            record: Mutex::new(Record::default()),
            pod_resources,
            resource_name: resource_name.to_owned(),
        }
    }

    /// Records that `ids` went to `pod`. Entries of pods for which `live`
    /// says no are dropped each time the record has doubled since it was
    /// last pruned (a stale entry is harmless: the same ids allocated again
    /// replace it), so that this stays cheap on every Allocate.
    pub(crate) fn remember(&self, ids: &[String], pod: PodRef, live: impl Fn(&str) -> bool) {
        let mut record = self.record.lock().unwrap_or_else(PoisonError::into_inner);
        if record.by_ids.len() >= record.prune_at {
            record.by_ids.retain(|_, p| live(&p.uid));
            let Record {
                by_ids,
                hooked,
                containers,
                ..
            } = &mut *record;
            hooked.retain(|ids, _| by_ids.contains_key(ids));
            containers.retain(|ids, _| by_ids.contains_key(ids));
            record.prune_at = 2 * record.by_ids.len() + 16;
        }
        record.by_ids.insert(ids.iter().cloned().collect(), pod);
    }

    /// Records whether Allocate mounted a staged memory hook for `ids`
    /// (after [`Self::remember`]).
    pub(crate) fn remember_hook(&self, ids: &[String], staged: bool) {
        let mut record = self.record.lock().unwrap_or_else(PoisonError::into_inner);
        record.hooked.insert(ids.iter().cloned().collect(), staged);
    }

    /// Records the container of the pod that `ids` went to (after
    /// [`Self::remember`]).
    pub(crate) fn remember_container(&self, ids: &[String], container: &str) {
        let mut record = self.record.lock().unwrap_or_else(PoisonError::into_inner);
        record
            .containers
            .insert(ids.iter().cloned().collect(), container.to_owned());
    }

    /// The container `ids` went to, when known.
    pub(crate) fn container(&self, ids: &[String]) -> Option<String> {
        let key: BTreeSet<String> = ids.iter().cloned().collect();
        let record = self.record.lock().unwrap_or_else(PoisonError::into_inner);
        record.containers.get(&key).cloned()
    }

    /// The resource whose devices these are.
    pub(crate) fn resource(&self) -> &str {
        &self.resource_name
    }

    /// Whether Allocate mounted a staged hook for exactly `ids`; `None`
    /// when this process did not allocate them.
    pub(crate) fn hooked(&self, ids: &[String]) -> Option<bool> {
        let key: BTreeSet<String> = ids.iter().cloned().collect();
        let record = self.record.lock().unwrap_or_else(PoisonError::into_inner);
        record.hooked.get(&key).copied()
    }

    /// The recorded owner of exactly `ids`.
    pub(crate) fn get(&self, ids: &[String]) -> Option<PodRef> {
        let key: BTreeSet<String> = ids.iter().cloned().collect();
        let record = self.record.lock().unwrap_or_else(PoisonError::into_inner);
        record.by_ids.get(&key).cloned()
    }

    /// Asks kubelet's pod-resources API which pod's container holds `ids`,
    /// and records the answer.
    ///
    /// # Errors
    /// When the API is off or unreachable, or names no such pod.
    pub(crate) async fn recover(
        &self,
        ids: &[String],
        pods: &dyn PodLookup,
    ) -> Result<PodRef, CapError> {
        let fail = |source: RecoverError| CapError::NoPod {
            ids: ids.to_vec(),
            source,
        };
        let Some(path) = &self.pod_resources else {
            return Err(fail(RecoverError::NoPodResources));
        };
        let list = list_pod_resources(path).await.map_err(|source| {
            fail(RecoverError::PodResources {
                path: path.clone(),
                source,
            })
        })?;
        let (namespace, name, container) = holder_in(&list, &self.resource_name, ids)
            .ok_or_else(|| fail(RecoverError::NotListed { path: path.clone() }))?;
        let who = format!("{namespace}/{name}");
        let uid = pods
            .find(&namespace, &name, None)
            .await
            .map_err(|source| {
                fail(RecoverError::Lookup {
                    pod: who.clone(),
                    source,
                })
            })?
            .uid()
            .ok_or_else(|| fail(RecoverError::NoUid { pod: who.clone() }))?;
        let pod = PodRef {
            namespace,
            name,
            uid,
        };
        info!(pod = %format!("{}/{}", pod.namespace, pod.name), "owner of {ids:?} recovered from pod-resources");
        self.remember(ids, pod.clone(), |_| true);
        self.remember_container(ids, &container);
        Ok(pod)
    }
}

pub(crate) async fn list_pod_resources(
    path: &std::path::Path,
) -> Result<ListPodResourcesResponse, PodResourcesError> {
    let call = async {
        let channel = proto::unix::channel(path)
            .await
            .map_err(PodResourcesError::Connect)?;
        PodResourcesListerClient::new(channel)
            .list(ListPodResourcesRequest {})
            .await
            .map(tonic::Response::into_inner)
            .map_err(PodResourcesError::List)
    };
    tokio::time::timeout(CALL_TIMEOUT, call)
        .await
        .map_err(|_| PodResourcesError::Timeout(CALL_TIMEOUT))?
}

/// The pod (namespace, name) and container whose `resource` devices
/// include every id.
pub(crate) fn holder_in(
    list: &ListPodResourcesResponse,
    resource: &str,
    ids: &[String],
) -> Option<(String, String, String)> {
    list.pod_resources.iter().find_map(|pod| {
        let holder = pod.containers.iter().find(|c| {
            c.devices.iter().any(|d| {
                d.resource_name == resource && ids.iter().all(|id| d.device_ids.contains(id))
            })
        })?;
        Some((pod.namespace.clone(), pod.name.clone(), holder.name.clone()))
    })
}

#[cfg(test)]
mod tests {
    use proto::podresources::v1::{ContainerDevices, ContainerResources, PodResources};

    use super::*;

    fn pod(ns: &str, name: &str, resource: &str, ids: &[&str]) -> PodResources {
        PodResources {
            name: name.into(),
            namespace: ns.into(),
            containers: vec![ContainerResources {
                name: "c".into(),
                devices: vec![ContainerDevices {
                    resource_name: resource.into(),
                    device_ids: ids.iter().map(ToString::to_string).collect(),
                    topology: None,
                }],
                ..ContainerResources::default()
            }],
            ..PodResources::default()
        }
    }

    #[test]
    fn the_owner_is_the_pod_whose_container_holds_every_id() {
        let list = ListPodResourcesResponse {
            pod_resources: vec![
                pod("a", "other-resource", "example.com/gpu", &["G#0"]),
                pod("a", "one", "amd.com/gpu", &["G#1"]),
                pod("b", "two", "amd.com/gpu", &["G#0", "H#0"]),
            ],
        };
        let ids = |v: &[&str]| v.iter().map(ToString::to_string).collect::<Vec<_>>();
        assert_eq!(
            holder_in(&list, "amd.com/gpu", &ids(&["G#0", "H#0"])),
            Some(("b".into(), "two".into(), "c".into()))
        );
        assert_eq!(holder_in(&list, "amd.com/gpu", &ids(&["G#9"])), None);
        assert_eq!(
            holder_in(&list, "amd.com/gpu", &ids(&["G#1"])),
            Some(("a".into(), "one".into(), "c".into()))
        );
    }

    #[test]
    fn records_are_by_id_set_and_pruned_by_liveness() {
        let owners = Owners::new(None, "amd.com/gpu");
        let p = |uid: &str| PodRef {
            namespace: "n".into(),
            name: uid.into(),
            uid: uid.into(),
        };
        owners.remember(&["B".into(), "A".into()], p("u1"), |_| true);
        assert_eq!(owners.get(&["A".into(), "B".into()]), Some(p("u1")));
        for i in 0..40 {
            owners.remember(&[format!("C{i}")], p("u2"), |uid| uid != "u1");
        }
        assert_eq!(owners.get(&["A".into(), "B".into()]), None, "u1 is gone");
        assert_eq!(owners.get(&["C39".into()]), Some(p("u2")));
        let kept = owners.record.lock().unwrap().by_ids.len();
        assert_eq!(kept, 40, "live entries are kept");
        owners.remember_hook(&["C39".into()], true);
        assert_eq!(owners.hooked(&["C39".into()]), Some(true));
        assert_eq!(owners.hooked(&["C38".into()]), None);
    }
}
