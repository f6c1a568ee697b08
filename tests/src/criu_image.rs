//! CRIU amdgpu plugin checkpoint images for tests: `amdgpu-kfd-<id>.img` as CRIU would
//! write it for a process that sees every GPU of a node, built from that node's KFD
//! topology (a builder fixture or a real capture) with the schemas in `gpud/proto/`.
//!
//! ```no_run
//! use tests::criu_image::{Format, ImageOptions, write_image};
//! let root = tempfile::tempdir()?; // a host root with sys/class/kfd/kfd/topology
//! let path = write_image(root.path(), &ImageOptions::new(Format::V3_17), root.path())?;
//! # Ok::<(), std::io::Error>(())
//! ```

use std::{
    io,
    path::{Path, PathBuf},
};

use gpud::{
    HostPaths,
    testing::inventory::RestoreProps,
    testing::restore_check::{
        image::frame,
        proto::{current, v3_17},
    },
    testing::topology::{KfdNode, LinkType, read_topology},
};

use crate::fixture::{self, BuildOptions, NodeSpec};

/// Which CRIU wrote the image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// CRIU 3.17.1 to 4.2: `device_entry`, `bo_entry` without a handle.
    V3_17,
    /// CRIU after 4.2: `kfd_device_entry`, `kfd_bo_entry` with a handle.
    Newest,
}

/// How to write an image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageOptions {
    pub format: Format,
    /// Buffer objects to list (they decide whether the format shows).
    pub bos: u32,
    /// `(heap_type, size_in_bytes)` of the VRAM bank for GPU nodes whose topology has
    /// none (captures made without `mem_banks/`); CRIU cannot dump without one.
    pub vram_fallback: Option<(u64, u64)>,
    /// `<id>` of `amdgpu-kfd-<id>.img`.
    pub id: u32,
}

impl ImageOptions {
    /// Two buffer objects, no VRAM fallback, id 5.
    #[must_use]
    pub fn new(format: Format) -> Self {
        Self {
            format,
            bos: 2,
            vram_fallback: None,
            id: 5,
        }
    }
}

/// What one device entry holds.
struct Entry {
    node_id: u32,
    gpu_id: u32,
    cpu_cores: u32,
    props: RestoreProps,
    links: Vec<(u32, u32)>,
}

/// CRIU's fields are 32 bits wide; fixture values always fit.
fn n32(value: u64) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX)
}

fn entry(node: &KfdNode, opts: &ImageOptions) -> Entry {
    // A capture may lack gpu_id files; the dumping host had them. Any unique
    // non-zero id will do (ids are not compared).
    let gpu_id = match node.gpu_id {
        Some(id) => n32(id),
        None if node.is_gpu() => 0x8000 + node.index,
        None => 0,
    };
    let mut props = RestoreProps::from_node(node);
    if let Some((heap, size)) = opts.vram_fallback
        && gpu_id != 0
        && props.vram_size == 0
    {
        props.vram_size = size;
        props.vram_public = heap == 1;
    }
    let links = node
        .io_links
        .iter()
        .filter_map(|l| {
            let kind = match l.link_type {
                LinkType::Pcie => 2,
                LinkType::Xgmi => 11,
                LinkType::Other(_) => return None,
            };
            Some((kind, l.node_to))
        })
        .collect();
    let cpu_cores = if gpu_id == 0 {
        n32(node.properties.get_or_zero("cpu_cores_count"))
    } else {
        0
    };
    Entry {
        node_id: node.index,
        gpu_id,
        cpu_cores,
        props,
        links,
    }
}

/// A device entry of either schema from an [`Entry`].
trait FromEntry {
    fn from_entry(e: &Entry) -> Self;
}

fn same<T>(value: T) -> T {
    value
}

