//! A fake kubelet: the device-plugin side of kubelet ≥ 1.26, on a temp directory.
//!
//! [`FakeKubelet`] serves `Registration` on `<dir>/kubelet.sock` and behaves the way
//! kubelet's device manager does (`docs/kubelet-api.md` §2):
//!
//! * `Register` is handled synchronously, in kubelet's order: the version must be
//!   `v1beta1`, the resource name must be an extended resource name, then kubelet dials
//!   `<dir>/<endpoint>` (blocking, retrying until a 10 s deadline, `:authority` localhost)
//!   and calls `GetDevicePluginOptions`. Only when all of that worked does it answer `Ok`,
//!   so a plugin that registers before it serves fails here as it would on a real node.
//!   Kubelet's own errors are plain Go errors, which a gRPC client sees as `Unknown`.
//! * After an accepted registration a background task opens `ListAndWatch` and keeps
//!   every list the plugin sends; each list replaces the previous one. When the stream
//!   ends nothing reconnects: only a new `Register` revives the resource.
//! * [`FakeKubelet::preferred_allocation`], [`FakeKubelet::allocate`] and
//!   [`FakeKubelet::pre_start`] call the plugin as kubelet does at pod admission and
//!   container start: one container request per call, only `container_responses[0]`
//!   used, the 30 s PreStartContainer deadline, and no call that kubelet would skip
//!   because the plugin's options did not ask for it.
//! * [`FakeKubelet::restart`] does what a restarting kubelet does to the directory: drop
//!   every connection, delete every socket file in the directory (and nothing else), and
//!   serve a fresh `kubelet.sock`.
//!
//! The fake talks to one plugin at a time: the newest accepted registration. Streams of
//! older registrations stay open (kubelet does not close them either) but are ignored.

mod dial;
pub mod pod_resources;
mod register;
mod state;
#[cfg(test)]
mod tests;

