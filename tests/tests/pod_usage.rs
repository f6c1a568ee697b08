//! What each pod really uses, end to end: amd-gpud reads fake KFD process
//! files (`vram_<gpu_id>`), the processes' cgroups and the pod's
//! `dmem.current` on the fake host; the plugin joins `GetUsage` with the
//! grants HAMi made and exports HAMi's series. A pod's usage shows under its
//! namespace, pod and container; a process outside every pod cgroup is
//! never counted; the series go when the pod ends. HAMi's dashboard finds
//! every node-side series it queries, with the labels it reads, and the
//! node exports exactly the HAMi series AMD can fill. With AMD SMI loaded, the
//! per-GPU series carry its figures where it has them and sysfs's where it
//! has none. Needs root.

// An integration-test file is itself the test module, and a failed unwrap is a
// failed test here.
#![allow(clippy::tests_outside_test_module, clippy::unwrap_used)]

mod common;

use std::{
    path::Path,
    time::{Duration, Instant},
};

use common::world::{Setup, World, schedule, world, world_with_amdsmi};
use prometheus_parse::{Scrape, Value};
use tests::apiserver::Kind;

const MIB: u64 = 1024 * 1024;

/// The node-side series HAMi's Grafana dashboard queries
/// (Project-HAMi/HAMi:dashboards/hami-vgpu-dashboard.json), with the labels
/// its queries filter, join or group by and its legends print.
const DASHBOARD: [(&str, &[&str]); 5] = [
    (
        "hami_host_gpu_memory_used_bytes",
        &["device_uuid", "device_type", "device_index"],
    ),
    (
        "hami_host_gpu_utilization_ratio",
        &["device_uuid", "device_type", "device_index"],
    ),
    (
        "hami_vgpu_memory_used_bytes",
        &["namespace", "pod", "container", "vdevice_index"],
    ),
    (
        "hami_vgpu_memory_limit_bytes",
        &["namespace", "pod", "container", "vdevice_index"],
    ),
    (
        "hami_container_device_utilization_ratio",
        &["namespace", "pod", "container", "vdevice_index"],
    ),
];
const CID: &str = "4e5d6c7b8a9f0e1d2c3b4a5f6e7d8c9b0a1f2e3d4c5b6a7f8e9d0c1b2a3f4e5d";

#[test]
fn hami_series_show_what_each_pod_uses() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(Duration::from_secs(150), scenario());
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// A KFD process `pid` in cgroup `cgroup` holding `bytes` on `gpu_id`.
fn process(root: &Path, pid: u32, cgroup: &str, gpu_id: u64, bytes: u64) {
    write(
        &root.join(format!("proc/{pid}/cgroup")),
        &format!("0::{cgroup}\n"),
    );
    let dir = root.join(format!("sys/class/kfd/kfd/proc/{pid}"));
    write(&dir.join(format!("vram_{gpu_id}")), &format!("{bytes}\n"));
}

/// KFD's count of the CUs process `pid`'s waves occupy on `gpu_id`.
fn occupancy(root: &Path, pid: u32, gpu_id: u64, cus: u32) {
    let dir = root.join(format!("sys/class/kfd/kfd/proc/{pid}"));
    write(
        &dir.join(format!("stats_{gpu_id}/cu_occupancy")),
        &format!("{cus}\n"),
    );
}

#[test]
fn host_series_carry_amdsmi_figures_where_it_has_them() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(Duration::from_secs(150), amdsmi_scenario());
}

/// GPU 0's PCI address and its (only, SPX) partition's KFD gpu_id.
async fn gpu0(w: &World) -> (String, u64) {
    gpu_at(w, 0).await
}

/// The PCI address of the GPU registered `index`-th, and its first
/// partition's KFD gpu_id.
async fn gpu_at(w: &World, index: usize) -> (String, u64) {
    let conn = zbus::connection::Builder::address(w.bus.address.as_str())
        .unwrap()
        .build()
        .await
        .unwrap();
    let node = ipc::proxy::NodeProxy::new(&conn).await.unwrap();
    for path in node.gpus().await.unwrap() {
        let gpu = ipc::proxy::read_gpu(&conn, &path.as_ref()).await.unwrap();
        if gpu.published_id == w.gpus[index].id {
            let part = ipc::proxy::read_partition(&conn, &gpu.partitions[0].as_ref())
                .await
                .unwrap();
            return (gpu.bdf, part.gpu_id);
        }
    }
    panic!("no GPU {}", w.gpus[index].id);
}

