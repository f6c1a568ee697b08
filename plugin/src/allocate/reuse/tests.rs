use serde_json::{Value, json};

use super::*;

const GPU: &str = "A";

fn container(name: &str, gpus: Option<u32>, restart: Option<&str>) -> Value {
    let mut c = json!({"name": name, "image": "rocm"});
    if let Some(n) = gpus {
        c["resources"] = json!({"limits": {"amd.com/gpu": n.to_string()}});
    }
    if let Some(policy) = restart {
        c["restartPolicy"] = json!(policy);
    }
    c
}

/// A pod with `inits` and `apps` containers, HAMi's entries `allocated`, of
/// which `left` are still to allocate, and `spare` as the spare annotation.
fn pod(
    inits: Vec<Value>,
    apps: Vec<Value>,
    allocated: &str,
    left: &str,
    spare: Option<&str>,
) -> Pod {
    let mut annotations = json!({
        "hami.io/amd-devices-allocated": allocated,
        "hami.io/amd-devices-to-allocate": left,
    });
    if let Some(s) = spare {
        annotations[CU_SPARE_KEY] = json!(s);
    }
    serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "default", "annotations": annotations},
        "spec": {"initContainers": inits, "containers": apps},
    }))
    .unwrap()
}

fn init_then_app(left: &str, spare: Option<&str>) -> Pod {
    pod(
        vec![container("setup", Some(1), None)],
        vec![container("main", Some(1), None)],
        "A,T,1024,76:;A,T,1024,38:;",
        left,
        spare,
    )
}

fn ranges(list: &[Range<u32>]) -> String {
    crate::cu::format_id_list(list)
}

#[test]
fn roles_follow_kubelets_order_of_init_then_app_containers() {
    let first = init_then_app("A,T,1024,76:;A,T,1024,38:;", None);
    assert_eq!(next_role(&first, "amd.com/gpu"), Role::Init);
    let second = init_then_app(";A,T,1024,38:;", None);
    assert_eq!(next_role(&second, "amd.com/gpu"), Role::App);
    // Another resource name: the pod's containers do not match the entries.
    assert_eq!(next_role(&first, "example.com/gpu"), Role::App);
}

#[test]
fn sidecars_and_unmatched_specs_never_share() {
    let sidecar = pod(
        vec![container("proxy", Some(1), Some("Always"))],
        vec![container("main", Some(1), None)],
        "A,T,1024,76:;A,T,1024,38:;",
        "A,T,1024,76:;A,T,1024,38:;",
        None,
    );
    assert_eq!(next_role(&sidecar, "amd.com/gpu"), Role::App);
    // Three AMD containers in the spec, two entries: cannot tell, so no reuse.
    let unmatched = pod(
        vec![container("setup", Some(1), None)],
        vec![container("a", Some(1), None), container("b", Some(1), None)],
        "A,T,1024,76:;A,T,1024,38:;",
        "A,T,1024,76:;A,T,1024,38:;",
        None,
    );
    assert_eq!(next_role(&unmatched, "amd.com/gpu"), Role::App);
    // Init containers without a GPU do not count.
    let plain_init = pod(
        vec![container("setup", None, None)],
        vec![container("main", Some(1), None)],
        "A,T,1024,38:;",
        "A,T,1024,38:;",
        None,
    );
    assert_eq!(next_role(&plain_init, "amd.com/gpu"), Role::App);
}

