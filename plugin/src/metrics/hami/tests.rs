use std::sync::Arc;

use ipc::usage::{ContainerCompute, ContainerVram, GpuUse, PodDmem, Usage};
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

use crate::{
    inventory::Snapshot,
    metrics::{Metrics, hami::Inputs},
    testutil::{mi300x, partition},
};

const POD_UID: &str = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
const GPU: &str = "GPU-0000000000000005";

fn snapshot() -> Snapshot {
    let gpu = mi300x("0000:05:00.0", GPU);
    let partitions = [(
        "0000:05:00.0".to_owned(),
        vec![partition("0000:05:00.0", 0, 0)],
    )]
    .into_iter()
    .collect();
    Snapshot::from_gpud(&[gpu], partitions, ipc::DmemBackend::default())
}

/// Two containers of one pod share the GPU: `a` 1 GiB and 76 CUs, `b` 2 GiB
/// and 38 CUs; only `a` has a known runtime ID.
fn pod() -> Arc<Pod> {
    Arc::new(
        serde_json::from_value(json!({
            "metadata": {"name": "train", "namespace": "ml", "uid": POD_UID, "annotations": {
                "hami.io/amd-devices-allocated": format!("{GPU},AMD,1024,76:;{GPU},AMD,2048,38:;"),
                "hami.io/amd-cu-allocated": format!("{{\"{GPU}\":\"0-113\"}}"),
            }},
            "spec": {"containers": [{"name": "a"}, {"name": "b"}]},
            "status": {"phase": "Running", "containerStatuses": [
                {"name": "a", "containerID": "containerd://abc123", "image": "", "imageID": "",
                 "ready": true, "restartCount": 0}
            ]}
        }))
        .unwrap(),
    )
}

fn measured() -> Usage {
    let vram = |uid: &str, cid: &str, bytes| ContainerVram {
        pod_uid: uid.to_owned(),
        container_id: cid.to_owned(),
        gpu_id: 100,
        processes: 1,
        vram_bytes: bytes,
    };
    Usage {
        containers: vec![
            vram(POD_UID, "abc123", 600),
            // Unknown ID, two holders: attributed to no container.
            vram(POD_UID, "", 7),
            // Another pod's processes never count for this one.
            vram("11111111-2222-3333-4444-555555555555", "abc123", 1 << 20),
        ],
        dmem: vec![PodDmem {
            pod_uid: POD_UID.to_owned(),
            bdf: "0000:05:00.0".to_owned(),
            current_bytes: 4096,
        }],
        gpus: vec![GpuUse {
            bdf: "0000:05:00.0".to_owned(),
            vram_used_bytes: 1 << 30,
            busy_percent: 37,
            temperature_millicelsius: 45_500,
            power_microwatts: 250_000_000,
            source: "sysfs".to_owned(),
        }],
        compute: Vec::new(),
    }
}

/// [`measured`] on a node whose KFD counts occupied CUs: `a`'s processes
/// occupy 76, an unknown ID's 38 (two holders: no one's), another pod's 300.
fn measured_with_cus() -> Usage {
    let cus = |uid: &str, cid: &str, cus| ContainerCompute {
        pod_uid: uid.to_owned(),
        container_id: cid.to_owned(),
        gpu_id: 100,
        processes: 1,
        cus,
    };
    Usage {
        compute: vec![
            cus(POD_UID, "abc123", 76),
            cus(POD_UID, "", 38),
            cus("11111111-2222-3333-4444-555555555555", "abc123", 300),
        ],
        ..measured()
    }
}

fn value(text: &str, series: &str) -> Option<String> {
    text.lines()
        .find(|l| l.starts_with(series))
        .map(|l| l.rsplit(' ').next().unwrap_or_default().to_owned())
}

fn scrape(m: &Metrics, pods: &[Arc<Pod>], usage: Option<&Usage>) -> String {
    m.observe_usage(&Inputs {
        node: "node-1",
        snapshot: &snapshot(),
        pods,
        usage,
    });
    m.encode().unwrap()
}