/// The fake AMD SMI reports 5000 MiB used and 17 % activity on every GPU
/// but the last by PCI address (which it answers `NOT_SUPPORTED` for);
/// sysfs says otherwise on both GPUs looked at.
async fn amdsmi_scenario() {
    let setup = Setup {
        fixture: "mi300x-8-spx",
        devices: 80,
        gpud_args: &[],
        plugin_args: &[],
        prepare: &|_| {},
    };
    let w = world_with_amdsmi(&setup, &|smi| {
        let mut processors: Vec<&mut serde_json::Value> = smi["sockets"]
            .as_array_mut()
            .unwrap()
            .iter_mut()
            .flat_map(|s| s["processors"].as_array_mut().unwrap().iter_mut())
            .collect();
        processors.sort_by_key(|p| p["bdf"].as_str().unwrap().to_owned());
        let last = processors.last().unwrap()["bdf"].clone();
        for p in processors.into_iter().filter(|p| p["bdf"] != last) {
            p["gfx_activity"] = 17.into();
            p["vram_used_mib"] = 5000.into();
        }
    })
    .await;
    let last = w.gpus.len() - 1;
    let ((bdf0, _), (bdf_last, _)) = (gpu_at(&w, 0).await, gpu_at(&w, last).await);
    for (bdf, gib, busy) in [(&bdf0, 9u64, "63"), (&bdf_last, 7, "41")] {
        let pci = w.root().join(format!("sys/bus/pci/devices/{bdf}"));
        write(&pci.join("mem_info_vram_used"), &format!("{}\n", gib << 30));
        write(&pci.join("gpu_busy_percent"), &format!("{busy}\n"));
    }
    let host = |index: usize| {
        [
            ("device_uuid", w.gpus[index].id.clone()),
            ("node", common::world::NODE.to_owned()),
            ("device_index", index.to_string()),
        ]
    };
    let figures = |s: &Scrape, index: usize| {
        let labels = host(index);
        let labels: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
        (
            value(s, "hami_host_gpu_memory_used_bytes", &labels),
            value(s, "hami_host_gpu_utilization_ratio", &labels),
        )
    };
    let want = |s: &Scrape| {
        figures(s, 0) == (Some(5000.0 * 1_048_576.0), Some(17.0))
            && figures(s, last) == (Some(7.0 * 1_073_741_824.0), Some(41.0))
    };
    until(&w, want).await;
}

