//! Values that cross the bus, and typed snapshots of the objects' properties.
//!
//! The GPU and partition properties are declared once each, in a table
//! macro ([`gpu_properties!`](crate::gpu_properties),
//! [`partition_properties!`](crate::partition_properties)): the snapshot
//! structs, their `GetAll` decoding and `PropertiesChanged` values, the
//! client proxies and amd-gpud's served getters are all expanded from it
//! (see [`crate::table`]).

use serde::{Deserialize, Serialize};
use zbus::zvariant::{Type, Value};

/// A property name with its value, as `GetAll` and `PropertiesChanged` carry it.
pub type Property = (&'static str, Value<'static>);

/// A link from one GPU to another (`(ssstu)`).
#[derive(
    Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Type, Value, zbus::zvariant::OwnedValue,
)]
pub struct Link {
    /// PCI address of the other GPU.
    pub peer: String,
    /// `pcie`, `xgmi`, or `other-<CRAT type>`.
    pub link_type: String,
    /// `io_link`, `p2p_link` or `host` (no KFD entry: through the CPUs).
    pub via: String,
    /// KFD weight; 0 when unknown.
    pub weight: u64,
    /// Hops; 0 when unknown.
    pub hops: u32,
}

/// One compute-partition profile a GPU offers in its current memory mode
/// (`(usasuu)`).
#[derive(
    Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Type, Value, zbus::zvariant::OwnedValue,
)]
pub struct PartitionProfile {
    /// Position in the GPU's menu (AMD SMI's profile index when it lists them).
    pub index: u32,
    /// `SPX`, `DPX`, `TPX`, `QPX` or `CPX`.
    pub compute_partition: String,
    /// Memory modes (`NPS1`, ...) the profile works with.
    pub memory_partitions: Vec<String>,
    /// Partitions the GPU shows in this mode.
    pub partitions: u32,
    /// XCCs in each partition.
    pub xcc_per_partition: u32,
}

/// An io link of a KFD node as CRIU's amdgpu plugin reads it (`(su)`).
#[derive(
    Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Type, Value, zbus::zvariant::OwnedValue,
)]
pub struct RestoreLink {
    /// `pcie` or `xgmi` (the only types CRIU keeps).
    pub link_type: String,
    /// KFD node the link points to.
    pub node_to: u32,
}

/// The GPU object's properties, one entry each (see [`crate::table`]):
/// `ipc::gpu_properties!(info)` is [`GpuInfo`], `(proxy)` is
/// `proxy::GpuProxy`, `(serve Object view)` amd-gpud's object.
#[macro_export]
macro_rules! gpu_properties {
    ($($mode:tt)*) => { $crate::__properties! { @norm [$($mode)*] [
        /// Every property of a GPU object, read in one `GetAll`.
        GpuInfo "io.hami.AmdGpu1.Gpu" Gpu
    ] []
        /// PCI address of the physical GPU.
        bdf: String = "Bdf",
        /// ROCr's `GPU-<16 hex digits>`; empty when the GPU has no unique id.
        rocr_uuid: String = "RocrUuid",
        /// KFD `unique_id`, decimal.
        unique_id: String = "UniqueId",
        /// gfx target (`gfx942`); empty when unknown.
        gfx: String = "Gfx",
        /// Active compute units of the whole GPU.
        compute_units: u32 = "ComputeUnits",
        /// 2 from gfx10 on (CU masks must keep pairs), else 1.
        cus_per_wgp: u32 = "CusPerWgp",
        /// VRAM of the whole GPU in bytes; 0 when unknown.
        vram_bytes: u64 = "VramBytes",
        /// NUMA node; -1 when unknown.
        numa_node: i32 = "NumaNode",
        /// Market name from AMD SMI; empty without it.
        market_name: String = "MarketName",
        /// AMD SMI's device UUID (an opaque label); empty without it.
        amdsmi_uuid: String = "AmdSmiUuid",
        /// The ID the GPU is published under: chosen the first time amd-gpud
        /// saw it and kept across AMD SMI failures and restarts.
        published_id: String = "PublishedId" [newer],
        /// PCI vendor id (0x1002).
        vendor_id: u32 = "VendorId",
        /// PCI device id.
        device_id: u32 = "DeviceId",
        /// Current compute partition mode (`SPX`, `CPX`, ...); empty when none.
        compute_partition: String = "ComputePartition",
        /// Current memory partition mode (`NPS1`, ...); empty when none.
        memory_partition: String = "MemoryPartition",
        /// Compute partition modes the GPU offers in its memory mode.
        available_compute_partitions: Vec<String> = "AvailableComputePartitions",
        /// `Healthy`, `Unhealthy` or `Missing` (a GPU is unhealthy when one of
        /// its partitions fails its probes).
        health: String = "Health",
        /// Why the GPU is not healthy, as found when it went out of service;
        /// empty while healthy.
        health_reason: String = "HealthReason",
        /// Partition objects of this GPU, by index.
        partitions: Vec<::zbus::zvariant::OwnedObjectPath> = "Partitions",
        /// Links to the other GPUs: (peer, type, via, weight, hops).
        links: Vec<$crate::types::Link> = "Links",
        /// Compute-partition profiles the GPU offers in its memory mode: (index,
        /// mode, memory modes, partitions, XCCs per partition); empty without
        /// compute partitions.
        partition_profiles: Vec<$crate::types::PartitionProfile> = "PartitionProfiles",
    } };
}

