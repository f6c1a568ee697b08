//! The emulator as HAMi's scheduler extender (`Project-HAMi/HAMi:
//! pkg/scheduler/routes`): `POST /filter` and `POST /bind` over HTTP, as a
//! kube-scheduler configured the way HAMi's chart configures it calls them
//! ([`crate::cluster::hami`]), against any API server the client reaches.
//!
//! Filter (`ExtenderArgs` with `NodeNames`, the chart's `nodeCacheCapable`):
//! the first node on which [`HamiEmulator::place`] fits the pod gets it, and
//! Filter's annotations are written on the pod; the other nodes are failed
//! with HAMi's reason. A pod whose requests HAMi drops passes every node
//! with nothing written (docs/hami-protocol.md §3.9). Bind
//! (`ExtenderBindingArgs`): the node lock when an app container asks for
//! AMD GPUs (waiting while another live pod holds it, as HAMi's `LockNode`
//! retries), `bind-phase: allocating` and `bind-time`, then the Binding.

use std::{convert::Infallible, io, sync::Arc, time::Duration};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response, body::Incoming, server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Api, Client,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use tokio::{net::TcpListener, sync::oneshot};

use super::{
    HamiEmulator,
    filter::{ALLOCATED_KEY, REGISTER_KEY},
    request::{self, GpuPolicy},
};
use crate::apiserver::rfc3339;

/// The node lock's key, shared by every HAMi vendor.
const LOCK_KEY: &str = "hami.io/mutex.lock";
/// How long Bind waits for a lock another live pod holds (HAMi's
/// `--node-lock-retry-timeout` default is 28 s).
const LOCK_WAIT: Duration = Duration::from_secs(28);
/// Filter's annotations (the rest of [`HamiEmulator::bind_annotations`] is
/// Bind's).
const FILTER_KEYS: [&str; 4] = [
    "hami.io/vgpu-node",
    "hami.io/vgpu-time",
    "hami.io/amd-devices-to-allocate",
    ALLOCATED_KEY,
];

/// A running extender; stops when dropped.
#[derive(Debug)]
pub struct ExtenderServer {
    /// `http://127.0.0.1:<port>`, the chart's `urlPrefix`.
    pub url: String,
    _stop: oneshot::Sender<()>,
}

/// Serves the emulator as HAMi's extender on a free loopback port, placing
/// with `policy` (HAMi's `--gpu-scheduler-policy`).
///
/// # Errors
/// When no port can be bound.
pub async fn serve(client: Client, policy: GpuPolicy) -> io::Result<ExtenderServer> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let (stop, mut stopped) = oneshot::channel();
    let shared = Arc::new((client, policy));
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = &mut stopped => return,
                accepted = listener.accept() => {
                    let Ok((stream, _)) = accepted else { continue };
                    let shared = Arc::clone(&shared);
                    tokio::spawn(async move {
                        let service = service_fn(move |req| answer(Arc::clone(&shared), req));
                        let _ = http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    });
                }
            }
        }
    });
    Ok(ExtenderServer { url, _stop: stop })
}

type Body = Full<Bytes>;

async fn answer(
    shared: Arc<(Client, GpuPolicy)>,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let (client, policy) = (&shared.0, shared.1);
    let path = req.uri().path().to_owned();
    let body = match req.into_body().collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(err) => return Ok(reply(400, &json!({"Error": err.to_string()}))),
    };
    let args: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let value = match path.as_str() {
        "/filter" => filter(client, policy, &args).await,
        "/bind" => json!({"Error": bind(client, &args).await.err().unwrap_or_default()}),
        "/healthz" => json!({}),
        _ => return Ok(reply(404, &json!({"Error": format!("no route {path}")}))),
    };
    Ok(reply(200, &value))
}

fn reply(code: u16, value: &Value) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(value.to_string())));
    *response.status_mut() = hyper::StatusCode::from_u16(code).unwrap_or_default();
    response
}

