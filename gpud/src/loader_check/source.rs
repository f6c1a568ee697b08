//! Where image blobs come from: the seam between the analysis, which reads
//! blobs through [`ImageSource`], and a content store (containerd in
//! production, an OCI layout directory in tests), which implements it.

use std::{io::Read, path::PathBuf};

/// An OCI content descriptor (image-spec `descriptor.md`): what a blob is,
/// its digest (`sha256:<64 hex>`) and its size in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Descriptor {
    pub media_type: String,
    pub digest: String,
    pub size: u64,
}

/// A content-addressed store holding images. Called from a blocking thread
/// (the containerd source blocks on its own runtime handle).
pub trait ImageSource {
    /// The descriptor the image `name` (a full reference as the runtime
    /// records it, e.g. `docker.io/library/debian:12`) points at: a
    /// manifest or an index.
    ///
    /// # Errors
    /// [`SourceError::NotPresent`] when the store has no such image.
    fn target(&mut self, name: &str) -> Result<Descriptor, SourceError>;

    /// The whole blob `desc`, refused unread when `desc.size` is above `max`
    /// bytes, and cut off (as [`SourceError::TooLarge`]) if the store sends
    /// more than `max`.
    ///
    /// # Errors
    /// [`SourceError::MissingBlob`], [`SourceError::TooLarge`], or a
    /// transport error.
    fn read_blob(&mut self, desc: &Descriptor, max: u64) -> Result<Vec<u8>, SourceError>;

    /// The blob `desc` as a stream, read once from start to end (a layer).
    ///
    /// # Errors
    /// [`SourceError::MissingBlob`] or a transport error; read errors come
    /// through the stream as `std::io::Error`.
    fn open_blob(&mut self, desc: &Descriptor) -> Result<Box<dyn Read + Send + '_>, SourceError>;
}

/// Why a store could not give what was asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SourceError {
    #[error("image {image:?} is not in the container runtime's store (not pulled yet?)")]
    NotPresent { image: String },
    #[error("no containerd at {socket}: {why} (the loader check needs containerd)")]
    NoRuntime { socket: PathBuf, why: String },
    #[error("blob {digest} is not in the content store")]
    MissingBlob { digest: String },
    #[error("blob {digest} is {size} bytes, more than the {max} read for it")]
    TooLarge { digest: String, size: u64, max: u64 },
    #[error("containerd {call} failed: {why}")]
    Rpc { call: &'static str, why: String },
}
