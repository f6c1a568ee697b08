//! What the inspector child and the loader check's fetcher (its parent,
//! `super::super::fetch`) say to each other over the child's stdin and
//! stdout, and the JSON lines the fetcher and amd-gpud exchange.
//!
//! The child asks, one JSON line at a time (at most [`MAX_LINE`] bytes, so
//! that the fetcher never reads more of it than that): a whole blob, a blob
//! to stream, the next chunk of that stream, and last its [`Verdict`].
//! The fetcher answers each question with one frame: a tag byte, a 4-byte
//! little-endian length and that many bytes (the blob, a chunk of at most
//! [`CHUNK`] bytes, or a [`WireSourceError`] as JSON). The first frame,
//! before any question, is the [`Job`].

use std::io::{self, BufRead, Read, Write};

use serde::{Deserialize, Serialize};

use crate::loader_check::{Descriptor, Loader, SourceError, run::RunSpec};

/// The longest line the fetcher reads from the child.
pub(crate) const MAX_LINE: usize = 8 << 10;
/// The most bytes one streamed chunk carries.
pub(crate) const CHUNK: usize = 256 << 10;
/// The most bytes of a job (the fetcher's line from amd-gpud, the child's
/// frame from the fetcher): a pod's spec of `run::MAX_RUN_BYTES` (32 KiB)
/// of control characters is six times that as JSON (`\u0001`), plus the
/// rest of the job.
pub(crate) const MAX_JOB: usize = 256 << 10;
/// The most bytes of a job or error frame the child reads: [`MAX_JOB`].
const MAX_SMALL_FRAME: u32 = 256 << 10;
/// The most bytes of evidence or reason the child sends (amd-gpud caps it
/// again at `checker::cache::MAX_EVIDENCE`).
pub(crate) const MAX_TEXT: usize = 2 << 10;

/// Frame tags.
pub(crate) const JOB: u8 = b'J';
pub(crate) const DATA: u8 = b'D';
pub(crate) const ERROR: u8 = b'E';

/// A descriptor as it crosses the pipe.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct WireDescriptor {
    pub media_type: String,
    pub digest: String,
    pub size: u64,
}

impl From<&Descriptor> for WireDescriptor {
    fn from(d: &Descriptor) -> Self {
        Self {
            media_type: d.media_type.clone(),
            digest: d.digest.clone(),
            size: d.size,
        }
    }
}

impl From<WireDescriptor> for Descriptor {
    fn from(d: WireDescriptor) -> Self {
        Self {
            media_type: d.media_type,
            digest: d.digest,
            size: d.size,
        }
    }
}

/// What the child is to inspect.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Job {
    pub target: WireDescriptor,
    /// How the pod starts the container (bounded by amd-gpud to
    /// `run::MAX_RUN_BYTES`, within this frame's [`MAX_SMALL_FRAME`] however
    /// it is escaped).
    #[serde(default)]
    pub run: RunSpec,
    /// Milliseconds left until the inspection's deadline.
    pub budget_ms: u64,
}

/// One question of the child.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "ask", rename_all = "snake_case")]
pub(crate) enum Request {
    /// The whole blob, refused above `max` bytes.
    Blob { desc: WireDescriptor, max: u64 },
    /// Start streaming the blob (answered with an empty data frame).
    Open { desc: WireDescriptor },
    /// The next chunk of the blob opened last; an empty one at its end.
    Next,
    /// The answer; nothing follows.
    Verdict(Verdict),
}

/// Why an inspection failed, as the checker tells failures apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum FailKind {
    NotPresent,
    NoRuntime,
    Content,
}

/// The child's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub(crate) enum Verdict {
    Found {
        loader: Loader,
        evidence: String,
    },
    Failed {
        kind: FailKind,
        why: String,
        /// Whether inspecting again would fail again (then cached).
        lasting: bool,
    },
}

/// A [`SourceError`] as it crosses the pipe.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum WireSourceError {
    NotPresent { image: String },
    NoRuntime { socket: String, why: String },
    MissingBlob { digest: String },
    TooLarge { digest: String, size: u64, max: u64 },
    Rpc { call: String, why: String },
}

impl From<&SourceError> for WireSourceError {
    fn from(e: &SourceError) -> Self {
        match e.clone() {
            SourceError::NotPresent { image } => Self::NotPresent { image },
            SourceError::NoRuntime { socket, why } => Self::NoRuntime {
                socket: socket.display().to_string(),
                why,
            },
            SourceError::MissingBlob { digest } => Self::MissingBlob { digest },
            SourceError::TooLarge { digest, size, max } => Self::TooLarge { digest, size, max },
            SourceError::Rpc { call, why } => Self::Rpc {
                call: call.to_owned(),
                why,
            },
        }
    }
}

impl From<WireSourceError> for SourceError {
    fn from(e: WireSourceError) -> Self {
        match e {
            WireSourceError::NotPresent { image } => Self::NotPresent { image },
            WireSourceError::NoRuntime { socket, why } => Self::NoRuntime {
                socket: socket.into(),
                why,
            },
            WireSourceError::MissingBlob { digest } => Self::MissingBlob { digest },
            WireSourceError::TooLarge { digest, size, max } => Self::TooLarge { digest, size, max },
            WireSourceError::Rpc { call, why } => Self::Rpc {
                call: rpc_name(&call),
                why,
            },
        }
    }
}

