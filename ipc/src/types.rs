//! Values that cross the bus, and typed snapshots of the objects' properties.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};
use zbus::zvariant::{Dict, OwnedObjectPath, OwnedValue, Type, Value};

/// A property name with its value, as `GetAll` and `PropertiesChanged` carry it.
pub type Property = (&'static str, Value<'static>);

use crate::ApiError;

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

/// Every property of a GPU object, read in one `GetAll`.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuInfo {
    pub bdf: String,
    /// `GPU-<16 hex digits>`; empty when the GPU has no unique id.
    pub rocr_uuid: String,
    /// KFD `unique_id` in decimal.
    pub unique_id: String,
    /// `gfx942`, ...; empty when unknown.
    pub gfx: String,
    pub compute_units: u32,
    pub cus_per_wgp: u32,
    pub vram_bytes: u64,
    /// -1 when unknown.
    pub numa_node: i32,
    pub market_name: String,
    pub amdsmi_uuid: String,
    /// The ID the GPU is published under, kept across AMD SMI failures and
    /// restarts; empty from an amd-gpud too old to say.
    pub published_id: String,
    pub vendor_id: u32,
    pub device_id: u32,
    /// Empty when the GPU has no compute partitions.
    pub compute_partition: String,
    pub memory_partition: String,
    pub available_compute_partitions: Vec<String>,
    /// [`HEALTHY`](crate::HEALTHY), [`UNHEALTHY`](crate::UNHEALTHY) or
    /// [`MISSING`](crate::MISSING).
    pub health: String,
    /// Why the GPU is not healthy (set when it went out); empty while healthy.
    pub health_reason: String,
    pub partitions: Vec<OwnedObjectPath>,
    pub links: Vec<Link>,
    /// The compute-partition profiles the GPU offers; empty when it has none.
    pub partition_profiles: Vec<PartitionProfile>,
}

/// Every property of a partition object.
#[derive(Debug, Clone, PartialEq)]
pub struct PartitionInfo {
    pub index: u32,
    pub kfd_node: u32,
    /// 0 when unknown.
    pub gpu_id: u64,
    /// 0 when the partition has no render node.
    pub render_minor: u32,
    /// -1 when unknown.
    pub card_minor: i32,
    pub bdf: String,
    pub compute_units: u32,
    pub num_xcc: u32,
    pub vram_bytes: u64,
    /// XCP platform device number; -1 when served by the PCI function.
    pub xcp: i32,
    pub gpu: OwnedObjectPath,
    pub health: String,
    /// What CRIU's amdgpu plugin compares at restore, by KFD property name
    /// (`fw_version`, `capability`, `vram_size`, `vram_public` as 0/1, ...).
    pub restore_props: BTreeMap<String, u64>,
    /// The node's PCIe and XGMI io links, as CRIU reads them.
    pub restore_links: Vec<RestoreLink>,
    /// Why the partition is not healthy; empty while healthy.
    pub health_reason: String,
}

/// Reads property `name` of type `T` out of a `GetAll` answer.
fn take<T>(props: &mut HashMap<String, OwnedValue>, name: &str) -> Result<T, ApiError>
where
    T: TryFrom<OwnedValue>,
    T::Error: std::fmt::Display,
{
    let value = props
        .remove(name)
        .ok_or_else(|| ApiError::Failed(format!("property {name} is missing")))?;
    T::try_from(value).map_err(|e| ApiError::Failed(format!("property {name}: {e}")))
}

/// As [`take`], for a property an older amd-gpud does not have: absent is
/// the default, mistyped is still an error.
fn take_newer<T>(props: &mut HashMap<String, OwnedValue>, name: &str) -> Result<T, ApiError>
where
    T: TryFrom<OwnedValue> + Default,
    T::Error: std::fmt::Display,
{
    if props.contains_key(name) {
        take(props, name)
    } else {
        Ok(T::default())
    }
}

impl GpuInfo {
    /// Every property with its wire name, in `GetAll` order (the inverse of
    /// [`GpuInfo::from_properties`]).
    pub fn to_properties(&self) -> Vec<Property> {
        vec![
            ("Bdf", self.bdf.clone().into()),
            ("RocrUuid", self.rocr_uuid.clone().into()),
            ("UniqueId", self.unique_id.clone().into()),
            ("Gfx", self.gfx.clone().into()),
            ("ComputeUnits", self.compute_units.into()),
            ("CusPerWgp", self.cus_per_wgp.into()),
            ("VramBytes", self.vram_bytes.into()),
            ("NumaNode", self.numa_node.into()),
            ("MarketName", self.market_name.clone().into()),
            ("AmdSmiUuid", self.amdsmi_uuid.clone().into()),
            ("PublishedId", self.published_id.clone().into()),
            ("VendorId", self.vendor_id.into()),
            ("DeviceId", self.device_id.into()),
            ("ComputePartition", self.compute_partition.clone().into()),
            ("MemoryPartition", self.memory_partition.clone().into()),
            (
                "AvailableComputePartitions",
                self.available_compute_partitions.clone().into(),
            ),
            ("Health", self.health.clone().into()),
            ("HealthReason", self.health_reason.clone().into()),
            ("Partitions", self.partitions.clone().into()),
            ("Links", self.links.clone().into()),
            ("PartitionProfiles", self.partition_profiles.clone().into()),
        ]
    }

