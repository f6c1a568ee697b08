//! A peer exhausting the plugin's metrics port (issue #19): thousands of
//! connections that send a long request head and never finish it. The
//! plugin runs in a memory cgroup of the chart's limit (128 MiB); it must
//! survive, answer its probes again once the flood stops, and keep serving
//! Allocate. Needs root (private bus, cgroup).

// An integration-test file is itself the test module, and a failed unwrap is a
// failed test here.
#![allow(clippy::tests_outside_test_module, clippy::unwrap_used)]

mod common;
#[path = "hostile_metrics/probes.rs"]
mod probes;

use std::{
    io::{ErrorKind, Write},
    net::{SocketAddr, TcpStream},
    time::{Duration, Instant},
};

use common::memcg::{CHART_LIMIT, MemCg, alive, status_kib};
use common::world::{World, released, schedule, world};

/// Connections of the flood, and how much of a request head each sends.
const FLOOD: usize = 3000;
const HEAD_BYTES: usize = 64 * 1024;

/// Sends as much of `head` as the socket takes now; `sent` is how much went.
fn push(stream: &mut TcpStream, head: &[u8], sent: &mut usize) {
    while *sent < head.len() {
        match stream.write(&head[*sent..]) {
            Ok(0) => return,
            Ok(n) => *sent += n,
            // Full, or closed by the plugin.
            Err(e) if e.kind() == ErrorKind::WouldBlock => return,
            Err(_) => {
                *sent = head.len();
                return;
            }
        }
    }
}

/// Opens the flood's connections, each with the start of a request whose
/// head never ends.
fn flood(address: SocketAddr) -> Vec<TcpStream> {
    let mut head = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Pad: ".to_vec();
    head.resize(HEAD_BYTES, b'a');
    let mut open = Vec::with_capacity(FLOOD);
    let mut sent = vec![0; FLOOD];
    for _ in 0..FLOOD {
        let Ok(stream) = TcpStream::connect(address) else {
            continue;
        };
        stream.set_nonblocking(true).unwrap();
        open.push(stream);
    }
    // A few passes: what the kernel did not take at first goes later.
    for _ in 0..4 {
        for (stream, sent) in open.iter_mut().zip(&mut sent) {
            push(stream, &head, sent);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    open
}

/// GET `path` until it answers 200 (the flood's connections time out first).
async fn answers(w: &World, path: &str) -> bool {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(60) {
        if w.http(path).0 == 200 {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    false
}

#[test]
fn a_flood_of_unfinished_requests_costs_bounded_memory() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(Duration::from_secs(240), flooded());
}

async fn flooded() {
    let w = world().await;
    let pid = w.plugin.0.id();
    let cg = MemCg::new(CHART_LIMIT.saturating_sub(status_kib(pid, "VmRSS") * 1024));
    if let Some(cg) = &cg {
        cg.add(pid);
    }
    assert_eq!(w.http("/healthz").0, 200);
    let idle = status_kib(pid, "VmHWM");
    let address = w.metrics;
    let open = tokio::task::spawn_blocking(move || flood(address))
        .await
        .unwrap();
    eprintln!("flood: {} connections open", open.len());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let flooded = status_kib(pid, "VmHWM");
    assert!(alive(pid), "the plugin died under the flood");
    if let Some(cg) = &cg {
        assert_eq!(cg.oom_kills(), 0, "OOM kill in the plugin's cgroup");
    }
    // Allocate goes on while the flood holds its connections.
    let g = &w.gpus[0];
    schedule(&w.api, "during-flood", &[(g, 1024, 76)], 1000);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let answer = w.kubelet.allocate(vec![format!("{}#0", g.id)]).await;
    assert!(answer.is_ok(), "{answer:?}");
    assert!(released(&w.api).await);
    // The probes answer again, with the flood still connected.
    assert!(
        answers(&w, "/healthz").await,
        "/healthz never answered again"
    );
    let after = status_kib(pid, "VmHWM");
    let cg_peak = cg.as_ref().map_or(0, |c| c.max_usage() / 1024);
    eprintln!(
        "memory: {FLOOD} connections of {HEAD_BYTES} bytes: plugin VmHWM idle {idle} KiB, \
         flooded {flooded} KiB, after {after} KiB; cgroup peak {cg_peak} KiB"
    );
    assert!(alive(pid));
    drop(open);
}