/// HAMi's Filter: `ExtenderFilterResult`.
async fn filter(client: &Client, policy: GpuPolicy, args: &Value) -> Value {
    let pod = &args["Pod"];
    let names: Vec<String> = args["NodeNames"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| n.as_str().map(str::to_owned))
        .collect();
    let (ns, name) = (
        pod["metadata"]["namespace"].as_str().unwrap_or("default"),
        pod["metadata"]["name"].as_str().unwrap_or_default(),
    );
    let pods = match others(client, ns, name).await {
        Ok(pods) => pods,
        Err(err) => return json!({"NodeNames": [], "Error": err}),
    };
    let mut failed = serde_json::Map::new();
    for node in &names {
        let register = register_of(client, node).await;
        let hami = HamiEmulator { node: node.clone() };
        match hami.place(register.as_deref(), &pods, pod, policy) {
            Ok(placement) if placement.grants.is_empty() => {
                return json!({"NodeNames": names, "FailedNodes": {}, "Error": ""});
            }
            Ok(placement) => {
                let now = unix_now();
                let written: serde_json::Map<String, Value> = hami
                    .bind_annotations(&placement.grants, now)
                    .into_iter()
                    .filter(|(k, _)| FILTER_KEYS.contains(k))
                    .map(|(k, v)| (k.to_owned(), Value::String(v)))
                    .collect();
                let patch = json!({"metadata": {"annotations": written}});
                if let Err(err) = patch_pod(client, ns, name, &patch).await {
                    return json!({"NodeNames": [], "Error": err});
                }
                return json!({"NodeNames": [node], "FailedNodes": failed, "Error": ""});
            }
            Err(err) => {
                failed.insert(node.clone(), Value::String(err.summary()));
            }
        }
    }
    json!({"NodeNames": [], "FailedNodes": failed, "Error": ""})
}

/// Every pod of the cluster but `ns/name`, as JSON (HAMi's usage).
async fn others(client: &Client, ns: &str, name: &str) -> Result<Vec<Value>, String> {
    let all: Api<Pod> = Api::all(client.clone());
    let listed = all
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("listing pods: {e}"))?;
    Ok(listed
        .items
        .iter()
        .filter(|p| {
            p.metadata.namespace.as_deref() != Some(ns) || p.metadata.name.as_deref() != Some(name)
        })
        .filter_map(|p| serde_json::to_value(p).ok())
        .collect())
}

async fn register_of(client: &Client, node: &str) -> Option<String> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node = nodes.get(node).await.ok()?;
    node.metadata.annotations?.get(REGISTER_KEY).cloned()
}

async fn patch_pod(client: &Client, ns: &str, name: &str, patch: &Value) -> Result<(), String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    pods.patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .map(drop)
        .map_err(|e| format!("patching pod {ns}/{name}: {e}"))
}

/// HAMi's Bind; the error for `ExtenderBindingResult`.
async fn bind(client: &Client, args: &Value) -> Result<(), String> {
    let text = |k: &str| args[k].as_str().unwrap_or_default().to_owned();
    let (ns, name, node) = (text("PodNamespace"), text("PodName"), text("Node"));
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let pod = pods
        .get(&name)
        .await
        .map_err(|e| format!("reading pod {ns}/{name}: {e}"))?;
    let requests = request::requests_of(&pod).map_err(|e| e.to_string())?;
    let now = unix_now();
    let locked = requests.kept.iter().any(|r| !r.init);
    if locked {
        lock(client, &node, &ns, &name, now).await?;
    }
    let phase = json!({"metadata": {"annotations": {
        "hami.io/bind-phase": "allocating", "hami.io/bind-time": now.to_string()}}});
    let binding = json!({"apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": name, "namespace": ns},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node}});
    let bound = async {
        patch_pod(client, &ns, &name, &phase).await?;
        pods.create_subresource::<Value, Value>("binding", &name, &PostParams::default(), &binding)
            .await
            .map(drop)
            .map_err(|e| format!("binding pod {ns}/{name} to {node}: {e}"))
    };
    let result = bound.await;
    if result.is_err() && locked {
        let release = json!({"metadata": {"annotations": {LOCK_KEY: null}}});
        let nodes: Api<Node> = Api::all(client.clone());
        let _ = nodes
            .patch(&node, &PatchParams::default(), &Patch::Merge(&release))
            .await;
    }
    result
}

/// Takes the node lock for `ns/name`, waiting while another pod holds it
/// (a lock older than 5 minutes is taken over, as HAMi does).
async fn lock(client: &Client, node: &str, ns: &str, name: &str, now: u64) -> Result<(), String> {
    let nodes: Api<Node> = Api::all(client.clone());
    let mine = format!("{},{ns},{name}", rfc3339(now));
    let start = tokio::time::Instant::now();
    loop {
        let current = nodes
            .get(node)
            .await
            .map_err(|e| format!("reading node {node}: {e}"))?;
        let held = current
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(LOCK_KEY))
            .filter(|v| !v.ends_with(&format!(",{ns},{name}")));
        if held.is_none() {
            let patch = json!({"metadata": {"annotations": {LOCK_KEY: mine},
                "resourceVersion": current.metadata.resource_version}});
            if nodes
                .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .is_ok()
            {
                return Ok(());
            }
        }
        if start.elapsed() > LOCK_WAIT {
            return Err(format!(
                "node {node} stays locked by {}",
                held.map_or("someone", String::as_str)
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
