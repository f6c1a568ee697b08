//! HAMi's Allocate through the fake kubelet with the plugin on the real
//! kube-apiserver (etcd behind it, the chart's RBAC and admission policy on,
//! the token of the chart's ServiceAccount bound to the plugin's pod), next
//! to the floor from the same run: the same two PATCH requests (the pod's
//! annotations, the node lock's release guarded by resourceVersion) sent
//! directly to the same API server with a token of the same ServiceAccount,
//! bound to a pod on a node of its own that the plugin does not watch.
//! Each Allocate and each floor follows the same pause (the watches deliver
//! HAMi's writes). The API requests per Allocate are the plugin's requests in
//! the API server's audit log, the lock's release included.
//!
//! Run (as root: the private bus loads the shipped policy), after
//! `tests/cluster/build.sh`: `cargo bench -p tests --bench allocate_real`.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use tests::{
    cluster::{
        ADMIN_TOKEN, RealCluster,
        chart::{NAMESPACE, RELEASE},
        setup,
    },
    kubelet::FakeKubelet,
    stack,
};

#[path = "shared/allocate.rs"]
mod shared;

const NODE: &str = "bench-node";
/// The floor's node: the same account's writes, no plugin watching them.
const FLOOR_NODE: &str = "floor-node";
const ADMISSIONS: usize = 300;
const LIVE_PODS: usize = 110;
const CUS: u32 = 19;
/// Longer than the fake API server's: etcd and the watch cache lie between
/// a write and its watch event.
const IDLE: Duration = Duration::from_millis(100);
const LOCK: &str = "hami.io/mutex.lock";

fn main() -> anyhow::Result<()> {
    let fake_node = Path::new(env!("CARGO_BIN_EXE_fake-node"));
    let node = stack::bench_node(fake_node, "mi300x-8-spx", &[])?;
    let cluster = RealCluster::start()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let report = rt.block_on(run(&cluster, &node, fake_node))?;
    print_report(&report);
    Ok(())
}

struct Report {
    allocate: Vec<Duration>,
    /// The pod's PATCH alone: what kubelet's answer waits for.
    floor_pod: Vec<Duration>,
    /// Both PATCHes: the pod's and the lock's release.
    floor: Vec<Duration>,
    reads: usize,
    writes: usize,
}

async fn client(cluster: &RealCluster, user: &str, token: &str) -> anyhow::Result<Client> {
    Ok(Client::try_from(cluster.client_config(user, token).await?)?)
}

async fn run(
    cluster: &RealCluster,
    node: &stack::BenchNode,
    fake_node: &Path,
) -> anyhow::Result<Report> {
    let admin = client(cluster, "admin", ADMIN_TOKEN).await?;
    setup::add_node(&admin, NODE).await?;
    setup::add_node(&admin, FLOOR_NODE).await?;
    setup::apply_chart(cluster)?;
    setup::add_pod(cluster, NAMESPACE, "plugin", NODE, RELEASE)?;
    setup::add_pod(cluster, NAMESPACE, "floor", FLOOR_NODE, RELEASE)?;
    let token = cluster.pod_token(NAMESPACE, RELEASE, "plugin")?;
    let floor = client(
        cluster,
        "floor",
        &cluster.pod_token(NAMESPACE, RELEASE, "floor")?,
    )
    .await?;
    let kubelet = FakeKubelet::start().await?;
    let kubeconfig = cluster.kubeconfig("plugin", &token)?;
    let hook = shared::hook_dir(node.root.path())?;
    let args = shared::plugin_args(&kubeconfig, NODE, &hook);
    let _plugin = stack::plugin(fake_node, &node.bus, kubelet.dir(), &args)?;
    kubelet
        .wait_devices(Duration::from_secs(60), |d| d.len() == 80)
        .await
        .map_err(anyhow::Error::msg)?;
    let gpus = registered_gpus(&admin).await?;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let floor_pod = bound_pod("floor-pod", FLOOR_NODE, &gpus[0], 0)?;
    pods.create(&PostParams::default(), &floor_pod).await?;
    let mut report = Report {
        allocate: Vec::with_capacity(ADMISSIONS),
        floor_pod: Vec::with_capacity(ADMISSIONS),
        floor: Vec::with_capacity(ADMISSIONS),
        reads: 0,
        writes: 0,
    };
    for i in 0..ADMISSIONS {
        admission(cluster, &admin, &kubelet, &gpus, i, &mut report).await?;
        lock(&admin, FLOOR_NODE, "floor-pod").await?;
        let (pod_patch, both) = two_patches(&floor, i).await?;
        report.floor_pod.push(pod_patch);
        report.floor.push(both);
        if i >= LIVE_PODS {
            let old = format!("pod-{}", i - LIVE_PODS);
            pods.delete(&old, &DeleteParams::default().grace_period(0))
                .await?; // no kubelet confirms
        }
    }
    Ok(report)
}

/// One pod bound by "HAMi", its Allocate timed, the plugin's requests from
/// the lock to its release counted.
async fn admission(
    cluster: &RealCluster,
    admin: &Client,
    kubelet: &FakeKubelet,
    gpus: &[(String, String)],
    i: usize,
    report: &mut Report,
) -> anyhow::Result<()> {
    let gpu = &gpus[i % gpus.len()];
    let name = format!("pod-{i}");
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    pods.create(&PostParams::default(), &bound_pod(&name, NODE, gpu, i)?)
        .await?;
    lock(admin, NODE, &name).await?;
    tokio::time::sleep(IDLE).await; // the watches deliver
    let offset = cluster.audit_offset();
    let t = Instant::now();
    let answer = kubelet
        .allocate(vec![format!("{}#{}", gpu.0, i / gpus.len() % 10)])
        .await
        .map_err(|s| anyhow::anyhow!("Allocate of {name}: {}", s.message()))?;
    report.allocate.push(t.elapsed());
    anyhow::ensure!(
        answer.envs.contains_key("HSA_CU_MASK"),
        "{name}: no CU mask"
    );
    wait_unlocked(admin).await?;
    // The release's audit event is written as its answer goes out, which
    // may be just after the GET above saw the lock gone.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let (reads, writes) = plugin_requests(&cluster.audit_events_since(offset));
    report.reads += reads;
    report.writes += writes;
    Ok(())
}