/// The partition object's properties, one entry each (see
/// [`crate::table`] and [`gpu_properties!`](crate::gpu_properties)).
#[macro_export]
macro_rules! partition_properties {
    ($($mode:tt)*) => { $crate::__properties! { @norm [$($mode)*] [
        /// Every property of a partition object.
        PartitionInfo "io.hami.AmdGpu1.Partition" Partition
    ] []
        /// Partition index within its GPU (0 when unpartitioned).
        index: u32 = "Index",
        /// KFD topology node index.
        kfd_node: u32 = "KfdNode",
        /// KFD `gpu_id`; 0 when unknown.
        gpu_id: u64 = "GpuId",
        /// DRM render minor (`/dev/dri/renderD<N>`); 0 when none.
        render_minor: u32 = "RenderMinor",
        /// DRM card minor; -1 when unknown.
        card_minor: i32 = "CardMinor",
        /// PCI address from KFD `location_id` (the function carries the index).
        bdf: String = "Bdf",
        /// Active compute units of this partition.
        compute_units: u32 = "ComputeUnits",
        /// XCCs in this partition.
        num_xcc: u32 = "NumXcc",
        /// VRAM of this partition in bytes.
        vram_bytes: u64 = "VramBytes",
        /// XCP platform device serving the render node; -1 for the PCI function.
        xcp: i32 = "Xcp",
        /// The GPU object this partition belongs to.
        gpu: ::zbus::zvariant::OwnedObjectPath = "Gpu",
        /// `Healthy`, `Unhealthy` or `Missing`.
        health: String = "Health",
        /// What CRIU's amdgpu plugin compares when it restores a checkpoint onto
        /// this KFD node, by KFD property name: fw_version, sdma_fw_version,
        /// caches_count, num_gws, vram_size and capability (relaxed by the
        /// KFD_*_CHECK options), the values always compared for equality
        /// (vram_public as 0/1), and domain, drm_render_minor, hive_id (saved,
        /// not compared).
        restore_props: ::std::collections::BTreeMap<String, u64>
            as ::std::collections::HashMap<String, u64> = "RestoreProps",
        /// The node's PCIe and XGMI io links as CRIU reads them: (type, node_to).
        restore_links: Vec<$crate::types::RestoreLink> = "RestoreLinks",
        /// Why the partition is not healthy, as found when it went out of
        /// service; empty while healthy.
        health_reason: String = "HealthReason",
    } };
}

