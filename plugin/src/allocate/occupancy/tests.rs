use k8s_openapi::api::core::v1::Pod;

use super::*;

fn pod(name: &str, created: &str, allocated: &str, claimed: &str) -> Arc<Pod> {
    let value = serde_json::json!({
        "metadata": {
            "name": name, "namespace": "default", "creationTimestamp": created,
            "annotations": {ALLOCATED_KEY: allocated, CU_ALLOCATED_KEY: claimed}
        },
        "status": {"phase": "Running"}
    });
    Arc::new(serde_json::from_value(value).unwrap())
}

/// One GPU `A` of 304 CUs (an MI300X).
fn one_gpu() -> Totals {
    [("A".to_owned(), 304)].into_iter().collect()
}

fn free(maps: &HashMap<String, CuBitmap>) -> u32 {
    maps["A"].free_count()
}

#[test]
fn honest_claims_count_and_forged_ones_do_not() {
    let totals = one_gpu();
    let honest = pod(
        "a",
        "2026-11-29T08:00:00Z",
        "A,T,1024,76:;",
        r#"{"A":"0-75"}"#,
    );
    // Claims more than granted, a GPU not granted, and an overlap with an older pod.
    let greedy = pod(
        "b",
        "2026-11-29T08:01:00Z",
        "A,T,1024,10:;",
        r#"{"A":"100-199"}"#,
    );
    let stranger = pod(
        "c",
        "2026-11-29T08:02:00Z",
        "B,T,1024,10:;",
        r#"{"A":"200-209"}"#,
    );
    let overlap = pod(
        "d",
        "2026-11-29T08:03:00Z",
        "A,T,1024,10:;",
        r#"{"A":"70-79"}"#,
    );
    let garbage = pod("e", "2026-11-29T08:04:00Z", "A,T,1024,10:;", "not json");
    let rebuilt = Claims::default().rebuild(
        &[honest, greedy, stranger, overlap, garbage],
        &totals,
        &|_| false,
        &|_| true,
    );
    let names: Vec<&str> = rebuilt.distrusted.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["b", "c", "d", "e"], "each forged claim is reported");
    let maps = rebuilt.maps;
    assert_eq!(
        free(&maps),
        304 - 80,
        "the honest claim and the overlap's union"
    );
    assert!(!maps["A"].is_free(0) && maps["A"].is_free(100) && maps["A"].is_free(200));
}

/// `pod` as the API server names one of its versions.
fn versioned(pod: &Pod, uid: &str, resource_version: &str) -> Arc<Pod> {
    let mut pod = pod.clone();
    pod.metadata.uid = Some(uid.to_owned());
    pod.metadata.resource_version = Some(resource_version.to_owned());
    Arc::new(pod)
}

fn kept(claims: &Claims) -> usize {
    claims.0.lock().unwrap().judged.len()
}

