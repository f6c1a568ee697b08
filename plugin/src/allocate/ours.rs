//! What this plugin process wrote on pods, laid over the watch cache.
//!
//! - **Recent writes**: Allocates are serialised, and the next one must not
//!   see a pod's entry that the previous one already consumed; the pod as our
//!   own patch returned it is used until the watch delivers that version.
//! - **Our CU record**: users can edit their own pods. Once this process has
//!   written a pod's `hami.io/amd-cu-allocated` and spare set, those values are
//!   what count for that pod for as long as it lives; an edit is reported and
//!   ignored. After a restart there is no record, and the annotation is
//!   judged by the occupancy checks instead.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex, PoisonError},
};

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use super::{occupancy::Distrust, reuse::CU_SPARE_KEY};
use crate::hami::CU_ALLOCATED_KEY;

/// The annotations of ours that a user's edit must not change.
const RECORDED: [&str; 2] = [CU_ALLOCATED_KEY, CU_SPARE_KEY];

fn resource_version(pod: &Pod) -> Option<u64> {
    pod.metadata.resource_version.as_deref()?.parse().ok()
}

/// Pod uid -> the recorded annotations' values as we last wrote them, and
/// the size at which entries of pods that are gone are next dropped.
#[derive(Debug, Default)]
struct Record {
    values: HashMap<String, [Option<String>; 2]>,
    prune_at: usize,
}

/// Our writes, by pod uid.
#[derive(Debug, Default)]
pub struct Ours {
    recent: Mutex<HashMap<String, Arc<Pod>>>,
    record: Mutex<Record>,
}

impl Ours {
    /// Remembers `written`, as our patch returned it.
    pub fn wrote(&self, written: Arc<Pod>) {
        if let Some(uid) = written.metadata.uid.clone() {
            lock(&self.recent).insert(uid, written);
        }
    }

    /// Remembers `written`'s CU annotations as ours (after an allocation).
    pub fn recorded(&self, written: &Pod) {
        let Some(uid) = written.uid() else { return };
        let values = RECORDED.map(|k| written.annotations().get(k).cloned());
        lock(&self.record).values.insert(uid, values);
    }

    /// `cached` with our newer writes laid over it, and our recorded values
    /// put back where a pod's annotations were edited (each such pod is
    /// returned in the second list). Called on every Allocate: it allocates
    /// nothing per unchanged pod.
    pub fn view(&self, cached: Vec<Arc<Pod>>) -> (Vec<Arc<Pod>>, Vec<Distrust>) {
        let mut recent = lock(&self.recent);
        let mut record = lock(&self.record);
        // Records of pods that are gone are dropped each time the record has
        // doubled since the last time (a uid never comes back).
        if record.values.len() >= record.prune_at {
            let live: HashSet<&str> = cached
                .iter()
                .chain(recent.values())
                .filter_map(|p| p.metadata.uid.as_deref())
                .collect();
            record.values.retain(|uid, _| live.contains(uid.as_str()));
            record.prune_at = 2 * record.values.len() + 16;
        }
        let record = &record.values;
        if recent.is_empty() && record.is_empty() {
            return (cached, Vec::new());
        }
        let mut edited = Vec::new();
        let pods: Vec<Arc<Pod>> = cached
            .iter()
            .map(|p| {
                let uid = p.metadata.uid.as_deref();
                let p = match uid.and_then(|uid| recent.get(uid)) {
                    Some(ours) if resource_version(p) < resource_version(ours) => Arc::clone(ours),
                    _ => Arc::clone(p),
                };
                match uid.and_then(|uid| record.get(uid)) {
                    Some(values) => restore(p, values, &mut edited),
                    None => p,
                }
            })
            .collect();
        // Our writes the watch has caught up with are dropped.
        recent.retain(|uid, ours| {
            !cached.iter().any(|p| {
                p.metadata.uid.as_deref() == Some(uid.as_str())
                    && resource_version(p) >= resource_version(ours)
            })
        });
        (pods, edited)
    }
}

