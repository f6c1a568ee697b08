//! Reading `amdgpu-kfd-<id>.img`, the image CRIU's amdgpu plugin writes for
//! each `/dev/kfd` file descriptor.
//!
//! Framing: no CRIU magic; 8 bytes of payload length (a native `size_t`,
//! little-endian on the x86-64 hosts CRIU supports here), then one proto2
//! `criu_kfd` message. CRIU reads and unpacks exactly the announced length
//! (checkpoint-restore/criu:plugins/amdgpu/amdgpu_plugin.c, the restore
//! path's `read_fp` and `criu_kfd__unpack`): bytes after it are ignored.
//!
//! Versions: CRIU 3.17 through the newest (criu-dev after v4.2) write the
//! same device entries; after v4.2 buffer-object entries gained a required
//! `handle`. One tolerant schema reads them all; every field CRIU declares
//! required for the topology must be present, so an image of anything else
//! is refused with the field it lacks rather than read as zeros.

use std::{
    fs,
    io::Read,
    path::{Path, PathBuf},
};

use prost::Message;
use serde::Serialize;

use super::{
    model::{GpuProps, Link, LinkKind, Location, Node, Topo},
    proto::current::{CriuKfd, KfdDeviceEntry},
};

/// Largest payload accepted: D-Bus's array limit, far above a real image's
/// topology and BO table.
pub const MAX_IMAGE_BYTES: u64 = 64 << 20;

/// Most device entries accepted (a host has at most a few dozen KFD nodes).
pub const MAX_DEVICES: usize = 1024;

/// CRIU core images start with one of these (little-endian u32), unlike the
/// plugin's images.
const CORE_MAGICS: [u32; 2] = [0x5476_4319, 0x5831_3116];

/// Which CRIU versions write an image like this one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum ImageFormat {
    /// No buffer objects: CRIU 3.17 and every later version read it alike.
    #[serde(rename = "criu-3.17-or-later")]
    Any,
    /// Buffer objects without `handle`: CRIU 3.17 to 4.2.
    #[serde(rename = "criu-3.17-to-4.2")]
    V3_17ToV4_2,
    /// Buffer objects with `handle`: CRIU after 4.2.
    #[serde(rename = "criu-after-4.2")]
    AfterV4_2,
}

/// What a kfd image says about the checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KfdImage {
    /// Where it came from (a path, or "image" for bytes).
    pub source: String,
    pub pid: u32,
    pub format: ImageFormat,
    /// Number of buffer objects.
    pub bo_count: usize,
    /// The nodes the dumping CRIU saw, in entry order.
    pub topo: Topo,
    /// `num_of_gpus + num_of_cpus` of the header (a 32-bit sum, as CRIU
    /// adds them); `None` when either is missing.
    pub header_entries: Option<u32>,
    /// Nodes with a `gpu_id` whose entry also has `cpu_cores_count` set:
    /// CRIU reads such an entry as a CPU's and keeps none of its GPU values.
    pub gpus_read_as_cpus: Vec<u32>,
    /// Bytes after the message the header announces (CRIU never reads them).
    pub trailing_bytes: u64,
}

/// How CRIU reads the device entries of an image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryReading {
    /// The first `n` entries (the header's count), `n` ≤ the entries there.
    First(usize),
    /// The header announces more entries than the image holds: CRIU reads
    /// past the entry array.
    PastEnd { announced: u32, present: usize },
    /// A header count is missing: CRIU's schema requires both, so it cannot
    /// unpack the image.
    NoCount,
}

impl KfdImage {
    /// Which entries CRIU reads: it takes the header's `num_of_gpus +
    /// num_of_cpus`, not the length of the entry list
    /// (checkpoint-restore/criu:plugins/amdgpu/amdgpu_plugin.c, the
    /// `devinfo_to_topology` call of the restore path).
    pub fn entry_reading(&self) -> EntryReading {
        let present = self.topo.nodes.len();
        match self.header_entries {
            None => EntryReading::NoCount,
            Some(n) => match usize::try_from(n) {
                Ok(n) if n <= present => EntryReading::First(n),
                _ => EntryReading::PastEnd {
                    announced: n,
                    present,
                },
            },
        }
    }
}

