//! The kubelet side: serve the DevicePlugin service on our socket, register,
//! and start over whenever kubelet restarts.
//!
//! A kubelet restart shows up as any of: kubelet.sock re-created (another
//! inode), our socket deleted, or kubelet's ListAndWatch stream closed. Each
//! time, the old server stops, a fresh socket is bound, and the plugin
//! registers again: serve first, because kubelet dials back during Register.

mod registration;
mod service;

use std::{
    future::Future,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use proto::v1beta1::device_plugin_server::DevicePluginServer;
pub(crate) use service::PluginService;
use tokio::sync::{Notify, oneshot, watch};
use tracing::{Instrument, info, info_span, warn};

use crate::{
    inventory::DeviceTable,
    preferred::{AllocationHint, Policy},
};

/// How often the sockets are checked for a kubelet restart.
const WATCH_INTERVAL: Duration = Duration::from_millis(250);

/// Where kubelet is and what to register.
#[derive(Debug, Clone)]
pub(crate) struct KubeletConfig {
    pub(crate) kubelet_socket: PathBuf,
    pub(crate) socket: PathBuf,
    pub(crate) resource_name: String,
    pub(crate) policy: Policy,
    /// HAMi's Allocate; `None` without the Kubernetes API.
    pub(crate) allocator: Option<Arc<crate::allocate::Allocator>>,
    /// HAMi's choice for GetPreferredAllocation; `None` without the API.
    pub(crate) hint: Option<Arc<dyn AllocationHint>>,
    /// VRAM caps at PreStartContainer; `None` without the API.
    pub(crate) vram: Option<Arc<crate::vram::VramCaps>>,
    /// The loader check at PreStartContainer; `None` when off.
    pub(crate) loader: Option<Arc<crate::loader::LoaderCheck>>,
    /// Allocate metrics and the registration state.
    pub(crate) metrics: Arc<crate::metrics::Metrics>,
    /// Binding again after a kubelet restart; tests shorten it.
    pub(crate) rebind: Rebind,
}

impl KubeletConfig {
    /// Whether kubelet must call PreStartContainer now.
    pub(crate) fn pre_start_required(&self) -> bool {
        self.loader.is_some() || self.vram.as_ref().is_some_and(|v| v.pre_start_required())
    }
}

/// How often, and how far apart, binding the plugin socket is tried again
/// after a kubelet restart before the plugin gives up (and kubelet restarts
/// its container).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rebind {
    pub(crate) attempts: u32,
    pub(crate) pause: Duration,
}

impl Default for Rebind {
    /// Ten attempts a second apart.
    fn default() -> Self {
        Self {
            attempts: 10,
            pause: Duration::from_secs(1),
        }
    }
}

