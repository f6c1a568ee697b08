//! Test helpers shared by the plugin's unit tests.

use ipc::types::GpuInfo;

/// A healthy MI300X at `bdf` (SPX, 304 CUs, 192 GiB, NUMA 0) with ROCr UUID
/// `rocr_uuid`; tests change the fields they care about.
pub fn mi300x(bdf: &str, rocr_uuid: &str) -> GpuInfo {
    GpuInfo {
        bdf: bdf.into(),
        rocr_uuid: rocr_uuid.into(),
        unique_id: "1".into(),
        gfx: "gfx942".into(),
        compute_units: 304,
        cus_per_wgp: 1,
        vram_bytes: 192 << 30,
        numa_node: 0,
        market_name: "AMD Instinct MI300X".into(),
        amdsmi_uuid: String::new(),
        vendor_id: 0x1002,
        device_id: 0x74a1,
        compute_partition: String::new(),
        memory_partition: String::new(),
        available_compute_partitions: vec![],
        health: ipc::HEALTHY.into(),
        health_reason: String::new(),
        partitions: vec![],
        links: vec![],
        partition_profiles: vec![],
    }
}