/// (reads, writes) the plugin's own pod token made, watches left out.
fn plugin_requests(events: &[Value]) -> (usize, usize) {
    let ours = events.iter().filter(|e| {
        e["stage"] == "ResponseComplete"
            && e["verb"] != "watch"
            && e["user"]["extra"]["authentication.kubernetes.io/pod-name"][0] == "plugin"
    });
    ours.fold((0, 0), |(r, w), e| match e["verb"].as_str() {
        Some("get" | "list") => (r + 1, w),
        _ => (r, w + 1),
    })
}

/// The floor: the pod patch and the lock release the plugin sends, timed
/// after the same pause; (the pod's patch, both).
async fn two_patches(client: &Client, i: usize) -> anyhow::Result<(Duration, Duration)> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let nodes: Api<Node> = Api::all(client.clone());
    let node = nodes.get(FLOOR_NODE).await?; // not timed: the plugin reads it from its cache
    tokio::time::sleep(IDLE).await;
    let t = Instant::now();
    let body = json!({"metadata": {"annotations": {
        "hami.io/amd-devices-to-allocate": ";",
        "hami.io/amd-cu-allocated": format!("{{\"x\":\"{i}\"}}"),
        "hami.io/bind-phase": "success",
    }}});
    pods.patch("floor-pod", &PatchParams::default(), &Patch::Merge(&body))
        .await?;
    let pod_patch = t.elapsed();
    let body = json!({"metadata": {
        "annotations": {LOCK: null},
        "resourceVersion": node.resource_version(),
    }});
    nodes
        .patch(FLOOR_NODE, &PatchParams::default(), &Patch::Merge(&body))
        .await?;
    Ok((pod_patch, t.elapsed()))
}

async fn lock(admin: &Client, node: &str, pod: &str) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(admin.clone());
    let value = format!("2026-11-29T08:00:00Z,default,{pod}");
    let body = json!({"metadata": {"annotations": {LOCK: value}}});
    nodes
        .patch(node, &PatchParams::default(), &Patch::Merge(&body))
        .await?;
    Ok(())
}

async fn wait_unlocked(admin: &Client) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(admin.clone());
    for _ in 0..1000 {
        if !nodes.get(NODE).await?.annotations().contains_key(LOCK) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    anyhow::bail!("the plugin did not release the lock of {NODE}")
}

/// (id, type) of every registered GPU, from the node's register annotation.
async fn registered_gpus(admin: &Client) -> anyhow::Result<Vec<(String, String)>> {
    let nodes: Api<Node> = Api::all(admin.clone());
    let start = Instant::now();
    loop {
        let node = nodes.get(NODE).await?;
        let value = node.annotations().get("hami.io/node-amd-register");
        if let Some(gpus) = value.and_then(|v| shared::gpus_of(v)) {
            return Ok(gpus);
        }
        anyhow::ensure!(
            start.elapsed() < Duration::from_secs(60),
            "the plugin did not register"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A pod as HAMi leaves it after Bind (created bound, as the scheduler's
/// binding would leave it).
fn bound_pod(name: &str, node: &str, gpu: &(String, String), i: usize) -> anyhow::Result<Pod> {
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": "default",
            "labels": {"app": "trainer", "team": "ml"},
            "annotations": shared::hami_annotations(node, gpu, i, CUS)},
        "spec": {
            "nodeName": node, "schedulerName": "hami-scheduler",
            "containers": [{"name": "main", "image": "rocm/pytorch:rocm6.4_ubuntu22.04",
                "resources": {"limits": {"amd.com/gpu": "1", "amd.com/gpucores": "6",
                    "amd.com/gpumem": "12288"}}}],
        },
    });
    Ok(serde_json::from_value(pod)?)
}

fn print_report(report: &Report) {
    let (ms, p50_p99) = (shared::ms, shared::p50_p99);
    let (a50, a99) = p50_p99(&report.allocate);
    let (p50, p99) = p50_p99(&report.floor_pod);
    let (f50, f99) = p50_p99(&report.floor);
    println!("| measure ({ADMISSIONS} admissions, real kube-apiserver v1.36.3) | p50 | p99 |");
    println!("|---|---|---|");
    let rows = [
        (
            "floor: the pod's PATCH alone (what the answer waits for), same account, same pause",
            p50,
            p99,
        ),
        (
            "floor: both PATCHes (the pod's, the lock's release)",
            f50,
            f99,
        ),
        (
            "Allocate through the fake kubelet (the release follows the answer)",
            a50,
            a99,
        ),
    ];
    for (what, p50, p99) in rows {
        println!("| {what} | {} | {} |", ms(p50), ms(p99));
    }
    let ratio = |a: Duration, f: Duration| a.as_secs_f64() / f.as_secs_f64();
    println!(
        "| ratio to the pod's PATCH alone | {:.2} | {:.2} |",
        ratio(a50, p50),
        ratio(a99, p99)
    );
    #[allow(clippy::cast_precision_loss)]
    let per = |n: usize| n as f64 / ADMISSIONS as f64;
    println!(
        "\nThe plugin's API requests per Allocate (audit log): {:.2} reads, {:.2} writes \
         ({} and {} in total)",
        per(report.reads),
        per(report.writes),
        report.reads,
        report.writes
    );
}
