//! What this plugin process knows of pods ahead of the watch cache, laid
//! over it.
//!
//! - **Pods ahead of the cache**: a pod as our own patch returned it, or as
//!   a read from the API server returned it, counts from that moment on for
//!   every later Allocate and PreStartContainer, whether the cache holds an
//!   older version of the pod or none at all (the watch lags), until the
//!   watch has delivered a version at least as new (the cache's copy, which
//!   includes our write, takes over) or the pod is gone: the watch has
//!   delivered changes past it, or the cache was listed after it, and the
//!   pod is not there ([`CacheMark::covers`]). There is no time limit: a
//!   grant must not stop counting because the watch is slow or broken.
//! - **Our CU record**: users can edit their own pods. Once this process has
//!   written a pod's `hami.io/amd-cu-allocated` and spare set, those values are
//!   what count for that pod for as long as it lives; an edit is reported and
//!   ignored. After a restart there is no record, and the annotation is
//!   judged by the occupancy checks instead.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex, PoisonError},
    time::Instant,
};

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use super::{occupancy::Distrust, reuse::CU_SPARE_KEY};
use crate::{hami::CU_ALLOCATED_KEY, kube::CacheMark};

/// The annotations of ours that a user's edit must not change.
const RECORDED: [&str; 2] = [CU_ALLOCATED_KEY, CU_SPARE_KEY];

/// Past this many pods known ahead of the cache (a watch that stopped
/// delivering while pods come and go), Allocate lists the node's pods to
/// forget those that are gone; what is left is at most the live pods.
pub(crate) const AHEAD_LIMIT: usize = 512;

fn resource_version(pod: &Pod) -> Option<u64> {
    pod.metadata.resource_version.as_deref()?.parse().ok()
}

/// Pod uid -> our record of the pod, and the size at which entries of pods
/// that are gone are next dropped.
#[derive(Debug, Default)]
struct Record {
    values: HashMap<String, Recorded>,
    prune_at: usize,
}

/// The recorded annotations' values as we last wrote them, and the
/// resourceVersion of the last version of the pod seen carrying them: that
/// version (whichever copy of it) has nothing to put back. A version's
/// contents never change, and a new record (our next write) starts afresh.
#[derive(Debug)]
struct Recorded {
    values: [Option<String>; 2],
    clean_at: Option<String>,
}

/// A version of a pod newer than the cache's (or one it does not hold), and
/// when this process got it.
#[derive(Debug)]
struct Ahead {
    known_at: Instant,
    pod: Arc<Pod>,
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

    /// `pod` from the cache with its recorded values put back (see
    /// [`restore`]); a version of it seen carrying them before (same uid and
    /// resourceVersion) is passed on without reading its annotations.
    fn seen(&mut self, pod: Arc<Pod>, edited: &mut Vec<Distrust>) -> Arc<Pod> {
        let meta = &pod.metadata;
        let Some(recorded) = meta.uid.as_deref().and_then(|u| self.values.get_mut(u)) else {
            return pod;
        };
        let version = meta.resource_version.as_deref();
        if version.is_some() && recorded.clean_at.as_deref() == version {
            return pod;
        }
        let seen = restore(Arc::clone(&pod), &recorded.values, edited);
        if Arc::ptr_eq(&seen, &pod) {
            recorded.clean_at = version.map(str::to_owned);
        }
        seen
    }
}

/// What we know ahead of the cache, and our CU records, by pod uid.
#[derive(Debug, Default)]
pub(crate) struct Ours {
    ahead: Mutex<HashMap<String, Ahead>>,
    record: Mutex<Record>,
}

impl Ours {
    /// Remembers `pod`, as our patch or a read from the API server returned
    /// it, unless a newer version is known already.
    pub(crate) fn learned(&self, pod: Arc<Pod>) {
        let Some(uid) = pod.metadata.uid.clone() else {
            return;
        };
        let mut ahead = lock(&self.ahead);
        if let Some(known) = ahead.get(&uid)
            && resource_version(&known.pod) > resource_version(&pod)
        {
            return;
        }
        let known_at = Instant::now();
        ahead.insert(uid, Ahead { known_at, pod });
    }

    /// How many pods are known ahead of the cache.
    pub(crate) fn ahead_len(&self) -> usize {
        lock(&self.ahead).len()
    }

    /// Forgets the pods known ahead of the cache that `listed` (a LIST sent
    /// after `listed_after`) does not hold and that were known before it:
    /// they are gone.
    pub(crate) fn forget_gone(&self, listed: &[Arc<Pod>], listed_after: Instant) {
        let live: HashSet<&str> = listed
            .iter()
            .filter_map(|p| p.metadata.uid.as_deref())
            .collect();
        lock(&self.ahead)
            .retain(|uid, a| live.contains(uid.as_str()) || a.known_at >= listed_after);
    }

