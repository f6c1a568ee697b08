//! How far the pods watch has brought its cache, so that a pod this process
//! knows of ahead of the cache (its own write, or a read from the API
//! server) can be told apart from a pod that is gone.
//!
//! A watch delivers changes in resourceVersion order, and kube-runtime's
//! reflector applies each event to the store before passing it on
//! (kube-rs/kube:kube-runtime/src/reflector/mod.rs), so once an event of
//! version `v` has been seen here, the store reflects every change up to
//! `v`. After a re-list the store is the list's state, and the list was sent
//! after the `Init` event was seen (kube-rs/kube:kube-runtime/src/watcher.rs,
//! `State::Empty`), so it holds every write that completed before that.

use std::{
    sync::{
        Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::Instant,
};

use kube::{Resource, runtime::watcher::Event};

/// What a reader may conclude from the cache it read after taking this mark.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct CacheMark {
    /// Every change with a resourceVersion up to this one is in the cache.
    pub(crate) delivered_through: u64,
    /// The cache holds a list that was requested after this instant.
    pub(crate) listed_after: Option<Instant>,
}

impl CacheMark {
    /// Whether the cache, read after this mark, would hold a pod of version
    /// `resource_version` (or a newer one) that existed at `known_at`: when
    /// it does not, the pod is gone.
    pub(crate) fn covers(&self, resource_version: Option<u64>, known_at: Instant) -> bool {
        resource_version.is_some_and(|rv| rv <= self.delivered_through)
            || self.listed_after.is_some_and(|listed| known_at < listed)
    }
}

/// The progress of one watch, updated by its event loop.
#[derive(Debug, Default)]
pub(crate) struct WatchProgress {
    delivered_through: AtomicU64,
    /// The list in progress: when its `Init` was seen, and the highest
    /// version among its objects so far.
    listing: Mutex<Option<(Instant, u64)>>,
    listed_after: Mutex<Option<Instant>>,
}

fn resource_version<K: Resource>(object: &K) -> u64 {
    object
        .meta()
        .resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

impl WatchProgress {
    /// Takes note of `event`, which the store has already applied.
    pub(crate) fn saw<K: Resource>(&self, event: &Event<K>) {
        let mut listing = self.listing.lock().unwrap_or_else(PoisonError::into_inner);
        match event {
            Event::Init => *listing = Some((Instant::now(), 0)),
            Event::InitApply(object) => {
                if let Some((_, highest)) = listing.as_mut() {
                    *highest = (*highest).max(resource_version(object));
                }
            }
            Event::InitDone => {
                if let Some((started, highest)) = listing.take() {
                    self.delivered_through.fetch_max(highest, Ordering::SeqCst);
                    *self
                        .listed_after
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner) = Some(started);
                }
            }
            Event::Apply(object) | Event::Delete(object) => {
                self.delivered_through
                    .fetch_max(resource_version(object), Ordering::SeqCst);
            }
        }
    }

    /// The mark to take *before* reading the store.
    pub(crate) fn mark(&self) -> CacheMark {
        let listed_after = *self
            .listed_after
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        CacheMark {
            delivered_through: self.delivered_through.load(Ordering::SeqCst),
            listed_after,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use k8s_openapi::api::core::v1::Pod;
    use serde_json::json;

    use super::*;

    fn pod(rv: &str) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p", "resourceVersion": rv}})).unwrap()
    }

    #[test]
    fn events_move_the_mark_and_a_list_counts_only_when_done() {
        let progress = WatchProgress::default();
        let before = Instant::now();
        progress.saw(&Event::<Pod>::Init);
        progress.saw(&Event::InitApply(pod("40")));
        assert_eq!(
            progress.mark(),
            CacheMark::default(),
            "a list in progress is not in the store yet"
        );
        progress.saw(&Event::<Pod>::InitDone);
        let mark = progress.mark();
        assert_eq!(mark.delivered_through, 40);
        assert!(mark.covers(None, before), "known before the list began");
        assert!(!mark.covers(Some(41), Instant::now() + Duration::from_secs(1)));
        progress.saw(&Event::Apply(pod("45")));
        progress.saw(&Event::Delete(pod("44")));
        assert_eq!(progress.mark().delivered_through, 45, "never goes back");
        assert!(progress.mark().covers(Some(45), Instant::now()));
    }
}