#[test]
fn hami_series_carry_hamis_names_labels_and_units() {
    let m = Metrics::new();
    let usage = measured();
    let text = scrape(&m, &[pod()], Some(&usage));
    let host = format!(
        r#"{{zone="vGPU",node="node-1",device_index="0",device_uuid="{GPU}",device_type="AMD Instinct MI300X"}}"#
    );
    assert_eq!(
        value(&text, &format!("hami_host_gpu_memory_used_bytes{host}")).as_deref(),
        Some("1073741824")
    );
    assert_eq!(
        value(&text, &format!("hami_host_gpu_utilization_ratio{host}")).as_deref(),
        Some("37")
    );
    let c = |name: &str| {
        format!(
            r#"{{namespace="ml",pod="train",container="{name}",vdevice_index="0",device_uuid="{GPU}""#
        )
    };
    let z = |name: &str| format!("{{zone=\"vGPU\",{}", &c(name)[1..]);
    assert_eq!(
        value(&text, &format!("hami_vgpu_memory_used_bytes{}", z("a"))).as_deref(),
        Some("600")
    );
    assert_eq!(
        value(&text, &format!("hami_vgpu_memory_used_bytes{}", z("b"))).as_deref(),
        Some("0")
    );
    assert_eq!(
        value(&text, &format!("hami_vgpu_memory_limit_bytes{}", z("b"))).as_deref(),
        Some("2147483648")
    );
    assert_eq!(
        value(
            &text,
            &format!("amdgpu_dp_container_compute_units{}", c("a"))
        )
        .as_deref(),
        Some("76")
    );
    let mask = format!(
        r#"amdgpu_dp_pod_cu_mask_info{{namespace="ml",pod="train",device_uuid="{GPU}",mask="0-113"}}"#
    );
    assert_eq!(value(&text, &mask).as_deref(), Some("1"));
    let charged =
        r#"amdgpu_dp_pod_vram_charged_bytes{namespace="ml",pod="train",pci_bdf="0000:05:00.0"}"#;
    assert_eq!(value(&text, charged).as_deref(), Some("4096"));
    assert_eq!(
        value(&text, &format!("hami_host_gpu_temperature_celsius{host}")).as_deref(),
        Some("45.5")
    );
    assert_eq!(
        value(&text, &format!("hami_host_gpu_power_usage_watts{host}")).as_deref(),
        Some("250.0")
    );
    assert_eq!(
        value(
            &text,
            &format!("hami_container_device_memory_bytes{}", z("a"))
        )
        .as_deref(),
        Some("600")
    );
    let success = r#"hami_vgpumonitor_collect_success{zone="vGPU",node="node-1"}"#;
    assert_eq!(value(&text, success).as_deref(), Some("1"));
    // Two containers share the GPU: its activity is neither's.
    assert!(
        !text.contains("hami_container_device_utilization_ratio{"),
        "{text}"
    );
    for name in super::HAMI_UNFILLED {
        assert!(!text.contains(name), "{name} is exported");
    }
}

/// Container `a` alone holds the GPU (what HAMi's dashboard reads for its
/// container-utilization panel: `hami_container_device_utilization_ratio`
/// by namespace, pod, container and vdevice_index).
#[test]
fn the_only_holder_of_a_gpu_gets_its_activity() {
    let m = Metrics::new();
    let alone = lone_pod();
    let usage = measured();
    let text = scrape(&m, &[pod_of(&alone)], Some(&usage));
    let a = format!(
        r#"hami_container_device_utilization_ratio{{zone="vGPU",namespace="ml",pod="train",container="a",vdevice_index="0",device_uuid="{GPU}"}}"#
    );
    assert_eq!(value(&text, &a).as_deref(), Some("37"), "{text}");
    // Another pod's container takes a share: no one's figure any more.
    let mut other = alone.clone();
    other.metadata.name = Some("infer".into());
    other.metadata.uid = Some("11111111-2222-3333-4444-555555555555".into());
    let text = scrape(&m, &[pod_of(&alone), pod_of(&other)], Some(&usage));
    assert!(!text.contains("hami_container_device_utilization_ratio{"));
    // No answer from amd-gpud: no figure, and the collection says so.
    let text = scrape(&m, &[pod()], None);
    let success = r#"hami_vgpumonitor_collect_success{zone="vGPU",node="node-1"}"#;
    assert_eq!(value(&text, success).as_deref(), Some("0"));
}

/// [`pod`] with the GPU granted to container `a` alone.
fn lone_pod() -> Pod {
    let mut alone = (*pod()).clone();
    let annotations = alone.metadata.annotations.as_mut().unwrap();
    annotations.insert(
        "hami.io/amd-devices-allocated".into(),
        format!("{GPU},AMD,1024,76:;;"),
    );
    alone
}

