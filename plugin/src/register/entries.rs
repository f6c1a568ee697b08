//! What the plugin publishes as `hami.io/node-amd-register`: one HAMi
//! DeviceInfo per GPU, derived from amd-gpud's inventory and the slot count
//! offered to kubelet, so that HAMi and kubelet see the same devices. The Go
//! plugin's `custominfo` keys are added by [`super::custominfo`]; the CRIU
//! properties go once per GPU into `hami.io/node-amd-gpus` ([`super::gpus`]).
//!
//! Writing is idempotent: the plugin patches the node only when the value it
//! wants differs from what the node carries (watch-fed). A graceful stop
//! leaves the published health as it is (see [`super`]).

use crate::{
    hami::{DeviceInfo, register::DEVICE_VENDOR},
    inventory::{Device, Snapshot, slots_of},
};

const MIB: u64 = 1024 * 1024;

/// `custominfo.gpuBDF`: a partition device's physical GPU (its entries share
/// the GPU's facts, published in the first of them).
pub(crate) const GPU_BDF: &str = "gpuBDF";

/// The DeviceInfo of one GPU.
pub(crate) fn device_info(gpu: &Device, split_count: u32) -> DeviceInfo {
    let count = slots_of(gpu, split_count);
    let mut info = DeviceInfo {
        id: gpu.id.clone(),
        count: i32::try_from(count).unwrap_or(i32::MAX),
        devmem: i32::try_from(gpu.vram_bytes / MIB).unwrap_or(i32::MAX),
        devcore: i32::try_from(gpu.compute_units).unwrap_or(i32::MAX),
        device_type: DeviceInfo::product_type(&product_name(gpu)),
        numa: i64::from(gpu.numa_node),
        health: gpu.health.is_healthy(),
        devicevendor: DEVICE_VENDOR.to_owned(),
        ..DeviceInfo::default()
    };
    info.custominfo.pci_bdf = gpu.bdf.clone();
    info
}

/// `custominfo.partitionProfile`: the current profile (e.g. `cpx_nps1`), as
/// newer upstream's Go plugin sends it, for GPUs with compute partitions. The
/// menu of profiles is a fact of the physical GPU ([`super::custominfo`]).
fn add_current_profile(info: &mut DeviceInfo, gpu: &Device) {
    let (Some(compute), Some(memory)) = (&gpu.compute_mode, &gpu.memory_mode) else {
        return;
    };
    if gpu.partition_profiles.is_empty() {
        return;
    }
    let current = format!(
        "{}_{}",
        compute.as_str().to_ascii_lowercase(),
        memory.as_str().to_ascii_lowercase()
    );
    info.custominfo
        .extra
        .insert("partitionProfile".to_owned(), current.into());
}

/// The market name, or `AMD <gfx>` when AMD SMI did not give one (HAMi wants
/// a type that starts with `AMD`).
pub(crate) fn product_name(gpu: &Device) -> String {
    match (gpu.market_name.is_empty(), gpu.gfx.is_empty()) {
        (false, _) => gpu.market_name.clone(),
        (true, false) => format!("AMD {}", gpu.gfx),
        (true, true) => "AMD GPU".to_owned(),
    }
}

#[cfg(test)]
/// The annotation value for the whole snapshot (the registrar encodes
/// [`device_infos`] with [`register_annotation`] itself).
///
/// # Errors
/// When a device would break HAMi's parser (the error names it), or the
/// snapshot holds no GPU (HAMi ignores an empty list and keeps stale devices).
pub(crate) fn annotation(
    snapshot: &Snapshot,
    split_count: u32,
) -> Result<String, crate::hami::HamiError> {
    crate::hami::register_annotation(&device_infos(snapshot, split_count))
}

