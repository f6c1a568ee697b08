//! The plugin's one HTTP server, on `--metrics-address`: `/metrics` (the
//! OpenMetrics text exposition), `/healthz` (the process answers) and
//! `/readyz` (registered with kubelet and connected to amd-gpud), for
//! Prometheus and the DaemonSet's probes.
//!
//! Anyone who can reach the port may connect (the chart's NetworkPolicy
//! narrows that to the scrapers): the server holds at most
//! [`MAX_CONNECTIONS`] connections and closes the others as soon as they are
//! accepted, each connection must send its request head within
//! [`HEADER_TIMEOUT`] and in at most [`MAX_REQUEST_BUF`] bytes, and lives
//! [`CONNECTION_TIMEOUT`] at most. Its memory is bounded whatever the peers
//! do; a flood can only delay a scrape or a probe.

use std::{convert::Infallible, net::SocketAddr, sync::Arc, time::Duration};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode, body::Incoming, header::CONTENT_TYPE};
use hyper_util::rt::TokioIo;
use hyper_util::rt::TokioTimer;
use tokio::{net::TcpListener, sync::Semaphore};
use tracing::{Instrument, debug, info, info_span, warn};

/// Content type of the OpenMetrics text format.
pub(crate) const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A connection may stay open this long at most (a scrape takes milliseconds).
pub(crate) const CONNECTION_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections served at once (Prometheus and kubelet's probes need a few).
pub(crate) const MAX_CONNECTIONS: usize = 32;

/// A client must have sent its request head this long after the connection
/// is ready to read one (also between the requests of a kept-alive one).
pub(crate) const HEADER_TIMEOUT: Duration = Duration::from_secs(5);

/// Largest request head read, bytes (hyper's minimum is 8 KiB; the requests
/// served have no body). A longer one is answered 431 and closed.
pub(crate) const MAX_REQUEST_BUF: usize = 16 * 1024;

/// What the server serves.
pub(crate) trait Exporter: Send + Sync + 'static {
    /// The metrics, refreshed for this scrape.
    ///
    /// # Errors
    /// When they cannot be encoded.
    fn metrics(&self) -> Result<String, std::fmt::Error>;

    /// Whether the plugin can serve pods now.
    ///
    /// # Errors
    /// Why not.
    fn ready(&self) -> Result<(), NotReady>;
}