async fn scenario() {
    let w = world().await;
    let mut pod = start_pod(&w).await;
    let uid = pod["metadata"]["uid"].as_str().unwrap().to_owned();
    let (bdf, gpu_id) = gpu0(&w).await;
    let root = w.root();
    let pod_cgroup = format!(
        "/kubepods.slice/kubepods-pod{}.slice",
        uid.replace('-', "_")
    );
    gpu_and_pod_files(root, &bdf, &pod_cgroup);
    let container_cgroup = format!("{pod_cgroup}/cri-containerd-{CID}.scope");
    process(root, 4100, &container_cgroup, gpu_id, 300 * MIB);
    // A process in the pod cgroup itself: the one container holding the GPU.
    process(root, 4101, &pod_cgroup, gpu_id, 20 * MIB);
    // A host service and a look-alike outside kubepods: never a pod's.
    process(
        root,
        4200,
        "/system.slice/ollama.service",
        gpu_id,
        8u64 << 30,
    );
    let look_alike = format!("/system.slice{pod_cgroup}/x");
    process(root, 4201, &look_alike, gpu_id, 1 << 30);
    let container = [("namespace", "default"), ("pod", "llm"), ("container", "c")];
    let scrape = until(&w, |s| {
        value(s, "hami_vgpu_memory_used_bytes", &container) == Some(320.0 * 1_048_576.0)
            && value(s, "hami_host_gpu_power_usage_watts", &[]).is_some()
    })
    .await;
    check_series(&scrape, &w.gpus[0].id, &bdf);
    check_hami_contract(&scrape, &w.gpus[0].id);

    // KFD counts the waves: the container's ratio becomes the CUs its
    // processes occupy out of the GPU's 304 (76: 25), not the GPU's
    // activity (63); the host service's waves are no pod's.
    occupancy(root, 4100, gpu_id, 38);
    occupancy(root, 4101, gpu_id, 38);
    occupancy(root, 4200, gpu_id, 200);
    until(&w, |s| {
        value(s, "hami_container_device_utilization_ratio", &container) == Some(25.0)
    })
    .await;

    // The pod ends: its processes go, then the pod; so do its series.
    std::fs::remove_dir_all(root.join("sys/class/kfd/kfd/proc/4100")).unwrap();
    std::fs::remove_dir_all(root.join("sys/class/kfd/kfd/proc/4101")).unwrap();
    until(&w, |s| {
        value(s, "hami_vgpu_memory_used_bytes", &container) == Some(0.0)
    })
    .await;
    pod["status"]["phase"] = "Succeeded".into();
    w.api.put(Kind::Pod, pod);
    until(&w, |s| {
        !s.samples.iter().any(|x| x.labels.get("pod") == Some("llm"))
    })
    .await;
}

/// HAMi places pod `llm` (48 GiB, 76 CUs of GPU 0), kubelet allocates it,
/// and it runs with container `c` of runtime ID [`CID`]. Returns the pod.
async fn start_pod(w: &World) -> serde_json::Value {
    let g0 = &w.gpus[0];
    schedule(&w.api, "llm", &[(g0, 49_152, 76)], 100);
    tokio::time::sleep(Duration::from_millis(300)).await;
    w.kubelet
        .allocate(vec![format!("{}#0", g0.id)])
        .await
        .unwrap();
    let mut pod = w.api.get(Kind::Pod, "default", "llm").unwrap();
    pod["status"] = serde_json::json!({"phase": "Running", "containerStatuses": [{
        "name": "c", "containerID": format!("containerd://{CID}"), "image": "rocm",
        "imageID": "", "ready": true, "restartCount": 0}]});
    w.api.put(Kind::Pod, pod.clone());
    pod
}

/// GPU 0's sysfs use and the pod cgroup's `dmem.current`, written before the
/// processes (a poll may come between).
fn gpu_and_pod_files(root: &Path, bdf: &str, pod_cgroup: &str) {
    let dmem = root.join(format!("sys/fs/cgroup{pod_cgroup}/dmem.current"));
    write(&dmem, &format!("drm/{bdf}/vram {}\n", 320 * MIB));
    let pci = root.join(format!("sys/bus/pci/devices/{bdf}"));
    write(
        &pci.join("mem_info_vram_used"),
        &format!("{}\n", 9u64 << 30),
    );
    write(&pci.join("gpu_busy_percent"), "63\n");
    write(&pci.join("hwmon/hwmon0/temp1_input"), "52000\n");
    write(&pci.join("hwmon/hwmon0/power1_average"), "310000000\n");
}

fn check_series(scrape: &Scrape, gpu: &str, bdf: &str) {
    let container = [("namespace", "default"), ("pod", "llm"), ("container", "c")];
    let extra = [
        ("vdevice_index", "0"),
        ("device_uuid", gpu),
        ("zone", "vGPU"),
    ];
    let c = [&container[..], &extra[..]].concat();
    let limit = value(scrape, "hami_vgpu_memory_limit_bytes", &c);
    assert_eq!(limit, Some(49_152.0 * 1_048_576.0));
    let cus = value(scrape, "amdgpu_dp_container_compute_units", &container);
    assert_eq!(cus, Some(76.0));
    let pod = [("namespace", "default"), ("pod", "llm"), ("pci_bdf", bdf)];
    let charged = value(scrape, "amdgpu_dp_pod_vram_charged_bytes", &pod);
    assert_eq!(charged, Some(320.0 * 1_048_576.0));
    let host = [
        ("device_uuid", gpu),
        ("node", common::world::NODE),
        ("device_index", "0"),
    ];
    let used = value(scrape, "hami_host_gpu_memory_used_bytes", &host);
    assert_eq!(used, Some(9.0 * 1_073_741_824.0));
    assert_eq!(
        value(scrape, "hami_host_gpu_utilization_ratio", &host),
        Some(63.0)
    );
    let counted: f64 = scrape
        .samples
        .iter()
        .filter(|s| s.metric == "hami_vgpu_memory_used_bytes")
        .filter_map(|s| number(&s.value))
        .sum();
    assert_eq!(
        counted,
        320.0 * 1_048_576.0,
        "the host service's VRAM counts for no pod"
    );
}

