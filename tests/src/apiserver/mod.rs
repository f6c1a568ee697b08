//! An in-memory fake Kubernetes API server over plain HTTP that the real kube-rs client talks
//! to unchanged.
//!
//! It serves core/v1 `nodes`, `pods` (with the `status` and `binding` subresources) and
//! `events`, plus `events.k8s.io/v1` `events`, with the semantics the plugin and HAMi rely on:
//!
//! * one global `resourceVersion` counter, bumped on every write; `uid` and
//!   `creationTimestamp` on create; a write that changes nothing is not a write;
//! * GET (404 as a `Status`), LIST with `fieldSelector` (any dotted path, `=`, `==`, `!=`) and
//!   `labelSelector` (equality and existence), in storage-key order;
//! * WATCH with `resourceVersion`, `allowWatchBookmarks` and `timeoutSeconds`: newline-delimited
//!   events after the given version, honouring the selectors (an object entering the selector
//!   is ADDED, one leaving it DELETED), a BOOKMARK at the timeout, and — as the real server
//!   does — a `200` whose only event is an `ERROR` with a `410 Expired` `Status` when the
//!   version is older than the bounded history;
//! * POST (409 `AlreadyExists`), PUT and PATCH (`merge-patch+json`; `strategic-merge-patch+json`
//!   handled as a merge patch) with the `metadata.resourceVersion` precondition (409
//!   `Conflict`, nothing changed), DELETE (immediate, no grace period);
//! * for pods and nodes the main resource ignores `status` and `status` ignores `spec`;
//! * the legacy discovery documents (`/api`, `/apis`, `/api/v1`, ...), so kubectl works;
//! * a lag knob ([`FakeApiServer::set_watch_delay`]): every watch event goes out a fixed
//!   plus a random time after it happened, in order, as from a loaded API server whose
//!   watch cache lags behind its writes (reads and writes are not delayed).
//!
//! The server runs on its own thread and runtime, so it works from sync and async tests
//! alike, and stops when dropped.

mod discovery;
mod http;
mod lag;
mod merge;
mod select;
mod store;

use std::{
    collections::BTreeMap,
    io,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use lag::Lag;
pub use lag::WatchDelay;
pub use merge::merge_patch;
use serde_json::Value;
use store::Store;
pub use store::rfc3339;
use tokio::sync::{oneshot, watch};

/// The resources the fake serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// core/v1 `nodes`, cluster-scoped.
    Node,
    /// core/v1 `pods`.
    Pod,
    /// core/v1 `events`.
    Event,
    /// events.k8s.io/v1 `events` (what kube-runtime's `Recorder` writes).
    EventV1,
}

impl Kind {
    /// The `apiVersion` of the objects.
    pub fn api_version(self) -> &'static str {
        match self {
            Self::EventV1 => "events.k8s.io/v1",
            Self::Node | Self::Pod | Self::Event => "v1",
        }
    }

    /// The `kind` of the objects.
    pub fn kind(self) -> &'static str {
        match self {
            Self::Node => "Node",
            Self::Pod => "Pod",
            Self::Event | Self::EventV1 => "Event",
        }
    }

    /// The plural resource name in URLs.
    pub fn resource(self) -> &'static str {
        match self {
            Self::Node => "nodes",
            Self::Pod => "pods",
            Self::Event | Self::EventV1 => "events",
        }
    }

    /// Whether the objects live in a namespace.
    pub fn namespaced(self) -> bool {
        self != Self::Node
    }

    /// Whether the kind has a `status` subresource.
    pub(crate) fn has_status(self) -> bool {
        matches!(self, Self::Node | Self::Pod)
    }
}

/// Requests served, by verb, and by `"<verb> <resource>"` (for example `"patch pods"`,
/// `"post pods/binding"`, `"watch nodes"`). Requests refused while unreachable are not counted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counts {
    pub get: u64,
    pub list: u64,
    pub watch: u64,
    pub post: u64,
    pub put: u64,
    pub patch: u64,
    pub delete: u64,
    pub by_resource: BTreeMap<String, u64>,
}

