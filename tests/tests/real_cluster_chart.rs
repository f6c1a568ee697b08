//! The chart against the real control plane (issue 17): `helm/amd-gpu` as
//! Helm's library renders it, applied server-side to a real kube-apiserver
//! v1.36.3, its RBAC, its ValidatingAdmissionPolicy and its pod under Pod
//! Security "restricted" judged by the real admission.

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

/// The chart's RBAC and ValidatingAdmissionPolicy, applied from
/// `helm/amd-gpu` as Helm renders it: the plugin's ServiceAccount, with the
/// token its pod on node-a gets, may change HAMi's annotations of node-a
/// and of pods on node-a, and nothing else.
#[test]
fn the_charts_account_changes_only_hami_annotations_of_its_node_and_its_pods() {
    common::run_async(LIMIT, async {
        let cluster = RealCluster::start().unwrap();
        let client = admin(&cluster).await;
        add_node(&client, "node-a").await;
        add_node(&client, "node-b").await;
        let objects = apply_chart(&cluster);
        let kinds: Vec<&str> = objects.iter().filter_map(|o| o["kind"].as_str()).collect();
        for kind in [
            "ServiceAccount",
            "ClusterRole",
            "ValidatingAdmissionPolicy",
            "NetworkPolicy",
        ] {
            assert!(
                kinds.contains(&kind),
                "the chart renders a {kind}: {kinds:?}"
            );
        }
        add_pod(&cluster, NAMESPACE, "plugin-on-a", "node-a", chart::RELEASE);
        add_pod(&cluster, "default", "job-on-a", "node-a", "default");
        add_pod(&cluster, "default", "job-on-b", "node-b", "default");
        let token = cluster
            .pod_token(NAMESPACE, chart::RELEASE, "plugin-on-a")
            .unwrap();
        let hami = r#"{"metadata":{"annotations":{"hami.io/node-amd-register":"[]"}}}"#;
        let patch = |path: &str, body: &str| cluster.merge_patch_as(&token, path, body).unwrap();

        let (code, answer) = patch("/api/v1/nodes/node-a", hami);
        assert_eq!(code, 200, "its own node: {answer}");
        let job = r#"{"metadata":{"annotations":{"hami.io/bind-phase":"success"}}}"#;
        let (code, answer) = patch("/api/v1/namespaces/default/pods/job-on-a", job);
        assert_eq!(code, 200, "a pod on its node: {answer}");
        // The policy takes effect once the API server has loaded it.
        let refused = || {
            let (code, answer) = patch("/api/v1/nodes/node-b", hami);
            (code == 403).then_some(answer)
        };
        let answer = eventually(
            Duration::from_secs(30),
            "the policy refusing node-b",
            || {
                let answer = refused();
                async move { answer }
            },
        )
        .await;
        assert!(answer.contains("may not change node node-b"), "{answer}");
        // The pods' policy is another object, loaded on its own time.
        let refused = || {
            let (code, answer) = patch("/api/v1/namespaces/default/pods/job-on-b", job);
            (code == 403).then_some(answer)
        };
        eventually(
            Duration::from_secs(30),
            "the policy refusing a pod on another node",
            || {
                let answer = refused();
                async move { answer }
            },
        )
        .await;
        let label = r#"{"metadata":{"labels":{"evil":"yes"}}}"#;
        let (code, answer) = patch("/api/v1/nodes/node-a", label);
        assert_eq!(code, 403, "a label of its own node: {answer}");
        assert!(answer.contains("only hami.io/ annotations"), "{answer}");
        let (code, _) = cluster
            .get_as(&token, "/api/v1/namespaces/kube-system/secrets")
            .unwrap();
        assert_eq!(code, 403, "RBAC: no secrets");
        let (code, _) = cluster
            .request_as(&token, "DELETE", "/api/v1/nodes/node-a", None)
            .unwrap();
        assert_eq!(code, 403, "RBAC: no deletes");
        let user = format!("system:serviceaccount:{NAMESPACE}:{}", chart::RELEASE);
        let audited = cluster
            .audit_events()
            .iter()
            .any(|e| e["user"]["username"] == user.as_str());
        assert!(audited, "the audit log names {user}");
    });
}