/// The name of a containerd call, as [`SourceError::Rpc`] keeps it.
fn rpc_name(call: &str) -> &'static str {
    ["Images.Get", "Content.Info", "Content.Read"]
        .into_iter()
        .find(|known| *known == call)
        .unwrap_or("containerd")
}

/// Writes one frame.
pub(crate) fn write_frame(out: &mut dyn Write, tag: u8, payload: &[u8]) -> io::Result<()> {
    let len = u32::try_from(payload.len())
        .map_err(|_| io::Error::other(format!("a frame of {} bytes", payload.len())))?;
    out.write_all(&[tag])?;
    out.write_all(&len.to_le_bytes())?;
    out.write_all(payload)?;
    out.flush()
}

/// Writes `err` as an error frame.
pub(crate) fn write_error(out: &mut dyn Write, err: &SourceError) -> io::Result<()> {
    let json = serde_json::to_vec(&WireSourceError::from(err)).map_err(io::Error::other)?;
    write_frame(out, ERROR, &json)
}

/// A frame as the child reads it.
pub(crate) enum Frame {
    Data(Vec<u8>),
    Error(SourceError),
    Job(Job),
}

/// Reads one frame, refusing a data frame above `max_data` bytes (read
/// nothing of it) and any other above [`MAX_SMALL_FRAME`].
pub(crate) fn read_frame(input: &mut dyn Read, max_data: u64) -> io::Result<Frame> {
    let mut head = [0_u8; 5];
    input.read_exact(&mut head)?;
    let [tag, len @ ..] = head;
    let len = u32::from_le_bytes(len);
    let bound = if tag == DATA {
        max_data
    } else {
        u64::from(MAX_SMALL_FRAME)
    };
    if u64::from(len) > bound {
        return Err(io::Error::other(format!(
            "a frame {tag:?} of {len} bytes, above {bound}"
        )));
    }
    let mut payload = vec![0; len as usize];
    input.read_exact(&mut payload)?;
    let bad = |e: serde_json::Error| io::Error::other(format!("a malformed frame: {e}"));
    match tag {
        DATA => Ok(Frame::Data(payload)),
        ERROR => Ok(Frame::Error(
            serde_json::from_slice::<WireSourceError>(&payload)
                .map_err(bad)?
                .into(),
        )),
        JOB => Ok(Frame::Job(serde_json::from_slice(&payload).map_err(bad)?)),
        other => Err(io::Error::other(format!("an unknown frame tag {other}"))),
    }
}

/// Writes one request line.
pub(crate) fn write_request(out: &mut dyn Write, request: &Request) -> io::Result<()> {
    write_line(out, request, MAX_LINE)
}

/// Why a line of the child could not be taken.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LineError {
    #[error("it closed its output without a verdict")]
    Closed,
    #[error("its output could not be read: {0}")]
    Io(#[from] io::Error),
    #[error("it sent a line longer than {max} bytes")]
    TooLong { max: usize },
    #[error("it sent a line that is no request: {excerpt:?} ({why})")]
    Garbage { excerpt: String, why: String },
}

/// Reads one request line of at most [`MAX_LINE`] bytes.
pub(crate) fn read_request(input: &mut dyn BufRead) -> Result<Request, LineError> {
    read_line(input, MAX_LINE)
}

/// Reads one JSON line of at most `max` bytes (the newline included) as a
/// `T`.
pub(crate) fn read_line<T: serde::de::DeserializeOwned>(
    input: &mut dyn BufRead,
    max: usize,
) -> Result<T, LineError> {
    let mut line = Vec::new();
    let limit = u64::try_from(max).unwrap_or(u64::MAX);
    let n = input.take(limit).read_until(b'\n', &mut line)?;
    if n == 0 {
        return Err(LineError::Closed);
    }
    if line.last() != Some(&b'\n') {
        return Err(if n >= max {
            LineError::TooLong { max }
        } else {
            LineError::Closed
        });
    }
    serde_json::from_slice(&line).map_err(|e| LineError::Garbage {
        excerpt: String::from_utf8_lossy(line.get(..80).unwrap_or(&line)).into_owned(),
        why: e.to_string(),
    })
}

/// Writes `value` as one JSON line, refused at `max` bytes or more.
pub(crate) fn write_line<T: Serialize>(
    out: &mut dyn Write,
    value: &T,
    max: usize,
) -> io::Result<()> {
    let mut line = serde_json::to_vec(value).map_err(io::Error::other)?;
    if line.len() >= max {
        return Err(io::Error::other(format!(
            "a line of {} bytes, above {max}",
            line.len()
        )));
    }
    line.push(b'\n');
    out.write_all(&line)?;
    out.flush()
}

/// `text` cut to [`MAX_TEXT`] bytes on a character boundary.
pub(crate) fn cut(mut text: String) -> String {
    if text.len() > MAX_TEXT {
        let mut end = MAX_TEXT;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

#[cfg(test)]
mod bounds {
    /// The job's two bounds are one.
    #[test]
    fn the_job_frame_holds_what_the_job_line_may() {
        assert_eq!(super::MAX_SMALL_FRAME as usize, super::MAX_JOB);
    }
}
