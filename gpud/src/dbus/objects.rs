//! The GPU and partition objects: read-only properties over a view. Their
//! `#[zbus::interface]` impls are generated from ipc's property tables
//! (`ipc::gpu_properties!`, `ipc::partition_properties!`), so each property
//! is declared once, there: its doc, name, type and value.

use super::views::{GpuView, PartitionView};

/// `io.hami.AmdGpu1.Gpu` on `/io/hami/AmdGpu1/gpu/<bdf>`.
pub struct GpuObject {
    pub view: GpuView,
}

ipc::gpu_properties!(serve GpuObject view);

/// `io.hami.AmdGpu1.Partition` on `/io/hami/AmdGpu1/gpu/<bdf>/partition/<n>`.
pub struct PartitionObject {
    pub view: PartitionView,
}

ipc::partition_properties!(serve PartitionObject view);

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use ipc::types::{GpuInfo, PartitionInfo};
    use zbus::object_server::Interface;

    use super::*;

    /// The `<property name=...>` names of an interface's introspection.
    fn served(intro: &str) -> BTreeSet<String> {
        intro
            .split("<property name=\"")
            .skip(1)
            .filter_map(|rest| rest.split('"').next())
            .map(str::to_owned)
            .collect()
    }

    fn declared(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    fn gpu_view() -> GpuView {
        GpuInfo {
            bdf: "0000:05:00.0".into(),
            rocr_uuid: String::new(),
            unique_id: "1".into(),
            gfx: "gfx942".into(),
            compute_units: 304,
            cus_per_wgp: 1,
            vram_bytes: 1 << 30,
            numa_node: -1,
            market_name: String::new(),
            amdsmi_uuid: String::new(),
            published_id: String::new(),
            vendor_id: 0x1002,
            device_id: 0x74a1,
            compute_partition: "SPX".into(),
            memory_partition: "NPS1".into(),
            available_compute_partitions: Vec::new(),
            health: ipc::HEALTHY.into(),
            health_reason: String::new(),
            partitions: Vec::new(),
            links: Vec::new(),
            partition_profiles: Vec::new(),
        }
    }

    fn partition_view() -> PartitionView {
        PartitionInfo {
            index: 0,
            kfd_node: 1,
            gpu_id: 52527,
            render_minor: 128,
            card_minor: 0,
            bdf: "0000:05:00.0".into(),
            compute_units: 304,
            num_xcc: 8,
            vram_bytes: 1 << 30,
            xcp: -1,
            gpu: ipc::gpu_path("0000:05:00.0"),
            health: ipc::HEALTHY.into(),
            restore_props: [("fw_version".to_owned(), 177)].into_iter().collect(),
            restore_links: Vec::new(),
            health_reason: String::new(),
        }
    }

    #[test]
    fn every_table_entry_is_served_and_nothing_else() {
        let gpu = GpuObject { view: gpu_view() };
        let mut intro = String::new();
        gpu.introspect_to_writer(&mut intro, 0);
        assert_eq!(served(&intro), declared(GpuInfo::PROPERTY_NAMES), "{intro}");
        let announced: Vec<&str> = gpu.view.to_properties().iter().map(|p| p.0).collect();
        assert_eq!(announced, GpuInfo::PROPERTY_NAMES);

        let part = PartitionObject {
            view: partition_view(),
        };
        let mut intro = String::new();
        part.introspect_to_writer(&mut intro, 0);
        assert_eq!(
            served(&intro),
            declared(PartitionInfo::PROPERTY_NAMES),
            "{intro}"
        );
    }
}