#[test]
fn app_containers_take_the_init_containers_cus_first() {
    let mut map = CuBitmap::new(GPU, 304);
    map.claim(0..10).unwrap(); // another pod
    let mut init = Reuse::for_pod(
        &init_then_app("A,T,1024,76:;A,T,1024,38:;", None),
        "amd.com/gpu",
    );
    let got = init.choose(&mut map, 76, 1).unwrap();
    assert_eq!(ranges(&got), "10-85");
    let spare = init.annotation().unwrap().unwrap();
    assert_eq!(spare, r#"{"A":"10-85"}"#);

    let pod = init_then_app(";A,T,1024,38:;", Some(&spare));
    let mut app = Reuse::for_pod(&pod, "amd.com/gpu");
    let free_before = map.free_count();
    let got = app.choose(&mut map, 38, 1).unwrap();
    assert_eq!(
        ranges(&got),
        "10-47",
        "the init container's CUs, lowest first"
    );
    assert_eq!(map.free_count(), free_before, "no new CU claimed");
    assert_eq!(app.annotation().unwrap().unwrap(), r#"{"A":"48-85"}"#);
}

#[test]
fn an_app_container_larger_than_the_spare_set_adds_fresh_cus() {
    let mut map = CuBitmap::new(GPU, 120);
    map.claim(0..20).unwrap(); // the pod's own init CUs, as the rebuild claims them
    map.claim(20..30).unwrap(); // another pod
    let pod = init_then_app(";A,T,1024,38:;", Some(r#"{"A":"0-19"}"#));
    let mut app = Reuse::for_pod(&pod, "amd.com/gpu");
    let got = app.choose(&mut map, 30, 2).unwrap();
    assert_eq!(ranges(&got), "0-19,30-39");
    assert_eq!(app.annotation().unwrap().unwrap(), "{}");
}

#[test]
fn later_init_containers_share_and_grow_the_spare_set() {
    let inits = vec![container("a", Some(1), None), container("b", Some(1), None)];
    let pod = pod(
        inits,
        vec![container("main", Some(1), None)],
        "A,T,1,20:;A,T,1,30:;A,T,1,10:;",
        ";A,T,1,30:;A,T,1,10:;",
        Some(r#"{"A":"0-19"}"#),
    );
    let mut map = CuBitmap::new(GPU, 100);
    map.claim(0..20).unwrap();
    let mut second = Reuse::for_pod(&pod, "amd.com/gpu");
    assert_eq!(second.role(), Role::Init);
    let got = second.choose(&mut map, 30, 1).unwrap();
    assert_eq!(ranges(&got), "0-29");
    assert_eq!(second.annotation().unwrap().unwrap(), r#"{"A":"0-29"}"#);
}

#[test]
fn below_one_wgp_is_still_an_error_with_a_spare_set() {
    let pod = init_then_app(";A,T,1024,38:;", Some(r#"{"A":"0-19"}"#));
    let mut app = Reuse::for_pod(&pod, "amd.com/gpu");
    let mut map = CuBitmap::new(GPU, 64);
    let err = app.choose(&mut map, 1, 2).unwrap_err();
    assert!(
        matches!(err, CuError::BelowSmallestShare { smallest: 2, .. }),
        "{err}"
    );
}

fn finished(mut pod: Pod, exit_code: i32) -> Pod {
    pod.status = Some(
        serde_json::from_value(json!({"initContainerStatuses": [{
            "name": "setup", "image": "rocm", "imageID": "", "ready": false,
            "restartCount": 0,
            "state": {"terminated": {"exitCode": exit_code}}
        }]}))
        .unwrap(),
    );
    pod
}

#[test]
fn spare_cus_stop_counting_once_the_init_containers_succeeded() {
    let claimed = CuList::parse("0-75").unwrap();
    let spare = Some(r#"{"A":"38-75"}"#);
    let running = init_then_app(";;", spare);
    assert_eq!(
        occupied(&running, GPU, &claimed).unwrap(),
        claimed,
        "init still running"
    );
    let failed = finished(init_then_app(";;", spare), 1);
    assert_eq!(
        occupied(&failed, GPU, &claimed).unwrap(),
        claimed,
        "it will run again"
    );
    let done = finished(init_then_app(";;", spare), 0);
    assert_eq!(occupied(&done, GPU, &claimed).unwrap().to_string(), "0-37");
    let pending = finished(init_then_app(";A,T,1024,38:;", spare), 0);
    assert_eq!(
        occupied(&pending, GPU, &claimed).unwrap(),
        claimed,
        "app not admitted yet"
    );
}

#[test]
fn a_spare_set_beyond_the_claim_is_not_trusted() {
    let claimed = CuList::parse("0-75").unwrap();
    let forged = finished(init_then_app(";;", Some(r#"{"A":"0-299"}"#)), 0);
    let err = occupied(&forged, GPU, &claimed).unwrap_err().to_string();
    assert!(
        err.contains("224 CUs") && err.contains("CU 76") && err.contains(CU_SPARE_KEY),
        "{err}"
    );
    let garbage = finished(init_then_app(";;", Some("nope")), 0);
    assert!(occupied(&garbage, GPU, &claimed).is_err());
}

#[test]
fn a_forged_spare_set_is_bounded_by_its_gpu_before_it_is_expanded() {
    // The pod's own manifest sets a spare set of two billion CUs.
    let forged = init_then_app(";A,T,1024,38:;", Some(r#"{"A":"0-2147483646"}"#));
    let mut app = Reuse::for_pod(&forged, "amd.com/gpu");
    let mut map = CuBitmap::new(GPU, 304);
    let got = app.choose(&mut map, 38, 1).unwrap();
    assert_eq!(ranges(&got), "0-37", "fresh CUs, nothing reused");
    assert_eq!(
        app.annotation().unwrap().unwrap(),
        "{}",
        "the forgery is dropped"
    );
    // Judged against a claim: refused on the ranges, nothing expanded.
    let done = finished(init_then_app(";;", Some(r#"{"A":"0-2147483646"}"#)), 0);
    let claimed = CuList::parse("0-37").unwrap();
    let why = occupied(&done, GPU, &claimed).unwrap_err().to_string();
    assert!(
        why.contains("2147483609 CUs") && why.contains("first is CU 38"),
        "{why}"
    );
}
