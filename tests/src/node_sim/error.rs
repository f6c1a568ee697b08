//! What can stop the node simulator.

use std::{io, path::PathBuf};

use super::options::MODE_ANNOTATION;

/// Why `node-sim` could not run its scenario.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("reading {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{}: no pod manifests (*.yaml) there", path.display())]
    NoPods { path: PathBuf },
    #[error("{}: YAML document {doc}: {source}", path.display())]
    Yaml {
        path: PathBuf,
        doc: usize,
        #[source]
        source: serde_yaml::Error,
    },
    #[error("{}: YAML document {doc} is not a Pod: {message}", path.display())]
    NotPod {
        path: PathBuf,
        doc: usize,
        message: String,
    },
    #[error("pod {name} is defined twice ({} and {})", first.display(), second.display())]
    Duplicate {
        name: String,
        first: PathBuf,
        second: PathBuf,
    },
    #[error("{}: {MODE_ANNOTATION} is {value:?}, not cu or partition", path.display())]
    BadMode { path: PathBuf, value: String },
    #[error("unknown node {name:?}; known: mi300x-8, rx9070xt, {known}")]
    UnknownNode { name: String, known: String },
    #[error("building the fake node {fixture} under {}: {source}", root.display())]
    Fixture {
        fixture: String,
        root: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("starting {what}: {source}")]
    Start {
        what: String,
        #[source]
        source: io::Error,
    },
    #[error("{what} did not happen within {secs} s; see {}", log.display())]
    Timeout {
        what: String,
        secs: u64,
        log: PathBuf,
    },
    #[error(
        "--cluster real runs kubelet, which needs root; this is UID {uid} (try sudo, or --cluster fake)"
    )]
    NeedsRoot { uid: u32 },
    #[error("{what} exited early ({status}); the end of its log ({}):\n{tail}", log.display())]
    Exited {
        what: String,
        status: String,
        log: PathBuf,
        tail: String,
    },
}

impl SimError {
    /// A [`SimError::Start`] for `what`.
    pub fn start(what: impl Into<String>) -> impl FnOnce(io::Error) -> Self {
        let what = what.into();
        move |source| Self::Start { what, source }
    }
}
