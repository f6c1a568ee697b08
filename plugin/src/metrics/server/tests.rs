use std::{
    sync::atomic::{AtomicBool, AtomicUsize, Ordering},
    time::Instant,
};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

struct Fake(AtomicBool);

impl Exporter for Fake {
    fn metrics(&self) -> Result<String, std::fmt::Error> {
        Ok("# TYPE x gauge\nx 1\n# EOF\n".to_owned())
    }
    fn ready(&self) -> Result<Ready, NotReady> {
        if self.0.load(Ordering::Relaxed) {
            Ok(Ready::Serving)
        } else {
            Err(NotReady::NotRegistered)
        }
    }
}

fn ready() -> Arc<Fake> {
    Arc::new(Fake(AtomicBool::new(true)))
}

/// A listener on a free loopback port serving `routes` within `limits`.
async fn start(
    exporter: Arc<Fake>,
    routes: Routes,
    limits: Limits,
) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = bind("127.0.0.1:0".parse().unwrap(), routes).await.unwrap();
    let address = listener.local_addr().unwrap();
    (
        address,
        tokio::spawn(serve(listener, exporter, routes, limits)),
    )
}

async fn get(address: SocketAddr, path: &str) -> String {
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    response
}

/// `get`, but an empty answer when the connection fails or is closed
/// unanswered, or none comes within `within`.
async fn try_get(address: SocketAddr, path: &str, within: Duration) -> String {
    let attempt = async {
        let mut stream = tokio::net::TcpStream::connect(address).await.ok()?;
        let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await.ok()?;
        Some(response)
    };
    tokio::time::timeout(within, attempt)
        .await
        .ok()
        .flatten()
        .unwrap_or_default()
}

#[tokio::test]
async fn routes_and_readiness() {
    tokio::time::timeout(Duration::from_secs(10), async {
        let fake = Arc::new(Fake(AtomicBool::new(false)));
        let (address, server) = start(fake.clone(), Routes::Metrics, Limits::default()).await;
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
        let taken = bind(address, Routes::Metrics)
            .await
            .unwrap_err()
            .to_string();
        assert!(taken.contains(&address.to_string()), "{taken}");
        assert!(taken.contains("--metrics-address"), "{taken}");
        server.abort();
    })
    .await
    .expect("timed out");
}

