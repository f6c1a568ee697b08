//! containerd's content store as an [`ImageSource`].
//!
//! Three calls of containerd's gRPC API, over its Unix socket
//! (`/run/containerd/containerd.sock` on a node):
//!
//! * `Images.Get` (containerd/containerd:api/services/images/v1/images.proto)
//!   gives the descriptor an image name points at;
//! * `Content.Info` (containerd/containerd:api/services/content/v1/content.proto)
//!   gives a blob's size, checked against the caller's bound before reading;
//! * `Content.Read` streams the blob in chunks, each carrying its offset.
//!
//! Every call names its namespace in the `containerd-namespace` header (CRI
//! keeps Kubernetes images in `k8s.io`). The source is synchronous, like the
//! analysis: the loader check's fetcher process (`super::fetch`) uses it on
//! its main thread, blocking on a handle of its own runtime, every call
//! bounded by `call_timeout`.

mod blob;

use std::{
    future::Future,
    io,
    path::{Path, PathBuf},
    time::Duration,
};

use proto::containerd::{
    NAMESPACE_HEADER,
    services::{
        content::v1::{
            InfoRequest, ReadContentRequest, ReadContentResponse, content_client::ContentClient,
        },
        images::v1::{GetImageRequest, images_client::ImagesClient},
    },
};
use tokio::runtime::Handle;
use tonic::{Code, Request, Status, Streaming, metadata::AsciiMetadataValue, transport::Channel};
use tracing::{Instrument as _, debug_span};

use super::{Descriptor, ImageSource, SourceError};

/// Longest containerd namespace accepted (containerd's own limit is 76).
const MAX_NAMESPACE_LEN: usize = 76;

/// How much of a status message from containerd goes into an error.
const MAX_WHY_LEN: usize = 512;

/// A connection to containerd, reading one namespace's images.
pub struct ContainerdSource {
    socket: PathBuf,
    namespace: AsciiMetadataValue,
    handle: Handle,
    call_timeout: Duration,
    images: ImagesClient<Channel>,
    content: ContentClient<Channel>,
}

impl ContainerdSource {
    /// Connects to containerd's socket `socket` and reads the images of
    /// `namespace` (e.g. `k8s.io`).
    ///
    /// Must be called off the runtime (not from one of its tasks): it blocks
    /// on `handle`. A current-thread runtime's handle drives no I/O itself,
    /// so its `Runtime::block_on` must be running on another thread
    /// meanwhile (tokio's `Handle::block_on`); the fetcher's runtime has a
    /// worker thread of its own. `call_timeout` bounds the
    /// connection and every later call; a streamed read gets it as an idle
    /// timeout between chunks.
    ///
    /// # Errors
    /// [`SourceError::NoRuntime`] when nothing answers at `socket` (missing,
    /// refused, too slow); [`SourceError::Rpc`] for a namespace that is not a
    /// valid containerd namespace.
    pub fn connect(
        socket: &Path,
        namespace: &str,
        handle: Handle,
        call_timeout: Duration,
    ) -> Result<Self, SourceError> {
        let namespace = namespace_header(namespace)?;
        let span = debug_span!("containerd_connect", socket = %socket.display());
        let connecting = proto::unix::channel(socket).instrument(span);
        // The timer is made inside the runtime: outside it, tokio panics.
        let connected =
            handle.block_on(async { tokio::time::timeout(call_timeout, connecting).await });
        let channel = match connected {
            Ok(Ok(channel)) => channel,
            Ok(Err(err)) => {
                return Err(SourceError::NoRuntime {
                    socket: socket.to_owned(),
                    why: error_chain(&err),
                });
            }
            Err(_) => {
                return Err(SourceError::NoRuntime {
                    socket: socket.to_owned(),
                    why: format!("no answer within {call_timeout:?}"),
                });
            }
        };
        Ok(Self {
            socket: socket.to_owned(),
            namespace,
            handle,
            call_timeout,
            images: ImagesClient::new(channel.clone()),
            content: ContentClient::new(channel),
        })
    }

    /// `message` with the namespace header and the call timeout set as the
    /// call's gRPC deadline.
    fn request<T>(&self, message: T) -> Request<T> {
        let mut request = self.stream_request(message);
        request.set_timeout(self.call_timeout);
        request
    }

    /// `message` with the namespace header but no deadline: a streamed
    /// read may take longer than one call, and is bounded per chunk instead
    /// (a deadline would have containerd cut a large layer off mid-way).
    fn stream_request<T>(&self, message: T) -> Request<T> {
        let mut request = Request::new(message);
        request
            .metadata_mut()
            .insert(NAMESPACE_HEADER, self.namespace.clone());
        request
    }