/// `dp.reportNodeCapacity`: the chart grants patch on nodes/status, and its
/// policy keeps that to the token's node and to `amd.com/gpumem` and
/// `amd.com/gpucores` in its capacity and allocatable, on the real API
/// server with the token of the plugin's pod on node-a.
#[test]
fn the_charts_account_sets_only_amd_capacity_in_its_nodes_status() {
    common::run_async(LIMIT, async {
        let cluster = RealCluster::start().unwrap();
        let client = admin(&cluster).await;
        add_node(&client, "node-a").await;
        add_node(&client, "node-b").await;
        let objects = chart::render(&[
            ("validatingAdmissionPolicy.enabled", "true"),
            ("dp.reportNodeCapacity", "true"),
        ])
        .unwrap();
        for object in objects.iter().filter(|o| o["kind"] != "DaemonSet") {
            let (code, answer) = cluster.apply(object).unwrap();
            assert!(
                code == 200 || code == 201,
                "{}: {code} {answer}",
                object["kind"]
            );
        }
        add_pod(&cluster, NAMESPACE, "plugin-on-a", "node-a", chart::RELEASE);
        let token = cluster
            .pod_token(NAMESPACE, chart::RELEASE, "plugin-on-a")
            .unwrap();
        let patch = |node: &str, body: &str| {
            let path = format!("/api/v1/nodes/{node}/status");
            cluster.merge_patch_as(&token, &path, body).unwrap()
        };
        let capacity = r#"{"status":{"capacity":{"amd.com/gpumem":"1024","amd.com/gpucores":"38"},
            "allocatable":{"amd.com/gpumem":"1024","amd.com/gpucores":"38"}}}"#;
        let (code, answer) = patch("node-a", capacity);
        assert_eq!(code, 200, "RBAC: its node's GPU capacity: {answer}");
        // The policy takes effect once the API server has loaded it.
        let answer = eventually(
            Duration::from_secs(30),
            "the policy refusing node-b",
            || {
                let (code, answer) = patch("node-b", capacity);
                async move { (code == 403).then_some(answer) }
            },
        )
        .await;
        assert!(
            answer.contains("may not change the status of node node-b"),
            "{answer}"
        );
        let (code, answer) = patch("node-a", capacity);
        assert_eq!(
            code, 200,
            "its node's GPU capacity, under the policy: {answer}"
        );
        let cpu = r#"{"status":{"capacity":{"cpu":"512"}}}"#;
        let (code, answer) = patch("node-a", cpu);
        assert_eq!(code, 403, "another resource: {answer}");
        assert!(
            answer.contains("only amd.com/gpumem and amd.com/gpucores"),
            "{answer}"
        );
        let label = r#"{"metadata":{"labels":{"evil":"yes"}}}"#;
        let (code, answer) = patch("node-a", label);
        assert_eq!(code, 403, "a label through the status: {answer}");
        let condition = r#"{"status":{"addresses":[{"type":"InternalIP","address":"10.9.9.9"}]}}"#;
        let (code, answer) = patch("node-a", condition);
        assert_eq!(code, 403, "the rest of the status: {answer}");
    });
}

/// What `helm/amd-gpu/pss-exceptions.txt` allows: the hostPath volumes, and
/// the init containers that may run as root (its `initContainer:` entries:
/// the hook installer, on by default), each sorted.
fn documented_exceptions() -> (Vec<String>, Vec<String>) {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../helm/amd-gpu/pss-exceptions.txt"
    );
    let entries: Vec<String> = std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| l.split('#').next().unwrap_or_default().trim().to_owned())
        .filter(|l| !l.is_empty())
        .collect();
    let (inits, mut volumes): (Vec<String>, Vec<String>) = entries
        .into_iter()
        .partition(|e| e.starts_with("initContainer:"));
    let mut inits: Vec<String> = inits
        .iter()
        .filter_map(|e| e.strip_prefix("initContainer:").map(str::to_owned))
        .collect();
    volumes.sort();
    inits.sort();
    (volumes, inits)
}

