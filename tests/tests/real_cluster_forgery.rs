//! Issue 19, defect 4, at admission: the chart's policies (on by default)
//! refuse HAMi's and the plugin's pod annotations from anyone but HAMi's
//! scheduler and the plugin, so a pod's author cannot forge a grant, a
//! bind phase or a CU record; through the pod, its status or a Binding
//! (issue 38, F4); and they leave other vendors' pods to them (issue 37,
//! point 3). Against the real kube-apiserver v1.36.3 with the chart applied
//! as Helm renders it (the administrator plays HAMi's scheduler,
//! `tests::cluster::setup::HAMI_WRITERS`).

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

/// The ServiceAccounts `namespace:name` of `names`, each allowed by RBAC to
/// do to pods all the tests below try (as a readiness-gate controller, a
/// scheduler or a device plugin may); their tokens, in order.
fn accounts(cluster: &RealCluster, names: &[&str]) -> Vec<String> {
    let mut objects = vec![json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "pod-writer"},
        "rules": [{"apiGroups": [""], "resources": ["pods", "pods/status"],
                   "verbs": ["get", "patch", "update"]},
                  {"apiGroups": [""], "resources": ["pods/binding", "bindings"],
                   "verbs": ["create"]}]})];
    for account in names {
        let (namespace, name) = account.split_once(':').unwrap();
        objects.push(json!({"apiVersion": "v1", "kind": "ServiceAccount",
                            "metadata": {"name": name, "namespace": namespace}}));
        objects.push(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": format!("pod-writer-{namespace}-{name}")},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "pod-writer"},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]}));
    }
    for object in &objects {
        let (code, answer) = cluster.apply(object).unwrap();
        assert!(code == 200 || code == 201, "{answer}");
    }
    names
        .iter()
        .map(|account| {
            let (namespace, name) = account.split_once(':').unwrap();
            cluster.account_token(namespace, name).unwrap()
        })
        .collect()
}

/// Pod `default/<name>` of `spec`, created by the administrator.
fn create_pod(cluster: &RealCluster, name: &str, spec: &Value) {
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec});
    let (code, answer) = cluster
        .request_as(ADMIN_TOKEN, "POST", PODS, Some(&pod.to_string()))
        .unwrap();
    assert_eq!(code, 201, "{answer}");
}

/// A pod spec whose one container asks for `resource`, on node-a if `bound`.
fn spec(resource: &str, bound: bool) -> Value {
    let mut spec = json!({"containers": [{"name": "c", "image": "gpu",
                                          "resources": {"limits": {resource: "1"}}}]});
    if bound {
        spec["nodeName"] = json!("node-a");
    }
    spec
}

/// `{"metadata":{"annotations":{key: value}}}`.
fn annotate(key: &str, value: &str) -> String {
    json!({"metadata": {"annotations": {key: value}}}).to_string()
}

/// A Binding of pod `default/<pod>` to node-a that carries `annotations`.
fn binding(pod: &str, annotations: &Value) -> String {
    json!({"apiVersion": "v1", "kind": "Binding",
           "metadata": {"name": pod, "annotations": annotations},
           "target": {"apiVersion": "v1", "kind": "Node", "name": "node-a"}})
    .to_string()
}

/// Pod `default/<name>` as the administrator reads it.
fn read_pod(cluster: &RealCluster, name: &str) -> Value {
    let (code, answer) = cluster
        .get_as(ADMIN_TOKEN, &format!("{PODS}/{name}"))
        .unwrap();
    assert_eq!(code, 200, "{answer}");
    serde_json::from_str(&answer).unwrap()
}