    /// Runs one unary call to completion within the call timeout.
    fn block<T>(
        &self,
        call: &'static str,
        fut: impl Future<Output = Result<tonic::Response<T>, Status>>,
    ) -> Result<T, Failure> {
        let limit = self.call_timeout;
        match self
            .handle
            .block_on(async { tokio::time::timeout(limit, fut).await })
        {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) => Err(Failure::Status(status)),
            Err(_) => Err(Failure::Timeout(call, self.call_timeout)),
        }
    }

    /// The error for a failed `call`; `not_found` stands for `NOT_FOUND`.
    fn error(&self, call: &'static str, failure: Failure, not_found: SourceError) -> SourceError {
        match failure {
            Failure::Status(status) if status.code() == Code::NotFound => not_found,
            Failure::Status(status) => status_error(&self.socket, call, &status),
            Failure::Timeout(call, after) => SourceError::Rpc {
                call,
                why: format!("no answer within {after:?}"),
            },
        }
    }

    /// `Content.Info` of `desc`, checked against `desc.size`.
    fn info_size(&self, desc: &Descriptor) -> Result<u64, SourceError> {
        const CALL: &str = "Content.Info";
        let mut client = self.content.clone();
        let request = self.request(InfoRequest {
            digest: desc.digest.clone(),
        });
        let response = self
            .block(CALL, client.info(request))
            .map_err(|f| self.error(CALL, f, missing(desc)))?;
        let info = response.info.ok_or_else(|| SourceError::Rpc {
            call: CALL,
            why: format!("the answer for {} carries no info", desc.digest),
        })?;
        let size = u64::try_from(info.size).map_err(|_| SourceError::Rpc {
            call: CALL,
            why: format!("blob {} has a negative size {}", desc.digest, info.size),
        })?;
        if size != desc.size {
            return Err(SourceError::Rpc {
                call: CALL,
                why: format!(
                    "blob {} is {size} bytes in the store, {} in its descriptor",
                    desc.digest, desc.size
                ),
            });
        }
        Ok(size)
    }

    /// Starts `Content.Read` of the whole of `desc`.
    fn start_read(&self, desc: &Descriptor) -> Result<Streaming<ReadContentResponse>, SourceError> {
        const CALL: &str = "Content.Read";
        let mut client = self.content.clone();
        // Size 0 reads to the end of the blob.
        let request = self.stream_request(ReadContentRequest {
            digest: desc.digest.clone(),
            offset: 0,
            size: 0,
        });
        self.block(CALL, client.read(request))
            .map_err(|f| self.error(CALL, f, missing(desc)))
    }
}

impl ImageSource for ContainerdSource {
    fn target(&mut self, name: &str) -> Result<Descriptor, SourceError> {
        const CALL: &str = "Images.Get";
        let _span = debug_span!("containerd_call", call = CALL, image = name).entered();
        let mut client = self.images.clone();
        let request = self.request(GetImageRequest {
            name: name.to_owned(),
        });
        let not_present = SourceError::NotPresent {
            image: name.to_owned(),
        };
        let response = self
            .block(CALL, client.get(request))
            .map_err(|f| self.error(CALL, f, not_present))?;
        let no_target = || SourceError::Rpc {
            call: CALL,
            why: format!("image {name:?} has no target"),
        };
        let target = response
            .image
            .and_then(|i| i.target)
            .ok_or_else(no_target)?;
        let size = u64::try_from(target.size).map_err(|_| SourceError::Rpc {
            call: CALL,
            why: format!(
                "image {name:?}'s target has a negative size {}",
                target.size
            ),
        })?;
        Ok(Descriptor {
            media_type: target.media_type,
            digest: target.digest,
            size,
        })
    }

    fn read_blob(&mut self, desc: &Descriptor, max: u64) -> Result<Vec<u8>, SourceError> {
        let _span =
            debug_span!("containerd_call", call = "Content.Read", digest = %desc.digest).entered();
        too_large(desc, desc.size, max)?;
        let size = self.info_size(desc)?;
        too_large(desc, size, max)?;
        let stream = self.start_read(desc)?;
        let mut reader =
            blob::BlobReader::new(stream, self.handle.clone(), self.call_timeout, desc);
        let mut out = Vec::new();
        // `size <= max` and the reader refuses bytes past `size`: bounded.
        let read = io::Read::read_to_end(&mut reader, &mut out);
        if let Some(sent) = reader.overrun() {
            too_large(desc, sent, max)?;
        }
        read.map_err(|err| SourceError::Rpc {
            call: "Content.Read",
            why: err.to_string(),
        })?;
        Ok(out)
    }

