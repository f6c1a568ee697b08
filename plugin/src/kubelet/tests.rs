use std::{
    io,
    sync::{Arc, Mutex},
};

use proto::v1beta1::{
    Empty, RegisterRequest,
    registration_server::{Registration, RegistrationServer},
};
use tokio::{sync::mpsc, task::JoinHandle};
use tonic::{Request, Response, Status};

use super::*;
use crate::metrics::Metrics;

/// Bound on each async test below.
const LIMIT: Duration = Duration::from_secs(30);
/// What the kubelet loop logs before each new bind attempt.
const RETRYING: &str = "binding again in";
const ENDPOINT: &str = "amd.com_gpu.sock";

#[test]
fn a_socket_gone_before_we_looked_is_not_ours() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("amd.com_gpu.sock");
    assert!(!still_ours(&path, identity(&path)));
}

#[test]
fn a_deleted_socket_is_not_ours() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("amd.com_gpu.sock");
    let first = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let ours = identity(&path);
    assert!(still_ours(&path, ours));
    drop(first);
    std::fs::remove_file(&path).unwrap();
    assert!(!still_ours(&path, ours));
}

/// After a kubelet restart a directory sits where the plugin binds: the
/// bind fails, and once the directory is gone the plugin binds and
/// registers again instead of exiting.
#[tokio::test]
async fn a_bind_that_fails_after_a_kubelet_restart_is_tried_again() {
    let log = Log::default();
    let _logging = log.install();
    let rebind = Rebind {
        attempts: 100,
        pause: Duration::from_millis(20),
    };
    tokio::time::timeout(LIMIT, async {
        let dir = tempfile::tempdir().unwrap();
        let mut kubelet = Kubelet::start(dir.path());
        let mut plugin = Plugin::start(dir.path(), rebind);
        kubelet.registered().await;
        kubelet.restart_with_obstacle();
        tokio::select! {
            () = log.wait_for(RETRYING) => {}
            ended = &mut plugin.task => panic!("the loop ended on the failed bind: {ended:?}"),
        }
        std::fs::remove_dir(kubelet.plugin_socket()).unwrap();
        let again = kubelet.registered().await;
        assert_eq!(again.endpoint, ENDPOINT);
        assert!(!plugin.task.is_finished(), "the kubelet loop kept running");
        plugin.stop().await.expect("a clean stop");
    })
    .await
    .expect("within the limit");
}

/// The same obstacle left in place: the loop gives up with the bind error
/// after the attempts, and leaves the directory alone.
#[tokio::test]
async fn a_bind_that_keeps_failing_after_a_restart_ends_the_loop() {
    let log = Log::default();
    let _logging = log.install();
    let rebind = Rebind {
        attempts: 3,
        pause: Duration::from_millis(20),
    };
    tokio::time::timeout(LIMIT, async {
        let dir = tempfile::tempdir().unwrap();
        let mut kubelet = Kubelet::start(dir.path());
        let plugin = Plugin::start(dir.path(), rebind);
        kubelet.registered().await;
        kubelet.restart_with_obstacle();
        let ended = plugin.task.await.expect("the loop did not panic");
        assert_is_the_obstacle(ended);
        assert_eq!(log.count(RETRYING), 3, "one warning per attempt");
        assert!(kubelet.plugin_socket().is_dir(), "the directory stays");
    })
    .await
    .expect("within the limit");
}

/// The first bind's failure is the setup's: no attempt again.
#[tokio::test]
async fn the_first_bind_failing_ends_the_loop_at_once() {
    let log = Log::default();
    let _logging = log.install();
    tokio::time::timeout(LIMIT, async {
        let dir = tempfile::tempdir().unwrap();
        let kubelet = Kubelet::start(dir.path());
        std::fs::create_dir(kubelet.plugin_socket()).unwrap();
        let plugin = Plugin::start(dir.path(), Rebind::default());
        let ended = plugin.task.await.expect("the loop did not panic");
        assert_is_the_obstacle(ended);
        assert_eq!(log.count(RETRYING), 0, "the first bind is not tried again");
    })
    .await
    .expect("within the limit");
}