/// Why an image cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no amdgpu-kfd-<id>.img in {path} (nor in its checkpoint/ folder)")]
    NoImage { path: PathBuf },
    #[error("{path} holds {count} kfd images ({names}); pass the one to check")]
    SeveralImages {
        path: PathBuf,
        count: usize,
        names: String,
    },
    #[error("{source_name}: {len} bytes is too short for the 8-byte length header")]
    TooShort { source_name: String, len: u64 },
    #[error("{source_name}: {size} bytes is more than the limit of {limit} bytes")]
    TooLarge {
        source_name: String,
        size: u64,
        limit: u64,
    },
    #[error(
        "{source_name}: truncated: the header announces a {announced}-byte message, {actual} bytes follow"
    )]
    Truncated {
        source_name: String,
        announced: u64,
        actual: u64,
    },
    #[error("{source_name}: a CRIU core image (magic {magic:#010x}), not an amdgpu plugin image")]
    CoreImage { source_name: String, magic: u32 },
    #[error("{source_name}: not a criu_kfd message: {source}")]
    Decode {
        source_name: String,
        #[source]
        source: prost::DecodeError,
    },
    #[error(
        "{source_name}: device entry {index} lacks required field {field}: not an amdgpu-kfd image of CRIU 3.17 or later"
    )]
    MissingField {
        source_name: String,
        index: usize,
        field: &'static str,
    },
    #[error(
        "{source_name}: no device entries: not an amdgpu-kfd image (every kfd image lists the nodes CRIU saw)"
    )]
    NoDevices { source_name: String },
    #[error("{source_name}: {count} device entries, more than {limit}")]
    TooManyDevices {
        source_name: String,
        count: usize,
        limit: usize,
    },
    #[error("{source_name}: node {node} appears twice")]
    DuplicateNode { source_name: String, node: u32 },
    #[error("{source_name}: gpu_id {gpu_id:#06x} appears twice")]
    DuplicateGpu { source_name: String, gpu_id: u32 },
    #[error(
        "{source_name}: {with} buffer objects have a handle and {without} do not: no CRIU version writes that"
    )]
    MixedFormats {
        source_name: String,
        with: usize,
        without: usize,
    },
}

/// The payload of a framed image as CRIU reads it (the announced length),
/// and the number of bytes after it.
fn unframe<'b>(bytes: &'b [u8], source_name: &str) -> Result<(&'b [u8], u64), ImageError> {
    let len = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
    let (header, payload) = bytes
        .split_first_chunk::<8>()
        .ok_or_else(|| ImageError::TooShort {
            source_name: source_name.to_owned(),
            len,
        })?;
    let announced = u64::from_le_bytes(*header);
    let actual = len - 8;
    if announced <= actual && actual <= MAX_IMAGE_BYTES {
        let end = usize::try_from(announced).unwrap_or(payload.len());
        return Ok((payload.get(..end).unwrap_or(payload), actual - announced));
    }
    let magic = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
    if CORE_MAGICS.contains(&magic) {
        return Err(ImageError::CoreImage {
            source_name: source_name.to_owned(),
            magic,
        });
    }
    let name = source_name.to_owned();
    Err(if announced > MAX_IMAGE_BYTES || actual > MAX_IMAGE_BYTES {
        ImageError::TooLarge {
            source_name: name,
            size: announced.max(actual),
            limit: MAX_IMAGE_BYTES,
        }
    } else {
        ImageError::Truncated {
            source_name: name,
            announced,
            actual,
        }
    })
}

/// Frames `message` as CRIU's plugin writes an image: length, then payload.
pub fn frame(message: &impl Message) -> Vec<u8> {
    let payload = message.encode_to_vec();
    let len = u64::try_from(payload.len()).unwrap_or(u64::MAX);
    let mut out = Vec::with_capacity(payload.len() + 8);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&payload);
    out
}

/// Parses the bytes of an image; `source_name` names it in errors.
///
/// # Errors
/// See [`ImageError`]: bad framing, a message that does not decode, or one
/// that lacks what every supported CRIU version writes.
pub fn parse(bytes: &[u8], source_name: &str) -> Result<KfdImage, ImageError> {
    let (payload, trailing_bytes) = unframe(bytes, source_name)?;
    let message = CriuKfd::decode(payload).map_err(|source| ImageError::Decode {
        source_name: source_name.to_owned(),
        source,
    })?;
    let err_name = || source_name.to_owned();
    let count = message.device_entries.len();
    if count == 0 {
        return Err(ImageError::NoDevices {
            source_name: err_name(),
        });
    }
    if count > MAX_DEVICES {
        return Err(ImageError::TooManyDevices {
            source_name: err_name(),
            count,
            limit: MAX_DEVICES,
        });
    }
    let with = message
        .bo_entries
        .iter()
        .filter(|b| b.handle.is_some())
        .count();
    let bo_count = message.bo_entries.len();
    let format = match (with, bo_count - with) {
        (0, 0) => ImageFormat::Any,
        (0, _) => ImageFormat::V3_17ToV4_2,
        (_, 0) => ImageFormat::AfterV4_2,
        (with, without) => {
            return Err(ImageError::MixedFormats {
                source_name: err_name(),
                with,
                without,
            });
        }
    };
    let mut nodes: Vec<Node> = Vec::with_capacity(count);
    let mut gpus_read_as_cpus = Vec::new();
    for (index, entry) in message.device_entries.iter().enumerate() {
        if entry.cpu_cores_count.unwrap_or(0) != 0 && entry.gpu_id.unwrap_or(0) != 0 {
            gpus_read_as_cpus.extend(entry.node_id);
        }
        let node = node(entry).map_err(|field| ImageError::MissingField {
            source_name: err_name(),
            index,
            field,
        })?;
        if nodes.iter().any(|n| n.id == node.id) {
            return Err(ImageError::DuplicateNode {
                source_name: err_name(),
                node: node.id,
            });
        }
        if node.is_gpu() && nodes.iter().any(|n| n.gpu_id == node.gpu_id) {
            return Err(ImageError::DuplicateGpu {
                source_name: err_name(),
                gpu_id: node.gpu_id,
            });
        }
        nodes.push(node);
    }
    Ok(KfdImage {
        source: source_name.to_owned(),
        pid: message.pid.unwrap_or(0),
        format,
        bo_count,
        topo: Topo { nodes },
        header_entries: message
            .num_of_gpus
            .zip(message.num_of_cpus)
            .map(|(g, c)| g.wrapping_add(c)),
        gpus_read_as_cpus,
        trailing_bytes,
    })
}