impl Counts {
    /// Requests with this verb on this resource (`"pods"`, `"pods/status"`, ...).
    pub fn of(&self, verb: &str, resource: &str) -> u64 {
        self.by_resource
            .get(&format!("{verb} {resource}"))
            .copied()
            .unwrap_or(0)
    }

    /// All requests counted.
    pub fn total(&self) -> u64 {
        self.get + self.list + self.watch + self.post + self.put + self.patch + self.delete
    }
}

/// State shared by the HTTP side and the test hooks.
pub(crate) struct Shared {
    store: Mutex<Store>,
    /// The lag knob.
    lag: Mutex<Lag>,
    /// Bumped after every write (and on `set_unreachable`) to wake the watches.
    changed: watch::Sender<u64>,
    unreachable: AtomicBool,
    /// While set, requests are accepted and never answered.
    blackhole: AtomicBool,
    counts: Mutex<Counts>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    pub(crate) fn lock_store(&self) -> MutexGuard<'_, Store> {
        lock(&self.store)
    }

    /// Runs `f` on the store and wakes the watches when it wrote something.
    pub(crate) fn with_store<R>(&self, f: impl FnOnce(&mut Store) -> R) -> R {
        let mut store = self.lock_store();
        let before = store.rv;
        let result = f(&mut store);
        let after = store.rv;
        drop(store);
        if after != before {
            self.changed.send_replace(after);
        }
        result
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// How late the next watch event goes out.
    pub(crate) fn next_watch_delay(&self) -> Duration {
        lock(&self.lag).next()
    }

    pub(crate) fn is_unreachable(&self) -> bool {
        self.unreachable.load(Ordering::SeqCst)
    }

    pub(crate) fn is_blackholed(&self) -> bool {
        self.blackhole.load(Ordering::SeqCst)
    }

    /// Resolves once the blackhole knob is off (at once when it is).
    pub(crate) async fn blackhole_lifted(&self) {
        let mut changed = self.subscribe();
        while self.is_blackholed() {
            if changed.changed().await.is_err() {
                return;
            }
        }
    }

    pub(crate) fn count(&self, verb: &str, resource: &str) {
        let mut counts = lock(&self.counts);
        match verb {
            "get" => counts.get += 1,
            "list" => counts.list += 1,
            "watch" => counts.watch += 1,
            "post" => counts.post += 1,
            "put" => counts.put += 1,
            "patch" => counts.patch += 1,
            _ => counts.delete += 1,
        }
        *counts
            .by_resource
            .entry(format!("{verb} {resource}"))
            .or_default() += 1;
    }
}

