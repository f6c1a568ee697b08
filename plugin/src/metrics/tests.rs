use std::time::Duration;

use ipc::types::GpuInfo;

use super::{usage::GpuUsage, *};

fn gpu(bdf: &str, health: &str) -> GpuInfo {
    let mut gpu = crate::testutil::mi300x(bdf, &format!("GPU-00000000000000{}", &bdf[5..7]));
    gpu.market_name = String::new();
    gpu.health = health.into();
    gpu
}

fn line<'a>(text: &'a str, prefix: &str) -> &'a str {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no {prefix} in\n{text}"))
}

#[test]
fn every_series_is_exposed() {
    let m = Metrics::new();
    m.record_allocate(Duration::from_millis(3), Ok(()));
    m.record_allocate(Duration::from_millis(40), Err("unknown_gpu"));
    m.set_kubelet_registered(true);
    m.set_apiserver_connected(true);
    let gpus = [
        gpu("0000:05:00.0", ipc::HEALTHY),
        gpu("0000:15:00.0", ipc::MISSING),
    ];
    let snapshot = Snapshot::from_gpud(&gpus, Default::default(), Default::default());
    let mut usage = Usage::new();
    usage.insert(
        "GPU-0000000000000005".into(),
        GpuUsage {
            compute_units: 76,
            vram_bytes: 1 << 30,
            containers: 1,
        },
    );
    m.observe_gpus(&snapshot, 0, &usage);
    let text = m.encode().unwrap();
    let g0 = r#"{gpu="GPU-0000000000000005",pci_bdf="0000:05:00.0""#;
    assert!(line(&text, &format!("amdgpu_dp_gpu_compute_units_allocated{g0}")).ends_with(" 76"));
    assert!(
        line(&text, &format!("amdgpu_dp_gpu_vram_allocated_bytes{g0}")).ends_with(" 1073741824")
    );
    assert!(line(&text, &format!("amdgpu_dp_gpu_slots{g0}")).ends_with(" 10"));
    assert!(line(&text, &format!("amdgpu_dp_gpu_slots_used{g0}")).ends_with(" 1"));
    let missing = r#"amdgpu_dp_gpu_health{gpu="GPU-0000000000000015",pci_bdf="0000:15:00.0",state="Missing"}"#;
    assert!(line(&text, missing).ends_with(" 1"));
    assert!(line(&text, "amdgpu_dp_allocate_requests_total").ends_with(" 2"));
    assert!(
        line(
            &text,
            r#"amdgpu_dp_allocate_errors_total{reason="unknown_gpu"}"#
        )
        .ends_with(" 1")
    );
    assert!(line(&text, "amdgpu_dp_allocate_duration_seconds_count").ends_with(" 2"));
    assert!(line(&text, "amdgpu_dp_kubelet_registered").ends_with(" 1"));
    assert!(line(&text, r#"amdgpu_dp_landlock_status{status="not_applied"}"#).ends_with(" 1"));
    assert!(text.ends_with("# EOF\n"));
    // A GPU that leaves the inventory leaves the metrics.
    m.observe_gpus(&Snapshot::default(), 0, &Usage::new());
    let text = m.encode().unwrap();
    assert!(!text.contains("GPU-0000000000000015"));
    assert!(line(&text, "amdgpu_dp_gpud_connected").ends_with(" 0"));
}