use std::{
    fs::{self, DirBuilder},
    io,
    os::unix::fs::{DirBuilderExt, FileTypeExt},
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use proto::v1beta1::{
    AllocateRequest, ContainerAllocateRequest, ContainerPreferredAllocationRequest,
    PreStartContainerRequest, PreferredAllocationRequest, device_plugin_client::DevicePluginClient,
    registration_server::RegistrationServer,
};
pub use proto::v1beta1::{ContainerAllocateResponse, Device, DevicePluginOptions, RegisterRequest};
use tempfile::TempDir;
use tokio::{sync::oneshot, task::JoinHandle};
use tonic::{Status, transport::Channel};

use self::{register::RegistrationService, state::Shared};

/// File name of kubelet's registration socket.
pub const KUBELET_SOCKET: &str = "kubelet.sock";
/// Kubelet's checkpoint file, which it never deletes when it cleans the directory.
pub const CHECKPOINT_FILE: &str = "kubelet_internal_checkpoint";
/// The only API version kubelet accepts.
pub const SUPPORTED_VERSION: &str = "v1beta1";
/// How long kubelet's blocking dial back to the plugin may take.
pub const DIAL_TIMEOUT: Duration = Duration::from_secs(10);
/// Kubelet's deadline for `PreStartContainer`.
pub const PRE_START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long [`FakeKubelet::restart`] and [`FakeKubelet::stop`] wait for the registration
/// server to drain before they abort it.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);
/// Mode kubelet creates the device-plugin directory with.
const DIR_MODE: u32 = 0o750;

/// A kubelet stand-in owning a device-plugin directory. See the module docs.
pub struct FakeKubelet {
    shared: Arc<Shared>,
    server: Option<ServerHandle>,
    dir: PathBuf,
    /// Held for its `Drop` when the fake made the directory.
    tempdir: Option<TempDir>,
}

/// The running `Registration` server.
struct ServerHandle {
    shutdown: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl FakeKubelet {
    /// Creates a temporary device-plugin directory (removed on drop) and serves
    /// `Registration` on `<dir>/kubelet.sock`.
    pub async fn start() -> io::Result<Self> {
        let tempdir = tempfile::Builder::new().prefix("kubelet-").tempdir()?;
        let mut kubelet = Self::start_in(tempdir.path()).await?;
        kubelet.tempdir = Some(tempdir);
        Ok(kubelet)
    }

    /// Serves `Registration` on `<dir>/kubelet.sock`, starting like kubelet: create the
    /// directory (mode 0750) if missing, then delete every socket file in it.
    pub async fn start_in(dir: &Path) -> io::Result<Self> {
        DirBuilder::new()
            .recursive(true)
            .mode(DIR_MODE)
            .create(dir)?;
        cleanup_plugin_dir(dir)?;
        let shared = Arc::new(Shared::new(dir.to_path_buf()));
        let server = spawn_server(&shared)?;
        Ok(Self {
            shared,
            server: Some(server),
            dir: dir.to_path_buf(),
            tempdir: None,
        })
    }

    /// The device-plugin directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Path of `kubelet.sock`.
    pub fn socket(&self) -> PathBuf {
        self.dir.join(KUBELET_SOCKET)
    }

    /// Accepted registrations, oldest first.
    pub fn registrations(&self) -> Vec<RegisterRequest> {
        self.shared.read(|s| s.registrations.clone())
    }

    /// Every `Register` call received, accepted or not, oldest first.
    pub fn register_attempts(&self) -> Vec<RegisterRequest> {
        self.shared.read(|s| s.attempts.clone())
    }

    /// The error of every refused `Register` call, oldest first.
    pub fn rejections(&self) -> Vec<String> {
        self.shared.read(|s| s.rejections.clone())
    }

    /// Waits until `n` registrations (1-based) have been accepted and returns the `n`th.
    pub async fn wait_registrations(
        &self,
        n: usize,
        timeout: Duration,
    ) -> Result<RegisterRequest, String> {
        let what = format!("{n} accepted registration(s)");
        self.shared
            .wait_for(timeout, &what, |s| {
                n.checked_sub(1)
                    .and_then(|i| s.registrations.get(i).cloned())
            })
            .await
    }

    /// Waits until the latest device list received satisfies `pred` and returns it.
    pub async fn wait_devices(
        &self,
        timeout: Duration,
        pred: impl Fn(&[Device]) -> bool,
    ) -> Result<Vec<Device>, String> {
        self.shared
            .wait_for(
                timeout,
                "a ListAndWatch device list matching the predicate",
                |s| (s.received_any && pred(&s.devices)).then(|| s.devices.clone()),
            )
            .await
    }

    /// Waits until the current plugin's `ListAndWatch` stream is open (`true`) or has
    /// ended (`false`).
    pub async fn wait_stream(&self, open: bool, timeout: Duration) -> Result<(), String> {
        let what = if open {
            "the ListAndWatch stream to open"
        } else {
            "the ListAndWatch stream to end"
        };
        self.shared
            .wait_for(timeout, what, |s| (s.stream_open == open).then_some(()))
            .await
    }

    /// The latest device list of the current plugin (empty before the first list and
    /// after a restart).
    pub fn devices(&self) -> Vec<Device> {
        self.shared.read(|s| s.devices.clone())
    }

    /// Every device list received from current plugins, oldest first.
    pub fn device_history(&self) -> Vec<Vec<Device>> {
        self.shared.read(|s| s.history.clone())
    }

    /// How many `ListAndWatch` messages have been received (across restarts).
    pub fn list_and_watch_updates(&self) -> usize {
        self.shared.read(|s| s.history.len())
    }

    /// Whether the current plugin's `ListAndWatch` stream is open.
    pub fn stream_open(&self) -> bool {
        self.shared.read(|s| s.stream_open)
    }

    /// Why the last `ListAndWatch` stream of a current plugin ended, if one did.
    pub fn stream_end(&self) -> Option<String> {
        self.shared.read(|s| s.stream_end.clone())
    }

    /// Calls `GetDevicePluginOptions` on the current plugin.
    pub async fn options(&self) -> Result<DevicePluginOptions, Status> {
        let mut client = self.client()?;
        Ok(client
            .get_device_plugin_options(proto::v1beta1::Empty {})
            .await?
            .into_inner())
    }

    /// Calls `GetPreferredAllocation` with one container request, as kubelet does, and
    /// returns `container_responses[0]` (empty if there is none, as kubelet treats it).
    /// Refused when the options from registration did not set
    /// `get_preferred_allocation_available`: kubelet would not call.
    pub async fn preferred_allocation(
        &self,
        available: Vec<String>,
        must_include: Vec<String>,
        size: i32,
    ) -> Result<Vec<String>, Status> {
        let mut client = self.client_if(
            |o| o.get_preferred_allocation_available,
            "get_preferred_allocation_available",
        )?;
        let request = PreferredAllocationRequest {
            container_requests: vec![ContainerPreferredAllocationRequest {
                available_device_i_ds: available,
                must_include_device_i_ds: must_include,
                allocation_size: size,
            }],
        };
        let response = client.get_preferred_allocation(request).await?.into_inner();
        Ok(response
            .container_responses
            .into_iter()
            .next()
            .map(|c| c.device_i_ds)
            .unwrap_or_default())
    }

    /// Calls `Allocate` with one container request and returns `container_responses[0]`;
    /// an empty response is an error, as in kubelet.
    pub async fn allocate(&self, ids: Vec<String>) -> Result<ContainerAllocateResponse, Status> {
        let mut client = self.client()?;
        let request = AllocateRequest {
            container_requests: vec![ContainerAllocateRequest { devices_ids: ids }],
        };
        let response = client.allocate(request).await?.into_inner();
        response
            .container_responses
            .into_iter()
            .next()
            .ok_or_else(|| Status::unknown("no containers return in allocation response"))
    }

    /// Calls `PreStartContainer` with kubelet's 30 s deadline. Refused when the options
    /// from registration did not set `pre_start_required`: kubelet would not call.
    pub async fn pre_start(&self, ids: Vec<String>) -> Result<(), Status> {
        let mut client = self.client_if(|o| o.pre_start_required, "pre_start_required")?;
        let mut request = tonic::Request::new(PreStartContainerRequest { devices_ids: ids });
        request.set_timeout(PRE_START_TIMEOUT);
        match tokio::time::timeout(PRE_START_TIMEOUT, client.pre_start_container(request)).await {
            Ok(result) => result.map(|_| ()),
            Err(_) => Err(Status::deadline_exceeded(
                "PreStartContainer: context deadline exceeded",
            )),
        }
    }

    /// Fails the next `n` `Register` calls with `Unavailable`, before any check.
    pub fn fail_next_registrations(&self, n: usize) {
        self.shared.with(|s| s.fail_next = n);
    }

    /// Sets the dial-back deadline (default [`DIAL_TIMEOUT`]); tests of failing dials
    /// shorten it.
    pub fn set_dial_timeout(&self, timeout: Duration) {
        self.shared.with(|s| s.dial_timeout = timeout);
    }

    /// Simulates a kubelet restart: every connection to the plugin drops (its
    /// `ListAndWatch` ends), the registration server goes away, every socket file in the
    /// directory is deleted (not directories, regular files or the checkpoint), and
    /// `kubelet.sock` is served anew. Device lists are cleared, as a restarted kubelet
    /// reads capacity 0 until the plugin registers again; registrations stay recorded.
    ///
    /// The new kubelet starts at once; see [`Self::restart_after`] for a real one's
    /// downtime. Note that a socket deleted and bound again at once usually gets the same
    /// inode number back (ext4, tmpfs), with a real kubelet too.
    pub async fn restart(&mut self) -> io::Result<()> {
        self.restart_after(Duration::ZERO).await
    }

    /// [`Self::restart`] with `downtime` between the old kubelet dying and the new one
    /// cleaning the directory. Meanwhile the stale `kubelet.sock` file stays and refuses
    /// connections, and a socket the plugin binds early is deleted by the cleanup, as on
    /// a node, where a restart takes seconds.
    pub async fn restart_after(&mut self, downtime: Duration) -> io::Result<()> {
        self.shared.kill_epoch().await;
        if let Some(server) = self.server.take() {
            server.stop().await;
        }
        tokio::time::sleep(downtime).await;
        cleanup_plugin_dir(&self.dir)?;
        self.server = Some(spawn_server(&self.shared)?);
        Ok(())
    }

    /// Stops serving and drops every connection; a temp directory is removed.
    pub async fn stop(mut self) {
        self.shared.kill_epoch().await;
        if let Some(server) = self.server.take() {
            server.stop().await;
        }
    }

    fn client(&self) -> Result<DevicePluginClient<Channel>, Status> {
        self.client_if(|_| true, "")
    }

    /// The current plugin's client, if its options allow the call.
    fn client_if(
        &self,
        allowed: impl Fn(&DevicePluginOptions) -> bool,
        option: &str,
    ) -> Result<DevicePluginClient<Channel>, Status> {
        self.shared.read(|s| match &s.conn {
            None => Err(Status::failed_precondition(
                "no device plugin is registered",
            )),
            Some(conn) if !allowed(&conn.options) => Err(Status::failed_precondition(format!(
                "kubelet would not make this call: GetDevicePluginOptions returned {option}=false"
            ))),
            Some(conn) => Ok(conn.client.clone()),
        })
    }
}

impl Drop for FakeKubelet {
    /// Without [`FakeKubelet::stop`]: the server shuts down as its handle drops, and the
    /// plugin connections are cut here.
    fn drop(&mut self) {
        for reader in self.shared.end_epoch() {
            reader.abort();
        }
    }
}

impl ServerHandle {
    async fn stop(self) {
        let _ = self.shutdown.send(());
        let mut task = self.task;
        if tokio::time::timeout(SHUTDOWN_GRACE, &mut task)
            .await
            .is_err()
        {
            task.abort();
            let _ = task.await;
        }
    }
}

/// Binds a fresh `kubelet.sock` and serves `Registration` on it for the current epoch.
fn spawn_server(shared: &Arc<Shared>) -> io::Result<ServerHandle> {
    let listener = proto::unix::bind_fresh(&shared.dir.join(KUBELET_SOCKET))?;
    let service = RegistrationService::new(Arc::clone(shared));
    let (shutdown, signal) = oneshot::channel::<()>();
    let errors = Arc::clone(shared);
    let task = tokio::spawn(async move {
        let served = tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(service))
            .serve_with_incoming_shutdown(proto::unix::incoming(listener), async {
                let _ = signal.await;
            })
            .await;
        if let Err(e) = served {
            errors.with(|s| {
                s.rejections
                    .push(format!("registration server failed: {e}"))
            });
        }
    });
    Ok(ServerHandle { shutdown, task })
}

/// Kubelet's `CleanupPluginDirectory`: remove every entry that `stat` (following links)
/// reports as a socket, except the checkpoint; keep going past errors and return the
/// first.
fn cleanup_plugin_dir(dir: &Path) -> io::Result<()> {
    let mut first_error = None;
    for entry in fs::read_dir(dir)? {
        let Ok(entry) = entry else { continue };
        if entry.file_name() == CHECKPOINT_FILE {
            continue;
        }
        let path = entry.path();
        let Ok(meta) = fs::metadata(&path) else {
            continue;
        };
        if meta.is_dir() || !meta.file_type().is_socket() {
            continue;
        }
        match fs::remove_file(&path) {
            // Like Go's os.RemoveAll, a file already gone (a plugin re-binding, say) is fine.
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                let e = io::Error::new(e.kind(), format!("{}: {e}", path.display()));
                first_error.get_or_insert(e);
            }
            _ => {}
        }
    }
    first_error.map_or(Ok(()), Err)
}
