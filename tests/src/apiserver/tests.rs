//! The fake API server driven by the real kube-rs client.

use std::{future::Future, time::Duration};

use futures_util::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Client, ResourceExt,
    api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams},
    runtime::watcher,
};
use serde_json::{Value, json};

use super::{FakeApiServer, Kind};

async fn within<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(20), f)
        .await
        .expect("the test timed out")
}

fn client(server: &FakeApiServer) -> Client {
    Client::try_from(server.client_config()).expect("a kube client")
}

fn pod_json(name: &str, node: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "annotations": {"a": "1", "b": "2"}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]},
    })
}

fn pod(name: &str, node: &str) -> Pod {
    serde_json::from_value(pod_json(name, node)).expect("a pod")
}

fn api_error(err: kube::Error) -> Box<kube::core::Status> {
    match err {
        kube::Error::Api(status) => status,
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn merge(value: Value) -> Patch<Value> {
    Patch::Merge(value)
}

#[tokio::test]
async fn create_then_get_a_pod() {
    within(async {
        let server = FakeApiServer::start().expect("server");
        let pods: Api<Pod> = Api::default_namespaced(client(&server));
        let created = pods
            .create(&PostParams::default(), &pod("p1", "n1"))
            .await
            .expect("create");
        assert!(created.uid().is_some());
        assert!(created.creation_timestamp().is_some());
        let status = created.status.as_ref().and_then(|s| s.phase.as_deref());
        assert_eq!(status, Some("Pending"), "the API server defaults the phase");
        let got = pods.get("p1").await.expect("get");
        assert_eq!(got.resource_version(), created.resource_version());
        assert_eq!(got.spec.and_then(|s| s.node_name).as_deref(), Some("n1"));

        let again = pods.create(&PostParams::default(), &pod("p1", "n1")).await;
        assert!(api_error(again.expect_err("a duplicate")).is_already_exists());
        let missing = pods.get("nope").await.expect_err("missing");
        assert!(api_error(missing).is_not_found());
        assert_eq!(pods.get_opt("nope").await.expect("get_opt"), None);
    })
    .await;
}

#[tokio::test]
async fn list_pods_by_node_with_a_field_selector() {
    within(async {
        let server = FakeApiServer::start().expect("server");
        server.put_pod(pod_json("a", "n1"));
        server.put_pod(pod_json("b", "n2"));
        let mut other_ns = pod_json("c", "n1");
        other_ns["metadata"]["namespace"] = json!("kube-system");
        server.put_pod(other_ns);
        let all: Api<Pod> = Api::all(client(&server));
        let on_n1 = all
            .list(&ListParams::default().fields("spec.nodeName=n1"))
            .await
            .expect("list");
        let names: Vec<_> = on_n1.items.iter().map(ResourceExt::name_any).collect();
        assert_eq!(names, ["a", "c"], "storage order: namespace, then name");
        assert_eq!(
            on_n1.metadata.resource_version,
            Some(server.resource_version().to_string())
        );
        let by_name = all
            .list(&ListParams::default().fields("metadata.name=b"))
            .await
            .expect("list");
        assert_eq!(by_name.items.len(), 1);
        let in_default: Api<Pod> = Api::default_namespaced(client(&server));
        let both = in_default
            .list(&ListParams::default().fields("spec.nodeName!=n3"))
            .await;
        assert_eq!(both.expect("list").items.len(), 2);
    })
    .await;
}

#[tokio::test]
async fn watch_sees_added_then_modified() {
    within(async {
        let server = FakeApiServer::start().expect("server");
        let pods: Api<Pod> = Api::default_namespaced(client(&server));
        let start = pods.list(&ListParams::default()).await.expect("list");
        let rv = start
            .metadata
            .resource_version
            .expect("a list resourceVersion");
        let params = WatchParams::default()
            .fields("spec.nodeName=n1")
            .timeout(10);
        let mut events = pods.watch(&params, &rv).await.expect("watch").boxed();

        pods.create(&PostParams::default(), &pod("other", "n2"))
            .await
            .expect("create");
        pods.create(&PostParams::default(), &pod("p", "n1"))
            .await
            .expect("create");
        let patch = merge(json!({"metadata": {"annotations": {"hami.io/bind-phase": "success"}}}));
        pods.patch("p", &PatchParams::default(), &patch)
            .await
            .expect("patch");

        match events.try_next().await.expect("event") {
            Some(WatchEvent::Added(p)) => assert_eq!(p.name_any(), "p"),
            other => panic!("expected ADDED p, got {other:?}"),
        }
        match events.try_next().await.expect("event") {
            Some(WatchEvent::Modified(p)) => {
                assert_eq!(
                    p.annotations()
                        .get("hami.io/bind-phase")
                        .map(String::as_str),
                    Some("success")
                );
            }
            other => panic!("expected MODIFIED p, got {other:?}"),
        }
    })
    .await;
}

#[tokio::test]
async fn stale_resource_version_in_a_merge_patch_is_a_conflict() {
    within(async {
        let server = FakeApiServer::start().expect("server");
        server.put_pod(pod_json("p", "n1"));
        let pods: Api<Pod> = Api::default_namespaced(client(&server));
        let old = pods
            .get("p")
            .await
            .expect("get")
            .resource_version()
            .expect("rv");
        pods.patch(
            "p",
            &PatchParams::default(),
            &merge(json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await
        .expect("patch");
        let before = server.get(Kind::Pod, "default", "p");
        let stale = merge(json!({"metadata": {"resourceVersion": old, "annotations": {"a": "9"}}}));
        let err = pods
            .patch("p", &PatchParams::default(), &stale)
            .await
            .expect_err("stale");
        let status = api_error(err);
        assert!(status.is_conflict(), "{status:?}");
        assert_eq!(status.reason, "Conflict");
        assert_eq!(
            server.get(Kind::Pod, "default", "p"),
            before,
            "nothing changed"
        );

        let current = pods
            .get("p")
            .await
            .expect("get")
            .resource_version()
            .expect("rv");
        let fresh =
            merge(json!({"metadata": {"resourceVersion": current, "annotations": {"a": "9"}}}));
        let patched = pods
            .patch("p", &PatchParams::default(), &fresh)
            .await
            .expect("fresh");
        assert_eq!(
            patched.annotations().get("a").map(String::as_str),
            Some("9")
        );

        let mut replace = pods.get("p").await.expect("get");
        replace.metadata.resource_version = Some(old);
        let err = pods
            .replace("p", &PostParams::default(), &replace)
            .await
            .expect_err("stale put");
        assert!(api_error(err).is_conflict());
    })
    .await;
}

#[tokio::test]
async fn null_in_a_merge_patch_deletes_an_annotation() {
    within(async {
        let server = FakeApiServer::start().expect("server");
        server.put_pod(pod_json("p", "n1"));
        let pods: Api<Pod> = Api::default_namespaced(client(&server));
        let patch = merge(json!({"metadata": {"annotations": {"a": null, "c": "3"}}}));
        let patched = pods
            .patch("p", &PatchParams::default(), &patch)
            .await
            .expect("patch");
        let annotations = patched.annotations();
        assert!(!annotations.contains_key("a"));
        assert_eq!(annotations.get("b").map(String::as_str), Some("2"));
        assert_eq!(annotations.get("c").map(String::as_str), Some("3"));
        let stored = server.get(Kind::Pod, "default", "p").expect("stored");
        assert_eq!(
            stored["metadata"]["annotations"],
            json!({"b": "2", "c": "3"})
        );

        // A patch that changes nothing writes nothing.
        let rv = server.resource_version();
        let same = merge(json!({"metadata": {"annotations": {"c": "3"}}}));
        pods.patch("p", &PatchParams::default(), &same)
            .await
            .expect("no-op patch");
        assert_eq!(server.resource_version(), rv);
    })
    .await;
}

#[tokio::test]
async fn counters_count_by_verb_and_resource() {
    within(async {
        let server = FakeApiServer::start().expect("server");
        server.put_node(json!({"metadata": {"name": "n1"}}));
        let kube = client(&server);
        let pods: Api<Pod> = Api::default_namespaced(kube.clone());
        let nodes: Api<Node> = Api::all(kube);
        nodes.get("n1").await.expect("get node");
        pods.create(&PostParams::default(), &pod("p", "n1"))
            .await
            .expect("create");
        pods.list(&ListParams::default()).await.expect("list");
        pods.patch(
            "p",
            &PatchParams::default(),
            &merge(json!({"metadata": {"labels": {"l": "v"}}})),
        )
        .await
        .expect("patch");
        pods.patch_status(
            "p",
            &PatchParams::default(),
            &merge(json!({"status": {"phase": "Running"}})),
        )
        .await
        .expect("patch status");
        pods.delete("p", &DeleteParams::default())
            .await
            .expect("delete");
        let counts = server.requests();
        assert_eq!(
            (
                counts.get,
                counts.post,
                counts.list,
                counts.patch,
                counts.delete
            ),
            (1, 1, 1, 2, 1)
        );
        assert_eq!(counts.of("get", "nodes"), 1);
        assert_eq!(counts.of("patch", "pods"), 1);
        assert_eq!(counts.of("patch", "pods/status"), 1);
        assert_eq!(counts.total(), 6);
        server.reset_requests();
        assert_eq!(server.requests().total(), 0);
        assert!(server.get(Kind::Pod, "default", "p").is_none());
    })
    .await;
}

#[tokio::test]
async fn unreachable_makes_calls_fail() {
    within(async {
        let server = FakeApiServer::start().expect("server");
        server.put_pod(pod_json("p", "n1"));
        let pods: Api<Pod> = Api::default_namespaced(client(&server));
        pods.get("p").await.expect("reachable");
        server.set_unreachable(true);
        let err = pods.get("p").await.expect_err("unreachable");
        assert!(
            !matches!(err, kube::Error::Api(_)),
            "no answer at all, got {err:?}"
        );
        let err = pods.get("p").await.expect_err("still unreachable");
        assert!(!matches!(err, kube::Error::Api(_)), "{err:?}");
        server.set_unreachable(false);
        pods.get("p").await.expect("reachable again");
        assert_eq!(server.requests().get, 2, "refused requests are not counted");
    })
    .await;
}

#[tokio::test]
async fn watcher_with_a_field_selector_gets_the_list_then_changes() {
    within(async {
        let server = FakeApiServer::start().expect("server");
        server.put_pod(pod_json("early", "n1"));
        server.put_pod(pod_json("elsewhere", "n2"));
        let mut unbound = pod_json("late", "");
        unbound["spec"]
            .as_object_mut()
            .expect("spec")
            .remove("nodeName");
        server.put_pod(unbound);
        let pods: Api<Pod> = Api::all(client(&server));
        let config = watcher::Config::default().fields("spec.nodeName=n1");
        let mut stream = watcher(pods.clone(), config).boxed();
        let mut initial = Vec::new();
        loop {
            match stream.try_next().await.expect("watcher") {
                Some(watcher::Event::Init) => {}
                Some(watcher::Event::InitApply(p)) => initial.push(p.name_any()),
                Some(watcher::Event::InitDone) => break,
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(initial, ["early"]);

        // Binding the pod to n1 brings it into the selector: the watcher sees it appear.
        let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "late"},
                             "target": {"kind": "Node", "name": "n1"}});
        let bound = server.url() + "/api/v1/namespaces/default/pods/late/binding";
        let request = http_post(&bound, &binding);
        let kube = client(&server);
        let answer: Value = kube.request(request).await.expect("binding");
        assert_eq!(answer["status"], "Success");
        match stream.try_next().await.expect("watcher") {
            Some(watcher::Event::Apply(p)) => assert_eq!(p.name_any(), "late"),
            other => panic!("expected late to apply, got {other:?}"),
        }
        server.remove(Kind::Pod, "default", "early");
        match stream.try_next().await.expect("watcher") {
            Some(watcher::Event::Delete(p)) => assert_eq!(p.name_any(), "early"),
            other => panic!("expected early deleted, got {other:?}"),
        }
    })
    .await;
}

fn http_post(url: &str, body: &Value) -> hyper::Request<Vec<u8>> {
    let path = url
        .split_once("//")
        .and_then(|(_, rest)| rest.split_once('/'))
        .map(|(_, p)| p);
    hyper::Request::post(format!("/{}", path.expect("a path")))
        .header("content-type", "application/json")
        .body(body.to_string().into_bytes())
        .expect("a request")
}

#[tokio::test]
async fn watch_from_a_compacted_version_is_expired() {
    within(async {
        let server = FakeApiServer::start().expect("server");
        server.put_pod(pod_json("p", "n1"));
        let old = server.resource_version();
        server.put_pod(pod_json("q", "n1"));
        server.compact();
        let pods: Api<Pod> = Api::default_namespaced(client(&server));
        let mut events = pods
            .watch(&WatchParams::default().timeout(5), &old.to_string())
            .await
            .expect("watch")
            .boxed();
        match events.try_next().await.expect("event") {
            Some(WatchEvent::Error(status)) => {
                assert_eq!((status.code, status.reason.as_str()), (410, "Expired"));
            }
            other => panic!("expected 410 Expired, got {other:?}"),
        }
        assert!(events.try_next().await.expect("end").is_none());
    })
    .await;
}

#[tokio::test]
async fn watch_ends_with_a_bookmark_at_its_timeout() {
    within(async {
        let server = FakeApiServer::start().expect("server");
        server.put_pod(pod_json("p", "n1"));
        let nodes: Api<Node> = Api::all(client(&server));
        let params = WatchParams::default().timeout(1);
        let mut events = nodes.watch(&params, "0").await.expect("watch").boxed();
        match events.try_next().await.expect("event") {
            Some(WatchEvent::Bookmark(b)) => {
                assert_eq!(
                    b.metadata.resource_version,
                    server.resource_version().to_string()
                );
            }
            other => panic!("expected a bookmark, got {other:?}"),
        }
        assert!(events.try_next().await.expect("end").is_none());
    })
    .await;
}

#[tokio::test]
async fn main_resource_ignores_status_and_status_ignores_spec() {
    within(async {
        let server = FakeApiServer::start().expect("server");
        server.put_pod(pod_json("p", "n1"));
        let pods: Api<Pod> = Api::default_namespaced(client(&server));
        let params = PatchParams::default();
        let ignored = merge(json!({"status": {"phase": "Running"}}));
        let patched = pods.patch("p", &params, &ignored).await.expect("patch");
        assert_eq!(patched.status.and_then(|s| s.phase), None);
        let both = merge(json!({"status": {"phase": "Running"}, "spec": {"nodeName": "zz"}}));
        let patched = pods
            .patch_status("p", &params, &both)
            .await
            .expect("patch status");
        assert_eq!(
            patched.status.and_then(|s| s.phase).as_deref(),
            Some("Running")
        );
        assert_eq!(
            patched.spec.and_then(|s| s.node_name).as_deref(),
            Some("n1")
        );
        let apply = PatchParams::apply("tests");
        let applied = pods
            .patch("p", &apply, &Patch::<Value>::Apply(json!({})))
            .await;
        assert_eq!(api_error(applied.expect_err("apply")).code, 415);
    })
    .await;
}

#[test]
fn kubeconfig_file_is_accepted_by_kube() {
    let server = FakeApiServer::start().expect("server");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = server.kubeconfig(dir.path());
    let config = kube::config::Kubeconfig::read_from(&path).expect("parses");
    let cluster = config.clusters[0].cluster.as_ref().expect("a cluster");
    assert_eq!(cluster.server.as_deref(), Some(server.url().as_str()));
    assert_eq!(config.current_context.as_deref(), Some("fake"));
}

#[tokio::test]
async fn events_are_recorded() {
    within(async {
        let server = FakeApiServer::start().expect("server");
        let kube = client(&server);
        let events: Api<k8s_openapi::api::core::v1::Event> = Api::default_namespaced(kube);
        let event: k8s_openapi::api::core::v1::Event = serde_json::from_value(json!({
            "metadata": {"generateName": "p."},
            "involvedObject": {"kind": "Pod", "name": "p", "namespace": "default"},
            "reason": "Allocated", "message": "2 GPUs", "type": "Normal",
        }))
        .expect("an event");
        events
            .create(&PostParams::default(), &event)
            .await
            .expect("create");
        let recorded = server.events();
        assert_eq!(recorded.len(), 1);
        assert_eq!(recorded[0]["reason"], "Allocated");
        assert!(
            recorded[0]["metadata"]["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("p."))
        );
    })
    .await;
}