/// Implements [`FromEntry`]: `$wrap` is `Some` for the newest schema (optional fields
/// in our reader's declaration) and `same` for v3.17 (required fields).
macro_rules! impl_from_entry {
    ($entry:ty, $link:ident, $wrap:ident) => {
        impl FromEntry for $entry {
            fn from_entry(e: &Entry) -> Self {
                let p = &e.props;
                Self {
                    node_id: $wrap(e.node_id),
                    gpu_id: $wrap(e.gpu_id),
                    cpu_cores_count: $wrap(e.cpu_cores),
                    simd_count: $wrap(n32(p.simd_count)),
                    mem_banks_count: $wrap(n32(p.mem_banks_count)),
                    caches_count: $wrap(n32(p.caches_count)),
                    io_links_count: $wrap(n32(p.io_links_count)),
                    max_waves_per_simd: $wrap(n32(p.max_waves_per_simd)),
                    lds_size_in_kb: $wrap(n32(p.lds_size_in_kb)),
                    // CRIU never parses gds_size_in_kb: always 0 in images.
                    gds_size_in_kb: $wrap(0),
                    num_gws: $wrap(n32(p.num_gws)),
                    wave_front_size: $wrap(n32(p.wave_front_size)),
                    array_count: $wrap(n32(p.array_count)),
                    simd_arrays_per_engine: $wrap(n32(p.simd_arrays_per_engine)),
                    cu_per_simd_array: $wrap(n32(p.cu_per_simd_array)),
                    simd_per_cu: $wrap(n32(p.simd_per_cu)),
                    max_slots_scratch_cu: $wrap(n32(p.max_slots_scratch_cu)),
                    vendor_id: $wrap(n32(p.vendor_id)),
                    device_id: $wrap(n32(p.device_id)),
                    domain: $wrap(n32(p.domain)),
                    drm_render_minor: $wrap(n32(p.drm_render_minor)),
                    hive_id: $wrap(p.hive_id),
                    num_sdma_engines: $wrap(n32(p.num_sdma_engines)),
                    num_sdma_xgmi_engines: $wrap(n32(p.num_sdma_xgmi_engines)),
                    num_sdma_queues_per_engine: $wrap(n32(p.num_sdma_queues_per_engine)),
                    num_cp_queues: $wrap(n32(p.num_cp_queues)),
                    fw_version: $wrap(n32(p.fw_version)),
                    capability: $wrap(n32(p.capability)),
                    sdma_fw_version: $wrap(n32(p.sdma_fw_version)),
                    vram_public: $wrap(u32::from(p.vram_public)),
                    vram_size: $wrap(p.vram_size),
                    iolinks: e
                        .links
                        .iter()
                        .map(|&(kind, to)| $link {
                            r#type: $wrap(kind),
                            node_to_id: $wrap(to),
                        })
                        .collect(),
                }
            }
        }
    };
}

use current::DevIolink as NewLink;
use v3_17::DevIolink as OldLink;
impl_from_entry!(current::KfdDeviceEntry, NewLink, Some);
impl_from_entry!(v3_17::DeviceEntry, OldLink, same);

/// The GPU a buffer object belongs to: the first GPU entry's.
fn first_gpu(entries: &[Entry]) -> u32 {
    entries
        .iter()
        .find(|e| e.gpu_id != 0)
        .map_or(0, |e| e.gpu_id)
}

fn counts(entries: &[Entry]) -> (u32, u32) {
    let gpus = entries.iter().filter(|e| e.gpu_id != 0).count();
    let gpus = u32::try_from(gpus).unwrap_or(u32::MAX);
    let all = u32::try_from(entries.len()).unwrap_or(u32::MAX);
    (gpus, all - gpus)
}