/// The fake API server; see the module documentation.
pub struct FakeApiServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl FakeApiServer {
    /// Starts serving on `127.0.0.1` on a free port.
    ///
    /// # Errors
    ///
    /// Binding the port, building the runtime or spawning its thread failed.
    pub fn start() -> io::Result<Self> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let shared = Arc::new(Shared {
            store: Mutex::new(Store::default()),
            lag: Mutex::new(Lag::new(WatchDelay::default(), 0)),
            changed: watch::Sender::new(0),
            unreachable: AtomicBool::new(false),
            blackhole: AtomicBool::new(false),
            counts: Mutex::new(Counts::default()),
        });
        let (stop, stopped) = oneshot::channel();
        let serving = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("fake-apiserver".into())
            .spawn(move || {
                runtime.block_on(async move {
                    if let Ok(listener) = tokio::net::TcpListener::from_std(listener) {
                        http::serve(listener, serving, stopped).await;
                    }
                });
                // Dropping the runtime here drops every connection, open watches included.
            })?;
        Ok(Self {
            addr,
            shared,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Writes `<dir>/kubeconfig` pointing at the server (no auth, namespace `default`).
    ///
    /// # Panics
    ///
    /// Writing the file failed.
    pub fn kubeconfig(&self, dir: &Path) -> PathBuf {
        let path = dir.join("kubeconfig");
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\n\
             contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    \
             namespace: default\ncurrent-context: fake\nusers:\n- name: fake\n  user: {{}}\n",
            self.url()
        );
        if let Err(e) = std::fs::write(&path, text) {
            panic!("writing {}: {e}", path.display());
        }
        path
    }

    /// A kube-rs configuration for the server (default namespace `default`).
    pub fn client_config(&self) -> kube::Config {
        let uri: hyper::Uri = self
            .url()
            .parse()
            .expect("a socket address makes a valid URI");
        kube::Config::new(uri)
    }

    /// Creates or replaces a node whole (status included), bypassing HTTP; returns it as
    /// stored.
    ///
    /// # Panics
    ///
    /// The object has no `metadata.name`.
    pub fn put_node(&self, node: Value) -> Value {
        self.put(Kind::Node, node)
    }

    /// Creates or replaces a pod whole (status included; namespace `default` when none),
    /// bypassing HTTP; returns it as stored.
    ///
    /// # Panics
    ///
    /// The object has no `metadata.name`.
    pub fn put_pod(&self, pod: Value) -> Value {
        self.put(Kind::Pod, pod)
    }

    /// Creates or replaces any object whole, bypassing HTTP.
    ///
    /// # Panics
    ///
    /// The object has no `metadata.name`.
    pub fn put(&self, kind: Kind, obj: Value) -> Value {
        match self.shared.with_store(|s| s.put(kind, obj)) {
            Ok(stored) => stored,
            Err(failure) => panic!("FakeApiServer::put: {}", failure.message),
        }
    }

    /// The stored object (`ns` is ignored for nodes).
    pub fn get(&self, kind: Kind, ns: &str, name: &str) -> Option<Value> {
        let ns = if kind.namespaced() { ns } else { "" };
        self.shared.lock_store().get(kind, ns, name).cloned()
    }

    /// Deletes an object, bypassing HTTP; watches see DELETED.
    pub fn remove(&self, kind: Kind, ns: &str, name: &str) -> Option<Value> {
        let ns = if kind.namespaced() { ns } else { "" };
        let key = (kind, ns.to_owned(), name.to_owned());
        self.shared.with_store(|s| s.delete(&key).ok())
    }

    /// Every stored object of `kind`, in list order.
    pub fn list(&self, kind: Kind) -> Vec<Value> {
        self.shared
            .lock_store()
            .list(kind, None, &select::Selector::default())
    }

    /// The events created so far (core/v1 and events.k8s.io/v1), oldest first.
    pub fn events(&self) -> Vec<Value> {
        let store = self.shared.lock_store();
        let mut events: Vec<Value> = store
            .objects
            .iter()
            .filter(|((kind, _, _), _)| matches!(kind, Kind::Event | Kind::EventV1))
            .map(|(_, obj)| obj.clone())
            .collect();
        events.sort_by(|a, b| store::meta_str(a, "uid").cmp(&store::meta_str(b, "uid")));
        events
    }

    /// The current (last written) resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.shared.lock_store().rv
    }

    /// Forgets the watch history: a watch from any earlier resourceVersion gets 410 Expired.
    pub fn compact(&self) {
        self.shared.lock_store().compact();
    }

    /// The requests served since the start or the last [`Self::reset_requests`].
    pub fn requests(&self) -> Counts {
        lock(&self.shared.counts).clone()
    }

    /// Zeroes the request counters.
    pub fn reset_requests(&self) {
        *lock(&self.shared.counts) = Counts::default();
    }

    /// Delays every watch event queued from now on by `delay`, its random
    /// parts drawn from a generator seeded with `seed` (zero turns it off).
    pub fn set_watch_delay(&self, delay: WatchDelay, seed: u64) {
        *lock(&self.shared.lag) = Lag::new(delay, seed);
    }

    /// While set, every connection is closed without an answer (new ones at accept, open
    /// ones at their next request) and open watches are cut.
    pub fn set_unreachable(&self, unreachable: bool) {
        self.shared.unreachable.store(unreachable, Ordering::SeqCst);
        self.shared.changed.send_modify(|_| {});
    }
}

impl FakeApiServer {
    /// While set, the server is a blackhole: connections are accepted and
    /// requests read, and none is answered (open watches stop sending);
    /// when it is cleared, each request held is dropped unanswered (and
    /// unapplied) and each open watch cut, as a client that gave up on a
    /// silent connection would find it.
    pub fn set_blackhole(&self, blackhole: bool) {
        self.shared.blackhole.store(blackhole, Ordering::SeqCst);
        self.shared.changed.send_modify(|_| {});
    }
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests;
