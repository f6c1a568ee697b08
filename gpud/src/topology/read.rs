//! Walking the topology directory, with libhsakmt's rule: if `generation_id`
//! changes during the walk, walk again.

use std::{fs, path::PathBuf};

use tracing::{debug, warn};

use super::{
    KfdNode, TopologyError, TopologyIssue,
    node::{listed_entries, read_number},
};
use crate::hostpaths::HostPaths;

/// How many times a walk is repeated when the topology changes under it.
const MAX_ATTEMPTS: u32 = 3;

/// The KFD topology of a node.
#[derive(Debug)]
pub struct Topology {
    pub path: PathBuf,
    /// `generation_id`, when the kernel provides it.
    pub generation_id: Option<u64>,
    /// Every node that could be read, by index.
    pub nodes: Vec<KfdNode>,
    /// Indices of [`Topology::nodes`] in the order the `nodes` directory
    /// listing returned them: the order CRIU's amdgpu plugin walks them in.
    pub listing_order: Vec<u32>,
    /// Problems with single files or nodes.
    pub issues: Vec<TopologyIssue>,
}

impl Topology {
    /// The node with directory index `index`.
    pub fn node(&self, index: u32) -> Option<&KfdNode> {
        self.nodes
            .binary_search_by_key(&index, |n| n.index)
            .ok()
            .and_then(|i| self.nodes.get(i))
    }
}

/// Reads the whole topology under `paths`.
///
/// # Errors
/// When the `nodes` directory cannot be listed, or the topology changed on
/// every one of [`MAX_ATTEMPTS`] walks.
#[tracing::instrument(skip_all, fields(path = %paths.kfd_topology().display()))]
pub fn read_topology(paths: &HostPaths) -> Result<Topology, TopologyError> {
    let path = paths.kfd_topology();
    let nodes_dir = path.join("nodes");
    crate::deadline::reading(&nodes_dir);
    if let Err(source) = fs::read_dir(&nodes_dir) {
        return Err(TopologyError::Missing {
            path: nodes_dir,
            source,
        });
    }
    let mut buf = String::with_capacity(4096);
    for attempt in 1..=MAX_ATTEMPTS {
        let mut issues = Vec::new();
        let before = read_number(&path.join("generation_id"), &mut buf, &mut issues);
        let (nodes, listing_order) = read_nodes(&nodes_dir, &mut buf, &mut issues);
        let after = read_number(
            &path.join("generation_id"),
            &mut Default::default(),
            &mut Vec::new(),
        );
        match (before, after) {
            (Some(b), Some(a)) if a != b => {
                warn!(
                    attempt,
                    before = b,
                    after = a,
                    "KFD topology changed while being read"
                );
                continue;
            }
            _ => {}
        }
        debug!(
            nodes = nodes.len(),
            issues = issues.len(),
            "read KFD topology"
        );
        return Ok(Topology {
            path,
            generation_id: before,
            nodes,
            listing_order,
            issues,
        });
    }
    Err(TopologyError::Unstable {
        path,
        attempts: MAX_ATTEMPTS,
    })
}

/// The nodes sorted by index (read in that order, so problems are reported
/// in a stable order), and the indices of those read in listing order.
fn read_nodes(
    nodes_dir: &std::path::Path,
    buf: &mut String,
    issues: &mut Vec<TopologyIssue>,
) -> (Vec<KfdNode>, Vec<u32>) {
    let mut entries = listed_entries(nodes_dir, issues);
    let listed: Vec<u32> = entries.iter().map(|(index, _)| *index).collect();
    entries.sort_unstable_by_key(|(index, _)| *index);
    let mut nodes = Vec::with_capacity(entries.len());
    for (index, path) in entries {
        if let Some(node) = KfdNode::read(index, &path, buf, issues) {
            nodes.push(node);
        }
    }
    let order = listed
        .into_iter()
        .filter(|i| nodes.binary_search_by_key(i, |n| n.index).is_ok())
        .collect();
    (nodes, order)
}