/// The register entries of the whole snapshot, one per device, in PCI order.
pub(crate) fn device_infos(snapshot: &Snapshot, split_count: u32) -> Vec<DeviceInfo> {
    let registered = super::custominfo::registered_gpus(snapshot);
    let mut seen = std::collections::BTreeSet::new();
    snapshot
        .devices()
        .iter()
        .map(|gpu| {
            let mut info = device_info(gpu, split_count);
            if gpu.is_partition() {
                // A compute partition, allocated whole; never `mig`. Its
                // GPU's address joins it to the GPU's facts.
                info.count = 1;
                info.mode = gpu.compute_mode_str().to_ascii_lowercase();
                info.custominfo
                    .extra
                    .insert(GPU_BDF.to_owned(), gpu.physical_bdf().into());
            }
            info.index = card_minor(snapshot, gpu);
            add_rocr_selection(&mut info, gpu);
            add_current_profile(&mut info, gpu);
            let first_of_gpu = seen.insert(gpu.physical_bdf());
            super::custominfo::add(&mut info, snapshot, gpu, first_of_gpu, &registered);
            info
        })
        .collect()
}

/// `index`: the device's DRM card minor (`/dev/dri/card<N>`), as HAMi's Go
/// AMD plugin publishes it; HAMi uses it as a metrics label and a
/// tie-break. The first partition's for a whole GPU, the partition's own
/// for a partition device; 0 (omitted) when there is no card node.
fn card_minor(snapshot: &Snapshot, gpu: &Device) -> u32 {
    snapshot
        .partitions
        .get(&gpu.bdf)
        .and_then(|parts| parts.first())
        .and_then(|p| u32::try_from(p.card_minor).ok())
        .unwrap_or(0)
}

/// `custominfo.rocrVisibleDevice`: what a container's `ROCR_VISIBLE_DEVICES`
/// selects a whole GPU by. Its ROCr UUID (`GPU-<16 hex>`) when it has one;
/// `index` for a GPU without (an APU, whose `unique_id` is 0): then every GPU
/// of that container is selected by its container-local index, its rank
/// among the container's GPUs in KFD order, since ROCr stops at the first
/// token it cannot parse. Left out for a compute partition, which is always
/// selected by index (its GPU's partitions share one ROCr UUID): 28 bytes an
/// entry that keep 64 CPX partitions under the 24 KiB budget.
fn add_rocr_selection(info: &mut DeviceInfo, gpu: &Device) {
    if gpu.is_partition() {
        return;
    }
    let uuid = gpu.rocr_uuid.as_str();
    let shown = if crate::cu::env::is_rocr_uuid(uuid) {
        uuid
    } else {
        "index"
    };
    info.custominfo
        .extra
        .insert("rocrVisibleDevice".to_owned(), shown.into());
}

