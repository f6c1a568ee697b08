//! HAMi's Allocate through the fake kubelet, 1,000 pod admissions, next to
//! the floor from the same run: the same two PATCH requests (the pod's
//! annotations, the node lock's release guarded by resourceVersion) sent
//! directly to the same fake API server with kube-rs. Each Allocate follows
//! a 40 ms pause (the watches deliver HAMi's writes), so every process on the
//! path starts from idle; the floor is timed after the same pause, and once
//! more right after an untimed GET (warm), for reference. Also the API requests
//! per Allocate and the plugin's memory with 110 pods cached on the 8-GPU
//! node (80 devices).
//!
//! Run (as root: the private bus loads the shipped policy):
//! `cargo bench -p tests --bench allocate`.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Api, Client, ResourceExt,
    api::{Patch, PatchParams},
};
use serde_json::{Value, json};
use tests::{
    apiserver::{FakeApiServer, Kind},
    kubelet::FakeKubelet,
    stack,
};

#[path = "shared/allocate.rs"]
mod shared;

const NODE: &str = "bench-node";
const ADMISSIONS: usize = 1000;
const LIVE_PODS: usize = 110;
/// A sixteenth of an MI300X: 110 live pods fit on 8 GPUs.
const CUS: u32 = 19;
/// The pause before each timed Allocate (the watches deliver HAMi's writes)
/// and, likewise, before each timed floor: both start from idle processes.
const IDLE: Duration = Duration::from_millis(40);

fn main() -> anyhow::Result<()> {
    let fake_node = Path::new(env!("CARGO_BIN_EXE_fake-node"));
    let node = stack::bench_node(fake_node, "mi300x-8-spx", &[])?;
    let (root, bus) = (&node.root, &node.bus);
    let api = FakeApiServer::start()?;
    api.put_node(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}));
    api.put_node(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "floor"}}));
    let kubeconfig = api.kubeconfig(root.path());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let kubelet = rt.block_on(FakeKubelet::start())?;
    let args = shared::plugin_args(&kubeconfig, NODE, &shared::hook_dir(root.path())?);
    let plugin = stack::plugin(fake_node, bus, kubelet.dir(), &args)?;
    rt.block_on(kubelet.wait_devices(Duration::from_secs(30), |d| d.len() == 80))
        .map_err(anyhow::Error::msg)?;
    let gpus = registered_gpus(&api)?;
    let client = {
        let _guard = rt.enter();
        Client::try_from(api.client_config())?
    };
    let report = rt.block_on(admissions(&api, &kubelet, &client, &gpus))?;
    let (rss, hwm) = memory_of(plugin.0.id())?;
    print_report(&report, rss, hwm);
    Ok(())
}

