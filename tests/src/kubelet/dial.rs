//! Kubelet's dial back to a plugin: grpc-go `DialContext` with `WithBlock` and a 10 s
//! deadline (`plugin/v1beta1/client.go`).
//!
//! A blocking grpc-go dial returns only once the connection is ready, which means the
//! server has answered the HTTP/2 preface with its SETTINGS frame; until the deadline it
//! retries failed connects with grpc's backoff (1 s, ×1.6). A tonic channel is "connected"
//! as soon as the socket accepts, even if nothing serves it yet, so each attempt first
//! checks readiness on a probe connection, then opens the channel with
//! [`proto::unix::channel`] (`:authority` localhost).

use std::{path::Path, time::Duration};

use proto::v1beta1::device_plugin_client::DevicePluginClient;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::UnixStream,
    time::{self, Instant},
};
use tonic::transport::Channel;

/// grpc-go's default connect backoff.
const BASE_BACKOFF: Duration = Duration::from_secs(1);
const BACKOFF_MULTIPLIER: f64 = 1.6;
const MAX_BACKOFF: Duration = Duration::from_secs(120);

/// The HTTP/2 client connection preface.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// An empty SETTINGS frame: length 0, type 4, no flags, stream 0.
const EMPTY_SETTINGS: [u8; 9] = [0, 0, 0, 4, 0, 0, 0, 0, 0];
/// GOAWAY (type 7), last stream 0, NO_ERROR: closes the probe politely.
const GOAWAY: [u8; 17] = [0, 0, 8, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
const FRAME_TYPE_SETTINGS: u8 = 4;

/// Dials the plugin at `path`, retrying until `timeout`; the error reads like grpc-go's.
pub(super) async fn dial(
    path: &Path,
    timeout: Duration,
) -> Result<DevicePluginClient<Channel>, String> {
    let deadline = Instant::now() + timeout;
    let mut backoff = BASE_BACKOFF;
    let last_error = loop {
        let error = match time::timeout_at(deadline, connect_once(path)).await {
            Ok(Ok(channel)) => return Ok(DevicePluginClient::new(channel)),
            Ok(Err(e)) => e,
            Err(_) => break format!("{}: no HTTP/2 server answered in time", path.display()),
        };
        if Instant::now() + backoff >= deadline {
            time::sleep_until(deadline).await;
            break error;
        }
        time::sleep(backoff).await;
        backoff = backoff.mul_f64(BACKOFF_MULTIPLIER).min(MAX_BACKOFF);
    };
    Err(format!(
        "context deadline exceeded after {timeout:?} (last error: {last_error})"
    ))
}

/// One attempt: the socket accepts and a server answers the preface, then the channel.
async fn connect_once(path: &Path) -> Result<Channel, String> {
    let shown = path.display();
    let mut probe = UnixStream::connect(path)
        .await
        .map_err(|e| format!("dial unix {shown}: {e}"))?;
    probe
        .write_all(PREFACE)
        .await
        .map_err(|e| format!("{shown}: writing the preface: {e}"))?;
    probe
        .write_all(&EMPTY_SETTINGS)
        .await
        .map_err(|e| format!("{shown}: writing the preface: {e}"))?;
    let mut header = [0u8; 9];
    probe
        .read_exact(&mut header)
        .await
        .map_err(|e| format!("{shown}: reading the server preface: {e}"))?;
    if header[3] != FRAME_TYPE_SETTINGS {
        return Err(format!(
            "{shown}: the server preface is not a SETTINGS frame"
        ));
    }
    // Best effort: the probe has done its job either way.
    let _ = probe.write_all(&GOAWAY).await;
    let _ = probe.shutdown().await;
    drop(probe);
    proto::unix::channel(path)
        .await
        .map_err(|e| format!("{shown}: {e}"))
}
