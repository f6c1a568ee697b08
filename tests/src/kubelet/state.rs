//! State shared by the fake's handle, its `Registration` server and its `ListAndWatch`
//! readers, and the waits on it.

use std::{
    path::PathBuf,
    sync::{Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use proto::v1beta1::{
    Device, DevicePluginOptions, RegisterRequest, device_plugin_client::DevicePluginClient,
};
use tokio::{sync::watch, task::JoinHandle};
use tonic::transport::Channel;

use super::DIAL_TIMEOUT;

/// What the fake shares between tasks: the directory, the state, and a counter bumped
/// on every change to wake waiters.
pub(super) struct Shared {
    pub(super) dir: PathBuf,
    state: Mutex<State>,
    changed: watch::Sender<u64>,
}

/// The plugin connection kubelet keeps after an accepted registration.
pub(super) struct Conn {
    pub(super) id: u64,
    pub(super) options: DevicePluginOptions,
    pub(super) client: DevicePluginClient<Channel>,
}

pub(super) struct State {
    /// Generation of the registration server; bumped by a restart, so that calls still
    /// in flight on the old one cannot register with the new kubelet.
    pub(super) epoch: u64,
    pub(super) attempts: Vec<RegisterRequest>,
    pub(super) registrations: Vec<RegisterRequest>,
    pub(super) rejections: Vec<String>,
    pub(super) fail_next: usize,
    pub(super) dial_timeout: Duration,
    pub(super) conn: Option<Conn>,
    next_conn: u64,
    /// `ListAndWatch` readers, aborted when kubelet "dies".
    readers: Vec<JoinHandle<()>>,
    pub(super) received_any: bool,
    pub(super) devices: Vec<Device>,
    pub(super) history: Vec<Vec<Device>>,
    pub(super) stream_open: bool,
    pub(super) stream_end: Option<String>,
}

impl Shared {
    pub(super) fn new(dir: PathBuf) -> Self {
        let state = State {
            epoch: 0,
            attempts: Vec::new(),
            registrations: Vec::new(),
            rejections: Vec::new(),
            fail_next: 0,
            dial_timeout: DIAL_TIMEOUT,
            conn: None,
            next_conn: 0,
            readers: Vec::new(),
            received_any: false,
            devices: Vec::new(),
            history: Vec::new(),
            stream_open: false,
            stream_end: None,
        };
        Self {
            dir,
            state: Mutex::new(state),
            changed: watch::Sender::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Reads the state under the lock.
    pub(super) fn read<T>(&self, f: impl FnOnce(&State) -> T) -> T {
        f(&self.lock())
    }

    /// Runs `f` on the state under the lock and wakes every waiter.
    pub(super) fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let result = f(&mut self.lock());
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
        result
    }

    /// Waits until `check` returns `Some`, re-checking after every change.
    pub(super) async fn wait_for<T>(
        &self,
        timeout: Duration,
        what: &str,
        check: impl Fn(&State) -> Option<T>,
    ) -> Result<T, String> {
        let mut changes = self.changed.subscribe();
        let wait = async {
            loop {
                let found = check(&self.lock());
                if let Some(found) = found {
                    return found;
                }
                // The sender lives as long as `self`, so this never fails while we wait.
                let _ = changes.changed().await;
            }
        };
        tokio::time::timeout(timeout, wait).await.map_err(|_| {
            format!(
                "timed out after {timeout:?} waiting for {what} ({})",
                self.lock().summary()
            )
        })
    }

    /// Kubelet dies: the registration epoch ends, every plugin connection drops (so each
    /// `ListAndWatch` ends on the plugin's side), and the device lists are forgotten.
    pub(super) async fn kill_epoch(&self) {
        for reader in self.end_epoch() {
            reader.abort();
            let _ = reader.await;
        }
    }

    /// The synchronous part of [`Self::kill_epoch`]; returns the readers to abort.
    pub(super) fn end_epoch(&self) -> Vec<JoinHandle<()>> {
        self.with(|s| {
            s.epoch += 1;
            s.conn = None;
            if s.stream_open {
                s.stream_end = Some("kubelet restarted".to_owned());
            }
            s.stream_open = false;
            s.received_any = false;
            s.devices.clear();
            std::mem::take(&mut s.readers)
        })
    }
}

impl State {
    /// Records an accepted registration and makes its connection the current one.
    pub(super) fn connect(
        &mut self,
        request: RegisterRequest,
        options: DevicePluginOptions,
        client: DevicePluginClient<Channel>,
    ) -> u64 {
        self.next_conn += 1;
        let id = self.next_conn;
        self.registrations.push(request);
        self.conn = Some(Conn {
            id,
            options,
            client,
        });
        self.stream_open = false;
        id
    }

    pub(super) fn add_reader(&mut self, reader: JoinHandle<()>) {
        self.readers.retain(|r| !r.is_finished());
        self.readers.push(reader);
    }

    fn is_current(&self, id: u64) -> bool {
        self.conn.as_ref().is_some_and(|c| c.id == id)
    }

    pub(super) fn stream_opened(&mut self, id: u64) {
        if self.is_current(id) {
            self.stream_open = true;
        }
    }

    /// A `ListAndWatch` message replaces the whole device list.
    pub(super) fn received(&mut self, id: u64, devices: Vec<Device>) {
        if self.is_current(id) {
            self.received_any = true;
            self.history.push(devices.clone());
            self.devices = devices;
        }
    }

    pub(super) fn stream_ended(&mut self, id: u64, why: String) {
        if self.is_current(id) {
            self.stream_open = false;
            self.stream_end = Some(why);
        }
    }

    fn summary(&self) -> String {
        let last_rejection = self.rejections.last().map_or("none", String::as_str);
        format!(
            "{} register call(s), {} accepted, last rejection: {last_rejection}; \
             {} device list(s) received, latest has {} device(s); ListAndWatch {}",
            self.attempts.len(),
            self.registrations.len(),
            self.history.len(),
            self.devices.len(),
            if self.stream_open { "open" } else { "not open" },
        )
    }
}
