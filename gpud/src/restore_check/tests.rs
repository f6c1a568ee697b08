//! Tests of the restore check on topologies built in code; the images are
//! covered in `tests/images.rs`, and end to end runs in the `tests` crate.

mod criu_groups;
mod criu_props;
mod criu_search;
mod images;
mod local;
mod matching;
mod quirk;

use super::{
    Mode, Request, Verdict, check,
    local::LocalTopology,
    model::{GpuProps, Link, LinkKind, Location, Node, Topo},
    options::{Check, Options},
};
use crate::restore_check::image::{ImageFormat, KfdImage};

/// Builds a [`Topo`] node by node; GPUs get [`gpu_props`] and a PCIe link
/// to their CPU in both directions.
#[derive(Debug, Default, Clone)]
pub(super) struct TopoBuilder {
    pub topo: Topo,
}

/// A plausible GPU: every compared value non-zero.
pub(super) fn gpu_props() -> GpuProps {
    GpuProps {
        simd_count: 1216,
        mem_banks_count: 1,
        caches_count: 640,
        io_links_count: 4,
        max_waves_per_simd: 8,
        lds_size_in_kb: 64,
        num_gws: 64,
        wave_front_size: 64,
        array_count: 32,
        simd_arrays_per_engine: 1,
        cu_per_simd_array: 10,
        simd_per_cu: 4,
        max_slots_scratch_cu: 32,
        vendor_id: 4098,
        device_id: 0x74a1,
        num_sdma_engines: 16,
        num_sdma_xgmi_engines: 0,
        num_sdma_queues_per_engine: 8,
        num_cp_queues: 24,
        fw_version: 177,
        capability: 0xac77_a280,
        sdma_fw_version: 24,
        vram_public: 1,
        vram_size: 192 << 30,
        domain: 0,
        drm_render_minor: 128,
        hive_id: 0,
    }
}

impl TopoBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    fn node_mut(&mut self, id: u32) -> &mut Node {
        let i = self
            .topo
            .nodes
            .iter()
            .position(|n| n.id == id)
            .expect("node exists");
        &mut self.topo.nodes[i]
    }

    pub fn cpu(mut self, id: u32) -> Self {
        self.topo.nodes.push(Node {
            id,
            gpu_id: 0,
            props: GpuProps::default(),
            links: Vec::new(),
            location: Location::default(),
        });
        self
    }

    /// A GPU with `gpu_id` 0x1000 + `id`, linked to CPU node `cpu`.
    pub fn gpu(self, id: u32, cpu: u32) -> Self {
        self.gpu_with(id, cpu, gpu_props())
    }

    pub fn gpu_with(mut self, id: u32, cpu: u32, props: GpuProps) -> Self {
        self.topo.nodes.push(Node {
            id,
            gpu_id: 0x1000 + id,
            props,
            links: vec![Link {
                kind: LinkKind::Pcie,
                to: cpu,
            }],
            location: Location {
                bdf: Some(format!("0000:{:02x}:00.0", id)),
                render_minor: Some(127 + id),
            },
        });
        self.node_mut(cpu).links.push(Link {
            kind: LinkKind::Pcie,
            to: id,
        });
        self
    }

    /// Links every pair of `ids` by XGMI, both ways.
    pub fn hive(mut self, ids: &[u32]) -> Self {
        for &a in ids {
            for &b in ids.iter().filter(|&&b| b != a) {
                self.node_mut(a).links.push(Link {
                    kind: LinkKind::Xgmi,
                    to: b,
                });
            }
        }
        self
    }

    /// A PCIe link between nodes `a` and `b`, both ways.
    pub fn link(mut self, a: u32, b: u32) -> Self {
        self.node_mut(a).links.push(Link {
            kind: LinkKind::Pcie,
            to: b,
        });
        self.node_mut(b).links.push(Link {
            kind: LinkKind::Pcie,
            to: a,
        });
        self
    }

    /// Changes the properties of GPU node `id`.
    pub fn tweak(mut self, id: u32, f: impl FnOnce(&mut GpuProps)) -> Self {
        f(&mut self.node_mut(id).props);
        self
    }

    pub fn build(self) -> Topo {
        self.topo
    }
}

pub(super) fn image(topo: Topo) -> KfdImage {
    KfdImage {
        source: "test.img".to_owned(),
        pid: 42,
        format: ImageFormat::Any,
        bo_count: 0,
        header_entries: u32::try_from(topo.nodes.len()).ok(),
        gpus_read_as_cpus: Vec::new(),
        trailing_bytes: 0,
        topo,
    }
}

pub(super) fn local(topo: Topo) -> LocalTopology {
    LocalTopology {
        topo,
        notes: Vec::new(),
    }
}

/// Runs one check.
pub(super) fn run(src: &Topo, dst: &Topo, mode: Mode, options: Options) -> Verdict {
    let request = Request {
        mode,
        gpus: Vec::new(),
        options,
    };
    check(&image(src.clone()), &local(dst.clone()), &request).expect("verdict")
}

/// Runs both modes and checks they agree on the answer.
pub(super) fn both(src: &Topo, dst: &Topo, options: &Options) -> (Verdict, Verdict) {
    let criu = run(src, dst, Mode::Criu, options.clone());
    let explain = run(src, dst, Mode::Explain, options.clone());
    assert_eq!(
        criu.restorable, explain.restorable,
        "{criu:#?}\n{explain:#?}"
    );
    assert_eq!(explain.criu_restorable, Some(criu.restorable));
    (criu, explain)
}

/// Options with `checks` off.
pub(super) fn off(checks: &[Check]) -> Options {
    checks
        .iter()
        .fold(Options::default(), |o, c| o.with(*c, false))
}