/// Every key the policy protects on a pod that asks for AMD devices, with a
/// value HAMi or the plugin could have written.
const PROTECTED: [(&str, &str); 8] = [
    ("hami.io/vgpu-node", "node-a"),
    ("hami.io/vgpu-time", "1"),
    ("hami.io/bind-phase", "allocating"),
    ("hami.io/bind-time", "1"),
    ("hami.io/amd-devices-to-allocate", "GPU-1,AMD,196608,304:;"),
    ("hami.io/amd-devices-allocated", "GPU-1,AMD,196608,304:;"),
    ("hami.io/amd-cu-allocated", r#"{"GPU-1":"0-303"}"#),
    ("hami.io/amd-cu-init-spare", r#"{"GPU-1":"0-303"}"#),
];

/// Starts the control plane with the chart applied and node-a registered;
/// the tokens of the ServiceAccounts `names` ([`accounts`]).
async fn cluster_with(names: &[&str]) -> (RealCluster, Vec<String>) {
    let cluster = RealCluster::start().unwrap();
    let client = admin(&cluster).await;
    add_node(&client, "node-a").await;
    apply_chart(&cluster);
    let tokens = accounts(&cluster, names);
    (cluster, tokens)
}

/// Issue 38, F4: whoever may patch `pods/status` (a readiness-gate
/// controller here) cannot write HAMi's annotations that way. Before the
/// fix the policy matched only `pods`: every status write went through.
#[test]
fn the_status_carries_no_hami_annotation() {
    common::run_async(LIMIT, async {
        let (cluster, tokens) = cluster_with(&["default:gates"]).await;
        status_writes(&cluster, &tokens[0]).await;
    });
}

/// Issue 38, F4: whoever may create Bindings cannot carry HAMi's
/// annotations onto the pod it binds. Before the fix a Binding with forged
/// fallback-rule annotations bound the pod.
#[test]
fn a_binding_carries_no_hami_annotation() {
    common::run_async(LIMIT, async {
        let (cluster, tokens) = cluster_with(&["default:binder"]).await;
        bindings(&cluster, &tokens[0]).await;
    });
}

/// `pods/status` patches as the holder of `gates`: HAMi's keys refused on
/// an AMD pod, the AMD ones on any pod; the controller's own condition and
/// the shared keys of a pod without AMD devices pass.
async fn status_writes(cluster: &RealCluster, gates: &str) {
    create_pod(cluster, "amd", &spec("amd.com/gpu", true));
    create_pod(cluster, "cpu", &spec("cpu", true));
    let status = |pod: &str, body: &str, dry: bool| {
        let path = format!(
            "{PODS}/{pod}/status{}",
            if dry { "?dryRun=All" } else { "" }
        );
        cluster.merge_patch_as(gates, &path, body).unwrap()
    };
    // The policy takes effect once the API server has loaded it (asked with
    // dry runs, which admission judges but nothing stores).
    let (key, value) = PROTECTED[0];
    let answer = eventually(Duration::from_secs(30), "the status write refused", || {
        let (code, answer) = status("amd", &annotate(key, value), true);
        async move { (code == 403).then_some(answer) }
    })
    .await;
    assert!(answer.contains("through pods/status"), "{answer}");
    assert!(
        answer.contains("system:serviceaccount:default:gates"),
        "{answer}"
    );
    for (key, value) in PROTECTED {
        let (code, answer) = status("amd", &annotate(key, value), false);
        assert_eq!(code, 403, "{key} on an AMD pod's status: {answer}");
        assert!(answer.contains(key), "{answer}");
        // On a pod without AMD devices only the AMD keys are ours.
        let (code, answer) = status("cpu", &annotate(key, value), false);
        let want = if key.starts_with("hami.io/amd-") {
            403
        } else {
            200
        };
        assert_eq!(code, want, "{key} on another pod's status: {answer}");
    }
    // What such a controller is for still works.
    let gate = r#"{"status":{"conditions":[{"type":"example.com/gate","status":"True"}]}}"#;
    let (code, answer) = status("amd", gate, false);
    assert_eq!(code, 200, "{answer}");
    let pod = read_pod(cluster, "amd");
    let annotations = pod["metadata"]["annotations"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    assert!(
        annotations.keys().all(|k| !k.starts_with("hami.io/")),
        "{pod}"
    );
}

/// Bindings as the holder of `binder`, through `pods/binding` and the legacy
/// `bindings`: any protected key refused and the pod left unbound; other
/// annotations bind it.
async fn bindings(cluster: &RealCluster, binder: &str) {
    create_pod(cluster, "unbound", &spec("amd.com/gpu", false));
    let forged = json!({"hami.io/vgpu-node": "node-a", "hami.io/bind-phase": "allocating",
                        "hami.io/bind-time": "1",
                        "hami.io/amd-devices-to-allocate": "GPU-1,AMD,196608,304:;"});
    let bind = |path: &str, body: &str| {
        cluster
            .request_as(binder, "POST", path, Some(body))
            .unwrap()
    };
    let subresource = format!("{PODS}/unbound/binding");
    let answer = eventually(Duration::from_secs(30), "the Binding refused", || {
        let body = binding("unbound", &forged);
        let (code, answer) = bind(&format!("{subresource}?dryRun=All"), &body);
        async move { (code == 403).then_some(answer) }
    })
    .await;
    assert!(
        answer.contains("hami.io/amd-devices-to-allocate"),
        "{answer}"
    );
    let legacy = "/api/v1/namespaces/default/bindings";
    let bind_time = json!({"hami.io/bind-time": "1"});
    for (path, annotations) in [
        (&*subresource, &forged),
        (legacy, &forged),
        (legacy, &bind_time),
    ] {
        let (code, answer) = bind(path, &binding("unbound", annotations));
        assert_eq!(code, 403, "{path} {annotations}: {answer}");
        assert!(
            answer.contains("a Binding's annotations are copied onto the pod"),
            "{answer}"
        );
    }
    let pod = read_pod(cluster, "unbound");
    assert!(pod["spec"]["nodeName"].is_null(), "{pod}");
    // A Binding with other annotations binds.
    let zone = json!({"example.com/zone": "a"});
    let (code, answer) = bind(&subresource, &binding("unbound", &zone));
    assert_eq!(code, 201, "{answer}");
    let pod = read_pod(cluster, "unbound");
    assert_eq!(pod["spec"]["nodeName"], "node-a", "{pod}");
    assert_eq!(pod["metadata"]["annotations"], zone, "{pod}");
}

/// The ServiceAccounts of [`other_vendors_pods_stay_theirs`], in this order.
const VENDORS: [&str; 6] = [
    // A second device plugin, neither HAMi's chart's nor listed.
    "kube-system:vendor-device-plugin",
    // HAMi's chart installed as release `gpu`: its NVIDIA plugin, its scheduler.
    "kube-system:gpu-hami-device-plugin",
    "kube-system:gpu-hami-scheduler",
    // A lookalike in a tenant's namespace.
    "default:hami-scheduler",
    // HAMi's Ascend plugin (a default of devicePlugins).
    "kube-system:hami-ascend",
    // A scheduler that copies pod annotations into its Bindings.
    "default:volcano",
];

/// Issue 37, point 3: on a cluster with other vendors' devices, HAMi's keys
/// shared by all vendors stay free on pods that ask for no AMD device, so a
/// second device plugin marks its pods' bind phase; on a pod that asks for
/// AMD devices it is refused. HAMi's scheduler and device plugins are found
/// under any release name (`gpu` here), and the writers are configurable.
/// Before the fix the second plugin was refused on every pod.
#[test]
fn other_vendors_pods_stay_theirs() {
    common::run_async(LIMIT, async {
        let (cluster, tokens) = cluster_with(&VENDORS).await;
        create_pod(&cluster, "nvidia", &spec("nvidia.com/gpu", true));
        create_pod(&cluster, "amd", &spec("amd.com/gpu", true));
        // AMD devices asked for by an init container only.
        let mut init = spec("cpu", true);
        init["initContainers"] = spec("amd.com/gpumem", false)["containers"].clone();
        init["initContainers"][0]["name"] = json!("init");
        create_pod(&cluster, "amd-init", &init);
        second_plugin(&cluster, &tokens[0]).await;
        hami_by_name(&cluster, &tokens[1..5]);
        listed_writer(&cluster, &tokens[5]).await;
    });
}

/// A merge patch of annotation `key` of pod `default/<pod>` as the holder of
/// `token`: the status code and the answer.
fn patch(
    cluster: &RealCluster,
    token: &str,
    pod: &str,
    (key, value): (&str, &str),
) -> (u16, String) {
    let path = format!("{PODS}/{pod}");
    cluster
        .merge_patch_as(token, &path, &annotate(key, value))
        .unwrap()
}

const PHASE: (&str, &str) = ("hami.io/bind-phase", "success");

/// The second device plugin: HAMi's shared keys on its pods, never the AMD
/// ones, nothing on a pod that asks for AMD devices.
async fn second_plugin(cluster: &RealCluster, vendor: &str) {
    let path = format!("{PODS}/amd?dryRun=All");
    let answer = eventually(Duration::from_secs(30), "the second plugin refused", || {
        let (code, answer) = cluster
            .merge_patch_as(vendor, &path, &annotate(PHASE.0, PHASE.1))
            .unwrap();
        async move { (code == 403).then_some(answer) }
    })
    .await;
    for key in PROTECTED {
        let (code, answer) = patch(cluster, vendor, "nvidia", key);
        let want = if key.0.starts_with("hami.io/amd-") {
            403
        } else {
            200
        };
        assert_eq!(code, want, "{key:?} on the NVIDIA pod: {answer}");
    }
    for pod in ["amd", "amd-init"] {
        let (code, answer) = patch(cluster, vendor, pod, PHASE);
        assert_eq!(code, 403, "{pod}: {answer}");
    }
    assert!(
        answer.contains("on a pod that asks for amd.com/ resources"),
        "{answer}"
    );
}

/// HAMi's NVIDIA and Ascend plugins set the bind phase of a pod that also
/// asks for AMD devices, nothing else of it; HAMi's scheduler of release
/// `gpu` writes its decision, in the pod and in a Binding; a lookalike in a
/// tenant's namespace cannot. `tokens`: [`VENDORS`] 1 to 4.
fn hami_by_name(cluster: &RealCluster, tokens: &[String]) {
    let [nvidia, scheduler, lookalike, ascend] = tokens else {
        panic!("four tokens: {}", tokens.len())
    };
    // Each a phase of its own: a patch that changes nothing passes anyway.
    for (plugin, phase) in [(nvidia, "success"), (ascend, "failed")] {
        let (code, answer) = patch(cluster, plugin, "amd", (PHASE.0, phase));
        assert_eq!(code, 200, "{answer}");
        assert_eq!(
            patch(cluster, plugin, "amd", ("hami.io/bind-time", "2")).0,
            403
        );
        assert_eq!(patch(cluster, plugin, "amd", PROTECTED[6]).0, 403);
    }
    let (code, answer) = patch(cluster, scheduler, "amd", PROTECTED[5]);
    assert_eq!(code, 200, "{answer}");
    let other = (PROTECTED[5].0, "GPU-2,AMD,196608,304:;");
    for pod in ["amd", "nvidia"] {
        assert_eq!(patch(cluster, lookalike, pod, other).0, 403, "{pod}");
    }
    create_pod(cluster, "unbound", &spec("amd.com/gpu", false));
    let body = binding("unbound", &json!({"hami.io/bind-time": "3"}));
    let path = format!("{PODS}/unbound/binding");
    let (code, answer) = cluster
        .request_as(lookalike, "POST", &path, Some(&body))
        .unwrap();
    assert_eq!(code, 403, "{answer}");
    let (code, answer) = cluster
        .request_as(scheduler, "POST", &path, Some(&body))
        .unwrap();
    assert_eq!(code, 201, "{answer}");
}

/// `validatingAdmissionPolicy.writers.serviceAccounts`: a scheduler that
/// copies the pod's annotations into its Binding, listed, binds and writes.
async fn listed_writer(cluster: &RealCluster, volcano: &str) {
    let writers = r#"{"users": ["admin"], "serviceAccounts": ["default:volcano"]}"#;
    let objects = chart::render(&[
        ("validatingAdmissionPolicy.enabled", "true"),
        ("validatingAdmissionPolicy.writers", writers),
    ])
    .unwrap();
    for object in objects
        .iter()
        .filter(|o| o["kind"] == "ValidatingAdmissionPolicy")
    {
        let (code, answer) = cluster.apply(object).unwrap();
        assert_eq!(code, 200, "{answer}");
    }
    create_pod(cluster, "volcano-pod", &spec("amd.com/gpu", false));
    let path = format!("{PODS}/volcano-pod/binding");
    let body = binding("volcano-pod", &json!({"hami.io/bind-time": "3"}));
    eventually(
        Duration::from_secs(30),
        "the listed writer's Binding",
        || {
            let dry = format!("{path}?dryRun=All");
            let (code, _) = cluster
                .request_as(volcano, "POST", &dry, Some(&body))
                .unwrap();
            async move { (code == 201).then_some(()) }
        },
    )
    .await;
    let (code, answer) = cluster
        .request_as(volcano, "POST", &path, Some(&body))
        .unwrap();
    assert_eq!(code, 201, "{answer}");
    assert_eq!(patch(cluster, volcano, "amd", PROTECTED[6]).0, 200);
}
