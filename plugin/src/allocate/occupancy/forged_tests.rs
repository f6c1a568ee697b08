//! Claims forged to cost memory: refused before anything is expanded.

use k8s_openapi::api::core::v1::Pod;

use super::*;

fn pod(name: &str, allocated: &str, claimed: &str) -> Pod {
    let value = serde_json::json!({
        "metadata": {
            "name": name, "namespace": "default", "creationTimestamp": "2026-11-29T08:00:00Z",
            "annotations": {ALLOCATED_KEY: allocated, CU_ALLOCATED_KEY: claimed}
        },
        "status": {"phase": "Running"}
    });
    serde_json::from_value(value).unwrap()
}

#[test]
fn a_forged_range_is_refused_by_its_gpu_before_anything_expands_it() {
    // HAMi's grant, the claim and the spare set all forged (a pod with no
    // GPU request can carry any annotation), on a GPU of the node and not.
    let totals: Totals = [("A".to_owned(), 304)].into_iter().collect();
    let claimed = r#"{"A":"0-2147483646"}"#;
    let mut on_a = pod("f", "A,T,1,2147483647:;", claimed);
    on_a.annotations_mut()
        .insert(reuse::CU_SPARE_KEY.into(), r#"{"A":"0"}"#.into());
    let elsewhere = pod("x", "X,T,1,2147483647:;", r#"{"X":"0-2147483646"}"#);
    let rebuilt = Claims::default().rebuild(
        &[Arc::new(on_a), Arc::new(elsewhere)],
        &totals,
        &|_| false,
        &|_| true,
    );
    let reasons: Vec<&str> = rebuilt
        .distrusted
        .iter()
        .map(|d| d.reason.as_str())
        .collect();
    assert!(
        reasons[0].contains("CU 2147483646 on GPU A, which has 304 CUs"),
        "{reasons:?}"
    );
    assert!(
        reasons[1].contains("which this node does not have"),
        "{reasons:?}"
    );
    assert_eq!(rebuilt.maps["A"].free_count(), 304);
}
