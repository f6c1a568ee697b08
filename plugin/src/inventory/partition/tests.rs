use std::collections::BTreeMap;

use ipc::{
    DmemBackend,
    types::{GpuInfo, PartitionInfo},
};

use super::*;

fn gpu(bdf: &str, mode: &str) -> GpuInfo {
    let mut gpu = crate::testutil::mi300x(bdf, "GPU-8ecb9de71e8aa497");
    gpu.compute_partition = mode.into();
    gpu.memory_partition = "NPS1".into();
    gpu
}

fn part(bdf: &str, index: u32, health: &str) -> PartitionInfo {
    PartitionInfo {
        index,
        kfd_node: 2 + index,
        gpu_id: 100 + u64::from(index),
        render_minor: 128 + index,
        card_minor: i32::try_from(index).unwrap(),
        bdf: bdf.into(),
        compute_units: 38,
        num_xcc: 1,
        vram_bytes: 24 << 30,
        xcp: -1,
        gpu: ipc::gpu_path("0000:05:00.0"),
        health: health.into(),
        restore_props: BTreeMap::new(),
        restore_links: vec![],
        health_reason: String::new(),
    }
}

fn node_of(gpus: &[GpuInfo]) -> Snapshot {
    let mut parts: Vec<PartitionInfo> = (0..8)
        .map(|i| part(&format!("0000:05:00.{i}"), i, ipc::HEALTHY))
        .collect();
    parts[7].health = ipc::MISSING.into(); // gone after a switch back
    let partitions = BTreeMap::from([
        ("0000:05:00.0".to_owned(), parts),
        (
            "0000:83:00.0".to_owned(),
            vec![part("0000:83:00.0", 0, ipc::HEALTHY)],
        ),
    ]);
    Snapshot::from_gpud(gpus, partitions, DmemBackend::On)
}

fn gpus() -> Vec<GpuInfo> {
    let mut radeon = gpu("0000:83:00.0", "");
    radeon.rocr_uuid = "GPU-1111222233334444".into();
    vec![gpu("0000:05:00.0", "CPX"), radeon]
}

fn node() -> Snapshot {
    node_of(&gpus())
}

#[test]
fn each_live_partition_replaces_its_gpu() {
    let view = view(&node(), OperatingMode::Partition);
    let ids: Vec<&str> = view.devices().iter().map(|d| d.id.as_str()).collect();
    assert_eq!(
        ids[..3],
        [
            "GPU-8ecb9de71e8aa497-cpx0",
            "GPU-8ecb9de71e8aa497-cpx1",
            "GPU-8ecb9de71e8aa497-cpx2"
        ]
    );
    assert_eq!(ids.len(), 7 + 1, "seven live partitions and the Radeon");
    assert_eq!(
        ids[7], "GPU-1111222233334444",
        "a GPU without partitions stays whole"
    );
    let first = &view.devices()[0];
    assert_eq!(
        (first.compute_units, first.vram_bytes),
        (304 / 8, (192 << 30) / 8),
        "a vanished sibling leaves the shares as CPX makes them"
    );
    assert!(
        first.rocr_uuid.is_empty(),
        "selected by container-local index"
    );
    let by_bdf = |bdf: &str| view.devices().iter().find(|d| d.bdf == bdf).unwrap();
    assert_eq!(by_bdf("0000:05:00.3").physical_bdf(), "0000:05:00.0");
    assert!(by_bdf("0000:05:00.3").is_partition() && !by_bdf("0000:83:00.0").is_partition());
    assert_eq!(view.partitions["0000:05:00.3"][0].render_minor, 131);
    assert!(!ids.iter().any(|id| id.contains([',', ':', ';'])));
}

/// The profile menu says how many partitions the mode makes, even when
/// amd-gpud lists fewer (a switch in progress), and division floors.
#[test]
fn shares_follow_the_mode_from_the_profile_menu_floored() {
    let mut gpus = gpus();
    gpus[0].compute_units = 302;
    gpus[0].partition_profiles = vec![ipc::types::PartitionProfile {
        index: 3,
        compute_partition: "CPX".into(),
        memory_partitions: vec!["NPS1".into()],
        partitions: 8,
        xcc_per_partition: 1,
    }];
    let mut snapshot = node_of(&gpus);
    snapshot
        .partitions
        .get_mut("0000:05:00.0")
        .unwrap()
        .truncate(5);
    let view = view(&snapshot, OperatingMode::Partition);
    assert_eq!(view.devices()[0].compute_units, 37, "302 / 8, floored");
    assert_eq!(view.devices()[0].vram_bytes, (192 << 30) / 8);
}

#[test]
fn cu_mode_is_the_snapshot_itself() {
    assert_eq!(view(&node(), OperatingMode::Cu), node());
}

#[test]
fn the_annotation_wins_and_unknown_values_mean_cu() {
    use OperatingMode::{Cu, Partition};
    assert_eq!(resolve(None, Partition), Partition);
    assert_eq!(resolve(Some("partition"), Cu), Partition);
    assert_eq!(resolve(Some("cu"), Partition), Cu);
    assert_eq!(resolve(Some("mig"), Partition), Cu);
}

/// With no follower of the mode annotation (the plugin without the
/// Kubernetes API) the mode's sender is dropped at once: the snapshots
/// must still be followed.
#[test]
fn snapshots_are_followed_when_the_mode_sender_is_gone() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let (raw_tx, raw) = watch::channel(Snapshot::default());
        let (mode_tx, mode) = watch::channel(OperatingMode::Cu);
        drop(mode_tx);
        let mut view = follow(raw, mode);
        raw_tx.send_replace(node());
        let changed = tokio::time::timeout(std::time::Duration::from_secs(5), view.changed()).await;
        assert!(matches!(changed, Ok(Ok(()))), "the new snapshot arrives");
        assert_eq!(view.borrow().devices().len(), 2);
    });
}