/// (id, type) of every registered GPU, from the node's register annotation.
fn registered_gpus(api: &FakeApiServer) -> anyhow::Result<Vec<(String, String)>> {
    let start = Instant::now();
    loop {
        let node = api.get(Kind::Node, "", NODE);
        let value = node
            .as_ref()
            .and_then(|n| n["metadata"]["annotations"]["hami.io/node-amd-register"].as_str());
        if let Some(gpus) = value.and_then(shared::gpus_of) {
            return Ok(gpus);
        }
        anyhow::ensure!(
            start.elapsed() < Duration::from_secs(30),
            "the plugin did not register"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

struct Report {
    allocate: Vec<Duration>,
    floor: Vec<Duration>,
    warm_floor: Vec<Duration>,
    reads: u64,
    writes: u64,
}

async fn admissions(
    api: &FakeApiServer,
    kubelet: &FakeKubelet,
    client: &Client,
    gpus: &[(String, String)],
) -> anyhow::Result<Report> {
    api.put_pod(bound_pod("floor-pod", "floor", &gpus[0], 0));
    let mut report = Report {
        allocate: Vec::with_capacity(ADMISSIONS),
        floor: Vec::with_capacity(ADMISSIONS),
        warm_floor: Vec::with_capacity(ADMISSIONS),
        reads: 0,
        writes: 0,
    };
    for i in 0..ADMISSIONS {
        let gpu = &gpus[i % gpus.len()];
        let name = format!("pod-{i}");
        api.put_pod(bound_pod(&name, NODE, gpu, i));
        lock_node(api, NODE, &name)?;
        tokio::time::sleep(IDLE).await; // the watches deliver
        let before = api.requests();
        let t = Instant::now();
        let answer = kubelet
            .allocate(vec![format!("{}#{}", gpu.0, i / gpus.len() % 10)])
            .await
            .map_err(|s| anyhow::anyhow!("Allocate of {name}: {}", s.message()))?;
        report.allocate.push(t.elapsed());
        // The plugin releases the node lock in the background, after it has
        // answered; count that write too (not timed).
        wait_unlocked(api, NODE).await?;
        let after = api.requests();
        report.reads += (after.get + after.list) - (before.get + before.list);
        report.writes += after.patch - before.patch;
        anyhow::ensure!(
            answer.envs.contains_key("HSA_CU_MASK"),
            "{name}: no CU mask"
        );
        lock_node(api, "floor", "floor-pod")?;
        report.floor.push(two_patches(client, i, IDLE).await?);
        lock_node(api, "floor", "floor-pod")?;
        report
            .warm_floor
            .push(two_patches(client, i, Duration::ZERO).await?);
        if i >= LIVE_PODS {
            api.remove(Kind::Pod, "default", &format!("pod-{}", i - LIVE_PODS));
        }
    }
    Ok(report)
}

/// The floor: the pod patch and the lock release the plugin sends, timed
/// after `idle` (zero: right after an untimed GET on the same client).
async fn two_patches(client: &Client, i: usize, idle: Duration) -> anyhow::Result<Duration> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let nodes: Api<Node> = Api::all(client.clone());
    let node = nodes.get("floor").await?; // not timed: the plugin reads it from its cache
    tokio::time::sleep(idle).await;
    let t = Instant::now();
    let body = json!({"metadata": {"annotations": {
        "hami.io/amd-devices-to-allocate": ";",
        "hami.io/amd-cu-allocated": format!("{{\"x\":\"{i}\"}}"),
        "hami.io/bind-phase": "success",
    }}});
    pods.patch("floor-pod", &PatchParams::default(), &Patch::Merge(&body))
        .await?;
    let body = json!({"metadata": {
        "annotations": {"hami.io/mutex.lock": null},
        "resourceVersion": node.resource_version(),
    }});
    nodes
        .patch("floor", &PatchParams::default(), &Patch::Merge(&body))
        .await?;
    Ok(t.elapsed())
}

async fn wait_unlocked(api: &FakeApiServer, node: &str) -> anyhow::Result<()> {
    for _ in 0..500 {
        let value = api.get(Kind::Node, "", node);
        let locked =
            value.is_some_and(|n| !n["metadata"]["annotations"]["hami.io/mutex.lock"].is_null());
        if !locked {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    anyhow::bail!("the plugin did not release the lock of {node}")
}

fn lock_node(api: &FakeApiServer, node: &str, pod: &str) -> anyhow::Result<()> {
    let mut value = api
        .get(Kind::Node, "", node)
        .ok_or_else(|| anyhow::anyhow!("no node {node}"))?;
    value["metadata"]["annotations"]["hami.io/mutex.lock"] =
        json!(format!("2026-11-29T08:00:00Z,default,{pod}"));
    api.put_node(value);
    Ok(())
}

/// A pod as HAMi leaves it after Bind, with the bulk of a real pod (labels,
/// owner, env, mounts, conditions) so that the cache holds realistic objects.
fn bound_pod(name: &str, node: &str, gpu: &(String, String), i: usize) -> Value {
    let env: Vec<Value> = (0..12)
        .map(|k| json!({"name": format!("SETTING_{k}"), "value": format!("value-{k}-{i}")}))
        .collect();
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": "default",
            "labels": {"app": "trainer", "pod-template-hash": "6d8f7c9b5", "team": "ml"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                "name": "trainer-6d8f7c9b5", "uid": "9a1d2c3e-0000-4000-8000-000000000001",
                "controller": true, "blockOwnerDeletion": true}],
            "annotations": shared::hami_annotations(node, gpu, i, CUS)},
        "spec": {
            "nodeName": node, "schedulerName": "hami-scheduler",
            "containers": [{"name": "main", "image": "rocm/pytorch:rocm6.4_ubuntu22.04",
                "command": ["python3", "train.py", "--epochs", "10"], "env": env,
                "resources": {"limits": {"amd.com/gpu": "1", "amd.com/gpucores": "6",
                    "amd.com/gpumem": "12288"}},
                "volumeMounts": [{"name": "data", "mountPath": "/data"},
                    {"name": "kube-api-access", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true}]}],
            "volumes": [{"name": "data", "emptyDir": {}},
                {"name": "kube-api-access", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}],
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}]
        },
        "status": {"phase": "Pending", "qosClass": "Burstable", "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-11-29T08:00:00Z"}]}
    })
}

/// (VmRSS, VmHWM) of `pid` in KiB.
fn memory_of(pid: u32) -> anyhow::Result<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    Ok((field("VmRSS:"), field("VmHWM:")))
}

fn print_report(report: &Report, rss: u64, hwm: u64) {
    let (ms, p50_p99) = (shared::ms, shared::p50_p99);
    let (a50, a99) = p50_p99(&report.allocate);
    let (f50, f99) = p50_p99(&report.floor);
    let (w50, w99) = p50_p99(&report.warm_floor);
    let ratio = |a: Duration, f: Duration| a.as_secs_f64() / f.as_secs_f64();
    println!(
        "| measure ({ADMISSIONS} admissions, {LIVE_PODS} pods cached, 80 devices) | p50 | p99 |"
    );
    println!("|---|---|---|");
    let rows = [
        (
            "floor: the same two PATCHes sent directly, after the same idle pause",
            f50,
            f99,
        ),
        (
            "Allocate through the fake kubelet, after the idle pause",
            a50,
            a99,
        ),
        (
            "the two PATCHes right after an untimed GET (warm client, no pause)",
            w50,
            w99,
        ),
    ];
    for (what, p50, p99) in rows {
        println!("| {what} | {} | {} |", ms(p50), ms(p99));
    }
    println!(
        "| ratio to the floor (target at p99 <= 3.0) | {:.2} | {:.2} |",
        ratio(a50, f50),
        ratio(a99, f99)
    );
    println!(
        "| ratio to the warm PATCHes | {:.2} | {:.2} |",
        ratio(a50, w50),
        ratio(a99, w99)
    );
    let n = u64::try_from(ADMISSIONS).unwrap_or(u64::MAX);
    println!(
        "\nAPI requests per Allocate: {:.2} reads, {:.2} writes ({} and {} in total)",
        report.reads as f64 / n as f64,
        report.writes as f64 / n as f64,
        report.reads,
        report.writes
    );
    println!(
        "plugin memory with {LIVE_PODS} pods cached: VmRSS {:.1} MiB, VmHWM {:.1} MiB (target <= 24 MiB)",
        rss as f64 / 1024.0,
        hwm as f64 / 1024.0
    );
}