/// `pod` with the recorded `values`; an edit is reported in `edited`.
fn restore(pod: Arc<Pod>, values: &[Option<String>; 2], edited: &mut Vec<Distrust>) -> Arc<Pod> {
    let annotations = pod.annotations();
    if RECORDED
        .iter()
        .zip(values)
        .all(|(k, v)| annotations.get(*k) == v.as_ref())
    {
        return pod;
    }
    let changed: Vec<&str> = RECORDED
        .iter()
        .zip(values)
        .filter(|(k, v)| annotations.get(**k) != v.as_ref())
        .map(|(k, _)| *k)
        .collect();
    let value = changed
        .iter()
        .map(|k| format!("{k}={:?}", annotations.get(*k)))
        .collect::<Vec<_>>()
        .join(" ");
    edited.push(Distrust {
        namespace: pod.namespace().unwrap_or_default(),
        name: pod.name_any(),
        uid: pod.uid().unwrap_or_default(),
        reason: format!(
            "{} edited after the plugin wrote it ({value}); the plugin's own record counts",
            changed.join(" and ")
        ),
        value,
    });
    let mut fixed = (*pod).clone();
    let map = fixed.annotations_mut();
    for (k, v) in RECORDED.iter().zip(values) {
        match v {
            Some(v) => map.insert((*k).to_owned(), v.clone()),
            None => map.remove(*k),
        };
    }
    Arc::new(fixed)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(rv: &str, cus: Option<&str>) -> Pod {
        let mut annotations = json!({});
        if let Some(c) = cus {
            annotations[CU_ALLOCATED_KEY] = json!(c);
        }
        serde_json::from_value(json!({"metadata": {
            "name": "p", "namespace": "ns", "uid": "u-1", "resourceVersion": rv,
            "annotations": annotations}}))
        .unwrap()
    }

    #[test]
    fn our_newer_write_wins_until_the_cache_catches_up() {
        let ours = Ours::default();
        ours.wrote(Arc::new(pod("7", Some(r#"{"A":"0-9"}"#))));
        let (view, _) = ours.view(vec![Arc::new(pod("5", None))]);
        assert_eq!(view[0].resource_version().as_deref(), Some("7"));
        let (view, _) = ours.view(vec![Arc::new(pod("8", None))]);
        assert_eq!(view[0].resource_version().as_deref(), Some("8"));
    }

    #[test]
    fn an_edit_of_our_record_is_reported_and_undone() {
        let ours = Ours::default();
        let written = pod("7", Some(r#"{"A":"0-9"}"#));
        ours.recorded(&written);
        let (view, edited) = ours.view(vec![Arc::new(written.clone())]);
        assert!(edited.is_empty());
        assert_eq!(view[0].annotations()[CU_ALLOCATED_KEY], r#"{"A":"0-9"}"#);
        let (view, edited) = ours.view(vec![Arc::new(pod("9", None))]);
        assert_eq!(view[0].annotations()[CU_ALLOCATED_KEY], r#"{"A":"0-9"}"#);
        assert_eq!(edited.len(), 1);
        assert!(
            edited[0].reason.contains(CU_ALLOCATED_KEY),
            "{:?}",
            edited[0]
        );
    }

    #[test]
    fn unchanged_pods_are_shared_not_copied() {
        let ours = Ours::default();
        let written = pod("7", Some(r#"{"A":"0-9"}"#));
        ours.recorded(&written);
        let cached = Arc::new(written);
        let (view, edited) = ours.view(vec![Arc::clone(&cached)]);
        assert!(edited.is_empty());
        assert!(Arc::ptr_eq(&view[0], &cached));
    }

    #[test]
    fn records_of_pods_that_are_gone_are_dropped() {
        let ours = Ours::default();
        ours.recorded(&pod("7", Some(r#"{"A":"0-9"}"#)));
        let (_, _) = ours.view(Vec::new());
        assert!(lock(&ours.record).values.is_empty());
    }
}