fn pod_of(pod: &Pod) -> Arc<Pod> {
    Arc::new(pod.clone())
}

#[test]
fn a_pod_that_ends_loses_its_series_and_no_answer_shows_no_use() {
    let m = Metrics::new();
    let usage = measured();
    assert!(scrape(&m, &[pod()], Some(&usage)).contains("pod=\"train\""));
    let mut done = (*pod()).clone();
    done.status.as_mut().unwrap().phase = Some("Succeeded".into());
    let text = scrape(&m, &[Arc::new(done)], Some(&usage));
    assert!(!text.contains("pod=\"train\""), "{text}");
    // Without an answer from amd-gpud: limits, but no used series.
    let text = scrape(&m, &[pod()], None);
    assert!(text.contains("hami_vgpu_memory_limit_bytes{"));
    assert!(!text.contains("hami_vgpu_memory_used_bytes{"));
    assert!(!text.contains("hami_host_gpu_memory_used_bytes{"));
}

/// Every series `/metrics` can show, with its type, as
/// plugin/src/metrics/series.txt lists them (the chart check reads that
/// file to prove each dashboard query names a series the plugin exports).
/// `UPDATE_SERIES=1` rewrites the file.
#[test]
fn the_series_list_is_in_sync() {
    let m = Metrics::new();
    m.record_allocate(std::time::Duration::from_millis(1), Err("unknown_gpu"));
    m.observe_gpus(&snapshot(), 0, &crate::metrics::Usage::new());
    let text = scrape(&m, &[pod_of(&lone_pod())], Some(&measured()));
    let mut types: Vec<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(str::to_owned)
        .collect();
    types.sort();
    let listed = types.join("\n") + "\n";
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/metrics/series.txt");
    if std::env::var_os("UPDATE_SERIES").is_some() {
        std::fs::write(&path, &listed).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert_eq!(
        committed,
        listed,
        "run with UPDATE_SERIES=1 to update {}",
        path.display()
    );
    for name in super::HAMI_SERIES.iter().chain(&super::OURS) {
        assert!(
            listed.contains(&format!("{name} ")),
            "{name} is not exported"
        );
    }
}

/// With KFD's `cu_occupancy`, a shared GPU's containers each get the CUs
/// their waves occupy, as a percent of the device's 304.
#[test]
fn occupied_cus_give_each_holder_of_a_shared_gpu_its_percent() {
    let m = Metrics::new();
    let usage = measured_with_cus();
    let text = scrape(&m, &[pod()], Some(&usage));
    let ratio = |name: &str| {
        format!(
            r#"hami_container_device_utilization_ratio{{zone="vGPU",namespace="ml",pod="train",container="{name}",vdevice_index="0",device_uuid="{GPU}"}}"#
        )
    };
    assert_eq!(value(&text, &ratio("a")).as_deref(), Some("25"), "{text}");
    assert_eq!(value(&text, &ratio("b")).as_deref(), Some("0"), "{text}");
    // The lone holder gets its CUs too (the unknown ID's now count for it:
    // 114 of 304), not the GPU's activity (37).
    let text = scrape(&m, &[pod_of(&lone_pod())], Some(&usage));
    assert_eq!(value(&text, &ratio("a")).as_deref(), Some("38"), "{text}");
    assert_eq!(super::occupied_percent(400, 304), 100);
    assert_eq!(super::occupied_percent(1, 0), 0);
}

/// A GPU amd-gpud measures but the plugin does not offer (`--exclude-gpus`
/// took it out of the snapshot) has no `hami_host_gpu_*` series; the offered
/// one keeps its own.
#[test]
fn an_excluded_gpu_has_no_host_series() {
    let m = Metrics::new();
    let mut usage = measured();
    let mut kept_by_the_node = usage.gpus[0].clone();
    kept_by_the_node.bdf = "0000:83:00.0".to_owned();
    usage.gpus.push(kept_by_the_node);
    let text = scrape(&m, &[pod()], Some(&usage));
    let host: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("hami_host_gpu_memory_used_bytes{"))
        .collect();
    assert_eq!(host.len(), 1, "{host:?}");
    assert!(
        host[0].contains(&format!("device_uuid=\"{GPU}\"")),
        "{host:?}"
    );
    assert!(!text.contains("0000:83:00.0"), "{text}");
}
