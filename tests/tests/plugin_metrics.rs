//! The plugin's `/metrics`, `/healthz` and `/readyz` end to end: after a few
//! Allocate calls (one of them failing) on the world of the Allocate tests,
//! the scrape is parsed with a Prometheus text parser and every series is
//! checked, HAMi's vGPU series among them as HAMi's dashboard reads them.
//! Needs root.

// An integration-test file is itself the test module, and a failed unwrap is a
// failed test here.
#![allow(clippy::tests_outside_test_module, clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::world::{Gpu, World, schedule, world};
use prometheus_parse::{Sample, Scrape, Value};

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
const MIB: f64 = 1024.0 * 1024.0;

#[test]
fn every_series_after_a_few_allocations() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(Duration::from_secs(120), scenario());
}

async fn scenario() {
    let w = world().await;
    assert_eq!(w.http("/healthz").0, 200);
    wait_ready(&w).await;
    let (g0, g1) = (&w.gpus[0], &w.gpus[1]);
    let slot = |g: &Gpu, n: u32| format!("{}#{n}", g.id);
    allocate(&w, ("quarter-a", 100), (g0, 49_152, 76), slot(g0, 0))
        .await
        .unwrap();
    allocate(&w, ("quarter-b", 101), (g0, 49_152, 76), slot(g0, 1))
        .await
        .unwrap();
    allocate(&w, ("whole", 102), (g1, 196_608, 304), slot(g1, 0))
        .await
        .unwrap();
    let ghost = Gpu {
        id: "GPU-00000000deadbeef".into(),
        device_type: g0.device_type.clone(),
        rocr_uuid: String::new(),
    };
    let err = allocate(&w, ("ghost", 103), (&ghost, 1024, 10), slot(g0, 2)).await;
    assert!(
        err.unwrap_err().contains("deadbeef"),
        "an unknown GPU fails"
    );

    let scrape = scrape_with_activity(&w, g1).await;
    for (i, gpu) in w.gpus.iter().enumerate() {
        let id = gpu.id.as_str();
        let of = |name: &str| value(&scrape, name, &[("gpu", id)]);
        let healthy = [("gpu", id), ("state", "Healthy")];
        assert_eq!(value(&scrape, "amdgpu_dp_gpu_health", &healthy), 1.0);
        let unhealthy = [("gpu", id), ("state", "Unhealthy")];
        assert_eq!(value(&scrape, "amdgpu_dp_gpu_health", &unhealthy), 0.0);
        assert_eq!(of("amdgpu_dp_gpu_compute_units"), 304.0);
        assert_eq!(of("amdgpu_dp_gpu_vram_bytes"), 192.0 * GIB);
        assert_eq!(of("amdgpu_dp_gpu_slots"), 10.0);
        let (cus, vram_mib, used) = match i {
            0 => (152.0, 98_304.0, 2.0),
            1 => (304.0, 196_608.0, 1.0),
            _ => (0.0, 0.0, 0.0),
        };
        assert_eq!(of("amdgpu_dp_gpu_compute_units_allocated"), cus, "GPU {i}");
        assert_eq!(of("amdgpu_dp_gpu_vram_allocated_bytes"), vram_mib * MIB);
        assert_eq!(of("amdgpu_dp_gpu_slots_used"), used, "GPU {i}");
    }
    assert_eq!(
        value(&scrape, "amdgpu_dp_allocate_requests_total", &[]),
        4.0
    );
    let unknown = [("reason", "unknown_gpu")];
    assert_eq!(
        value(&scrape, "amdgpu_dp_allocate_errors_total", &unknown),
        1.0
    );
    assert_eq!(
        value(&scrape, "amdgpu_dp_allocate_duration_seconds_count", &[]),
        4.0
    );
    let latency = sample(&scrape, "amdgpu_dp_allocate_duration_seconds", &[]);
    let Value::Histogram(buckets) = &latency.value else {
        panic!("not a histogram: {latency:?}");
    };
    let all = buckets.iter().find(|b| b.less_than.is_infinite()).unwrap();
    assert_eq!(all.count, 4.0);
    for connection in [
        "amdgpu_dp_apiserver_connected",
        "amdgpu_dp_gpud_connected",
        "amdgpu_dp_kubelet_registered",
    ] {
        assert_eq!(value(&scrape, connection, &[]), 1.0, "{connection}");
    }
    check_landlock(&scrape);
    check_hami(&scrape, g0, g1);
}