/// The names of `template`'s init containers, sorted.
fn init_containers(template: &Value) -> Vec<String> {
    let mut names: Vec<String> = template["spec"]["initContainers"]
        .as_array()
        .map(|cs| {
            cs.iter()
                .filter_map(|c| c["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Whether one of PodSecurity's violations is root in a documented init
/// container: `runAsNonRoot != true (container "x" must not set ...)` or
/// `runAsUser=0 (container "x" must not set ...)`, naming only those.
fn root_in(violation: &str, inits: &[String]) -> bool {
    let root =
        violation.starts_with("runAsNonRoot != true (") || violation.starts_with("runAsUser=0 (");
    let named: Vec<&str> = violation.split('"').skip(1).step_by(2).collect();
    root && !named.is_empty() && named.iter().all(|n| inits.iter().any(|i| i == n))
}

/// Creates the DaemonSet's pod as its controller would (bound to a node);
/// the status code and the answer.
fn create_daemon_pod(cluster: &RealCluster, namespace: &str, template: &Value) -> (u16, String) {
    let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
                         "metadata": template["metadata"].clone(), "spec": template["spec"].clone()});
    pod["metadata"]["generateName"] = json!("amd-gpu-");
    pod["spec"]["nodeName"] = json!("node-a");
    let path = format!("/api/v1/namespaces/{namespace}/pods");
    cluster
        .request_as(ADMIN_TOKEN, "POST", &path, Some(&pod.to_string()))
        .unwrap()
}

/// The chart applied server-side into a namespace that enforces Pod
/// Security "restricted": the real admission refuses its pod for the
/// hostPath volumes `pss-exceptions.txt` documents and root in the init
/// container it documents (the hook installer), and nothing else, and
/// admits it once they are taken out.
#[test]
fn under_restricted_pod_security_only_the_documented_host_paths_are_refused() {
    common::run_async(LIMIT, async {
        let cluster = RealCluster::start().unwrap();
        let client = admin(&cluster).await;
        add_node(&client, "node-a").await;
        let ns = "amd-gpu-restricted";
        let namespace = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns,
            "labels": {"pod-security.kubernetes.io/enforce": "restricted",
                       "pod-security.kubernetes.io/enforce-version": "latest"}}});
        let (code, answer) = cluster.apply(&namespace).unwrap();
        assert_eq!(code, 201, "{answer}");
        let objects = chart::render_in(ns, &[]).unwrap();
        for object in &objects {
            let (code, answer) = cluster.apply(object).unwrap();
            assert!(
                code == 200 || code == 201,
                "applying {}: {code} {answer}",
                object["kind"]
            );
        }
        let daemonset = objects.iter().find(|o| o["kind"] == "DaemonSet").unwrap();
        let template = &daemonset["spec"]["template"];
        let (code, answer) = create_daemon_pod(&cluster, ns, template);
        assert_eq!(code, 403, "{answer}");
        let refusal: Value = serde_json::from_str(&answer).unwrap();
        let message = refusal["message"].as_str().unwrap();
        let (_, violations) = message
            .split_once(r#"violates PodSecurity "restricted:latest": "#)
            .unwrap();
        let host_paths: Vec<&str> = template["spec"]["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|v| v.get("hostPath").is_some())
            .filter_map(|v| v["name"].as_str())
            .collect();
        let (documented, inits) = documented_exceptions();
        let mut sorted = host_paths.clone();
        sorted.sort_unstable();
        assert_eq!(
            sorted, documented,
            "the chart's hostPath volumes are the documented ones"
        );
        assert_eq!(
            init_containers(template),
            inits,
            "the chart's init containers are the documented ones"
        );
        let quoted: Vec<String> = host_paths.iter().map(|n| format!("{n:?}")).collect();
        // PodSecurity's wording for the restricted volume-type control (the
        // baseline hostPath control says the same of the same volumes).
        let expected = format!(
            "restricted volume types (volumes {} use restricted volume type \"hostPath\")",
            quoted.join(", ")
        );
        assert!(violations.contains(&expected), "{violations}");
        // The rest: PodSecurity's other violations, each "<control> (<detail>)".
        let rest = violations.replacen(&expected, "", 1);
        let root: Vec<&str> = rest
            .split("), ")
            .map(|v| v.trim_matches(|c: char| c == ',' || c == ';' || c.is_whitespace()))
            .filter(|v| !v.is_empty())
            .collect();
        assert!(
            !inits.is_empty() && root.len() == 2 && root.iter().all(|v| root_in(v, &inits)),
            "besides the volumes, only root in {inits:?}: {violations}"
        );

        // Without those volumes (and their mounts) the same pod is admitted.
        let allowed = without_exceptions(template, &host_paths);
        let (code, answer) = create_daemon_pod(&cluster, ns, &allowed);
        assert_eq!(code, 201, "the pod without its hostPath volumes: {answer}");
    });
}

/// The daemon pod's template without the `host_paths` volumes, their mounts
/// and the init containers (the hook installer mounts the hook's volume and
/// runs as root).
fn without_exceptions(template: &Value, host_paths: &[&str]) -> Value {
    let mut allowed = template.clone();
    let keep = |v: &Value| !host_paths.contains(&v["name"].as_str().unwrap_or_default());
    let volumes: Vec<Value> = template["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| keep(v))
        .cloned()
        .collect();
    allowed["spec"]["volumes"] = json!(volumes);
    // The hook installer mounts the hook's volume and runs as root.
    allowed["spec"]
        .as_object_mut()
        .unwrap()
        .remove("initContainers");
    for container in allowed["spec"]["containers"].as_array_mut().unwrap() {
        let mounts: Vec<Value> = container["volumeMounts"]
            .as_array()
            .map(|m| m.iter().filter(|m| keep(m)).cloned().collect())
            .unwrap_or_default();
        container["volumeMounts"] = json!(mounts);
    }
    allowed
}