/// Whether the node must be patched: only when the wanted value differs from
/// what the node carries now.
pub(crate) fn needs_write(wanted: &str, on_node: Option<&str>) -> bool {
    on_node != Some(wanted)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use ipc::{DmemBackend, types::GpuInfo};

    use super::*;
    use crate::hami::parse_register;

    fn gpu(bdf: &str, gfx: &str, health: &str) -> GpuInfo {
        GpuInfo {
            bdf: bdf.into(),
            rocr_uuid: format!("GPU-8ecb9de71e8aa4{}", &bdf[5..7]),
            unique_id: "10289491389633438871".into(),
            gfx: gfx.into(),
            compute_units: 304,
            cus_per_wgp: 1,
            vram_bytes: 192 << 30,
            numa_node: 1,
            market_name: "AMD Instinct MI300X".into(),
            amdsmi_uuid: String::new(),
            published_id: String::new(),
            vendor_id: 0x1002,
            device_id: 0x74a1,
            compute_partition: "SPX".into(),
            memory_partition: "NPS1".into(),
            available_compute_partitions: vec![],
            health: health.into(),
            health_reason: String::new(),
            partitions: vec![],
            links: vec![],
            partition_profiles: vec![],
        }
    }

    #[test]
    fn one_device_info_per_gpu_as_hami_reads_it() {
        let gpus = [
            gpu("0000:05:00.0", "gfx942", "Healthy"),
            gpu("0000:15:00.0", "gfx1201", "Missing"),
        ];
        let snapshot = Snapshot::from_gpud(&gpus, BTreeMap::new(), DmemBackend::On);
        let value = annotation(&snapshot, 0).unwrap();
        let parsed = parse_register(&value).unwrap();
        assert_eq!(parsed.len(), 2);
        assert_eq!(parsed[0].id, "GPU-8ecb9de71e8aa405");
        assert_eq!(parsed[0].count, 10);
        assert_eq!(parsed[1].count, 2, "gfx12 splits in two");
        assert_eq!(parsed[0].devmem, 196_608);
        assert_eq!(parsed[0].devcore, 304);
        assert_eq!(parsed[0].device_type, "AMD Instinct MI300X");
        assert_eq!(parsed[0].numa, 1);
        assert!(parsed[0].health);
        assert!(!parsed[1].health, "anything but Healthy is unhealthy");
        let mut nameless = gpu("0000:25:00.0", "gfx942", "Healthy");
        nameless.market_name.clear();
        let nameless = Device::whole(&nameless);
        assert_eq!(device_info(&nameless, 0).device_type, "AMD gfx942");
        assert_eq!(parsed[0].custominfo.pci_bdf, "0000:05:00.0");
    }

    /// `index` is the card minor, as HAMi's Go AMD plugin publishes it;
    /// a device without a card node leaves it out (0).
    #[test]
    fn index_is_the_drm_card_minor() {
        let partition = crate::testutil::partition;
        let gpus = [
            gpu("0000:05:00.0", "gfx942", "Healthy"),
            gpu("0000:15:00.0", "gfx942", "Healthy"),
        ];
        let partitions = BTreeMap::from([
            (
                "0000:05:00.0".to_owned(),
                vec![partition("0000:05:00.0", 0, 3)],
            ),
            (
                "0000:15:00.0".to_owned(),
                vec![partition("0000:15:00.0", 0, -1)],
            ),
        ]);
        let snapshot = Snapshot::from_gpud(&gpus, partitions, DmemBackend::default());
        let value = annotation(&snapshot, 0).unwrap();
        let parsed = parse_register(&value).unwrap();
        assert_eq!((parsed[0].index, parsed[1].index), (3, 0));
        let shown = |i: usize| parsed[i].custominfo.extra["rocrVisibleDevice"].clone();
        assert_eq!(shown(0), "GPU-8ecb9de71e8aa405");
        assert!(value.contains(r#""index":3"#), "{value}");
    }

    /// A partition entry names its GPU (`gpuBDF`) and its current profile;
    /// the GPU's menu and CRIU properties are not repeated in it.
    #[test]
    fn a_partition_entry_names_its_gpu_and_nothing_per_gpu() {
        let mut whole = gpu("0000:05:00.0", "gfx942", "Healthy");
        whole.compute_partition = "CPX".into();
        whole.partition_profiles = vec![ipc::types::PartitionProfile {
            index: 3,
            compute_partition: "CPX".into(),
            memory_partitions: vec!["NPS1".into()],
            partitions: 8,
            xcc_per_partition: 1,
        }];
        let parts = (0..8)
            .map(|i| {
                let mut p = crate::testutil::partition("0000:05:00.0", i, 1);
                p.bdf = format!("0000:05:00.{i}");
                p.restore_props = [("fw_version".to_owned(), 177)].into();
                p
            })
            .collect();
        let partitions = [("0000:05:00.0".to_owned(), parts)].into();
        let raw = Snapshot::from_gpud(&[whole], partitions, DmemBackend::default());
        let snapshot = crate::inventory::partition::view(
            &raw,
            crate::inventory::partition::OperatingMode::Partition,
        );
        let value: Vec<serde_json::Value> =
            serde_json::from_str(&annotation(&snapshot, 0).unwrap()).unwrap();
        assert_eq!(value.len(), 8);
        assert_eq!(
            value[2]["custominfo"],
            serde_json::json!({"pciBDF": "0000:05:00.2", "gpuBDF": "0000:05:00.0",
                               "partitionProfile": "cpx_nps1"})
        );
        // Whole GPUs are their own key: no gpuBDF.
        let whole = annotation(&raw, 0).unwrap();
        assert!(
            !whole.contains("gpuBDF") && !whole.contains("criu"),
            "{whole}"
        );
    }

    #[test]
    fn an_empty_inventory_is_not_published() {
        assert!(annotation(&Snapshot::default(), 0).is_err());
    }

    #[test]
    fn writes_only_when_the_node_differs() {
        assert!(needs_write("[1]", None));
        assert!(needs_write("[1]", Some("[2]")));
        assert!(!needs_write("[1]", Some("[1]")));
    }
}