/// Why the server stopped serving.
#[derive(Debug, thiserror::Error)]
pub(crate) enum KubeletError {
    #[error("cannot bind the plugin socket {path}: {source}")]
    Bind {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the plugin socket {0} has no file name")]
    Endpoint(String),
}

/// Serves and registers until `shutdown` completes; re-registers after every
/// kubelet restart.
///
/// # Errors
/// When the plugin socket cannot be bound.
pub(crate) async fn run(
    config: KubeletConfig,
    devices: watch::Receiver<DeviceTable>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), KubeletError> {
    let endpoint = config
        .socket
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| KubeletError::Endpoint(config.socket.display().to_string()))?
        .to_owned();
    tokio::pin!(shutdown);
    let mut generation = 0_u64;
    let mut failed_binds = 0_u32;
    loop {
        generation += 1;
        let span = info_span!("kubelet", generation);
        let ended = match serve_once(&config, &endpoint, devices.clone(), &mut shutdown)
            .instrument(span)
            .await
        {
            Ok(ended) => ended,
            // The first bind's failure is the setup's (a directory we may
            // not write): the pod's error says so. After a kubelet restart
            // it may be kubelet's clean-up racing ours: try again a while.
            Err(err) if generation > 1 && failed_binds < config.rebind.attempts => {
                failed_binds += 1;
                let pause = config.rebind.pause;
                warn!("{err}; binding again in {pause:?} (attempt {failed_binds})");
                tokio::select! {
                    () = &mut shutdown => return Ok(()),
                    () = tokio::time::sleep(pause) => continue,
                }
            }
            Err(err) => return Err(err),
        };
        failed_binds = 0;
        if ended == Ended::Shutdown {
            let _ = std::fs::remove_file(&config.socket);
            info!("stopped serving kubelet");
            return Ok(());
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Ended {
    Shutdown,
    KubeletRestarted,
}

async fn serve_once(
    config: &KubeletConfig,
    endpoint: &str,
    devices: watch::Receiver<DeviceTable>,
    shutdown: &mut (impl Future<Output = ()> + Unpin),
) -> Result<Ended, KubeletError> {
    tokio::select! {
        () = &mut *shutdown => return Ok(Ended::Shutdown),
        () = wait_for_kubelet(&config.kubelet_socket) => {}
    }
    let listener =
        proto::unix::bind_fresh(&config.socket).map_err(|source| KubeletError::Bind {
            path: config.socket.display().to_string(),
            source,
        })?;
    // Taken at once: kubelet may delete the fresh socket while it cleans up
    // after its start, and a socket already gone must not pass for ours.
    let ours = identity(&config.socket);
    let stream_closed = Arc::new(Notify::new());
    let (stopping, stopping_rx) = watch::channel(false);
    let service = PluginService {
        devices,
        policy: config.policy,
        stream_closed: stream_closed.clone(),
        hint: config.hint.clone(),
        allocator: config.allocator.clone(),
        vram: config.vram.clone(),
        loader: config.loader.clone(),
        stopping: stopping_rx,
        metrics: config.metrics.clone(),
    };
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(DevicePluginServer::new(service))
            .serve_with_incoming_shutdown(proto::unix::incoming(listener), async {
                let _ = stopped.await;
            }),
    );
    let ended = tokio::select! {
        () = &mut *shutdown => Ended::Shutdown,
        reason = serve_until_restart(config, endpoint, ours, &stream_closed) => {
            warn!("kubelet restarted ({reason}); registering again");
            Ended::KubeletRestarted
        }
    };
    config.metrics.set_kubelet_registered(false);
    stopping.send_replace(true);
    let _ = stop.send(());
    if tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .is_err()
    {
        warn!("the previous gRPC server did not stop within 5 s");
    }
    Ok(ended)
}

/// Registers, then watches for a kubelet restart; returns its sign.
///
/// `ours` is our socket's identity right after binding; kubelet.sock's is
/// taken before registering, so a restart during registration is not
/// missed. A kubelet that deletes our fresh socket while it cleans up after
/// its own start ends the attempt (we bind again).
async fn serve_until_restart(
    config: &KubeletConfig,
    endpoint: &str,
    ours: Identity,
    stream_closed: &Notify,
) -> &'static str {
    let kubelet = identity(&config.kubelet_socket);
    let pre_start = config.pre_start_required();
    let registered = registration::register(
        &config.kubelet_socket,
        endpoint,
        &config.resource_name,
        pre_start,
        || still_ours(&config.socket, ours),
    );
    if !registered.await {
        return "our socket was removed before kubelet accepted the registration";
    }
    config.metrics.set_kubelet_registered(true);
    let mut tick = tokio::time::interval(WATCH_INTERVAL);
    loop {
        tokio::select! {
            () = stream_closed.notified() => return "the ListAndWatch stream closed",
            _ = tick.tick() => {
                if !still_ours(&config.socket, ours) {
                    return "our socket was removed";
                }
                if identity(&config.kubelet_socket) != kubelet {
                    return "kubelet.sock was re-created";
                }
                if config.pre_start_required() != pre_start {
                    return "amd-gpud's VRAM cap backend changed, so does PreStartContainer";
                }
            }
        }
    }
}

/// Identity of a socket file: device, inode and change time. A socket that
/// is removed and bound again may get the same inode number, but not the
/// same change time.
type Identity = Option<(u64, u64, i64, i64)>;

fn identity(path: &Path) -> Identity {
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino(), m.ctime(), m.ctime_nsec()))
}

/// Whether `path` is still the socket we bound. A socket that is gone is
/// never ours, even when it was already gone as we looked right after
/// binding (kubelet's directory cleanup can come that fast): kubelet could
/// not dial back to it.
fn still_ours(path: &Path, ours: Identity) -> bool {
    ours.is_some() && identity(path) == ours
}

/// Waits until kubelet.sock exists (kubelet is up) before binding again.
async fn wait_for_kubelet(kubelet_socket: &Path) {
    let mut logged = false;
    while !kubelet_socket.exists() {
        if !logged {
            info!(path = %kubelet_socket.display(), "waiting for kubelet.sock");
            logged = true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests;