/// A device entry as a node; `Err` names the first required field missing.
fn node(e: &KfdDeviceEntry) -> Result<Node, &'static str> {
    macro_rules! req {
        ($field:ident) => {
            e.$field.ok_or(stringify!($field))?
        };
    }
    let props = GpuProps {
        simd_count: req!(simd_count),
        mem_banks_count: req!(mem_banks_count),
        caches_count: req!(caches_count),
        io_links_count: req!(io_links_count),
        max_waves_per_simd: req!(max_waves_per_simd),
        lds_size_in_kb: req!(lds_size_in_kb),
        num_gws: req!(num_gws),
        wave_front_size: req!(wave_front_size),
        array_count: req!(array_count),
        simd_arrays_per_engine: req!(simd_arrays_per_engine),
        cu_per_simd_array: req!(cu_per_simd_array),
        simd_per_cu: req!(simd_per_cu),
        max_slots_scratch_cu: req!(max_slots_scratch_cu),
        vendor_id: req!(vendor_id),
        device_id: req!(device_id),
        num_sdma_engines: req!(num_sdma_engines),
        num_sdma_xgmi_engines: req!(num_sdma_xgmi_engines),
        num_sdma_queues_per_engine: req!(num_sdma_queues_per_engine),
        num_cp_queues: req!(num_cp_queues),
        fw_version: req!(fw_version),
        capability: req!(capability),
        sdma_fw_version: req!(sdma_fw_version),
        // CRIU keeps it in a bool (`tp_node.vram_public`): any non-zero is 1.
        vram_public: u32::from(req!(vram_public) != 0),
        vram_size: req!(vram_size),
        domain: req!(domain),
        drm_render_minor: req!(drm_render_minor),
        hive_id: req!(hive_id),
    };
    let _ = req!(gds_size_in_kb);
    // An entry with CPU cores is read as a CPU's: CRIU copies only the core
    // count and leaves every GPU value zero, whatever gpu_id says
    // (checkpoint-restore/criu:plugins/amdgpu/amdgpu_plugin.c,
    // `devinfo_to_topology`).
    let props = if req!(cpu_cores_count) == 0 {
        props
    } else {
        GpuProps::default()
    };
    let mut links = Vec::with_capacity(e.iolinks.len());
    for l in &e.iolinks {
        let kind = l.r#type.ok_or("iolinks.type")?;
        let to = l.node_to_id.ok_or("iolinks.node_to_id")?;
        links.push(Link {
            kind: LinkKind::from_crat(kind),
            to,
        });
    }
    Ok(Node {
        id: req!(node_id),
        gpu_id: req!(gpu_id),
        props,
        links,
        location: Location::default(),
    })
}

/// The kfd image at `path`: the file itself, or the only
/// `amdgpu-kfd-<id>.img` in the directory (or in its `checkpoint/` folder,
/// as in a kubelet checkpoint archive unpacked).
///
/// # Errors
/// When there is none, or several, or the directory cannot be listed.
pub fn find(path: &Path) -> Result<PathBuf, ImageError> {
    if !path.is_dir() {
        return Ok(path.to_owned());
    }
    for dir in [path.to_owned(), path.join("checkpoint")] {
        if !dir.is_dir() {
            continue;
        }
        let entries = fs::read_dir(&dir).map_err(|source| ImageError::Read {
            path: dir.clone(),
            source,
        })?;
        let mut found: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| is_kfd_image_name(p))
            .collect();
        found.sort();
        match found.len() {
            0 => {}
            1 => return Ok(found.remove(0)),
            count => {
                let names: Vec<String> = found
                    .iter()
                    .filter_map(|p| p.file_name()?.to_str().map(str::to_owned))
                    .collect();
                return Err(ImageError::SeveralImages {
                    path: dir,
                    count,
                    names: names.join(", "),
                });
            }
        }
    }
    Err(ImageError::NoImage {
        path: path.to_owned(),
    })
}

fn is_kfd_image_name(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("amdgpu-kfd-")?.strip_suffix(".img"))
        .is_some_and(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()))
}

/// Reads and parses the image at `path`, never more than the size limit.
///
/// # Errors
/// When the file cannot be read or is not a supported kfd image.
pub fn read_file(path: &Path) -> Result<KfdImage, ImageError> {
    let read_err = |source| ImageError::Read {
        path: path.to_owned(),
        source,
    };
    let file = fs::File::open(path).map_err(read_err)?;
    let mut bytes = Vec::new();
    file.take(MAX_IMAGE_BYTES + 9)
        .read_to_end(&mut bytes)
        .map_err(read_err)?;
    parse(&bytes, &path.display().to_string())
}
