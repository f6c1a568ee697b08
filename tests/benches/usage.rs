//! What a scrape of per-pod usage costs on a node of 64 partitions and 110
//! pods (issue 23), each figure against its floor in the same run:
//!
//! - amd-gpud's read (`gpud::testing::usage::read`: the KFD process directory, each
//!   process's cgroup and `vram_<gpu_id>` files, each pod's `dmem.current`,
//!   each GPU's sysfs values, attribution and sums) against the floor of
//!   opening and reading the same files once from a list made beforehand;
//! - the plugin's part of a scrape (joining the answer with 110 pods' grants,
//!   setting every series, encoding `/metrics`) against encoding the same
//!   registry alone.
//!
//! The builder's `mi300x-8-cpx` node (8 GPUs, 64 KFD partitions) with 110
//! KFD processes, one per pod, each showing `vram_<gpu_id>` for all 64
//! partitions (KFD makes one per GPU the process can see), VRAM on one.
//! Run: `cargo bench -p tests --bench usage`. Prints a Markdown table for
//! docs/benchmarks.md.

use std::{collections::BTreeMap, fs, io::Read, path::PathBuf, sync::Arc, time::Instant};

use gpud::testing::usage;
use ipc::types::{GpuInfo, PartitionInfo};
use k8s_openapi::api::core::v1::Pod;
use plugin::testing::{
    inventory::Snapshot,
    metrics::{Metrics, Usage as Grants, hami::Inputs},
};

#[path = "shared/usage_node.rs"]
mod usage_node;
use usage_node::{Node, PODS, ROUNDS, Samples, WARMUP, cid, uid};

fn read_each(files: &[PathBuf], buf: &mut Vec<u8>) -> std::io::Result<()> {
    for file in files {
        buf.clear();
        fs::File::open(file)?.read_to_end(buf)?;
    }
    Ok(())
}

/// 8 GPUs of 8 partitions each, whose gpu_ids are `ids` in order.
fn snapshot(gpus: &[GpuInfo], ids: &[u64]) -> Snapshot {
    let per = ids.len() / gpus.len();
    let bdfs: Vec<&String> = gpus.iter().map(|g| &g.bdf).collect();
    let partitions = bdfs
        .iter()
        .enumerate()
        .map(|(n, bdf)| {
            let parts = ids[n * per..(n + 1) * per]
                .iter()
                .enumerate()
                .map(|(i, &gpu_id)| PartitionInfo {
                    index: u32::try_from(i).unwrap_or(0),
                    kfd_node: 0,
                    gpu_id,
                    render_minor: 128,
                    card_minor: -1,
                    bdf: (*bdf).clone(),
                    compute_units: 38,
                    num_xcc: 1,
                    vram_bytes: 24 << 30,
                    xcp: -1,
                    gpu: ipc::gpu_path(bdf),
                    health: ipc::HEALTHY.into(),
                    restore_props: BTreeMap::new(),
                    restore_links: vec![],
                    health_reason: String::new(),
                })
                .collect();
            ((*bdf).clone(), parts)
        })
        .collect();
    Snapshot::from_gpud(gpus, partitions, ipc::DmemBackend::default())
}

/// The node's 8 GPUs, at `bdfs`.
fn gpus(bdfs: &[String]) -> Vec<GpuInfo> {
    bdfs.iter()
        .enumerate()
        .map(|(n, bdf)| GpuInfo {
            bdf: bdf.clone(),
            rocr_uuid: format!("GPU-{n:016x}"),
            unique_id: n.to_string(),
            gfx: "gfx942".into(),
            compute_units: 304,
            cus_per_wgp: 1,
            vram_bytes: 192 << 30,
            numa_node: 0,
            market_name: "AMD Instinct MI300X".into(),
            amdsmi_uuid: String::new(),
            published_id: format!("GPU-{n:016x}"),
            vendor_id: 0x1002,
            device_id: 0x74a1,
            compute_partition: "CPX".into(),
            memory_partition: "NPS1".into(),
            available_compute_partitions: vec![],
            health: ipc::HEALTHY.into(),
            health_reason: String::new(),
            partitions: vec![],
            links: vec![],
            partition_profiles: vec![],
        })
        .collect()
}

