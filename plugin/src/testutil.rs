//! Test helpers shared by the plugin's unit tests.

use std::{future::Future, pin::Pin, sync::Arc};

use ipc::types::GpuInfo;
use k8s_openapi::api::core::v1::Pod;

use crate::vram::{PodLookup, PodLookupError, is_pod};

/// The pods of the node as a [`PodLookup`] finds them.
#[derive(Debug, Default)]
pub(crate) struct KnownPods {
    pub(crate) pods: Vec<Arc<Pod>>,
}

impl PodLookup for KnownPods {
    fn find<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        uid: Option<&'a str>,
    ) -> Pin<Box<dyn Future<Output = Result<Arc<Pod>, PodLookupError>> + Send + 'a>> {
        let found = self.pods.iter().find(|p| is_pod(p, namespace, name, uid));
        let answer = found.cloned().ok_or(PodLookupError::NotKnown);
        Box::pin(async move { answer })
    }
}

/// A healthy MI300X at `bdf` (SPX, 304 CUs, 192 GiB, NUMA 0) with ROCr UUID
/// `rocr_uuid`; tests change the fields they care about.
pub(crate) fn mi300x(bdf: &str, rocr_uuid: &str) -> GpuInfo {
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
        published_id: String::new(),
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

/// Partition `index` of the GPU at `gpu_bdf`, healthy, with DRM minors
/// `card` and `128 + index`.
pub(crate) fn partition(gpu_bdf: &str, index: u32, card: i32) -> ipc::types::PartitionInfo {
    ipc::types::PartitionInfo {
        index,
        kfd_node: 2 + index,
        gpu_id: 100 + u64::from(index),
        render_minor: 128 + index,
        card_minor: card,
        bdf: gpu_bdf.into(),
        compute_units: 38,
        num_xcc: 1,
        vram_bytes: 24 << 30,
        xcp: -1,
        gpu: ipc::gpu_path(gpu_bdf),
        health: ipc::HEALTHY.into(),
        restore_props: std::collections::BTreeMap::new(),
        restore_links: vec![],
        health_reason: String::new(),
    }
}
