//! A scripted `Content` service on a Unix socket, for the stream checks that
//! a well-behaved containerd never trips.

use std::{path::PathBuf, pin::Pin, time::Duration};

use futures_util::{Stream, StreamExt as _, stream};
use proto::containerd::{
    NAMESPACE_HEADER,
    services::content::v1::{
        Info, InfoRequest, InfoResponse, ReadContentRequest, ReadContentResponse,
        content_server::{Content, ContentServer},
    },
};
use tempfile::TempDir;
use tokio::runtime::Runtime;
use tonic::{Request, Response, Status};

use super::{ContainerdSource, Descriptor};

/// What the fake answers.
#[derive(Clone, Default)]
pub(super) struct Script {
    /// `Info.size`; `None` answers `NOT_FOUND`.
    pub info_size: Option<i64>,
    /// The `Read` stream's messages: (offset, data).
    pub chunks: Vec<(i64, Vec<u8>)>,
    /// Keep the stream open, silent, after the chunks.
    pub hang: bool,
    /// How long the service waits before each chunk.
    pub delay: Duration,
}

type ReadStream = Pin<Box<dyn Stream<Item = Result<ReadContentResponse, Status>> + Send>>;

fn check_namespace<T>(request: &Request<T>) -> Result<(), Status> {
    match request.metadata().get(NAMESPACE_HEADER) {
        Some(value) if value == "k8s.io" => Ok(()),
        other => Err(Status::invalid_argument(format!("namespace {other:?}"))),
    }
}

#[tonic::async_trait]
impl Content for Script {
    async fn info(&self, request: Request<InfoRequest>) -> Result<Response<InfoResponse>, Status> {
        check_namespace(&request)?;
        let size = self
            .info_size
            .ok_or_else(|| Status::not_found("content digest: not found"))?;
        let digest = request.into_inner().digest;
        let info = Some(Info { digest, size });
        Ok(Response::new(InfoResponse { info }))
    }

    type ReadStream = ReadStream;

    async fn read(
        &self,
        request: Request<ReadContentRequest>,
    ) -> Result<Response<ReadStream>, Status> {
        check_namespace(&request)?;
        // containerd (grpc-go) cancels the whole stream at the deadline; tonic's
        // server does not, so refuse one here.
        if request.metadata().contains_key("grpc-timeout") {
            return Err(Status::invalid_argument("a deadline on a streamed read"));
        }
        let chunks = self.chunks.clone().into_iter();
        let delay = self.delay;
        let chunks = stream::iter(chunks).then(move |(offset, data)| async move {
            tokio::time::sleep(delay).await;
            Ok(ReadContentResponse { offset, data })
        });
        let stream: ReadStream = if self.hang {
            Box::pin(chunks.chain(stream::pending()))
        } else {
            Box::pin(chunks)
        };
        Ok(Response::new(stream))
    }
}

/// The fake, served on its own runtime until dropped.
pub(super) struct Served {
    runtime: Runtime,
    _dir: TempDir,
    socket: PathBuf,
}

impl Served {
    pub(super) fn start(script: Script) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("containerd.sock");
        let listener = runtime
            .block_on(async { proto::unix::bind_fresh(&socket) })
            .expect("bind");
        let server = tonic::transport::Server::builder()
            .add_service(ContentServer::new(script))
            .serve_with_incoming(proto::unix::incoming(listener));
        runtime.spawn(server);
        Self {
            runtime,
            _dir: dir,
            socket,
        }
    }

    /// A source on the fake, with `timeout` per call.
    pub(super) fn source(&self, timeout: Duration) -> ContainerdSource {
        let handle = self.runtime.handle().clone();
        ContainerdSource::connect(&self.socket, "k8s.io", handle, timeout).expect("connect")
    }
}

/// A descriptor of `size` bytes with a fixed digest.
pub(super) fn blob(size: u64) -> Descriptor {
    Descriptor {
        media_type: "application/octet-stream".into(),
        digest: format!("sha256:{}", "ab".repeat(32)),
        size,
    }
}
