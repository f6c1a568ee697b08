//! One KFD topology node and the sub-directories that describe it.

use std::{
    fs, io,
    path::{Path, PathBuf},
};

use serde::Serialize;

use super::{Properties, TopologyIssue};

/// CRAT io-link type, as KFD prints it in `io_links/*/properties`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LinkType {
    /// CRAT type 2.
    Pcie,
    /// CRAT type 11.
    Xgmi,
    /// Any other CRAT type (HyperTransport 1, AMBA 3, ...).
    Other(u64),
}

impl LinkType {
    pub fn from_crat(value: u64) -> Self {
        match value {
            2 => Self::Pcie,
            11 => Self::Xgmi,
            other => Self::Other(other),
        }
    }
}

/// One `io_links/<L>` or `p2p_links/<L>` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IoLink {
    pub index: u32,
    pub link_type: LinkType,
    pub node_from: u32,
    pub node_to: u32,
    pub weight: u64,
    pub min_bandwidth: u64,
    pub max_bandwidth: u64,
    pub flags: u64,
}

/// One `mem_banks/<M>` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MemBank {
    pub index: u32,
    /// 0 system, 1 frame buffer public, 2 frame buffer private, ...
    pub heap_type: u64,
    pub size_in_bytes: u64,
}

impl MemBank {
    /// A frame-buffer (VRAM) bank: heap type 1 (public) or 2 (private).
    pub fn is_vram(&self) -> bool {
        matches!(self.heap_type, 1 | 2)
    }
}

/// A KFD topology node as read from sysfs.
#[derive(Debug, Clone)]
pub struct KfdNode {
    /// Directory index `N` of `nodes/<N>`.
    pub index: u32,
    pub path: PathBuf,
    /// The `gpu_id` file: 0 on CPU nodes; `None` when the file is absent.
    pub gpu_id: Option<u64>,
    /// The `name` file, trimmed; `None` when absent or empty.
    pub name: Option<String>,
    pub properties: Properties,
    pub mem_banks: Vec<MemBank>,
    /// Sorted by index.
    pub io_links: Vec<IoLink>,
    /// The indices of [`KfdNode::io_links`] in the order the `io_links`
    /// directory listing returned them: the order CRIU's amdgpu plugin
    /// reads them in (on sysfs, not numeric).
    pub io_links_order: Vec<u32>,
    pub p2p_links: Vec<IoLink>,
}

impl KfdNode {
    /// A GPU node: `gpu_id` non-zero, or, where the file is missing,
    /// SIMDs present (an APU node has both CPU cores and SIMDs).
    pub fn is_gpu(&self) -> bool {
        match self.gpu_id {
            Some(id) => id != 0,
            None => self.properties.get_or_zero("simd_count") > 0,
        }
    }

    /// A node with CPU cores (CPU nodes and APU nodes).
    pub fn has_cpu_cores(&self) -> bool {
        self.properties.get_or_zero("cpu_cores_count") > 0
    }

    /// [`KfdNode::io_links`] in directory-listing order; links missing from
    /// that order (a node built in code) follow in index order.
    pub fn io_links_listed(&self) -> impl Iterator<Item = &IoLink> {
        let find = |i: &u32| self.io_links.iter().find(|l| l.index == *i);
        let listed = self.io_links_order.iter().filter_map(find);
        let rest = self
            .io_links
            .iter()
            .filter(|l| !self.io_links_order.contains(&l.index));
        listed.chain(rest)
    }

    /// Reads `nodes/<index>` at `path`. `Ok(None)` when the node vanished.
    pub(super) fn read(
        index: u32,
        path: &Path,
        buf: &mut String,
        issues: &mut Vec<TopologyIssue>,
    ) -> Option<Self> {
        let props_path = path.join("properties");
        let properties = match read_into(&props_path, buf) {
            Ok(()) => Properties::parse(buf, &props_path, issues),
            Err(source) => {
                issues.push(vanished_or_unreadable(index, props_path, source));
                return None;
            }
        };
        let gpu_id = read_number(&path.join("gpu_id"), buf, issues);
        let name = read_optional(&path.join("name"), buf, issues)
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty());
        let (io_links, io_links_order) = read_links(&path.join("io_links"), buf, issues);
        Some(Self {
            index,
            path: path.to_owned(),
            gpu_id,
            name,
            mem_banks: read_mem_banks(&path.join("mem_banks"), buf, issues),
            io_links,
            io_links_order,
            p2p_links: read_links(&path.join("p2p_links"), buf, issues).0,
            properties,
        })
    }
}

fn vanished_or_unreadable(node: u32, path: PathBuf, source: io::Error) -> TopologyIssue {
    if source.kind() == io::ErrorKind::NotFound {
        TopologyIssue::NodeVanished { node, path }
    } else {
        TopologyIssue::Unreadable { path, source }
    }
}