fn assert_is_the_obstacle(ended: Result<(), KubeletError>) {
    let Err(KubeletError::Bind { source, .. }) = ended else {
        panic!("not a bind error: {ended:?}");
    };
    assert_eq!(source.kind(), io::ErrorKind::AlreadyExists, "{source}");
    assert!(source.to_string().contains("it is a directory"), "{source}");
}

/// A kubelet that accepts every registration and reports it; it does not
/// dial back (the loop needs only Register's answer).
struct Kubelet {
    dir: PathBuf,
    server: JoinHandle<()>,
    tx: mpsc::UnboundedSender<RegisterRequest>,
    rx: mpsc::UnboundedReceiver<RegisterRequest>,
}

impl Kubelet {
    fn start(dir: &Path) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let server = serve(&dir.join("kubelet.sock"), tx.clone());
        Self {
            dir: dir.to_owned(),
            server,
            tx,
            rx,
        }
    }

    fn plugin_socket(&self) -> PathBuf {
        self.dir.join(ENDPOINT)
    }

    /// The next registration.
    async fn registered(&mut self) -> RegisterRequest {
        self.rx.recv().await.expect("the kubelet serves")
    }

    /// A kubelet restart (its server goes, every socket in the directory
    /// is deleted, kubelet.sock is served anew: docs/kubelet-api.md §2.4), with
    /// a directory left where the plugin's socket was. No await in here:
    /// on this single-threaded runtime the loop sees none of it half done.
    fn restart_with_obstacle(&mut self) {
        self.server.abort();
        let kubelet_socket = self.dir.join("kubelet.sock");
        std::fs::remove_file(&kubelet_socket).unwrap();
        std::fs::remove_file(self.plugin_socket()).unwrap();
        std::fs::create_dir(self.plugin_socket()).unwrap();
        self.server = serve(&kubelet_socket, self.tx.clone());
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.server.abort();
    }
}

fn serve(socket: &Path, tx: mpsc::UnboundedSender<RegisterRequest>) -> JoinHandle<()> {
    let listener = proto::unix::bind_fresh(socket).unwrap();
    tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(Registrations(tx)))
            .serve_with_incoming(proto::unix::incoming(listener))
            .await;
    })
}

struct Registrations(mpsc::UnboundedSender<RegisterRequest>);

#[tonic::async_trait]
impl Registration for Registrations {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let _ = self.0.send(request.into_inner());
        Ok(Response::new(Empty {}))
    }
}

/// The kubelet loop, run until `stop`.
struct Plugin {
    task: JoinHandle<Result<(), KubeletError>>,
    stop: oneshot::Sender<()>,
}

impl Plugin {
    fn start(dir: &Path, rebind: Rebind) -> Self {
        let config = KubeletConfig {
            kubelet_socket: dir.join("kubelet.sock"),
            socket: dir.join(ENDPOINT),
            resource_name: "amd.com/gpu".into(),
            policy: Policy::default(),
            allocator: None,
            hint: None,
            vram: None,
            loader: None,
            metrics: Arc::new(Metrics::new()),
            rebind,
        };
        let (devices_tx, devices) = watch::channel(DeviceTable::default());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let _devices_tx = devices_tx;
            run(config, devices, async {
                let _ = stopped.await;
            })
            .await
        });
        Self { task, stop }
    }

    async fn stop(self) -> Result<(), KubeletError> {
        let _ = self.stop.send(());
        self.task.await.expect("the loop did not panic")
    }
}

/// What the loop logs, for the tests to wait on: a subscriber for this
/// thread, which runs every task of a current-thread runtime.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl Log {
    fn install(&self) -> tracing::subscriber::DefaultGuard {
        let log = self.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || log.clone())
            .finish();
        tracing::subscriber::set_default(subscriber)
    }

    fn count(&self, needle: &str) -> usize {
        let text = self.0.lock().unwrap();
        String::from_utf8_lossy(&text).matches(needle).count()
    }

    async fn wait_for(&self, needle: &str) {
        while self.count(needle) == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl io::Write for Log {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
