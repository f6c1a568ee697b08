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
    hash::{Hash, Hasher},
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use super::{occupancy::Distrust, reuse::CU_SPARE_KEY};
use crate::hami::CU_ALLOCATED_KEY;

/// The annotations of ours that a user's edit must not change.
const RECORDED: [&str; 2] = [CU_ALLOCATED_KEY, CU_SPARE_KEY];

/// How long a write of ours is laid over a cache that has not delivered it.
const RECENT_FOR: Duration = Duration::from_secs(300);

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

/// A cached pod version (by address) that needed neither our overlay nor
/// our record last time. Its uid's hash is kept inline so that our next
/// write to it is noticed without reading the pod; the `Arc` is held so that
/// the address is not reused.
#[derive(Debug)]
struct Clean {
    address: usize,
    uid_hash: u64,
    _held: Arc<Pod>,
}

impl Record {
    /// Drops the records of pods not in `live` each time the record has
    /// doubled since the last time (a uid never comes back).
    fn prune<'a>(&mut self, live: impl Iterator<Item = &'a Arc<Pod>>) {
        if self.values.len() < self.prune_at {
            return;
        }
        let live: HashSet<&str> = live.filter_map(|p| p.metadata.uid.as_deref()).collect();
        self.values.retain(|uid, _| live.contains(uid.as_str()));
        self.prune_at = 2 * self.values.len() + 16;
    }
}

/// Our writes, by pod uid.
#[derive(Debug)]
pub struct Ours {
    /// Pod uid -> our last write to it, and when.
    recent: Mutex<HashMap<String, (Instant, Arc<Pod>)>>,
    record: Mutex<Record>,
    /// Sorted by address. A pod version stays clean: the record of a uid
    /// changes only when we write that pod, which makes a new version.
    clean: Mutex<Vec<Clean>>,
    recent_for: Duration,
}

impl Default for Ours {
    fn default() -> Self {
        Self::keeping_writes_for(RECENT_FOR)
    }
}

fn uid_hash(uid: &str) -> u64 {
    let mut hasher = std::hash::DefaultHasher::new();
    uid.hash(&mut hasher);
    hasher.finish()
}

impl Ours {
    /// Ours, laying a write over a cache that has not delivered it for at
    /// most `recent_for`.
    pub fn keeping_writes_for(recent_for: Duration) -> Self {
        Self {
            recent: Mutex::default(),
            record: Mutex::default(),
            clean: Mutex::default(),
            recent_for,
        }
    }