/// Reads `path` into `buf` (cleared first), reusing its allocation.
pub(super) fn read_into(path: &Path, buf: &mut String) -> io::Result<()> {
    use io::Read;
    buf.clear();
    crate::deadline::reading(path);
    let mut file = fs::File::open(path)?;
    let mut bytes = std::mem::take(buf).into_bytes();
    let result = file.read_to_end(&mut bytes);
    *buf = match String::from_utf8(bytes) {
        Ok(text) => text,
        Err(err) => String::from_utf8_lossy(err.as_bytes()).into_owned(),
    };
    result.map(drop)
}

/// Reads an optional file: `None` when absent, reported when unreadable.
fn read_optional(path: &Path, buf: &mut String, issues: &mut Vec<TopologyIssue>) -> Option<String> {
    match read_into(path, buf) {
        Ok(()) => Some(buf.clone()),
        Err(err) if err.kind() == io::ErrorKind::NotFound => None,
        Err(source) => {
            issues.push(TopologyIssue::Unreadable {
                path: path.to_owned(),
                source,
            });
            None
        }
    }
}

/// Reads an optional file holding one decimal number.
pub(super) fn read_number(
    path: &Path,
    buf: &mut String,
    issues: &mut Vec<TopologyIssue>,
) -> Option<u64> {
    let text = read_optional(path, buf, issues)?;
    match text.trim().parse() {
        Ok(value) => Some(value),
        Err(_) => {
            issues.push(TopologyIssue::NotANumber {
                path: path.to_owned(),
                value: text.trim().chars().take(40).collect(),
            });
            None
        }
    }
}

/// The numeric sub-directories of `dir`, sorted; empty when `dir` is absent.
pub(super) fn numbered_entries(dir: &Path, issues: &mut Vec<TopologyIssue>) -> Vec<(u32, PathBuf)> {
    let mut out = listed_entries(dir, issues);
    out.sort_unstable_by_key(|(index, _)| *index);
    out
}

/// The numeric sub-directories of `dir` in the order the directory listing
/// returns them (not sorted); empty when `dir` is absent.
pub(super) fn listed_entries(dir: &Path, issues: &mut Vec<TopologyIssue>) -> Vec<(u32, PathBuf)> {
    crate::deadline::reading(dir);
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Vec::new(),
        Err(source) => {
            issues.push(TopologyIssue::Unreadable {
                path: dir.to_owned(),
                source,
            });
            return Vec::new();
        }
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let index = e.file_name().to_str()?.parse().ok()?;
            Some((index, e.path()))
        })
        .collect()
}

fn read_mem_banks(dir: &Path, buf: &mut String, issues: &mut Vec<TopologyIssue>) -> Vec<MemBank> {
    let mut banks = Vec::new();
    for (index, path) in numbered_entries(dir, issues) {
        let path = path.join("properties");
        let Some(text) = read_optional(&path, buf, issues) else {
            continue;
        };
        let p = Properties::parse(&text, &path, issues);
        banks.push(MemBank {
            index,
            heap_type: p.get_or_zero("heap_type"),
            size_in_bytes: p.get_or_zero("size_in_bytes"),
        });
    }
    banks
}

/// The links under `dir`, sorted by index, and the indices read in listing
/// order.
fn read_links(
    dir: &Path,
    buf: &mut String,
    issues: &mut Vec<TopologyIssue>,
) -> (Vec<IoLink>, Vec<u32>) {
    let mut entries = listed_entries(dir, issues);
    let listed: Vec<u32> = entries.iter().map(|(index, _)| *index).collect();
    entries.sort_unstable_by_key(|(index, _)| *index);
    let mut links = Vec::new();
    for (index, path) in entries {
        let path = path.join("properties");
        if let Err(source) = read_into(&path, buf) {
            if source.kind() != io::ErrorKind::NotFound {
                issues.push(TopologyIssue::Unreadable { path, source });
            }
            continue;
        }
        let p = Properties::parse(buf, &path, issues);
        let (Some(node_from), Some(node_to)) =
            (node_field(&p, "node_from"), node_field(&p, "node_to"))
        else {
            issues.push(TopologyIssue::MalformedLine {
                path,
                line: 0,
                text: String::new(),
                reason: "link without a valid node_from and node_to",
            });
            continue;
        };
        links.push(IoLink {
            index,
            link_type: LinkType::from_crat(p.get_or_zero("type")),
            node_from,
            node_to,
            weight: p.get_or_zero("weight"),
            min_bandwidth: p.get_or_zero("min_bandwidth"),
            max_bandwidth: p.get_or_zero("max_bandwidth"),
            flags: p.get_or_zero("flags"),
        });
    }
    let order = listed
        .into_iter()
        .filter(|i| links.iter().any(|l| l.index == *i))
        .collect();
    (links, order)
}

fn node_field(p: &Properties, key: &str) -> Option<u32> {
    p.get(key).and_then(|v| u32::try_from(v).ok())
}
