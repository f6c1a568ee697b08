//! KFD topology: `<sys>/class/kfd/kfd/topology/nodes/*` read into plain data.
//!
//! Reading never fails as a whole for a bad file: each problem becomes a
//! [`TopologyIssue`] naming the file, and a node that cannot be described is
//! left out with the reason. Only a missing or unreadable topology directory
//! is an error.

mod node;
mod properties;
mod read;

use std::{io, path::PathBuf};

pub use node::{IoLink, KfdNode, LinkType};
pub use properties::Properties;
pub use read::{Topology, read_topology};

/// Something wrong with one file or node; the rest of the topology still counts.
#[derive(Debug, thiserror::Error)]
pub enum TopologyIssue {
    #[error("{path}:{line}: skipped {text:?}: {reason}")]
    MalformedLine {
        path: PathBuf,
        line: usize,
        text: String,
        reason: &'static str,
    },
    #[error("cannot read {path}: {source}")]
    Unreadable {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path}: {value:?} is not a number")]
    NotANumber { path: PathBuf, value: String },
    #[error("KFD node {node} skipped: {reason}")]
    NodeSkipped { node: u32, reason: String },
    #[error("KFD node {node} vanished while being read ({path})")]
    NodeVanished { node: u32, path: PathBuf },
    #[error("topology changed while being read (generation_id {before} -> {after}); read again")]
    GenerationChanged { before: u64, after: u64 },
}

/// The topology directory itself could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    #[error("no KFD topology at {path} (is the amdgpu driver loaded?): {source}")]
    Missing {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("KFD topology at {path} kept changing over {attempts} reads")]
    Unstable { path: PathBuf, attempts: u32 },
}