/// What HAMi's users read: pod `llm`'s container `c`, alone on GPU 0, gets
/// the GPU's activity as its utilization; temperature and power carry
/// HAMi's host labels; the dashboard's series carry its labels; the HAMi
/// series are exactly those AMD can fill.
fn check_hami_contract(scrape: &Scrape, gpu: &str) {
    let c = [
        ("namespace", "default"),
        ("pod", "llm"),
        ("container", "c"),
        ("vdevice_index", "0"),
        ("device_uuid", gpu),
        ("zone", "vGPU"),
    ];
    let utilization = value(scrape, "hami_container_device_utilization_ratio", &c);
    assert_eq!(
        utilization,
        Some(63.0),
        "the only holder gets the GPU's activity"
    );
    let memory = value(scrape, "hami_container_device_memory_bytes", &c);
    assert_eq!(memory, Some(320.0 * 1_048_576.0));
    let host = [
        ("node", common::world::NODE),
        ("device_index", "0"),
        ("device_uuid", gpu),
        ("zone", "vGPU"),
    ];
    let temperature = value(scrape, "hami_host_gpu_temperature_celsius", &host);
    assert_eq!(temperature, Some(52.0));
    assert_eq!(
        value(scrape, "hami_host_gpu_power_usage_watts", &host),
        Some(310.0)
    );
    let node = [("node", common::world::NODE)];
    assert_eq!(
        value(scrape, "hami_vgpumonitor_collect_success", &node),
        Some(1.0)
    );
    for (name, labels) in DASHBOARD {
        let samples: Vec<_> = scrape.samples.iter().filter(|s| s.metric == name).collect();
        assert!(!samples.is_empty(), "the dashboard's {name} is missing");
        for sample in samples {
            for label in labels {
                let got = sample.labels.get(label).unwrap_or_default();
                assert!(!got.is_empty(), "{name} without {label}: {sample:?}");
            }
        }
    }
    let hami: std::collections::BTreeSet<&str> = scrape
        .samples
        .iter()
        .map(|s| s.metric.as_str())
        .filter(|m| m.starts_with("hami_"))
        .collect();
    let fillable: std::collections::BTreeSet<&str> = plugin::testing::metrics::hami::HAMI_SERIES
        .into_iter()
        .collect();
    assert_eq!(hami, fillable, "the HAMi series AMD can fill, and no other");
    for name in plugin::testing::metrics::hami::HAMI_UNFILLED {
        assert!(!hami.contains(name), "{name} is exported");
    }
}

/// Scrapes until `done` holds (amd-gpud caches 2 s, the plugin asks every 5 s).
async fn until(w: &World, done: impl Fn(&Scrape) -> bool) -> Scrape {
    let start = Instant::now();
    loop {
        let (status, body) = w.http("/metrics");
        assert_eq!(status, 200, "{body}");
        let scrape = Scrape::parse(body.lines().map(|l| Ok(l.to_owned()))).unwrap();
        if done(&scrape) {
            return scrape;
        }
        assert!(
            start.elapsed() < Duration::from_secs(40),
            "never got there; last scrape:\n{body}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn number(v: &Value) -> Option<f64> {
    match v {
        Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => Some(*v),
        _ => None,
    }
}

fn value(scrape: &Scrape, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    scrape
        .samples
        .iter()
        .find(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .and_then(|s| number(&s.value))
}