#[tokio::test]
async fn the_probe_listener_serves_only_the_probes() {
    tokio::time::timeout(Duration::from_secs(10), async {
        let fake = Arc::new(Fake(AtomicBool::new(false)));
        let (address, server) = start(fake.clone(), Routes::Probes, Limits::default()).await;
        assert!(get(address, "/healthz").await.starts_with("HTTP/1.1 200"));
        let unready = get(address, "/readyz").await;
        assert!(unready.starts_with("HTTP/1.1 503"), "{unready}");
        fake.0.store(true, Ordering::Relaxed);
        assert!(get(address, "/readyz").await.starts_with("HTTP/1.1 200"));
        let metrics = get(address, "/metrics").await;
        assert!(metrics.starts_with("HTTP/1.1 404"), "{metrics}");
        assert!(!metrics.contains("# EOF"), "{metrics}");
        let taken = bind(address, Routes::Probes).await.unwrap_err().to_string();
        assert!(taken.contains("--probe-address"), "{taken}");
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
        let (address, server) = start(ready(), Routes::Metrics, Limits::default()).await;
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

/// Short limits, so that the attack's connections come and go within the
/// test; the connection timeout is far above the header timeout, so a close
/// before it is the header timeout's doing.
const SHORT: Limits = Limits {
    connections: MAX_CONNECTIONS,
    header_timeout: Duration::from_millis(400),
    connection_timeout: Duration::from_secs(30),
};

/// How long the server took to close a connection that sent `trickle`, one
/// byte every 100 ms (nothing when empty), and never a whole head.
async fn closed_after(address: SocketAddr, trickle: &[u8]) -> Duration {
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let start = Instant::now();
    let mut bytes = trickle.iter();
    let mut buf = [0; 256];
    loop {
        match tokio::time::timeout(Duration::from_millis(100), stream.read(&mut buf)).await {
            Ok(Ok(0) | Err(_)) => return start.elapsed(),
            // hyper answers a timed-out head with a 408 before closing.
            Ok(Ok(_)) => {}
            Err(_) => {
                if let Some(byte) = bytes.next()
                    && stream.write_all(&[*byte]).await.is_err()
                {
                    return start.elapsed();
                }
            }
        }
    }
}

#[tokio::test]
async fn idle_and_trickling_connections_are_closed_at_the_header_timeout() {
    tokio::time::timeout(Duration::from_secs(20), async {
        let (address, server) = start(ready(), Routes::Metrics, SHORT).await;
        let head =
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Pad: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
        for (what, trickle) in [("idle", &b""[..]), ("trickling", &head[..])] {
            let after = closed_after(address, trickle).await;
            assert!(
                after >= SHORT.header_timeout.mul_f32(0.9) && after < Duration::from_secs(5),
                "a {what} connection was closed after {after:?}, header timeout {:?}",
                SHORT.header_timeout
            );
        }
        server.abort();
    })
    .await
    .expect("timed out");
}

/// Issue 38, F5: `2 * MAX_CONNECTIONS` idle connections to the metrics
/// listener, each reopened as soon as the server closes it, for `ATTACK`.
const ATTACK: Duration = Duration::from_secs(4);

/// Connections the server closed, by how: as soon as accepted (all slots
/// taken), or at the header timeout.
#[derive(Default)]
struct Closes {
    at_accept: AtomicUsize,
    at_header_timeout: AtomicUsize,
}

/// One attacker: connects, sends nothing, waits for the close, reconnects,
/// until `until`.
async fn idle_peer(address: SocketAddr, until: Instant, closes: Arc<Closes>) {
    let mut buf = [0; 64];
    while Instant::now() < until {
        let Ok(mut stream) = tokio::net::TcpStream::connect(address).await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let opened = Instant::now();
        let left = until.saturating_duration_since(opened);
        if let Ok(Ok(0) | Err(_)) = tokio::time::timeout(left, stream.read(&mut buf)).await {
            let count = if opened.elapsed() >= SHORT.header_timeout.mul_f32(0.9) {
                &closes.at_header_timeout
            } else {
                &closes.at_accept
            };
            count.fetch_add(1, Ordering::Relaxed);
        }
        // Reopened at once: a short pause only keeps a closed-at-accept
        // peer from spinning the test's one thread.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn idle_peers_that_fill_the_metrics_listener_never_reach_the_probes() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let exporter = ready();
        let (metrics, metrics_server) = start(exporter.clone(), Routes::Metrics, SHORT).await;
        let (probes, probe_server) = start(exporter, Routes::Probes, SHORT).await;
        let until = Instant::now() + ATTACK;
        let closes = Arc::new(Closes::default());
        let peers: Vec<_> = (0..2 * MAX_CONNECTIONS)
            .map(|_| tokio::spawn(idle_peer(metrics, until, closes.clone())))
            .collect();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let (mut probed, mut starved) = (0, 0);
        while Instant::now() + Duration::from_millis(300) < until {
            let healthz = try_get(probes, "/healthz", Duration::from_secs(2)).await;
            assert!(
                healthz.starts_with("HTTP/1.1 200"),
                "probe {probed}: {healthz:?}"
            );
            let readyz = try_get(probes, "/readyz", Duration::from_secs(2)).await;
            assert!(
                readyz.starts_with("HTTP/1.1 200"),
                "probe {probed}: {readyz:?}"
            );
            probed += 1;
            // The same probe on the metrics listener: what kubelet got
            // before the probes had their own.
            let flooded = try_get(metrics, "/healthz", Duration::from_secs(2)).await;
            starved += usize::from(!flooded.starts_with("HTTP/1.1 200"));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for peer in peers {
            peer.await.unwrap();
        }
        assert!(probed >= 10, "only {probed} probes in {ATTACK:?}");
        assert!(
            starved * 2 > probed,
            "the attack did not starve the metrics listener: {starved} of {probed} failed there"
        );
        // The listener was full: peers past its slots were closed at once,
        // and those holding a slot were closed at the header timeout, each
        // slot several times over.
        let at_accept = closes.at_accept.load(Ordering::Relaxed);
        let at_timeout = closes.at_header_timeout.load(Ordering::Relaxed);
        eprintln!("{probed} probes, {starved} starved on the metrics listener; closed: {at_accept} at accept, {at_timeout} at the header timeout");
        assert!(at_accept > 0, "no connection was refused: the listener was never full");
        assert!(at_timeout >= 3 * MAX_CONNECTIONS, "{at_timeout} closes at the header timeout");
        metrics_server.abort();
        probe_server.abort();
    })
    .await
    .expect("timed out");
}
