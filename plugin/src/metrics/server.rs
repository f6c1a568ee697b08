//! The plugin's HTTP listeners: `--metrics-address` serves `/metrics` (the
//! OpenMetrics text exposition) for Prometheus, and `--probe-address`
//! serves `/healthz` (the process answers) and `/readyz` (registered with
//! kubelet and connected to amd-gpud, or amd-gpud absent from the node) for
//! the DaemonSet's probes. The
//! metrics listener answers the probes too, for probes set up before
//! `--probe-address` existed.
//!
//! Anyone who can reach a port may connect (the chart's NetworkPolicy
//! narrows the metrics port to the scrapers, and admits no one but the node
//! to the probe port): each listener holds at most [`Limits::connections`]
//! connections and closes the others as soon as they are accepted, each
//! connection must send its request head within [`Limits::header_timeout`]
//! (a deadline for the whole head: trickling does not extend it) and in at
//! most [`MAX_REQUEST_BUF`] bytes, and lives [`Limits::connection_timeout`]
//! at most. Memory is bounded whatever the peers do. Peers that fill the
//! metrics listener (32 idle connections, reopened as they close: issue 38,
//! F5) delay scrapes, never the probes, which have their slots to
//! themselves.

use std::{convert::Infallible, net::SocketAddr, sync::Arc, time::Duration};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode, body::Incoming, header::CONTENT_TYPE};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{
    net::{TcpListener, TcpStream},
    sync::{OwnedSemaphorePermit, Semaphore},
};
use tracing::{Instrument, debug, info, info_span, warn};

/// Content type of the OpenMetrics text format.
pub(crate) const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A connection may stay open this long at most (a scrape takes milliseconds).
pub(crate) const CONNECTION_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections served at once per listener (Prometheus and kubelet's probes
/// need a few).
pub(crate) const MAX_CONNECTIONS: usize = 32;

/// A client must have sent its whole request head this long after the
/// connection is ready to read one (also between the requests of a
/// kept-alive one).
pub(crate) const HEADER_TIMEOUT: Duration = Duration::from_secs(5);

/// Largest request head read, bytes (hyper's minimum is 8 KiB; the requests
/// served have no body). A longer one is answered 431 and closed.
pub(crate) const MAX_REQUEST_BUF: usize = 16 * 1024;

/// What a listener serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Routes {
    /// `--metrics-address`: `/metrics`, and the probes as well.
    Metrics,
    /// `--probe-address`: `/healthz` and `/readyz` only.
    Probes,
}

impl Routes {
    /// The flag that names the listener's address.
    pub(crate) fn flag(self) -> &'static str {
        match self {
            Self::Metrics => "--metrics-address",
            Self::Probes => "--probe-address",
        }
    }

    fn paths(self) -> &'static str {
        match self {
            Self::Metrics => "/metrics, /healthz and /readyz",
            Self::Probes => "/healthz and /readyz",
        }
    }
}

/// How much one listener gives its peers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    /// Connections served at once; more are closed as soon as accepted.
    pub(crate) connections: usize,
    /// Deadline for a whole request head, from when one can be read.
    pub(crate) header_timeout: Duration,
    /// Lifetime of a connection.
    pub(crate) connection_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            connections: MAX_CONNECTIONS,
            header_timeout: HEADER_TIMEOUT,
            connection_timeout: CONNECTION_TIMEOUT,
        }
    }
}

/// What the server serves.
pub(crate) trait Exporter: Send + Sync + 'static {
    /// The metrics, refreshed for this scrape.
    ///
    /// # Errors
    /// When they cannot be encoded.
    fn metrics(&self) -> Result<String, std::fmt::Error>;

    /// Whether the plugin is ready, and how.
    ///
    /// # Errors
    /// Why not.
    fn ready(&self) -> Result<Ready, NotReady>;
}

/// How the plugin is ready (`/readyz` answers 200 with this).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ready {
    /// Registered with kubelet and connected to amd-gpud.
    Serving,
    /// Registered with kubelet, no device: amd-gpud is not on this node
    /// (`Unreachable::absent`); the text says why.
    WithoutGpud(String),
}

