//! A blob streamed by `Content.Read` as a blocking [`std::io::Read`].
//!
//! containerd sends the blob as `ReadContentResponse{offset, data}` messages
//! (containerd/containerd:api/services/content/v1/content.proto). The reader
//! checks that they follow one another without gap or overlap and stop at
//! the descriptor's size, and reports a short blob as `UnexpectedEof`.

use std::{io, time::Duration};

use proto::containerd::services::content::v1::ReadContentResponse;
use tokio::runtime::Handle;
use tonic::Streaming;
use tracing::Span;

use super::bounded;
use crate::loader_check::Descriptor;

/// What the stream has delivered so far of a blob of `size` bytes.
#[derive(Debug)]
pub(super) struct Progress {
    size: u64,
    next: u64,
    /// Where a chunk refused for running past `size` would have ended.
    overrun: Option<u64>,
}

impl Progress {
    pub(super) fn new(size: u64) -> Self {
        Self {
            size,
            next: 0,
            overrun: None,
        }
    }

    /// Accepts a chunk of `len` bytes at `offset`, or says why not.
    pub(super) fn accept(&mut self, offset: i64, len: usize) -> Result<(), String> {
        if u64::try_from(offset).ok() != Some(self.next) {
            return Err(format!(
                "a chunk at offset {offset} where {} was due",
                self.next
            ));
        }
        let end = u64::try_from(len)
            .ok()
            .and_then(|len| self.next.checked_add(len))
            .unwrap_or(u64::MAX);
        if end > self.size {
            self.overrun = Some(end);
            return Err(format!(
                "{len} more bytes at offset {offset}, past the blob's {} bytes",
                self.size
            ));
        }
        self.next = end;
        Ok(())
    }

    /// Where the store tried to go past the blob's size, if it did.
    pub(super) fn overrun(&self) -> Option<u64> {
        self.overrun
    }

    /// Whether every byte arrived.
    pub(super) fn complete(&self) -> bool {
        self.next == self.size
    }
}

/// The reader [`super::ContainerdSource::open_blob`] returns.
pub(super) struct BlobReader {
    stream: Streaming<ReadContentResponse>,
    handle: Handle,
    idle: Duration,
    digest: String,
    progress: Progress,
    chunk: Vec<u8>,
    pos: usize,
    done: bool,
    span: Span,
}

impl BlobReader {
    pub(super) fn new(
        stream: Streaming<ReadContentResponse>,
        handle: Handle,
        idle: Duration,
        desc: &Descriptor,
    ) -> Self {
        Self {
            stream,
            handle,
            idle,
            digest: desc.digest.clone(),
            progress: Progress::new(desc.size),
            chunk: Vec::new(),
            pos: 0,
            done: false,
            span: Span::current(),
        }
    }

    /// See [`Progress::overrun`].
    pub(super) fn overrun(&self) -> Option<u64> {
        self.progress.overrun()
    }

    fn error(&self, kind: io::ErrorKind, why: &str) -> io::Error {
        io::Error::new(kind, format!("reading blob {}: {why}", self.digest))
    }

    /// Waits for the next chunk; false at the end of the stream.
    fn next_chunk(&mut self) -> io::Result<bool> {
        let idle = self.idle;
        let next = self.stream.message();
        match self
            .handle
            .block_on(async { tokio::time::timeout(idle, next).await })
        {
            Ok(Ok(Some(message))) => {
                self.progress
                    .accept(message.offset, message.data.len())
                    .map_err(|why| self.error(io::ErrorKind::InvalidData, &why))?;
                self.chunk = message.data;
                self.pos = 0;
                Ok(true)
            }
            Ok(Ok(None)) => {
                if !self.progress.complete() {
                    let why = format!(
                        "the stream ended after {} of {} bytes",
                        self.progress.next, self.progress.size
                    );
                    return Err(self.error(io::ErrorKind::UnexpectedEof, &why));
                }
                Ok(false)
            }
            Ok(Err(status)) => {
                let why = format!(
                    "Content.Read failed: {:?}: {}",
                    status.code(),
                    bounded(status.message())
                );
                Err(self.error(io::ErrorKind::Other, &why))
            }
            Err(_) => {
                let why = format!("no chunk within {:?}", self.idle);
                Err(self.error(io::ErrorKind::TimedOut, &why))
            }
        }
    }
}

impl io::Read for BlobReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let _span = self.span.clone().entered();
        loop {
            if self.pos < self.chunk.len() {
                let n = buf.len().min(self.chunk.len() - self.pos);
                buf[..n].copy_from_slice(&self.chunk[self.pos..self.pos + n]);
                self.pos += n;
                return Ok(n);
            }
            if self.done || buf.is_empty() {
                return Ok(0);
            }
            if !self.next_chunk()? {
                self.done = true;
            }
        }
    }
}