fn newest(entries: &[Entry], opts: &ImageOptions) -> Vec<u8> {
    let (gpus, cpus) = counts(entries);
    let message = current::CriuKfd {
        pid: Some(4242),
        num_of_gpus: Some(gpus),
        num_of_cpus: Some(cpus),
        device_entries: entries
            .iter()
            .map(current::KfdDeviceEntry::from_entry)
            .collect(),
        num_of_bos: Some(u64::from(opts.bos)),
        bo_entries: (0..opts.bos)
            .map(|i| current::KfdBoEntry {
                addr: Some(0x7f00_0000_0000 + u64::from(i) * 0x20_0000),
                size: Some(0x20_0000),
                offset: Some(0),
                alloc_flags: Some(1),
                gpu_id: Some(first_gpu(entries)),
                handle: Some(i + 1),
            })
            .collect(),
        num_of_objects: Some(0),
        shared_mem_size: Some(0),
        shared_mem_magic: Some(0),
        priv_data: Some(vec![0; 32]),
    };
    frame(&message)
}

fn old(entries: &[Entry], opts: &ImageOptions) -> Vec<u8> {
    let (gpus, cpus) = counts(entries);
    let message = v3_17::CriuKfd {
        pid: 4242,
        num_of_gpus: gpus,
        num_of_cpus: cpus,
        device_entries: entries.iter().map(v3_17::DeviceEntry::from_entry).collect(),
        num_of_bos: u64::from(opts.bos),
        bo_entries: (0..opts.bos)
            .map(|i| v3_17::BoEntry {
                addr: 0x7f00_0000_0000 + u64::from(i) * 0x20_0000,
                size: 0x20_0000,
                offset: 0,
                alloc_flags: 1,
                gpu_id: first_gpu(entries),
            })
            .collect(),
        num_of_objects: 0,
        shared_mem_size: 0,
        shared_mem_magic: 0,
        priv_data: vec![0; 32],
    };
    frame(&message)
}

/// The bytes of the image CRIU would write for a process that sees every GPU of the
/// host root `root`.
///
/// # Errors
/// When the topology cannot be read.
pub fn image_bytes(root: &Path, opts: &ImageOptions) -> io::Result<Vec<u8>> {
    let topology = read_topology(&HostPaths::under(root)).map_err(io::Error::other)?;
    let entries: Vec<Entry> = topology.nodes.iter().map(|n| entry(n, opts)).collect();
    Ok(match opts.format {
        Format::V3_17 => old(&entries, opts),
        Format::Newest => newest(&entries, opts),
    })
}

/// Writes `amdgpu-kfd-<id>.img` for the host root `root` into `dir`; returns its path.
///
/// # Errors
/// When the topology cannot be read or the file cannot be written.
pub fn write_image(root: &Path, opts: &ImageOptions, dir: &Path) -> io::Result<PathBuf> {
    let path = dir.join(format!("amdgpu-kfd-{}.img", opts.id));
    std::fs::create_dir_all(dir)?;
    std::fs::write(&path, image_bytes(root, opts)?)?;
    Ok(path)
}

/// The checkpoint layouts images are made for: one GPU, an 8-GPU XGMI hive over two
/// NUMA nodes, and 8 PCIe-only GPUs over two NUMA nodes.
#[must_use]
pub fn layouts() -> Vec<(&'static str, NodeSpec)> {
    let mut single = fixture::named("rx9070xt-igpu").unwrap_or_else(fixture::models::rx9070xt_igpu);
    single.gpus.truncate(1);
    let hive = fixture::models::mi300x_8(
        fixture::PartitionMode::Spx,
        "NPS1",
        fixture::XcpSpelling::Underscore,
    );
    let mut numa = hive.clone();
    numa.gpus.iter_mut().for_each(|g| g.hive_id = 0);
    vec![
        ("single-gpu", single),
        ("xgmi-hive", hive),
        ("multi-numa", numa),
    ]
}

/// Builds `spec` as a KFD-only host root under `root`.
///
/// # Errors
/// When the fixture cannot be written.
pub fn build_kfd(spec: &NodeSpec, root: &Path) -> io::Result<()> {
    fixture::build(spec, root, &BuildOptions::default()).map(drop)
}
