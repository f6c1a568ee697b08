//! Tests of [`super`]: what is laid over the cache, and until when.
use std::time::Duration;

use serde_json::json;

use super::*;

fn pod(rv: &str, cus: Option<&str>) -> Pod {
    named("p", "u-1", rv, cus)
}

fn named(name: &str, uid: &str, rv: &str, cus: Option<&str>) -> Pod {
    let mut annotations = json!({});
    if let Some(c) = cus {
        annotations[CU_ALLOCATED_KEY] = json!(c);
    }
    serde_json::from_value(json!({"metadata": {
        "name": name, "namespace": "ns", "uid": uid, "resourceVersion": rv,
        "annotations": annotations}}))
    .unwrap()
}

/// A cache mark that has seen nothing.
fn lagging() -> CacheMark {
    CacheMark::default()
}

#[test]
fn our_newer_write_wins_until_the_cache_catches_up() {
    let ours = Ours::default();
    ours.learned(Arc::new(pod("7", Some(r#"{"A":"0-9"}"#))));
    let (view, _) = ours.view(lagging(), vec![Arc::new(pod("5", None))]);
    assert_eq!(view.len(), 1);
    assert_eq!(view[0].resource_version().as_deref(), Some("7"));
    let (view, _) = ours.view(lagging(), vec![Arc::new(pod("8", None))]);
    assert_eq!(view[0].resource_version().as_deref(), Some("8"));
    assert!(lock(&ours.ahead).is_empty());
}

#[test]
fn a_pod_the_cache_does_not_hold_yet_counts_until_the_watch_passes_it() {
    let ours = Ours::default();
    ours.learned(Arc::new(named("a", "u-a", "7", Some(r#"{"A":"0-9"}"#))));
    let other = Arc::new(named("b", "u-b", "3", None));
    for _ in 0..3 {
        let (view, _) = ours.view(lagging(), vec![Arc::clone(&other)]);
        let names: Vec<String> = view.iter().map(|p| p.name_any()).collect();
        assert_eq!(names, ["b", "a"], "the uncached pod joins the view");
    }
    let behind = CacheMark {
        delivered_through: 6,
        listed_after: None,
    };
    assert_eq!(ours.view(behind, Vec::new()).0.len(), 1, "not there yet");
    let passed = CacheMark {
        delivered_through: 9,
        listed_after: None,
    };
    let (view, _) = ours.view(passed, Vec::new());
    assert!(
        view.is_empty(),
        "the watch passed version 7 without it: gone"
    );
    assert!(lock(&ours.ahead).is_empty());
}

#[test]
fn a_list_made_after_we_knew_the_pod_settles_it() {
    let ours = Ours::default();
    ours.learned(Arc::new(pod("7", None)));
    let listed_before = CacheMark {
        delivered_through: 0,
        listed_after: Some(Instant::now() - Duration::from_secs(1)),
    };
    assert_eq!(ours.view(listed_before, Vec::new()).0.len(), 1);
    let listed_after = CacheMark {
        delivered_through: 0,
        listed_after: Some(Instant::now() + Duration::from_secs(1)),
    };
    assert!(ours.view(listed_after, Vec::new()).0.is_empty());
    assert!(lock(&ours.ahead).is_empty());
}

#[test]
fn a_list_forgets_only_the_pods_it_proves_gone() {
    let ours = Ours::default();
    ours.learned(Arc::new(named("a", "u-a", "7", None)));
    ours.learned(Arc::new(named("b", "u-b", "8", None)));
    let listed_after = Instant::now();
    ours.learned(Arc::new(named("c", "u-c", "9", None)));
    ours.forget_gone(&[Arc::new(named("b", "u-b", "8", None))], listed_after);
    let left: HashSet<String> = lock(&ours.ahead).keys().cloned().collect();
    let want: HashSet<String> = ["u-b".to_owned(), "u-c".to_owned()].into();
    assert_eq!(left, want, "a is gone; c was known after the list was sent");
    assert_eq!(ours.ahead_len(), 2);
}

#[test]
fn records_are_put_back_on_a_listed_view() {
    let ours = Ours::default();
    ours.recorded(&pod("7", Some(r#"{"A":"0-9"}"#)));
    let (pods, edited) = ours.with_records(vec![Arc::new(pod("9", Some(r#"{"A":"0-99"}"#)))]);
    assert_eq!(pods[0].annotations()[CU_ALLOCATED_KEY], r#"{"A":"0-9"}"#);
    assert_eq!(edited.len(), 1);
    assert!(ours.with_recorded(|is_ours| is_ours(&pod("1", None))));
    let other = named("q", "u-2", "1", None);
    assert!(!ours.with_recorded(|is_ours| is_ours(&other)));
}

#[test]
fn an_older_read_never_replaces_a_newer_write() {
    let ours = Ours::default();
    ours.learned(Arc::new(pod("9", Some(r#"{"A":"0-9"}"#))));
    ours.learned(Arc::new(pod("8", None)));
    let found = ours.ahead_of_cache("ns", "p", Some("u-1")).unwrap();
    assert_eq!(found.resource_version().as_deref(), Some("9"));
    assert!(ours.ahead_of_cache("ns", "p", Some("u-2")).is_none());
    assert!(ours.ahead_of_cache("other", "p", None).is_none());
}

#[test]
fn an_edit_of_our_record_is_reported_and_undone() {
    let ours = Ours::default();
    let written = pod("7", Some(r#"{"A":"0-9"}"#));
    ours.recorded(&written);
    let (view, edited) = ours.view(lagging(), vec![Arc::new(written.clone())]);
    assert!(edited.is_empty());
    assert_eq!(view[0].annotations()[CU_ALLOCATED_KEY], r#"{"A":"0-9"}"#);
    let (view, edited) = ours.view(lagging(), vec![Arc::new(pod("9", None))]);
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
        let (view, edited) = ours.view(lagging(), vec![Arc::clone(&cached)]);
        assert!(edited.is_empty(), "{edited:?}");
        assert!(Arc::ptr_eq(&view[0], &cached), "shared, not copied");
    }
    ours.learned(Arc::new(pod("7", Some(r#"{"A":"0-9"}"#))));
    let (view, _) = ours.view(lagging(), vec![Arc::clone(&cached)]);
    assert_eq!(
        view[0].resource_version().as_deref(),
        Some("7"),
        "our newer write wins over the copy seen clean"
    );
    let (view, edited) = ours.view(lagging(), vec![Arc::new(pod("8", Some(r#"{"A":"0-99"}"#)))]);
    assert_eq!(edited.len(), 1, "the edit of a new version is caught");
    assert_eq!(view[0].annotations()[CU_ALLOCATED_KEY], r#"{"A":"0-9"}"#);
    assert!(lock(&ours.ahead).is_empty(), "the watch caught up at 8");
}

#[test]
fn records_of_pods_that_are_gone_are_dropped() {
    let ours = Ours::default();
    ours.recorded(&pod("7", Some(r#"{"A":"0-9"}"#)));
    let (_, _) = ours.view(lagging(), Vec::new());
    assert!(lock(&ours.record).values.is_empty());
}

fn clean_at(ours: &Ours, uid: &str) -> Option<String> {
    lock(&ours.record).values[uid].clean_at.clone()
}

#[test]
fn a_version_seen_clean_is_found_by_uid_and_resource_version() {
    let ours = Ours::default();
    let written = pod("5", Some(r#"{"A":"0-9"}"#));
    ours.recorded(&written);
    let (_, edited) = ours.view(lagging(), vec![Arc::new(written.clone())]);
    assert!(edited.is_empty());
    assert_eq!(clean_at(&ours, "u-1").as_deref(), Some("5"));
    // The API server never serves two contents under one resourceVersion;
    // a copy that did shows that the annotations are not read again.
    let odd_copy = Arc::new(pod("5", Some(r#"{"A":"0-99"}"#)));
    let (view, edited) = ours.view(lagging(), vec![Arc::clone(&odd_copy)]);
    assert!(edited.is_empty(), "not read: {edited:?}");
    assert!(Arc::ptr_eq(&view[0], &odd_copy), "passed on as it is");
    // A new version is read, and its edit caught.
    let (view, edited) = ours.view(lagging(), vec![Arc::new(pod("6", Some(r#"{"A":"0-99"}"#)))]);
    assert_eq!(edited.len(), 1);
    assert_eq!(view[0].annotations()[CU_ALLOCATED_KEY], r#"{"A":"0-9"}"#);
    assert_eq!(
        clean_at(&ours, "u-1").as_deref(),
        Some("5"),
        "6 was not clean"
    );
    // Our next write is a new record: nothing is clean for it yet.
    ours.recorded(&pod("7", Some(r#"{"A":"0-19"}"#)));
    assert_eq!(clean_at(&ours, "u-1"), None);
}

#[test]
fn a_pod_without_a_resource_version_is_read_every_time() {
    let ours = Ours::default();
    ours.recorded(&pod("5", Some(r#"{"A":"0-9"}"#)));
    let mut unversioned = pod("5", Some(r#"{"A":"0-9"}"#));
    unversioned.metadata.resource_version = None;
    let (_, edited) = ours.view(lagging(), vec![Arc::new(unversioned.clone())]);
    assert!(edited.is_empty());
    assert_eq!(clean_at(&ours, "u-1"), None, "nothing names its version");
    unversioned
        .annotations_mut()
        .insert(CU_ALLOCATED_KEY.into(), r#"{"A":"0-99"}"#.into());
    let (view, edited) = ours.view(lagging(), vec![Arc::new(unversioned)]);
    assert_eq!(edited.len(), 1, "read again, the edit caught");
    assert_eq!(view[0].annotations()[CU_ALLOCATED_KEY], r#"{"A":"0-9"}"#);
}
