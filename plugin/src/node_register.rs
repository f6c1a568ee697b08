//! What the plugin publishes as `hami.io/node-amd-register`: one HAMi
//! DeviceInfo per GPU, derived from amd-gpud's inventory and the slot count
//! offered to kubelet, so that HAMi and kubelet see the same devices.
//!
//! Writing is idempotent: the plugin patches the node only when the value it
//! wants differs from what the node carries (watch-fed), and on a graceful
//! stop it republishes every device with `health: false`.

use ipc::types::GpuInfo;

use crate::{
    devices::{gpu_id, slots_of},
    gpud_client::Snapshot,
    hami::{DeviceInfo, HamiError, register::DEVICE_VENDOR, register_annotation},
};

const MIB: u64 = 1024 * 1024;

/// The DeviceInfo of one GPU. `healthy` false forces `health: false` (a
/// graceful stop).
pub fn device_info(gpu: &GpuInfo, split_count: u32, healthy: bool) -> DeviceInfo {
    let count = slots_of(gpu, split_count);
    let mut info = DeviceInfo {
        id: gpu_id(gpu),
        count: i32::try_from(count).unwrap_or(i32::MAX),
        devmem: i32::try_from(gpu.vram_bytes / MIB).unwrap_or(i32::MAX),
        devcore: i32::try_from(gpu.compute_units).unwrap_or(i32::MAX),
        device_type: DeviceInfo::product_type(&product_name(gpu)),
        numa: i64::from(gpu.numa_node),
        health: healthy && gpu.health == ipc::HEALTHY,
        devicevendor: DEVICE_VENDOR.to_owned(),
        ..DeviceInfo::default()
    };
    info.custominfo.pci_bdf = gpu.bdf.clone();
    info
}

/// `custominfo.partitionProfiles` (each profile of the GPU once per memory
/// mode it allows, in the shape of HAMi's MIG profiles: a name, the memory and
/// cores of one partition, and how many there are) and
/// `custominfo.partitionProfile` (the current one, e.g. `cpx_nps1`), for GPUs
/// with compute partitions.
fn add_profiles(info: &mut DeviceInfo, gpu: &GpuInfo) {
    if gpu.partition_profiles.is_empty() {
        return;
    }
    let whole_mib = gpu_whole_mib(gpu, info);
    let mut menu = Vec::new();
    for p in &gpu.partition_profiles {
        let n = p.partitions.max(1);
        for memory in &p.memory_partitions {
            menu.push(serde_json::json!({
                "name": profile_name(&p.compute_partition, memory),
                "index": p.index,
                "computePartition": p.compute_partition.to_ascii_lowercase(),
                "memoryPartition": memory.to_ascii_lowercase(),
                "partitionCount": n,
                "xccPerPartition": p.xcc_per_partition,
                "memoryMB": whole_mib / u64::from(n),
                "core": gpu_whole_cus(gpu, info) / n,
            }));
        }
    }
    let extra = &mut info.custominfo.extra;
    extra.insert(
        "partitionProfiles".to_owned(),
        serde_json::Value::Array(menu),
    );
    if !gpu.compute_partition.is_empty() && !gpu.memory_partition.is_empty() {
        let current = profile_name(&gpu.compute_partition, &gpu.memory_partition);
        extra.insert("partitionProfile".to_owned(), current.into());
    }
}

/// Properties CRIU's amdgpu plugin compares at restore, as published; the
/// others (`domain`, `drm_render_minor`, `hive_id`) differ per device anyway.
const NOT_COMPARED: [&str; 3] = ["domain", "drm_render_minor", "hive_id"];

/// `custominfo.criu`: the restore properties of the device's first partition
/// (its partitions share them), non-zero ones only, so that a controller can
/// pre-select nodes for a checkpoint without asking amd-gpud on each.
fn add_restore_props(info: &mut DeviceInfo, snapshot: &Snapshot, gpu: &GpuInfo) {
    let Some(first) = snapshot.partitions.get(&gpu.bdf).and_then(|p| p.first()) else {
        return;
    };
    let props: serde_json::Map<String, serde_json::Value> = first
        .restore_props
        .iter()
        .filter(|(k, v)| **v != 0 && !NOT_COMPARED.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), (*v).into()))
        .collect();
    if !props.is_empty() {
        info.custominfo
            .extra
            .insert("criu".to_owned(), serde_json::Value::Object(props));
    }
}

/// `cpx_nps1`.
fn profile_name(compute: &str, memory: &str) -> String {
    format!(
        "{}_{}",
        compute.to_ascii_lowercase(),
        memory.to_ascii_lowercase()
    )
}

/// The whole GPU's MiB: a partition device carries its share, times the count.
fn gpu_whole_mib(gpu: &GpuInfo, info: &DeviceInfo) -> u64 {
    let share = gpu.vram_bytes / MIB;
    if info.count == 1 && !info.mode.is_empty() {
        share * u64::from(current_count(gpu))
    } else {
        share
    }
}

fn gpu_whole_cus(gpu: &GpuInfo, info: &DeviceInfo) -> u32 {
    if info.count == 1 && !info.mode.is_empty() {
        gpu.compute_units * current_count(gpu)
    } else {
        gpu.compute_units
    }
}

/// Partitions of the current profile.
fn current_count(gpu: &GpuInfo) -> u32 {
    gpu.partition_profiles
        .iter()
        .find(|p| {
            p.compute_partition
                .eq_ignore_ascii_case(&gpu.compute_partition)
        })
        .map_or(1, |p| p.partitions.max(1))
}

