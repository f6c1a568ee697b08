//! The untrusted claims already reported, so that each is reported once.
//! Users write the values: an entry is a fixed-size hash of the value (never
//! the value), and the set is bounded by the live pods, so that editing a
//! pod's annotation again and again (or creating and deleting pods) cannot
//! grow the plugin's memory.

use std::{
    collections::HashSet,
    hash::{DefaultHasher, Hash, Hasher},
    sync::Arc,
};

use k8s_openapi::api::core::v1::Pod;

/// Whatever the pods, the set is cleared past this many entries.
pub(crate) const MAX_REPORTED: usize = 4096;

/// (pod uid, hash of the value) of the claims reported, and the size at which
/// entries of pods that are gone are next dropped.
#[derive(Debug, Default)]
pub(crate) struct Reported {
    seen: HashSet<(String, u64)>,
    prune_at: usize,
}

impl Reported {
    /// True the first time `value` of pod `uid` is seen. Past a doubling of
    /// the set since the last time, entries of pods not in `live` are dropped
    /// first; past [`MAX_REPORTED`] all are (a claim is then reported again).
    pub(crate) fn first_time(&mut self, uid: &str, value: &str, live: &[Arc<Pod>]) -> bool {
        let mut hasher = DefaultHasher::new();
        value.hash(&mut hasher);
        let key = (uid.to_owned(), hasher.finish());
        if self.seen.contains(&key) {
            return false;
        }
        if self.seen.len() >= self.prune_at {
            let uids: HashSet<&str> = live
                .iter()
                .filter_map(|p| p.metadata.uid.as_deref())
                .collect();
            self.seen.retain(|(uid, _)| uids.contains(uid.as_str()));
            if self.seen.len() >= MAX_REPORTED {
                self.seen.clear();
            }
            self.prune_at = 2 * self.seen.len() + 16;
        }
        self.seen.insert(key)
    }

    /// Number of entries.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.seen.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str) -> Arc<Pod> {
        let value = serde_json::json!({"metadata": {"name": uid, "uid": uid}});
        Arc::new(serde_json::from_value(value).unwrap())
    }

    #[test]
    fn each_value_once_and_bounded_by_the_live_pods() {
        let live = [pod("a")];
        let mut reported = Reported::default();
        assert!(reported.first_time("a", "x", &live));
        assert!(!reported.first_time("a", "x", &live), "reported once");
        assert!(reported.first_time("a", "y", &live), "another value");
        // A pod that edits its value forever, while another came and went.
        assert!(reported.first_time("gone", "x", &live));
        for i in 0..100_000 {
            reported.first_time("a", &i.to_string(), &live);
        }
        assert!(reported.len() <= MAX_REPORTED, "{}", reported.len());
        assert!(
            reported.first_time("gone", "x", &live),
            "the gone pod was pruned"
        );
    }
}