/// Pod `i`: one container `c` granted 1 GiB and 38 CUs of the GPU its
/// process uses, running with the runtime ID its cgroup names.
fn pods(gpus: &[GpuInfo], ids: &[u64]) -> anyhow::Result<Vec<Arc<Pod>>> {
    let per = ids.len() / gpus.len();
    (0..PODS)
        .map(|i| {
            let gpu = &gpus[(i % ids.len()) / per];
            let id = &gpu.published_id;
            let value = serde_json::json!({
                "metadata": {"name": format!("pod-{i}"), "namespace": "ml", "uid": uid(i),
                    "annotations": {
                        "hami.io/amd-devices-allocated": format!("{id},AMD,1024,38:;"),
                        "hami.io/amd-cu-allocated": format!("{{\"{id}\":\"0-37\"}}"),
                    }},
                "spec": {"containers": [{"name": "c"}]},
                "status": {"phase": "Running", "containerStatuses": [{"name": "c",
                    "containerID": format!("containerd://{}", cid(i)), "image": "", "imageID": "",
                    "ready": true, "restartCount": 0}]}
            });
            Ok(Arc::new(serde_json::from_value(value)?))
        })
        .collect()
}

fn main() -> anyhow::Result<()> {
    let node = Node::build(None)?;
    let Node {
        files,
        paths,
        layouts,
        targets,
        ..
    } = &node;
    let mut gpud = Samples::new();
    let mut buf = Vec::new();
    let mut reading = usage::read(paths, layouts, targets);
    for round in 0..ROUNDS + WARMUP {
        let t = Instant::now();
        read_each(files, &mut buf)?;
        let floor = t.elapsed();
        let t = Instant::now();
        reading = usage::read(paths, layouts, targets);
        let work = t.elapsed();
        gpud.push(round, floor, work);
    }
    anyhow::ensure!(reading.usage.containers.len() == PODS && reading.outside == 0);
    let (bdfs, ids) = (&targets.gpus, &targets.gpu_ids);
    let gpus = gpus(bdfs);
    let snapshot = snapshot(&gpus, ids);
    let pods = pods(&gpus, ids)?;
    let (plugin, text) = time_plugin(&snapshot, &pods, &reading.usage)?;
    let used = text
        .lines()
        .filter(|l| l.starts_with("hami_vgpu_memory_used_bytes{"))
        .count();
    anyhow::ensure!(used == PODS, "{used} used series");
    println!(
        "| measure (mi300x-8-cpx: 64 partitions, {PODS} pods; {} files; {ROUNDS} interleaved rounds) | median | p90 |",
        files.len()
    );
    println!("|---|---|---|");
    gpud.row(
        "open + read each file once",
        "amd-gpud `usage::read` (walk, read, attribute, sum)",
    );
    plugin.row(
        "encode `/metrics` alone",
        "the plugin's scrape: join 110 pods' grants with the usage, set every series, encode",
    );
    println!("| `/metrics` size | {} KiB | |", text.len() / 1024);
    Ok(())
}

/// The plugin's scrape against encoding alone; returns the times and the
/// last `/metrics`.
fn time_plugin(
    snapshot: &Snapshot,
    pods: &[Arc<Pod>],
    usage: &ipc::usage::Usage,
) -> anyhow::Result<(Samples, String)> {
    let metrics = Metrics::new();
    let mut plugin = Samples::new();
    let mut text = String::new();
    for round in 0..ROUNDS + WARMUP {
        let t = Instant::now();
        metrics.observe_gpus(snapshot, 0, &Grants::new());
        metrics.observe_usage(&Inputs {
            node: "node-1",
            snapshot,
            pods,
            usage: Some(usage),
        });
        text = metrics.encode()?;
        let work = t.elapsed();
        let t = Instant::now();
        let again = metrics.encode()?;
        let floor = t.elapsed();
        anyhow::ensure!(again.len() == text.len());
        plugin.push(round, floor, work);
    }
    Ok((plugin, text))
}
