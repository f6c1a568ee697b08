//! Issue 19, defect 4, at admission: the chart's policy (on by default)
//! refuses HAMi's and the plugin's pod annotations from anyone but HAMi's
//! scheduler and the plugin, so a pod's author cannot forge a grant, a
//! bind phase or a CU record. Against the real kube-apiserver v1.36.3 with
//! the chart applied as Helm renders it (the administrator plays HAMi's
//! scheduler, `tests::cluster::setup::HAMI_WRITERS`).

// An integration-test file is itself the test module, and a failed unwrap is a
// failed test here.
#![allow(clippy::tests_outside_test_module, clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::cluster::{LIMIT, add_node, add_pod, admin, apply_chart, eventually};
use serde_json::{Value, json};
use tests::cluster::{
    ADMIN_TOKEN, RealCluster,
    chart::{self, NAMESPACE},
};

/// A ServiceAccount `default/author` that may create and change pods in
/// `default` (as a namespace's user may), and its token.
fn pod_author(cluster: &RealCluster) -> String {
    let objects = [
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
               "metadata": {"name": "author", "namespace": "default"}}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
               "metadata": {"name": "pod-author", "namespace": "default"},
               "rules": [{"apiGroups": [""], "resources": ["pods"],
                          "verbs": ["create", "get", "patch", "update"]}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": "pod-author", "namespace": "default"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                           "name": "pod-author"},
               "subjects": [{"kind": "ServiceAccount", "name": "author",
                             "namespace": "default"}]}),
    ];
    for object in &objects {
        let (code, answer) = cluster.apply(object).unwrap();
        assert!(code == 200 || code == 201, "{answer}");
    }
    cluster.account_token("default", "author").unwrap()
}

/// A pod on node-a with `annotations`.
fn pod(name: &str, annotations: &Value) -> String {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "annotations": annotations},
           "spec": {"nodeName": "node-a",
                    "containers": [{"name": "c", "image": "rocm",
                                    "resources": {"limits": {"amd.com/gpu": "1"}}}]}})
    .to_string()
}

const PODS: &str = "/api/v1/namespaces/default/pods";

#[test]
fn a_pods_author_cannot_forge_hamis_annotations() {
    common::run_async(LIMIT, async {
        let cluster = RealCluster::start().unwrap();
        let client = admin(&cluster).await;
        add_node(&client, "node-a").await;
        apply_chart(&cluster);
        let author = pod_author(&cluster);
        let forged = json!({"hami.io/amd-devices-allocated": "GPU-1,AMD,196608,304:;",
                            "hami.io/amd-cu-allocated": r#"{"GPU-1":"0-303"}"#});
        // The policy takes effect once the API server has loaded it.
        let create = |name: &str, annotations: &Value| {
            let body = pod(name, annotations);
            cluster
                .request_as(&author, "POST", PODS, Some(&body))
                .unwrap()
        };
        let refusal = eventually(Duration::from_secs(30), "the forged pod refused", || {
            let (code, answer) = create("forger", &forged);
            async move { (code == 403).then_some(answer) }
        })
        .await;
        assert!(
            refusal.contains("only HAMi's scheduler and the AMD device plugin"),
            "{refusal}"
        );
        assert!(
            refusal.contains("hami.io/amd-devices-allocated"),
            "{refusal}"
        );
        assert!(
            refusal.contains("system:serviceaccount:default:author"),
            "{refusal}"
        );

        // The annotation attacks of issue 19, each refused at admission:
        // defect 1 (a CU range of 2^31 CUs, the plugin's OOM), defect 3
        // (the fallback rule's annotations with an old bind-time), defect 4
        // (a whole GPU granted by the author).
        let attacks = [
            json!({"hami.io/amd-devices-allocated": "X,T,1,2147483647:;",
                   "hami.io/amd-cu-allocated": r#"{"X":"0-2147483646"}"#}),
            json!({"hami.io/vgpu-node": "node-a", "hami.io/bind-phase": "allocating",
                   "hami.io/bind-time": "1",
                   "hami.io/amd-devices-to-allocate": "GPU-1,AMD,196608,304:;"}),
            json!({"hami.io/amd-devices-allocated": "GPU-1,AMD,196608,304:;"}),
        ];
        for (i, annotations) in attacks.iter().enumerate() {
            let (code, answer) = create(&format!("attack-{i}"), annotations);
            assert_eq!(code, 403, "{annotations}: {answer}");
        }

        // A user's own hints are not HAMi's decisions.
        let hint = json!({"hami.io/gpu-scheduler-policy": "binpack", "team": "gpu"});
        let (code, answer) = create("honest", &hint);
        assert_eq!(code, 201, "{answer}");
        // HAMi's scheduler writes its decision; the author may not change it,
        // remove it, or add the plugin's record.
        let path = format!("{PODS}/honest");
        let decision = r#"{"metadata":{"annotations":{"hami.io/bind-phase":"allocating"}}}"#;
        let (code, answer) = cluster
            .merge_patch_as(ADMIN_TOKEN, &path, decision)
            .unwrap();
        assert_eq!(code, 200, "HAMi (the administrator here): {answer}");
        for patch in [
            r#"{"metadata":{"annotations":{"hami.io/bind-phase":"success"}}}"#,
            r#"{"metadata":{"annotations":{"hami.io/bind-phase":null}}}"#,
            r#"{"metadata":{"annotations":{"hami.io/amd-cu-allocated":"{}"}}}"#,
        ] {
            let (code, answer) = cluster.merge_patch_as(&author, &path, patch).unwrap();
            assert_eq!(code, 403, "{patch}: {answer}");
        }
        let other = r#"{"metadata":{"annotations":{"team":"ml"}}}"#;
        let (code, answer) = cluster.merge_patch_as(&author, &path, other).unwrap();
        assert_eq!(code, 200, "other annotations stay the author's: {answer}");

        // The plugin on node-a writes its CU record on the pod.
        add_pod(&cluster, NAMESPACE, "plugin-on-a", "node-a", chart::RELEASE);
        let plugin = cluster
            .pod_token(NAMESPACE, chart::RELEASE, "plugin-on-a")
            .unwrap();
        let record = r#"{"metadata":{"annotations":{"hami.io/amd-cu-allocated":"{\"GPU-1\":\"0-75\"}","hami.io/bind-phase":"success"}}}"#;
        let (code, answer) = cluster.merge_patch_as(&plugin, &path, record).unwrap();
        assert_eq!(code, 200, "the plugin: {answer}");
    });
}