/// Why the plugin cannot serve pods now (`/readyz`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum NotReady {
    #[error("not registered with kubelet")]
    NotRegistered,
    #[error("amd-gpud is not connected")]
    GpudAway,
}

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub(crate) enum MetricsServerError {
    #[error("cannot listen for metrics on {address}: {source}")]
    Bind {
        address: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// Binds `address` (so that a taken port fails the start, not a scrape).
///
/// # Errors
/// When the address cannot be bound.
pub(crate) async fn bind(address: SocketAddr) -> Result<TcpListener, MetricsServerError> {
    let listener = TcpListener::bind(address)
        .await
        .map_err(|source| MetricsServerError::Bind { address, source })?;
    info!(%address, "serving /metrics, /healthz and /readyz");
    Ok(listener)
}

/// Serves `exporter` on `listener` until the task is dropped or aborted.
pub(crate) async fn serve(listener: TcpListener, exporter: Arc<dyn Exporter>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(err) => {
                warn!("metrics: accept failed: {err}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            debug!(%peer, "metrics: {MAX_CONNECTIONS} connections open, closing this one");
            drop(stream);
            continue;
        };
        let exporter = exporter.clone();
        let service = hyper::service::service_fn(move |req| {
            let exporter = exporter.clone();
            async move { Ok::<_, Infallible>(answer(&req, exporter.as_ref())) }
        });
        let connection = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(HEADER_TIMEOUT)
            .max_buf_size(MAX_REQUEST_BUF)
            .serve_connection(TokioIo::new(stream), service);
        let span = info_span!("metrics_http", %peer);
        tokio::spawn(
            async move {
                match tokio::time::timeout(CONNECTION_TIMEOUT, connection).await {
                    Ok(Ok(())) => {}
                    Ok(Err(err)) => debug!("metrics connection: {err}"),
                    Err(_) => debug!("metrics connection closed after {CONNECTION_TIMEOUT:?}"),
                }
                drop(slot);
            }
            .instrument(span),
        );
    }
}

fn answer(req: &Request<Incoming>, exporter: &dyn Exporter) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n".to_owned());
    }
    match req.uri().path() {
        "/metrics" => match exporter.metrics() {
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
        },
        "/healthz" => text(StatusCode::OK, "ok\n".to_owned()),
        "/readyz" => match exporter.ready() {
            Ok(()) => text(StatusCode::OK, "ok\n".to_owned()),
            Err(why) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
        },
        _ => text(
            StatusCode::NOT_FOUND,
            "/metrics, /healthz or /readyz\n".to_owned(),
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
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    struct Fake(AtomicBool);

    impl Exporter for Fake {
        fn metrics(&self) -> Result<String, std::fmt::Error> {
            Ok("# TYPE x gauge\nx 1\n# EOF\n".to_owned())
        }
        fn ready(&self) -> Result<(), NotReady> {
            if self.0.load(Ordering::Relaxed) {
                Ok(())
            } else {
                Err(NotReady::NotRegistered)
            }
        }
    }

    async fn get(address: SocketAddr, path: &str) -> String {
        let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        response
    }

    #[tokio::test]
    async fn routes_and_readiness() {
        tokio::time::timeout(Duration::from_secs(10), async {
            let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
            let address = listener.local_addr().unwrap();
            let fake = Arc::new(Fake(AtomicBool::new(false)));
            let server = tokio::spawn(serve(listener, fake.clone()));
            let metrics = get(address, "/metrics").await;
            assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
            assert!(metrics.contains(OPENMETRICS) && metrics.ends_with("x 1\n# EOF\n"));
            assert!(get(address, "/healthz").await.starts_with("HTTP/1.1 200"));
            let unready = get(address, "/readyz").await;
            assert!(unready.starts_with("HTTP/1.1 503"), "{unready}");
            assert!(unready.contains("not registered with kubelet"));
            fake.0.store(true, Ordering::Relaxed);
            assert!(get(address, "/readyz").await.starts_with("HTTP/1.1 200"));
            assert!(get(address, "/other").await.starts_with("HTTP/1.1 404"));
            let taken = bind(address).await.unwrap_err().to_string();
            assert!(taken.contains(&address.to_string()), "{taken}");
            server.abort();
        })
        .await
        .expect("timed out");
    }

    /// The answer to `request`, sent again while the server closes the
    /// connection unanswered (all its slots are taken until it notices the
    /// peers that left).
    async fn answer(address: SocketAddr, request: &str) -> String {
        loop {
            let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
            let _ = stream.write_all(request.as_bytes()).await;
            let mut response = String::new();
            let _ = stream.read_to_string(&mut response).await;
            if !response.is_empty() {
                return response;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test]
    async fn connections_past_the_limit_are_closed_at_once() {
        tokio::time::timeout(Duration::from_secs(20), async {
            let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
            let address = listener.local_addr().unwrap();
            let server = tokio::spawn(serve(listener, Arc::new(Fake(AtomicBool::new(true)))));
            let mut held = Vec::new();
            for _ in 0..MAX_CONNECTIONS {
                let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
                stream
                    .write_all(b"GET /metrics HTTP/1.1\r\n")
                    .await
                    .unwrap();
                held.push(stream);
            }
            let mut extra = tokio::net::TcpStream::connect(address).await.unwrap();
            let mut buf = [0; 64];
            let read = extra.read(&mut buf).await;
            assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
            // A head longer than the buffer is refused, not buffered.
            let long = format!("GET / HTTP/1.1\r\nX: {}\r\n", "a".repeat(MAX_REQUEST_BUF));
            drop(held.pop());
            assert!(answer(address, &long).await.starts_with("HTTP/1.1 431"));
            drop(held);
            let healthz = "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
            assert!(answer(address, healthz).await.starts_with("HTTP/1.1 200"));
            server.abort();
        })
        .await
        .expect("timed out");
    }
}