crate::gpu_properties!(info);
crate::partition_properties!(info);

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use zbus::zvariant::OwnedValue;

    use super::*;

    fn owned(props: Vec<Property>) -> HashMap<String, OwnedValue> {
        props
            .into_iter()
            .map(|(name, value)| (name.to_owned(), OwnedValue::try_from(value).unwrap()))
            .collect()
    }

    #[test]
    fn gpu_properties_round_trip_and_name_what_is_missing() {
        let gpu = GpuInfo {
            bdf: "0000:05:00.0".into(),
            rocr_uuid: "GPU-0123456789abcdef".into(),
            unique_id: "81985529216486895".into(),
            gfx: "gfx942".into(),
            compute_units: 304,
            cus_per_wgp: 1,
            vram_bytes: 192 << 30,
            numa_node: -1,
            market_name: String::new(),
            amdsmi_uuid: String::new(),
            published_id: "GPU-0123456789abcdef".into(),
            vendor_id: 0x1002,
            device_id: 0x74a1,
            compute_partition: "SPX".into(),
            memory_partition: "NPS1".into(),
            available_compute_partitions: vec!["SPX".into(), "CPX".into()],
            health: crate::HEALTHY.into(),
            health_reason: String::new(),
            partitions: vec![crate::partition_path("0000:05:00.0", 0)],
            links: vec![Link {
                peer: "0000:15:00.0".into(),
                link_type: "xgmi".into(),
                via: "io_link".into(),
                weight: 15,
                hops: 1,
            }],
            partition_profiles: vec![PartitionProfile {
                index: 3,
                compute_partition: "CPX".into(),
                memory_partitions: vec!["NPS1".into(), "NPS4".into()],
                partitions: 8,
                xcc_per_partition: 1,
            }],
        };
        let mut props = owned(gpu.to_properties());
        assert_eq!(GpuInfo::from_properties(props.clone()).unwrap(), gpu);
        let names: Vec<&str> = gpu.to_properties().iter().map(|p| p.0).collect();
        assert_eq!(names, GpuInfo::PROPERTY_NAMES);
        // A [newer] property may be absent (an older amd-gpud), not mistyped.
        let mut older = props.clone();
        older.remove("PublishedId");
        assert_eq!(GpuInfo::from_properties(older).unwrap().published_id, "");
        let mut mistyped = props.clone();
        mistyped.insert("PublishedId".into(), OwnedValue::from(7_u32));
        assert!(GpuInfo::from_properties(mistyped).is_err());
        props.remove("Links");
        let err = GpuInfo::from_properties(props).unwrap_err();
        assert!(err.to_string().contains("Links"), "{err}");
    }

    #[test]
    fn partition_properties_round_trip_and_reject_wrong_types() {
        let part = PartitionInfo {
            index: 3,
            kfd_node: 5,
            gpu_id: 52527,
            render_minor: 131,
            card_minor: -1,
            bdf: "0000:05:00.3".into(),
            compute_units: 38,
            num_xcc: 1,
            vram_bytes: 24 << 30,
            xcp: 2,
            gpu: crate::gpu_path("0000:05:00.0"),
            health: crate::MISSING.into(),
            restore_props: [
                ("fw_version".to_owned(), 177),
                ("capability".to_owned(), 2_893_521_536),
            ]
            .into_iter()
            .collect(),
            restore_links: vec![RestoreLink {
                link_type: "xgmi".into(),
                node_to: 3,
            }],
            health_reason: "no longer found".into(),
        };
        let mut props = owned(part.to_properties());
        assert_eq!(PartitionInfo::from_properties(props.clone()).unwrap(), part);
        props.insert("Index".into(), OwnedValue::from(7_u64));
        let err = PartitionInfo::from_properties(props).unwrap_err();
        assert!(err.to_string().contains("Index"), "{err}");
    }
}
