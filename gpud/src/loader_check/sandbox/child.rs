//! The child's side: the whole analysis ([`analyze::inspect_target`]) over
//! an [`ImageSource`] that asks the fetcher for each blob over the pipes.

use std::{
    io::{self, Read, Write},
    time::{Duration, Instant},
};

use super::wire::{self, CHUNK, FailKind, Frame, Request, Verdict};
use crate::loader_check::{
    Descriptor, ImageSource, SourceError,
    analyze::{self, InspectError, Limits, Platform},
};

/// The blobs the fetcher hands out, asked for over `output`, read from
/// `input`.
pub(crate) struct PipeSource<R, W> {
    input: R,
    output: W,
    /// Set once the pipe is out of step (a frame refused unread): every
    /// later question fails.
    broken: Option<String>,
}

fn transport(why: impl std::fmt::Display) -> SourceError {
    SourceError::Rpc {
        call: "containerd",
        why: format!("the pipe to the fetcher: {why}"),
    }
}

impl<R: Read + Send, W: Write + Send> PipeSource<R, W> {
    pub(crate) fn new(input: R, output: W) -> Self {
        Self {
            input,
            output,
            broken: None,
        }
    }

    /// Asks `request` and reads the answer, a data frame of at most `max`.
    fn ask(&mut self, request: &Request, max: u64) -> Result<Vec<u8>, SourceError> {
        if let Some(why) = &self.broken {
            return Err(transport(why));
        }
        wire::write_request(&mut self.output, request).map_err(transport)?;
        match wire::read_frame(&mut self.input, max) {
            Ok(Frame::Data(bytes)) => Ok(bytes),
            Ok(Frame::Error(err)) => Err(err),
            Ok(Frame::Job(_)) => Err(transport("a second job")),
            Err(err) => {
                self.broken = Some(err.to_string());
                Err(transport(err))
            }
        }
    }

    /// Sends the verdict.
    fn answer(&mut self, verdict: Verdict) -> io::Result<()> {
        wire::write_request(&mut self.output, &Request::Verdict(verdict))
    }
}

impl<R: Read + Send, W: Write + Send> ImageSource for PipeSource<R, W> {
    fn target(&mut self, name: &str) -> Result<Descriptor, SourceError> {
        Err(transport(format!(
            "the inspector looks up no image names ({name:?})"
        )))
    }

    fn read_blob(&mut self, desc: &Descriptor, max: u64) -> Result<Vec<u8>, SourceError> {
        let request = Request::Blob {
            desc: desc.into(),
            max,
        };
        self.ask(&request, max).map_err(|err| match err {
            // Refused unread: a blob above the bound it was asked with.
            SourceError::Rpc { .. } if self.broken.is_some() => SourceError::TooLarge {
                digest: desc.digest.clone(),
                size: desc.size,
                max,
            },
            other => other,
        })
    }

    fn open_blob(&mut self, desc: &Descriptor) -> Result<Box<dyn Read + Send + '_>, SourceError> {
        self.ask(&Request::Open { desc: desc.into() }, 0)?;
        Ok(Box::new(Chunks {
            source: self,
            chunk: Vec::new(),
            at: 0,
            done: false,
        }))
    }
}

/// A streamed blob, one [`Request::Next`] per chunk.
struct Chunks<'a, R, W> {
    source: &'a mut PipeSource<R, W>,
    chunk: Vec<u8>,
    at: usize,
    done: bool,
}

impl<R: Read + Send, W: Write + Send> Read for Chunks<'_, R, W> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.at >= self.chunk.len() {
            if self.done {
                return Ok(0);
            }
            let max = u64::try_from(CHUNK).unwrap_or(u64::MAX);
            self.chunk = self
                .source
                .ask(&Request::Next, max)
                .map_err(io::Error::other)?;
            self.at = 0;
            if self.chunk.is_empty() {
                self.done = true;
                return Ok(0);
            }
        }
        let rest = self.chunk.get(self.at..).unwrap_or_default();
        let n = rest.len().min(buf.len());
        buf.get_mut(..n)
            .unwrap_or_default()
            .copy_from_slice(rest.get(..n).unwrap_or_default());
        self.at += n;
        Ok(n)
    }
}

/// The verdict of an inspection's result.
pub(crate) fn verdict(result: Result<crate::loader_check::Finding, InspectError>) -> Verdict {
    match result {
        Ok(found) => Verdict::Found {
            loader: match found.loader {
                crate::loader_check::Loader::Unknown { why } => {
                    crate::loader_check::Loader::Unknown {
                        why: wire::cut(why),
                    }
                }
                other => other,
            },
            evidence: wire::cut(found.evidence),
        },
        Err(err) => Verdict::Failed {
            kind: match &err {
                InspectError::Source(SourceError::NotPresent { .. }) => FailKind::NotPresent,
                InspectError::Source(SourceError::NoRuntime { .. }) => FailKind::NoRuntime,
                _ => FailKind::Content,
            },
            lasting: err.lasting(),
            why: wire::cut(err.to_string()),
        },
    }
}

/// Reads the job from `input`, inspects it asking the fetcher for each blob,
/// and writes the verdict to `output`.
///
/// # Errors
/// When the job cannot be read or the verdict written.
pub(crate) fn serve(input: impl Read + Send, output: impl Write + Send) -> io::Result<()> {
    let mut source = PipeSource::new(input, output);
    let job = match wire::read_frame(&mut source.input, 0)? {
        Frame::Job(job) => job,
        _ => return Err(io::Error::other("the first frame is not a job")),
    };
    let limits = Limits {
        deadline: Instant::now() + Duration::from_millis(job.budget_ms),
        ..Limits::default()
    };
    let target: Descriptor = job.target.into();
    let result =
        analyze::inspect_target(&mut source, &target, &Platform::host(), &job.run, &limits);
    source.answer(verdict(result))
}