impl std::fmt::Display for Ready {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Serving => f.write_str("ok"),
            Self::WithoutGpud(why) => write!(
                f,
                "ok, no device: amd-gpud is not on this node ({why}); \
                 the plugin registers its devices once amd-gpud answers"
            ),
        }
    }
}

/// Why the plugin cannot serve pods now (`/readyz`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum NotReady {
    #[error("not registered with kubelet")]
    NotRegistered,
    #[error("amd-gpud is not connected")]
    GpudAway,
}

/// Why a listener could not start.
#[derive(Debug, thiserror::Error)]
pub(crate) enum MetricsServerError {
    #[error("cannot listen on {address} ({flag}): {source}")]
    Bind {
        flag: &'static str,
        address: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// Binds `address` for `routes` (so that a taken port fails the start, not
/// a scrape or a probe).
///
/// # Errors
/// When the address cannot be bound.
pub(crate) async fn bind(
    address: SocketAddr,
    routes: Routes,
) -> Result<TcpListener, MetricsServerError> {
    let listener = TcpListener::bind(address)
        .await
        .map_err(|source| MetricsServerError::Bind {
            flag: routes.flag(),
            address,
            source,
        })?;
    info!(%address, flag = routes.flag(), "serving {}", routes.paths());
    Ok(listener)
}

/// Serves `routes` of `exporter` on `listener` within `limits` until the
/// task is dropped or aborted.
pub(crate) async fn serve(
    listener: TcpListener,
    exporter: Arc<dyn Exporter>,
    routes: Routes,
    limits: Limits,
) {
    let slots = Arc::new(Semaphore::new(limits.connections));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(err) => {
                warn!(flag = routes.flag(), "accept failed: {err}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            debug!(%peer, flag = routes.flag(), "{} connections open, closing this one", limits.connections);
            drop(stream);
            continue;
        };
        let span = info_span!("http", flag = routes.flag(), %peer);
        tokio::spawn(connection(stream, slot, exporter.clone(), routes, limits).instrument(span));
    }
}

/// Serves one connection, holding `slot` until it closes.
async fn connection(
    stream: TcpStream,
    slot: OwnedSemaphorePermit,
    exporter: Arc<dyn Exporter>,
    routes: Routes,
    limits: Limits,
) {
    let service = hyper::service::service_fn(move |req| {
        let exporter = exporter.clone();
        async move { Ok::<_, Infallible>(answer(&req, exporter.as_ref(), routes)) }
    });
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(MAX_REQUEST_BUF)
        .serve_connection(TokioIo::new(stream), service);
    match tokio::time::timeout(limits.connection_timeout, connection).await {
        Ok(Ok(())) => {}
        Ok(Err(err)) => debug!("connection: {err}"),
        Err(_) => debug!("connection closed after {:?}", limits.connection_timeout),
    }
    drop(slot);
}

fn answer(
    req: &Request<Incoming>,
    exporter: &dyn Exporter,
    routes: Routes,
) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n".to_owned());
    }
    match (req.uri().path(), routes) {
        ("/metrics", Routes::Metrics) => metrics(exporter),
        ("/healthz", _) => text(StatusCode::OK, "ok\n".to_owned()),
        ("/readyz", _) => match exporter.ready() {
            Ok(ready) => text(StatusCode::OK, format!("{ready}\n")),
            Err(why) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
        },
        _ => text(StatusCode::NOT_FOUND, format!("{}\n", routes.paths())),
    }
}

fn metrics(exporter: &dyn Exporter) -> Response<Full<Bytes>> {
    match exporter.metrics() {
        Ok(body) => {
            let mut response = Response::new(Full::new(Bytes::from(body)));
            if let Ok(value) = OPENMETRICS.parse() {
                response.headers_mut().insert(CONTENT_TYPE, value);
            }
            response
        }
        Err(err) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot encode the metrics: {err}\n"),
        ),
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(value) = "text/plain; charset=utf-8".parse() {
        response.headers_mut().insert(CONTENT_TYPE, value);
    }
    response
}

#[cfg(test)]
mod tests;