/// The market name, or `AMD <gfx>` when AMD SMI did not give one (HAMi wants
/// a type that starts with `AMD`).
fn product_name(gpu: &GpuInfo) -> String {
    match (gpu.market_name.is_empty(), gpu.gfx.is_empty()) {
        (false, _) => gpu.market_name.clone(),
        (true, false) => format!("AMD {}", gpu.gfx),
        (true, true) => "AMD GPU".to_owned(),
    }
}

/// The annotation value for the whole snapshot.
///
/// # Errors
/// When a device would break HAMi's parser (the error names it), or the
/// snapshot holds no GPU (HAMi ignores an empty list and keeps stale devices).
pub fn annotation(
    snapshot: &Snapshot,
    split_count: u32,
    healthy: bool,
) -> Result<String, HamiError> {
    let devices: Vec<DeviceInfo> = snapshot
        .gpus
        .iter()
        .map(|gpu| {
            let mut info = device_info(gpu, split_count, healthy);
            if snapshot.is_partition(&gpu.bdf) {
                // A compute partition, allocated whole; never `mig`.
                info.count = 1;
                info.mode = gpu.compute_partition.to_ascii_lowercase();
            }
            info.index = card_minor(snapshot, gpu);
            add_rocr_selection(&mut info, gpu);
            add_profiles(&mut info, gpu);
            add_restore_props(&mut info, snapshot, gpu);
            info
        })
        .collect();
    register_annotation(&devices)
}

/// `index`: the device's DRM card minor (`/dev/dri/card<N>`), as HAMi's Go
/// AMD plugin publishes it; HAMi uses it as a metrics label and a
/// tie-break. The first partition's for a whole GPU, the partition's own
/// for a partition device; 0 (omitted) when there is no card node.
fn card_minor(snapshot: &Snapshot, gpu: &GpuInfo) -> u32 {
    snapshot
        .partitions
        .get(&gpu.bdf)
        .and_then(|parts| parts.first())
        .and_then(|p| u32::try_from(p.card_minor).ok())
        .unwrap_or(0)
}

/// `custominfo.rocrVisibleDevice`: what a container's `ROCR_VISIBLE_DEVICES`
/// selects the device by. Its ROCr UUID (`GPU-<16 hex>`) when it has one;
/// `index` for a device without (an APU, whose `unique_id` is 0, or a
/// compute partition): then every GPU of that container is selected by its
/// container-local index, its rank among the container's GPUs in KFD
/// order, since ROCr stops at the first token it cannot parse.
fn add_rocr_selection(info: &mut DeviceInfo, gpu: &GpuInfo) {
    let uuid = &gpu.rocr_uuid;
    let selectable = uuid.len() == 20
        && uuid.starts_with("GPU-")
        && uuid[4..].bytes().all(|b| b.is_ascii_hexdigit());
    let shown = if selectable { uuid.as_str() } else { "index" };
    info.custominfo
        .extra
        .insert("rocrVisibleDevice".to_owned(), shown.into());
}

/// Whether the node must be patched: only when the wanted value differs from
/// what the node carries now.
pub fn needs_write(wanted: &str, on_node: Option<&str>) -> bool {
    on_node != Some(wanted)
}

#[cfg(test)]
mod tests {
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
        let snapshot = Snapshot {
            gpus: vec![
                gpu("0000:05:00.0", "gfx942", "Healthy"),
                gpu("0000:15:00.0", "gfx1201", "Missing"),
            ],
            partitions: Default::default(),
            connected: true,
            dmem_backend: "on".into(),
            parents: std::collections::BTreeMap::new(),
        };
        let value = annotation(&snapshot, 0, true).unwrap();
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
        assert_eq!(device_info(&nameless, 0, true).device_type, "AMD gfx942");
        assert_eq!(parsed[0].custominfo.pci_bdf, "0000:05:00.0");
        let stopping = parse_register(&annotation(&snapshot, 4, false).unwrap()).unwrap();
        assert!(stopping.iter().all(|d| !d.health && d.count == 4));
    }

    /// `index` is the card minor, as HAMi's Go AMD plugin publishes it;
    /// a device without a card node leaves it out (0).
    #[test]
    fn index_is_the_drm_card_minor() {
        let partition = crate::testutil::partition;
        let snapshot = Snapshot {
            gpus: vec![
                gpu("0000:05:00.0", "gfx942", "Healthy"),
                gpu("0000:15:00.0", "gfx942", "Healthy"),
            ],
            partitions: std::collections::BTreeMap::from([
                (
                    "0000:05:00.0".to_owned(),
                    vec![partition("0000:05:00.0", 0, 3)],
                ),
                (
                    "0000:15:00.0".to_owned(),
                    vec![partition("0000:15:00.0", 0, -1)],
                ),
            ]),
            connected: true,
            ..Snapshot::default()
        };
        let value = annotation(&snapshot, 0, true).unwrap();
        let parsed = parse_register(&value).unwrap();
        assert_eq!((parsed[0].index, parsed[1].index), (3, 0));
        let shown = |i: usize| parsed[i].custominfo.extra["rocrVisibleDevice"].clone();
        assert_eq!(shown(0), "GPU-8ecb9de71e8aa405");
        assert!(value.contains(r#""index":3"#), "{value}");
    }

    #[test]
    fn an_empty_inventory_is_not_published() {
        assert!(annotation(&Snapshot::default(), 0, true).is_err());
    }

    #[test]
    fn writes_only_when_the_node_differs() {
        assert!(needs_write("[1]", None));
        assert!(needs_write("[1]", Some("[2]")));
        assert!(!needs_write("[1]", Some("[1]")));
    }
}