    /// Remembers `written`, as our patch returned it.
    pub fn wrote(&self, written: Arc<Pod>) {
        if let Some(uid) = written.metadata.uid.clone() {
            lock(&self.recent).insert(uid, (Instant::now(), written));
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
    /// returned in the second list). Called on every Allocate: a pod version
    /// seen clean before is passed on without being read.
    pub fn view(&self, cached: Vec<Arc<Pod>>) -> (Vec<Arc<Pod>>, Vec<Distrust>) {
        let mut recent = lock(&self.recent);
        let mut record = lock(&self.record);
        record.prune(cached.iter().chain(recent.values().map(|(_, p)| p)));
        if recent.is_empty() && record.values.is_empty() {
            return (cached, Vec::new());
        }
        let ours: Vec<(u64, &str, &Arc<Pod>)> = recent
            .iter()
            .map(|(uid, (_, pod))| (uid_hash(uid), uid.as_str(), pod))
            .collect();
        let mut clean = lock(&self.clean);
        let mut earlier: Vec<(usize, Option<Clean>)> = std::mem::take(&mut *clean)
            .into_iter()
            .map(|c| (c.address, Some(c)))
            .collect();
        let (mut edited, mut caught_up) = (Vec::new(), Vec::new());
        let mut pods = Vec::with_capacity(cached.len());
        for p in cached {
            let address = Arc::as_ptr(&p).addr();
            let known = earlier
                .binary_search_by_key(&address, |(a, _)| *a)
                .ok()
                .and_then(|i| earlier[i].1.take());
            let hash = known.as_ref().map(|c| c.uid_hash);
            let hash = hash.or_else(|| p.metadata.uid.as_deref().map(uid_hash));
            let newer = ours
                .iter()
                .find(|(h, uid, _)| Some(*h) == hash && p.metadata.uid.as_deref() == Some(*uid));
            if let Some((_, uid, ours)) = newer {
                if resource_version(&p) >= resource_version(ours) {
                    caught_up.push((*uid).to_owned());
                } else {
                    pods.push(restored(ours, &record.values, &mut edited));
                    continue;
                }
            }
            if let Some(known) = known {
                clean.push(known);
                pods.push(p);
                continue;
            }
            let seen = restored(&p, &record.values, &mut edited);
            if let (true, Some(uid_hash)) = (Arc::ptr_eq(&seen, &p), hash) {
                clean.push(Clean {
                    address,
                    uid_hash,
                    _held: p,
                });
            }
            pods.push(seen);
        }
        clean.sort_unstable_by_key(|c| c.address);
        // Our writes the watch has caught up with are dropped, and so are
        // those it never delivered in `recent_for` (the pod was deleted first).
        let keep = self.recent_for;
        recent.retain(|uid, (at, _)| !caught_up.contains(uid) && at.elapsed() < keep);
        (pods, edited)
    }
}

/// `pod` with its recorded values, if it has any (see [`restore`]).
fn restored(
    pod: &Arc<Pod>,
    record: &HashMap<String, [Option<String>; 2]>,
    edited: &mut Vec<Distrust>,
) -> Arc<Pod> {
    match pod.metadata.uid.as_deref().and_then(|uid| record.get(uid)) {
        Some(values) => restore(Arc::clone(pod), values, edited),
        None => Arc::clone(pod),
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
    fn a_pod_seen_clean_still_gets_our_newer_write_and_its_edits_are_caught() {
        let ours = Ours::default();
        let first = pod("5", Some(r#"{"A":"0-9"}"#));
        ours.recorded(&first);
        let cached = Arc::new(first);
        for _ in 0..2 {
            let (view, edited) = ours.view(vec![Arc::clone(&cached)]);
            assert!(edited.is_empty(), "{edited:?}");
            assert!(Arc::ptr_eq(&view[0], &cached), "shared, not copied");
        }
        ours.wrote(Arc::new(pod("7", Some(r#"{"A":"0-9"}"#))));
        let (view, _) = ours.view(vec![Arc::clone(&cached)]);
        assert_eq!(
            view[0].resource_version().as_deref(),
            Some("7"),
            "our newer write wins over the copy seen clean"
        );
        let (view, edited) = ours.view(vec![Arc::new(pod("8", Some(r#"{"A":"0-99"}"#)))]);
        assert_eq!(edited.len(), 1, "the edit of a new version is caught");
        assert_eq!(view[0].annotations()[CU_ALLOCATED_KEY], r#"{"A":"0-9"}"#);
        assert!(lock(&ours.recent).is_empty(), "the watch caught up at 8");
    }

    #[test]
    fn a_write_the_watch_never_delivers_is_dropped_in_time() {
        let ours = Ours::keeping_writes_for(Duration::ZERO);
        ours.wrote(Arc::new(pod("7", Some(r#"{"A":"0-9"}"#))));
        let (view, _) = ours.view(Vec::new());
        assert!(
            view.is_empty(),
            "a pod the cache does not hold is not added"
        );
        assert!(lock(&ours.recent).is_empty());
        let ours = Ours::default();
        ours.wrote(Arc::new(pod("7", None)));
        ours.view(Vec::new());
        assert_eq!(lock(&ours.recent).len(), 1, "kept while the watch may lag");
    }

    #[test]
    fn records_of_pods_that_are_gone_are_dropped() {
        let ours = Ours::default();
        ours.recorded(&pod("7", Some(r#"{"A":"0-9"}"#)));
        let (_, _) = ours.view(Vec::new());
        assert!(lock(&ours.record).values.is_empty());
    }
}
