//! What was judged about each pod version, found again by the version's
//! name on the API server: the pod's `metadata.uid` and
//! `metadata.resourceVersion`. The API server gives every change of a pod
//! (spec, status, annotations) a new resourceVersion, so one (uid,
//! resourceVersion) always names the same contents, whichever copy of it
//! (the watch cache's, our patch's answer, a read) is at hand.
//!
//! A pod without either (a unit test's, a hand-made one) has no name for
//! its version: nothing is kept for it and it is judged every time.
//! Entries live while their pod is in the view: each pass over the view
//! drops those of the pods it did not look up ([`ByVersion::end_pass`]).

use std::collections::HashMap;

use k8s_openapi::api::core::v1::Pod;

/// The (uid, resourceVersion) of `pod`, if it has both.
pub(crate) fn version_of(pod: &Pod) -> Option<(&str, &str)> {
    let meta = &pod.metadata;
    Some((meta.uid.as_deref()?, meta.resource_version.as_deref()?))
}

/// One value per pod version, for the pods of the current view. One entry
/// per uid: a new version of a pod replaces the old one's.
#[derive(Debug)]
pub(crate) struct ByVersion<T> {
    by_uid: HashMap<String, Kept<T>>,
    /// The number of the current pass; an entry holds the last in which it
    /// was looked up or stored.
    pass: u64,
}

#[derive(Debug)]
struct Kept<T> {
    resource_version: String,
    pass: u64,
    value: T,
}

impl<T> Default for ByVersion<T> {
    fn default() -> Self {
        Self {
            by_uid: HashMap::new(),
            pass: 0,
        }
    }
}

impl<T> ByVersion<T> {
    /// The value kept for `pod`'s version, if any; it is kept past this pass.
    pub(crate) fn get(&mut self, pod: &Pod) -> Option<&T> {
        let (uid, version) = version_of(pod)?;
        let kept = self.by_uid.get_mut(uid)?;
        if kept.resource_version != version {
            return None;
        }
        kept.pass = self.pass;
        Some(&kept.value)
    }

    /// Keeps `value` for `pod`'s version (for none without a uid and a
    /// resourceVersion), in place of what was kept for its uid.
    pub(crate) fn insert(&mut self, pod: &Pod, value: T) {
        let Some((uid, version)) = version_of(pod) else {
            return;
        };
        let pass = self.pass;
        match self.by_uid.get_mut(uid) {
            Some(kept) => {
                version.clone_into(&mut kept.resource_version);
                kept.pass = pass;
                kept.value = value;
            }
            None => {
                let resource_version = version.to_owned();
                let kept = Kept {
                    resource_version,
                    pass,
                    value,
                };
                self.by_uid.insert(uid.to_owned(), kept);
            }
        }
    }

    /// Ends a pass over the view: drops the entries that were neither
    /// looked up nor stored since the last pass ended (their pods are gone
    /// from the view, or have a new version that was not kept).
    pub(crate) fn end_pass(&mut self) {
        let pass = self.pass;
        self.by_uid.retain(|_, kept| kept.pass == pass);
        self.pass = pass.wrapping_add(1);
    }

    /// Drops every entry.
    pub(crate) fn clear(&mut self) {
        self.by_uid.clear();
    }

    /// Number of pod versions kept.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.by_uid.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: Option<&str>, rv: Option<&str>) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.uid = uid.map(str::to_owned);
        pod.metadata.resource_version = rv.map(str::to_owned);
        pod
    }

    #[test]
    fn a_version_is_found_by_uid_and_resource_version_in_any_copy() {
        let mut kept = ByVersion::default();
        kept.insert(&pod(Some("u"), Some("5")), 1);
        assert_eq!(kept.get(&pod(Some("u"), Some("5"))), Some(&1), "a copy");
        assert_eq!(kept.get(&pod(Some("u"), Some("6"))), None, "a new version");
        assert_eq!(kept.get(&pod(Some("v"), Some("5"))), None, "another pod");
        kept.insert(&pod(Some("u"), Some("6")), 2);
        assert_eq!(kept.len(), 1, "the new version replaces the old one");
        assert_eq!(kept.get(&pod(Some("u"), Some("5"))), None);
        assert_eq!(kept.get(&pod(Some("u"), Some("6"))), Some(&2));
    }

    #[test]
    fn a_pod_without_uid_or_resource_version_is_never_kept() {
        let mut kept = ByVersion::default();
        for unnamed in [pod(None, Some("5")), pod(Some("u"), None), pod(None, None)] {
            kept.insert(&unnamed, 1);
            assert_eq!(kept.get(&unnamed), None);
        }
        assert_eq!(kept.len(), 0);
    }

    #[test]
    fn a_pass_drops_the_entries_of_pods_it_did_not_look_up() {
        let mut kept = ByVersion::default();
        let (a, b) = (pod(Some("a"), Some("1")), pod(Some("b"), Some("1")));
        kept.insert(&a, 1);
        kept.insert(&b, 2);
        kept.end_pass();
        assert_eq!(kept.len(), 2, "both stored in that pass");
        assert!(kept.get(&a).is_some());
        kept.end_pass();
        assert_eq!(kept.len(), 1, "b is gone from the view");
        assert_eq!(kept.get(&b), None);
        kept.end_pass();
        assert_eq!(kept.len(), 0, "so is a");
    }
}