/// HAMi's per-container series, with the labels HAMi's dashboard
/// (Project-HAMi/HAMi:dashboards/hami-vgpu-dashboard.json) filters and
/// prints: `namespace`, `pod`, `container`, `vdevice_index`. The two
/// quarters share GPU 0, so its activity is neither's; `whole` alone holds
/// GPU 1 and gets its activity.
fn check_hami(scrape: &Scrape, g0: &Gpu, g1: &Gpu) {
    for (pod, gpu, mib) in [
        ("quarter-a", g0, 49_152.0),
        ("quarter-b", g0, 49_152.0),
        ("whole", g1, 196_608.0),
    ] {
        let labels = [
            ("namespace", "default"),
            ("pod", pod),
            ("vdevice_index", "0"),
            ("device_uuid", gpu.id.as_str()),
            ("zone", "vGPU"),
        ];
        let limit = sample(scrape, "hami_vgpu_memory_limit_bytes", &labels);
        assert!(!limit.labels.get("container").unwrap_or_default().is_empty());
        assert_eq!(
            value(scrape, "hami_vgpu_memory_limit_bytes", &labels),
            mib * MIB
        );
        let utilization = find(scrape, "hami_container_device_utilization_ratio", &labels);
        let host = find(
            scrape,
            "hami_host_gpu_utilization_ratio",
            &[("device_uuid", gpu.id.as_str())],
        );
        assert_eq!(host, Some(41.0));
        let want = if pod == "whole" { host } else { None };
        assert_eq!(utilization, want, "{pod}'s utilization");
    }
}

/// Every GPU shows 41 % activity in sysfs; scrapes until amd-gpud's usage
/// answer (cached 2 s, asked every 5 s) shows it for `gpu`.
async fn scrape_with_activity(w: &World, gpu: &Gpu) -> Scrape {
    let devices = w.root().join("sys/bus/pci/devices");
    for entry in std::fs::read_dir(&devices).unwrap() {
        std::fs::write(entry.unwrap().path().join("gpu_busy_percent"), "41\n").unwrap();
    }
    let uuid = [("device_uuid", gpu.id.as_str())];
    for _ in 0..160 {
        let (status, body) = w.http("/metrics");
        assert_eq!(status, 200, "{body}");
        let scrape = Scrape::parse(body.lines().map(|l| Ok(l.to_owned()))).unwrap();
        if find(&scrape, "hami_host_gpu_utilization_ratio", &uuid) == Some(41.0) {
            return scrape;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    panic!("no GPU activity in 40 s");
}

fn find(scrape: &Scrape, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    scrape
        .samples
        .iter()
        .find(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .and_then(|s| match s.value {
            Value::Gauge(v) => Some(v),
            _ => None,
        })
}

/// The world runs the plugin with `--sandbox required` where the kernel
/// enforces all of it, else best-effort.
fn check_landlock(scrape: &Scrape) {
    let landlock = |status| value(scrape, "amdgpu_dp_landlock_status", &[("status", status)]);
    let expected = if common::sandbox_mode() == "required" {
        "fully_enforced"
    } else {
        "partially_enforced"
    };
    assert_eq!(landlock(expected), 1.0, "landlock {expected}");
    assert_eq!(landlock("not_applied"), 0.0);
}

/// HAMi schedules pod `name` at `bind_time` with `grant` (GPU, MiB, CUs),
/// then kubelet allocates `device`.
async fn allocate(
    w: &World,
    (name, bind_time): (&str, u64),
    grant: (&Gpu, u32, u32),
    device: String,
) -> Result<(), String> {
    schedule(&w.api, name, &[grant], bind_time);
    tokio::time::sleep(Duration::from_millis(300)).await; // the watch delivers the pod
    w.kubelet
        .allocate(vec![device])
        .await
        .map(drop)
        .map_err(|e| e.message().to_owned())
}

async fn wait_ready(w: &World) {
    for _ in 0..100 {
        if w.http("/readyz").0 == 200 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("/readyz: {:?}", w.http("/readyz"));
}

fn sample<'a>(scrape: &'a Scrape, name: &str, labels: &[(&str, &str)]) -> &'a Sample {
    scrape
        .samples
        .iter()
        .find(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .unwrap_or_else(|| panic!("no {name}{labels:?} in the scrape"))
}

fn value(scrape: &Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    match sample(scrape, name, labels).value {
        Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => v,
        ref other => panic!("{name} is not a number: {other:?}"),
    }
}
