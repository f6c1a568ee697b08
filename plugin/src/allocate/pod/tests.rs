use super::*;

#[test]
fn lock_values() {
    assert_eq!(parse_lock("2026-08-21T06:20:39Z"), Ok(LockOwner::Legacy));
    assert_eq!(
        parse_lock("2026-08-21T06:20:39Z,default,rocm-job-0"),
        Ok(LockOwner::Pod {
            namespace: "default".into(),
            name: "rocm-job-0".into()
        })
    );
    assert!(
        parse_lock("2026-08-21T06:20:39Z,default")
            .unwrap_err()
            .to_string()
            .contains("mutex.lock")
    );
    assert!(parse_lock("t,,x").is_err());
}

const NODE: &str = "n1";

/// A pod HAMi filtered for one container of one device (entry `ids`);
/// `bound` puts it on [`NODE`], `init` makes its request an init
/// container's.
fn pod(name: &str, bound: bool, init: bool, bind_time: u64) -> Arc<Pod> {
    let container = serde_json::json!([{"name": "c", "image": "x",
        "resources": {"limits": {"amd.com/gpu": "1"}}}]);
    let mut spec = if init {
        serde_json::json!({"initContainers": container,
            "containers": [{"name": "app", "image": "x"}]})
    } else {
        serde_json::json!({ "containers": container })
    };
    if bound {
        spec["nodeName"] = serde_json::json!(NODE);
    }
    let value = serde_json::json!({
        "metadata": {"name": name, "namespace": "default", "annotations": {
            VGPU_NODE_KEY: NODE, BIND_PHASE_KEY: "allocating",
            BIND_TIME_KEY: bind_time.to_string(),
            TO_ALLOCATE_KEY: format!("GPU-{name},AMD X,1024,38:;")}},
        "spec": spec,
        "status": {"phase": "Pending"}});
    Arc::new(serde_json::from_value(value).unwrap())
}

fn node(lock: Option<&str>) -> Node {
    let mut value = serde_json::json!({"metadata": {"name": NODE}});
    if let Some(owner) = lock {
        value["metadata"]["annotations"][LOCK_KEY] =
            serde_json::json!(format!("2026-12-03T10:00:00Z,default,{owner}"));
    }
    serde_json::from_value(value).unwrap()
}

fn wanted(protected: bool, knows: Option<&HashSet<(String, String)>>) -> Wanted<'_> {
    Wanted {
        node_name: NODE,
        resource: "amd.com/gpu",
        count: 1,
        annotations_protected: protected,
        kubelet_knows: knows,
    }
}

fn known(names: &[&str]) -> HashSet<(String, String)> {
    names
        .iter()
        .map(|n| ("default".to_owned(), (*n).to_owned()))
        .collect()
}

fn name(found: Result<Arc<Pod>, FindError>) -> String {
    found
        .map(|p| p.name_any())
        .unwrap_or_else(|e| e.to_string())
}

/// HAMi locked the node for r-app and, before r-app's Binding, bound the
/// init-only r-init without the lock: the cache defers to the API server,
/// whose list names r-init.
#[test]
fn a_pod_bound_without_the_lock_while_its_owner_is_not_bound() {
    let node = node(Some("r-app"));
    let pods = [pod("r-init", true, true, 2)];
    let cached = find(Some(&node), &pods, wanted(false, None), Source::Cache);
    assert!(matches!(cached, Err(FindError::LockOwnerNotPending { .. })));
    let knows = known(&["r-init"]);
    let cached = find(
        Some(&node),
        &pods,
        wanted(false, Some(&knows)),
        Source::Cache,
    );
    assert_eq!(name(cached), "r-init", "kubelet took r-init in");
    let listed = find(Some(&node), &pods, wanted(false, None), Source::Listed);
    assert_eq!(name(listed), "r-init");
    // The owner in the view but not bound yet changes nothing.
    let pods = [pod("r-app", false, false, 1), pod("r-init", true, true, 2)];
    let listed = find(Some(&node), &pods, wanted(false, None), Source::Listed);
    assert_eq!(name(listed), "r-init");
}

/// A lock whose owner is gone or bound elsewhere blocks nobody.
#[test]
fn a_stale_lock_blocks_nobody() {
    let node = node(Some("gone"));
    let pods = [pod("s-init", true, true, 2)];
    let listed = find(Some(&node), &pods, wanted(false, None), Source::Listed);
    assert_eq!(name(listed), "s-init");
    let mut elsewhere = (*pod("gone", false, false, 1)).clone();
    elsewhere.spec.as_mut().unwrap().node_name = Some("other".into());
    let pods = [Arc::new(elsewhere), pod("s-init", true, true, 2)];
    let listed = find(Some(&node), &pods, wanted(false, None), Source::Listed);
    assert_eq!(name(listed), "s-init");
    // Nothing fits at all: the error names the lock.
    let err = name(find(Some(&node), &[], wanted(false, None), Source::Listed));
    assert!(
        err.contains("default/gone") && err.contains("no pod bound without the lock"),
        "{err}"
    );
}

/// The owner and an init-only pod both bound and pending: kubelet admits
/// one pod at a time and knows only those it took in, so the one it knows
/// is the one; when it cannot tell, HAMi's choice (the owner).
#[test]
fn owner_and_unlocked_pod_both_pending_are_told_apart_by_kubelet() {
    let node = node(Some("r-app"));
    let pods = [pod("r-app", true, false, 1), pod("r-init", true, true, 2)];
    for source in [Source::Cache, Source::Listed] {
        let knows = known(&["r-init", "older"]);
        let found = find(Some(&node), &pods, wanted(false, Some(&knows)), source);
        assert_eq!(name(found), "r-init");
        let knows = known(&["r-app"]);
        let found = find(Some(&node), &pods, wanted(false, Some(&knows)), source);
        assert_eq!(name(found), "r-app");
        let knows = known(&["r-app", "r-init"]);
        let found = find(Some(&node), &pods, wanted(false, Some(&knows)), source);
        assert_eq!(name(found), "r-app");
        let found = find(Some(&node), &pods, wanted(false, None), source);
        assert_eq!(name(found), "r-app");
    }
}

/// Without a lock the fallback rule stands as before: several candidates
/// are refused unless admission protects the annotations (then the oldest
/// bind-time), or kubelet knows only one of them.
#[test]
fn without_a_lock_the_fallback_rule_stands() {
    let node = node(None);
    let pods = [pod("a", true, true, 5), pod("b", true, true, 3)];
    let err = name(find(Some(&node), &pods, wanted(false, None), Source::Cache));
    assert!(err.contains("refusing to guess"), "{err}");
    let found = find(Some(&node), &pods, wanted(true, None), Source::Cache);
    assert_eq!(name(found), "b");
    let knows = known(&["a"]);
    let found = find(
        Some(&node),
        &pods,
        wanted(false, Some(&knows)),
        Source::Cache,
    );
    assert_eq!(name(found), "a");
    let unbound = [pod("a", false, true, 5)];
    let err = name(find(
        Some(&node),
        &unbound,
        wanted(false, None),
        Source::Listed,
    ));
    assert!(err.contains("no binding pod found"), "{err}");
}