    /// Remembers `written`'s CU annotations as ours (after an allocation).
    pub(crate) fn recorded(&self, written: &Pod) {
        let Some(uid) = written.uid() else { return };
        let values = RECORDED.map(|k| written.annotations().get(k).cloned());
        let recorded = Recorded {
            values,
            clean_at: None,
        };
        lock(&self.record).values.insert(uid, recorded);
    }

    /// Runs `f` with a test of whether this process wrote a pod's CU record.
    pub(crate) fn with_recorded<R>(&self, f: impl FnOnce(&dyn Fn(&Pod) -> bool) -> R) -> R {
        let record = lock(&self.record);
        let recorded = |p: &Pod| {
            p.metadata
                .uid
                .as_ref()
                .is_some_and(|u| record.values.contains_key(u))
        };
        f(&recorded)
    }

    /// The pod `namespace/name` (of `uid`, when given) as known ahead of the
    /// cache, if it is.
    pub(crate) fn ahead_of_cache(
        &self,
        namespace: &str,
        name: &str,
        uid: Option<&str>,
    ) -> Option<Arc<Pod>> {
        lock(&self.ahead)
            .iter()
            .find(|(_, a)| crate::vram::is_pod(&a.pod, namespace, name, uid))
            .map(|(_, a)| Arc::clone(&a.pod))
    }

    /// `pods` (read from the API server, fresher than anything we know)
    /// with our recorded values put back where they were edited, as in
    /// [`Self::view`]; nothing known ahead of the cache is laid over them.
    pub(crate) fn with_records(&self, pods: Vec<Arc<Pod>>) -> (Vec<Arc<Pod>>, Vec<Distrust>) {
        let record = lock(&self.record);
        let mut edited = Vec::new();
        let pods = pods
            .iter()
            .map(|p| restored(p, &record.values, &mut edited))
            .collect();
        (pods, edited)
    }

    /// `cached` (read after `mark` was taken) with the pods we know ahead of
    /// it laid over it or added to it, and our recorded values put back
    /// where a pod's annotations were edited (each such pod is returned in
    /// the second list). Called on every Allocate: a pod version (uid and
    /// resourceVersion) seen carrying our record before is passed on
    /// without its annotations being read.
    pub(crate) fn view(
        &self,
        mark: CacheMark,
        cached: Vec<Arc<Pod>>,
    ) -> (Vec<Arc<Pod>>, Vec<Distrust>) {
        let mut ahead = lock(&self.ahead);
        let mut record = lock(&self.record);
        record.prune(cached.iter().chain(ahead.values().map(|a| &a.pod)));
        if ahead.is_empty() && record.values.is_empty() {
            return (cached, Vec::new());
        }
        let (mut edited, mut settled) = (Vec::new(), Vec::new());
        // The uids known ahead of the cache that it holds (any version).
        let mut in_cache = HashSet::new();
        let mut pods = Vec::with_capacity(cached.len() + ahead.len());
        for p in cached {
            let uid = p.metadata.uid.as_deref();
            if let Some((uid, ours)) = uid.and_then(|u| ahead.get_key_value(u)) {
                in_cache.insert(uid.as_str());
                if resource_version(&p) < resource_version(&ours.pod) {
                    pods.push(restored(&ours.pod, &record.values, &mut edited));
                    continue;
                }
                settled.push(uid.clone());
            }
            pods.push(record.seen(p, &mut edited));
        }
        let uncached = ahead
            .iter()
            .filter(|(uid, _)| !in_cache.contains(uid.as_str()));
        let gone = add_uncached(uncached, mark, &record.values, &mut pods, &mut edited);
        for uid in settled.iter().chain(&gone) {
            ahead.remove(uid);
        }
        (pods, edited)
    }
}

/// Adds to `pods` each pod known ahead of a cache that does not hold it,
/// unless the cache would hold it by now (see [`CacheMark::covers`]); the
/// uids of those, which are gone, are returned.
fn add_uncached<'a>(
    uncached: impl Iterator<Item = (&'a String, &'a Ahead)>,
    mark: CacheMark,
    record: &HashMap<String, Recorded>,
    pods: &mut Vec<Arc<Pod>>,
    edited: &mut Vec<Distrust>,
) -> Vec<String> {
    let mut gone = Vec::new();
    for (uid, ours) in uncached {
        if mark.covers(resource_version(&ours.pod), ours.known_at) {
            gone.push(uid.clone());
        } else {
            pods.push(restored(&ours.pod, record, edited));
        }
    }
    gone
}

/// `pod` with its recorded values, if it has any (see [`restore`]).
fn restored(
    pod: &Arc<Pod>,
    record: &HashMap<String, Recorded>,
    edited: &mut Vec<Distrust>,
) -> Arc<Pod> {
    match pod.metadata.uid.as_deref().and_then(|uid| record.get(uid)) {
        Some(recorded) => restore(Arc::clone(pod), &recorded.values, edited),
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
mod tests;
