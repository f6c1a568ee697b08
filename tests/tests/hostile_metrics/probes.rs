//! Issue 38, F5, on the whole stack: idle connections to the plugin's
//! metrics port, reopened as they close, took every one of its slots, and
//! the liveness probe shared them (30 of 30 `/healthz` failed over 30 s, so
//! kubelet would have restarted the plugin again and again). The probes now
//! have a listener of their own (`--probe-address`, bound under the
//! plugin's landlock sandbox): while `PEERS` idle peers hold the metrics
//! port past its 5 s header timeout, every probe there answers within
//! kubelet's 3 s (the chart's `timeoutSeconds`). Needs root (private bus).

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use super::common::{self, world::world};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Idle peers on the metrics port: twice its 32 slots.
const PEERS: usize = 64;
/// Longer than the plugin's header timeout (5 s), so that each slot is
/// freed by it and taken again.
const ATTACK: Duration = Duration::from_secs(12);
/// The chart's probe `timeoutSeconds`.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// One attacker: connects, sends nothing, waits for the close, reconnects,
/// until `until`; counts the connections the plugin closed.
async fn idle_peer(address: SocketAddr, until: Instant, closed: Arc<AtomicUsize>) {
    let mut buf = [0; 64];
    while Instant::now() < until {
        let Ok(mut stream) = tokio::net::TcpStream::connect(address).await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let left = until.saturating_duration_since(Instant::now());
        if let Ok(Ok(0) | Err(_)) = tokio::time::timeout(left, stream.read(&mut buf)).await {
            closed.fetch_add(1, Ordering::Relaxed);
        }
        // Reopened at once; the pause only keeps a peer closed at accept
        // from spinning.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The status line of GET `path`, or why there is none, as kubelet would
/// see it.
async fn probe(address: SocketAddr, path: &str) -> String {
    let attempt = async {
        let mut stream = tokio::net::TcpStream::connect(address)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        stream
            .write_all(request.as_bytes())
            .await
            .map_err(|e| format!("write: {e}"))?;
        let mut answer = String::new();
        stream
            .read_to_string(&mut answer)
            .await
            .map_err(|e| format!("read: {e}"))?;
        Ok::<_, String>(
            answer
                .lines()
                .next()
                .unwrap_or("closed unanswered")
                .to_owned(),
        )
    };
    match tokio::time::timeout(PROBE_TIMEOUT, attempt).await {
        Ok(Ok(status)) | Ok(Err(status)) => status,
        Err(_) => format!("no answer within {PROBE_TIMEOUT:?}"),
    }
}

#[test]
fn idle_peers_on_the_metrics_port_never_fail_the_probes() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(Duration::from_secs(120), starved());
}

async fn starved() {
    let w = world().await;
    assert_eq!(probe(w.probes, "/healthz").await, "HTTP/1.1 200 OK");
    let until = Instant::now() + ATTACK;
    let closed = Arc::new(AtomicUsize::new(0));
    let peers: Vec<_> = (0..PEERS)
        .map(|_| tokio::spawn(idle_peer(w.metrics, until, closed.clone())))
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (mut probed, mut starved) = (0, 0);
    while Instant::now() + Duration::from_secs(1) < until {
        for path in ["/healthz", "/readyz"] {
            let status = probe(w.probes, path).await;
            assert_eq!(status, "HTTP/1.1 200 OK", "probe {probed} of {path}");
        }
        probed += 1;
        // The same probe on the metrics port, where kubelet sent it before.
        starved += usize::from(probe(w.metrics, "/healthz").await != "HTTP/1.1 200 OK");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    for peer in peers {
        peer.await.unwrap();
    }
    let closed = closed.load(Ordering::Relaxed);
    eprintln!("{probed} probes answered; {starved} starved on the metrics port; {closed} closes");
    assert!(probed >= 10, "only {probed} probes in {ATTACK:?}");
    assert!(
        starved * 2 > probed,
        "the attack did not fill the metrics port: {starved} of {probed} probes failed there"
    );
    assert!(
        closed > PEERS,
        "{closed} closes: the header timeout freed no slot"
    );
}