    fn open_blob(
        &mut self,
        desc: &Descriptor,
    ) -> Result<Box<dyn io::Read + Send + '_>, SourceError> {
        let _span =
            debug_span!("containerd_call", call = "Content.Read", digest = %desc.digest).entered();
        self.info_size(desc)?;
        let stream = self.start_read(desc)?;
        let reader = blob::BlobReader::new(stream, self.handle.clone(), self.call_timeout, desc);
        Ok(Box::new(reader))
    }
}

/// Why one call failed, before it is told apart by call.
enum Failure {
    Status(Status),
    Timeout(&'static str, Duration),
}

fn missing(desc: &Descriptor) -> SourceError {
    SourceError::MissingBlob {
        digest: desc.digest.clone(),
    }
}

/// [`SourceError::TooLarge`] when `size` is above `max`.
fn too_large(desc: &Descriptor, size: u64, max: u64) -> Result<(), SourceError> {
    if size > max {
        return Err(SourceError::TooLarge {
            digest: desc.digest.clone(),
            size,
            max,
        });
    }
    Ok(())
}

/// A status other than `NOT_FOUND`: containerd gone since the connection
/// ([`SourceError::NoRuntime`]) or a failed call ([`SourceError::Rpc`]).
///
/// A connection that breaks under a call surfaces as `Unavailable` with the
/// socket error inside, or, when the transport notices first, as a bare
/// `Cancelled` or `Unavailable`, or as `Unknown` "transport error" (tonic's
/// code for a connection error it does not classify; seen in CI when
/// containerd was killed under an open channel); for those the socket is
/// tried once more so that "containerd is gone" is told apart from a call
/// that failed.
fn status_error(socket: &Path, call: &'static str, status: &Status) -> SourceError {
    let why = format!("{:?}: {}", status.code(), bounded(status.message()));
    if matches!(
        status.code(),
        Code::Unavailable | Code::Cancelled | Code::Unknown
    ) {
        let gone = io_cause(status)
            .filter(|io| runtime_absent(io))
            .map(io::Error::to_string)
            .or_else(|| socket_refuses(socket));
        if let Some(gone) = gone {
            return SourceError::NoRuntime {
                socket: socket.to_owned(),
                why: gone,
            };
        }
    }
    SourceError::Rpc { call, why }
}

/// Whether `io` says nothing listens at the socket any more.
fn runtime_absent(io: &io::Error) -> bool {
    matches!(
        io.kind(),
        io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
    )
}

/// Why a new connection to `socket` fails, when it fails the way a stopped
/// containerd makes it fail (missing socket, refused); `None` when it
/// connects or fails otherwise. A Unix socket connect answers at once.
fn socket_refuses(socket: &Path) -> Option<String> {
    match std::os::unix::net::UnixStream::connect(socket) {
        Err(err) if runtime_absent(&err) => Some(err.to_string()),
        _ => None,
    }
}

/// The `io::Error` at the bottom of `err`'s source chain, if any.
fn io_cause<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a io::Error> {
    let mut cause = Some(err);
    while let Some(err) = cause {
        if let Some(io) = err.downcast_ref::<io::Error>() {
            return Some(io);
        }
        cause = err.source();
    }
    None
}

/// `err` and its sources on one line, each said once, cut to
/// [`MAX_WHY_LEN`] (tonic's transport error alone only says "transport
/// error"; the errno text is further down).
fn error_chain(err: &tonic::transport::Error) -> String {
    bounded(&ipc::report::one_line(err))
}

/// `text` cut to [`MAX_WHY_LEN`] bytes at a character boundary.
fn bounded(text: &str) -> String {
    if text.len() <= MAX_WHY_LEN {
        return text.to_owned();
    }
    let mut end = MAX_WHY_LEN;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

/// `namespace` as a header value, if it is a containerd namespace:
/// 1 to [`MAX_NAMESPACE_LEN`] of `[A-Za-z0-9_.-]`.
fn namespace_header(namespace: &str) -> Result<AsciiMetadataValue, SourceError> {
    let valid = !namespace.is_empty()
        && namespace.len() <= MAX_NAMESPACE_LEN
        && namespace
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    let invalid = || SourceError::Rpc {
        call: "connect",
        why: format!("{namespace:?} is not a containerd namespace"),
    };
    if !valid {
        return Err(invalid());
    }
    AsciiMetadataValue::try_from(namespace).map_err(|_| invalid())
}

#[cfg(test)]
mod tests;