    /// Decodes a `GetAll("io.hami.AmdGpu1.Gpu")` answer.
    ///
    /// # Errors
    /// [`ApiError::Failed`] naming the property that is missing or mistyped.
    pub fn from_properties(mut p: HashMap<String, OwnedValue>) -> Result<Self, ApiError> {
        Ok(Self {
            bdf: take(&mut p, "Bdf")?,
            rocr_uuid: take(&mut p, "RocrUuid")?,
            unique_id: take(&mut p, "UniqueId")?,
            gfx: take(&mut p, "Gfx")?,
            compute_units: take(&mut p, "ComputeUnits")?,
            cus_per_wgp: take(&mut p, "CusPerWgp")?,
            vram_bytes: take(&mut p, "VramBytes")?,
            numa_node: take(&mut p, "NumaNode")?,
            market_name: take(&mut p, "MarketName")?,
            amdsmi_uuid: take(&mut p, "AmdSmiUuid")?,
            published_id: take_newer(&mut p, "PublishedId")?,
            vendor_id: take(&mut p, "VendorId")?,
            device_id: take(&mut p, "DeviceId")?,
            compute_partition: take(&mut p, "ComputePartition")?,
            memory_partition: take(&mut p, "MemoryPartition")?,
            available_compute_partitions: take(&mut p, "AvailableComputePartitions")?,
            health: take(&mut p, "Health")?,
            health_reason: take(&mut p, "HealthReason")?,
            partitions: take(&mut p, "Partitions")?,
            links: take(&mut p, "Links")?,
            partition_profiles: take(&mut p, "PartitionProfiles")?,
        })
    }
}

impl PartitionInfo {
    /// Every property with its wire name (the inverse of
    /// [`PartitionInfo::from_properties`]).
    pub fn to_properties(&self) -> Vec<Property> {
        vec![
            ("Index", self.index.into()),
            ("KfdNode", self.kfd_node.into()),
            ("GpuId", self.gpu_id.into()),
            ("RenderMinor", self.render_minor.into()),
            ("CardMinor", self.card_minor.into()),
            ("Bdf", self.bdf.clone().into()),
            ("ComputeUnits", self.compute_units.into()),
            ("NumXcc", self.num_xcc.into()),
            ("VramBytes", self.vram_bytes.into()),
            ("Xcp", self.xcp.into()),
            ("Gpu", self.gpu.clone().into()),
            ("Health", self.health.clone().into()),
            (
                "RestoreProps",
                Value::from(Dict::from(self.restore_props.clone())),
            ),
            ("RestoreLinks", self.restore_links.clone().into()),
            ("HealthReason", self.health_reason.clone().into()),
        ]
    }

    /// Decodes a `GetAll("io.hami.AmdGpu1.Partition")` answer.
    ///
    /// # Errors
    /// [`ApiError::Failed`] naming the property that is missing or mistyped.
    pub fn from_properties(mut p: HashMap<String, OwnedValue>) -> Result<Self, ApiError> {
        Ok(Self {
            index: take(&mut p, "Index")?,
            kfd_node: take(&mut p, "KfdNode")?,
            gpu_id: take(&mut p, "GpuId")?,
            render_minor: take(&mut p, "RenderMinor")?,
            card_minor: take(&mut p, "CardMinor")?,
            bdf: take(&mut p, "Bdf")?,
            compute_units: take(&mut p, "ComputeUnits")?,
            num_xcc: take(&mut p, "NumXcc")?,
            vram_bytes: take(&mut p, "VramBytes")?,
            xcp: take(&mut p, "Xcp")?,
            gpu: take(&mut p, "Gpu")?,
            health: take(&mut p, "Health")?,
            restore_props: take::<HashMap<String, u64>>(&mut p, "RestoreProps")?
                .into_iter()
                .collect(),
            restore_links: take(&mut p, "RestoreLinks")?,
            health_reason: take(&mut p, "HealthReason")?,
        })
    }
}

#[cfg(test)]
mod tests {
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