#[test]
fn a_kept_judgement_serves_only_the_same_pod_version() {
    let totals = one_gpu();
    let claims = Claims::default();
    let first = pod(
        "a",
        "2026-11-29T08:00:00Z",
        "A,T,1024,76:;",
        r#"{"A":"0-75"}"#,
    );
    let first = versioned(&first, "u-a", "5");
    let rebuilt = claims.rebuild(&[Arc::clone(&first)], &totals, &|_| false, &|_| true);
    assert_eq!(free(&rebuilt.maps), 304 - 76);
    let rebuilt = claims.rebuild(&[Arc::clone(&first)], &totals, &|_| false, &|_| true);
    assert_eq!(free(&rebuilt.maps), 304 - 76, "kept, same answer");
    // Another version, even with the same resourceVersion (the plugin's
    // record puts values back that way), is judged again.
    let mut edited = (*first).clone();
    edited
        .annotations_mut()
        .insert(CU_ALLOCATED_KEY.into(), r#"{"A":"0-199"}"#.into());
    let rebuilt = claims.rebuild(&[Arc::new(edited)], &totals, &|_| false, &|_| true);
    assert_eq!(rebuilt.distrusted.len(), 1, "more than granted");
    assert_eq!(free(&rebuilt.maps), 304);
    assert_eq!(kept(&claims), 1, "one per cached pod");
    claims.rebuild(&[], &totals, &|_| false, &|_| true);
    assert_eq!(kept(&claims), 0, "gone with the pod");
}

/// The judgement of a pod version is found by its uid and resourceVersion,
/// in whichever copy of it (the watch cache's after a relist, our patch's
/// answer): it is not judged again.
#[test]
fn another_copy_of_a_version_is_not_judged_again() {
    let totals = one_gpu();
    let claims = Claims::default();
    let a = pod(
        "a",
        "2026-11-29T08:00:00Z",
        "A,T,1024,76:;",
        r#"{"A":"0-75"}"#,
    );
    let (copy, other_copy) = (versioned(&a, "u-a", "5"), versioned(&a, "u-a", "5"));
    assert!(!Arc::ptr_eq(&copy, &other_copy));
    let before = claims.rebuild(&[copy], &totals, &|_| false, &|_| true);
    let after = claims.rebuild(&[other_copy], &totals, &|_| false, &|_| true);
    assert!(
        Arc::ptr_eq(&before.counted[0].1, &after.counted[0].1),
        "the same judgement"
    );
    assert_eq!(free(&after.maps), 304 - 76);
    // A pod without a uid or a resourceVersion is judged every time.
    let before = claims.rebuild(&[Arc::clone(&a)], &totals, &|_| false, &|_| true);
    let after = claims.rebuild(&[Arc::clone(&a)], &totals, &|_| false, &|_| true);
    assert!(!Arc::ptr_eq(&before.counted[0].1, &after.counted[0].1));
    assert_eq!(free(&after.maps), 304 - 76);
    assert_eq!(kept(&claims), 0, "nothing kept for it, and u-a is gone");
}

/// A new version of a pod (a status change, an edit of its claim) is
/// judged again, and its judgement replaces the old one's.
#[test]
fn a_new_version_of_a_pod_is_judged_again() {
    let totals = one_gpu();
    let claims = Claims::default();
    let a = pod(
        "a",
        "2026-11-29T08:00:00Z",
        "A,T,1024,76:;",
        r#"{"A":"0-75"}"#,
    );
    let rebuild = |pod| claims.rebuild(&[pod], &totals, &|_| false, &|_| true);
    let rebuilt = rebuild(versioned(&a, "u-a", "5"));
    assert_eq!(free(&rebuilt.maps), 304 - 76);
    let mut done = (*a).clone();
    done.status.as_mut().unwrap().phase = Some("Succeeded".into());
    let rebuilt = rebuild(versioned(&done, "u-a", "6"));
    assert_eq!(free(&rebuilt.maps), 304, "finished: its CUs are free");
    let mut forged = (*a).clone();
    forged
        .annotations_mut()
        .insert(CU_ALLOCATED_KEY.into(), r#"{"A":"0-199"}"#.into());
    let rebuilt = rebuild(versioned(&forged, "u-a", "7"));
    assert_eq!(rebuilt.distrusted.len(), 1, "more than granted");
    assert_eq!(kept(&claims), 1, "one entry per pod");
}

/// The reasons in the Events, word for word: what each untrusted claim is
/// told.
#[test]
fn the_reasons_name_the_gpu_and_the_numbers() {
    let totals = one_gpu();
    let honest = pod(
        "a",
        "2026-11-29T08:00:00Z",
        "A,T,1024,76:;",
        r#"{"A":"0-75"}"#,
    );
    let claims = [
        ("A,T,1024,10:;", r#"{"A":"100-199"}"#),
        ("B,T,1024,10:;", r#"{"A":"200-209"}"#),
        ("A,T,1024,10:;", r#"{"A":"70-79"}"#),
        ("A,T,1024,10:;", r#"{"A":"0-303","C":"0"}"#),
        ("A,T,1024,400:;", r#"{"A":"0-400"}"#),
    ];
    let mut pods = vec![honest];
    for (i, (allocated, claimed)) in claims.into_iter().enumerate() {
        pods.push(pod(
            &format!("p{i}"),
            "2026-11-29T09:00:00Z",
            allocated,
            claimed,
        ));
    }
    let rebuilt =
        Claims::for_resource("amd.com/gpu").rebuild(&pods, &totals, &|_| false, &|_| true);
    let reasons: Vec<&str> = rebuilt
        .distrusted
        .iter()
        .map(|d| d.reason.as_str())
        .collect();
    assert_eq!(
        reasons, ["its spec asks for no amd.com/gpu: HAMi grants only pods that do"; 6],
        "no pod here asks for a GPU"
    );
    let rebuilt = Claims::default().rebuild(&pods, &totals, &|_| false, &|_| true);
    let reasons: Vec<&str> = rebuilt
        .distrusted
        .iter()
        .map(|d| d.reason.as_str())
        .collect();
    assert_eq!(
        reasons,
        [
            "it claims 100 CUs on GPU A, HAMi granted the pod 10",
            "it claims CUs on GPU A, which HAMi did not grant the pod",
            "CU 70 of GPU A is also claimed by another pod (both claims count, so neither \
             pod's CUs are handed out again)",
            "it claims 304 CUs on GPU A, HAMi granted the pod 10; it claims CUs on GPU C, \
             which this node does not have",
            "it claims CU 400 on GPU A, which has 304 CUs",
        ]
    );
}

#[test]
fn a_claim_that_overlaps_another_counts_with_it_and_is_reported() {
    let totals = one_gpu();
    let older = pod(
        "g",
        "2026-11-29T08:00:00Z",
        "A,T,1024,6:;",
        r#"{"A":"250-255"}"#,
    );
    let newer = pod(
        "f",
        "2026-11-29T08:01:00Z",
        "A,T,1024,20:;",
        r#"{"A":"200-209,250-259"}"#,
    );
    let pods = [Arc::clone(&newer), Arc::clone(&older)];
    let rebuilt = Claims::default().rebuild(&pods, &totals, &|_| false, &|_| true);
    assert_eq!(rebuilt.distrusted.len(), 1);
    assert_eq!(
        rebuilt.distrusted[0].name, "f",
        "the newer claim is reported"
    );
    let map = &rebuilt.maps["A"];
    assert!(!map.is_free(200) && !map.is_free(259), "both claims count");
    assert_eq!(map.free_count(), 304 - 20);
    // A stale pod (gone from the API, still cached) overlapping a claim of
    // ours: ours comes first, the other is the one reported.
    let ours = |p: &Pod| p.metadata.name.as_deref() == Some("f");
    let rebuilt = Claims::default().rebuild(&pods, &totals, &ours, &|_| true);
    assert_eq!(rebuilt.distrusted[0].name, "g");
    assert_eq!(rebuilt.maps["A"].free_count(), 304 - 20);
}

#[test]
fn finished_pods_release_their_cus() {
    let totals = one_gpu();
    let done = pod(
        "a",
        "2026-11-29T08:00:00Z",
        "A,T,1024,76:;",
        r#"{"A":"0-75"}"#,
    );
    let mut finished = (*done).clone();
    finished.status.as_mut().unwrap().phase = Some("Succeeded".into());
    let maps = Claims::default()
        .rebuild(&[Arc::new(finished)], &totals, &|_| false, &|_| true)
        .maps;
    assert_eq!(free(&maps), 304);
}

/// A node upgraded from HAMi's Go AMD plugin: running pods hold grants and
/// CU records keyed by that plugin's IDs, in its exact format (the AMD SMI
/// UUID of a whole GPU, `{"<uuid>":"<ID list>"}`), while the GPU is now
/// published under another ID. Their CUs still count on that GPU, so none
/// is granted twice.
#[test]
fn records_in_the_go_plugins_format_count_on_the_gpu_they_name() {
    const GO_ID: &str = "8eff74a1-0000-1000-80aa-d3b1c6a5e0ff";
    let mut gpu = crate::testutil::mi300x("0000:05:00.0", "GPU-8ecb9de71e8aa497");
    gpu.published_id = "GPU-8ecb9de71e8aa497".into();
    gpu.amdsmi_uuid = GO_ID.into();
    let snapshot = crate::inventory::Snapshot::from_gpud(
        &[gpu],
        std::collections::BTreeMap::new(),
        ipc::DmemBackend::default(),
    );
    let totals = Totals {
        cus: [("GPU-8ecb9de71e8aa497".to_owned(), 304)]
            .into_iter()
            .collect(),
        units: HashMap::new(),
        aliases: Aliases::of(&snapshot),
    };
    let go = pod(
        "from-go",
        "2026-11-29T08:00:00Z",
        &format!("{GO_ID},AMD Instinct MI300X,16384,76:;"),
        &format!(r#"{{"{GO_ID}":"0-75"}}"#),
    );
    let ours = pod(
        "ours",
        "2026-11-29T09:00:00Z",
        "GPU-8ecb9de71e8aa497,AMD Instinct MI300X,16384,76:;",
        r#"{"GPU-8ecb9de71e8aa497":"76-151"}"#,
    );
    let rebuilt = Claims::default().rebuild(&[go, ours], &totals, &|_| false, &|_| true);
    assert!(rebuilt.distrusted.is_empty(), "{:?}", rebuilt.distrusted);
    let map = &rebuilt.maps["GPU-8ecb9de71e8aa497"];
    assert_eq!(map.free_count(), 304 - 152, "both records count");
    assert_eq!(map.choose(76, 1).unwrap(), vec![152..228], "after both");
    assert_eq!(rebuilt.holders("GPU-8ecb9de71e8aa497").len(), 2);
}

/// A record under a name that several devices share is not guessed onto
/// one of them: it is reported, naming the candidates.
#[test]
fn a_record_under_an_ambiguous_name_is_refused_with_the_candidates() {
    let mut gpu = crate::testutil::mi300x("0000:05:00.0", "");
    (gpu.published_id, gpu.unique_id) = ("X".into(), "1".into());
    gpu.compute_partition = "CPX".into();
    let parts = (0..2)
        .map(|i| crate::testutil::partition(&format!("0000:05:00.{i}"), i, 0))
        .collect();
    let raw = crate::inventory::Snapshot::from_gpud(
        &[gpu],
        [("0000:05:00.0".to_owned(), parts)].into(),
        ipc::DmemBackend::default(),
    );
    let snapshot = crate::inventory::partition::view(
        &raw,
        crate::inventory::partition::OperatingMode::Partition,
    );
    let totals = Totals {
        cus: [("X-cpx0".to_owned(), 38), ("X-cpx1".to_owned(), 38)]
            .into_iter()
            .collect(),
        units: HashMap::new(),
        aliases: Aliases::of(&snapshot),
    };
    let go = pod(
        "from-go",
        "2026-11-29T08:00:00Z",
        "GPU-0000000000000001#cpx,T,1024,38:;",
        r#"{"GPU-0000000000000001#cpx":"0-37"}"#,
    );
    let rebuilt = Claims::default().rebuild(&[go], &totals, &|_| false, &|_| true);
    let reason = &rebuilt.distrusted[0].reason;
    assert!(reason.contains("X-cpx0, X-cpx1"), "{reason}");
    assert!(reason.contains("cannot tell which"), "{reason}");
}

/// On gfx10+ a grant of 1 CU gets one whole WGP (2 CUs): that record is
/// within the grant and counts; 3 CUs for the same grant do not.
#[test]
fn one_wgp_for_a_grant_below_it_is_within_the_grant() {
    let totals = Totals {
        cus: [("A".to_owned(), 64)].into_iter().collect(),
        units: [("A".to_owned(), 2)].into_iter().collect(),
        aliases: Aliases::default(),
    };
    let tiny = pod(
        "tiny",
        "2026-11-29T08:00:00Z",
        "A,T,1024,1:;",
        r#"{"A":"0-1"}"#,
    );
    let rebuilt = Claims::default().rebuild(&[tiny], &totals, &|_| false, &|_| true);
    assert!(rebuilt.distrusted.is_empty(), "{:?}", rebuilt.distrusted);
    assert_eq!(rebuilt.maps["A"].free_count(), 62);
    let greedy = pod(
        "greedy",
        "2026-11-29T08:00:00Z",
        "A,T,1024,1:;",
        r#"{"A":"0-2"}"#,
    );
    let rebuilt = Claims::default().rebuild(&[greedy], &totals, &|_| false, &|_| true);
    assert_eq!(rebuilt.distrusted.len(), 1);
    assert_eq!(rebuilt.maps["A"].free_count(), 64);
}

/// Issue 19, defect 4: an older pod kubelet never admitted with our
/// devices forges a grant and a one-CU claim inside an honest pod's slice.
/// Before, both counted, the overlap was blamed on the honest (younger)
/// pod and a pod needing that CU was refused; now the forgery is left out
/// and reported on the forger, and the honest claim counts whole.
#[test]
fn a_claim_of_a_pod_kubelet_did_not_admit_neither_counts_nor_shadows() {
    let totals = one_gpu();
    let forger = pod(
        "forger",
        "2026-11-29T07:00:00Z",
        "A,T,1024,1:;",
        r#"{"A":"40"}"#,
    );
    let honest = pod(
        "honest",
        "2026-11-29T08:00:00Z",
        "A,T,1024,76:;",
        r#"{"A":"0-75"}"#,
    );
    let admitted = |p: &Pod| p.name_any() == "honest";
    let rebuilt = Claims::default().rebuild(&[forger, honest], &totals, &|_| false, &admitted);
    let names: Vec<&str> = rebuilt.distrusted.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["forger"], "blamed on the forger only");
    assert!(
        rebuilt.distrusted[0].reason.contains("pod-resources"),
        "{}",
        rebuilt.distrusted[0].reason
    );
    assert_eq!(free(&rebuilt.maps), 304 - 76);
    assert_eq!(rebuilt.holders("A"), ["default/honest"]);
}
