use std::{
    fs,
    future::Future,
    os::unix::fs::FileTypeExt,
    path::Path,
    sync::{Arc, Mutex},
    time::Duration,
};

use proto::v1beta1::{
    AllocateRequest, AllocateResponse, ContainerAllocateResponse,
    ContainerPreferredAllocationResponse, Device, DevicePluginOptions, Empty, ListAndWatchResponse,
    PreStartContainerRequest, PreStartContainerResponse, PreferredAllocationRequest,
    PreferredAllocationResponse, RegisterRequest,
    device_plugin_server::{DevicePlugin, DevicePluginServer},
    registration_client::RegistrationClient,
};
use tokio::{net::UnixListener, sync::mpsc, task::JoinHandle};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Request, Response, Status};

use super::{CHECKPOINT_FILE, FakeKubelet, KUBELET_SOCKET, register::is_extended_resource_name};

const TEST_TIMEOUT: Duration = Duration::from_secs(30);
const WAIT: Duration = Duration::from_secs(5);
/// Dial deadline for tests where the dial is meant to fail.
const SHORT_DIAL: Duration = Duration::from_millis(1500);
const ENDPOINT: &str = "test.sock";
const RESOURCE: &str = "example.com/gpu";

type ListSender = mpsc::Sender<Result<ListAndWatchResponse, Status>>;

/// A minimal device plugin: two devices, one healthy, one not; it records what kubelet
/// asks and keeps every ListAndWatch sender so the streams stay open.
#[derive(Clone, Default)]
struct TestPlugin {
    options: DevicePluginOptions,
    streams: Arc<Mutex<Vec<ListSender>>>,
    pre_started: Arc<Mutex<Vec<Vec<String>>>>,
}

fn two_devices() -> Vec<Device> {
    vec![
        Device {
            id: "gpu-0".into(),
            health: proto::HEALTHY.into(),
            topology: None,
        },
        Device {
            id: "gpu-1".into(),
            health: proto::UNHEALTHY.into(),
            topology: None,
        },
    ]
}

impl TestPlugin {
    fn new(preferred: bool, pre_start: bool) -> Self {
        let options = DevicePluginOptions {
            pre_start_required: pre_start,
            get_preferred_allocation_available: preferred,
        };
        Self {
            options,
            ..Self::default()
        }
    }

    fn last_stream(&self) -> ListSender {
        self.streams
            .lock()
            .unwrap()
            .last()
            .cloned()
            .expect("no ListAndWatch stream was opened")
    }

    fn request(&self) -> RegisterRequest {
        RegisterRequest {
            version: proto::VERSION.into(),
            endpoint: ENDPOINT.into(),
            resource_name: RESOURCE.into(),
            options: Some(self.options),
        }
    }
}

#[tonic::async_trait]
impl DevicePlugin for TestPlugin {
    type ListAndWatchStream = ReceiverStream<Result<ListAndWatchResponse, Status>>;

    async fn get_device_plugin_options(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(self.options))
    }

    async fn list_and_watch(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let (tx, rx) = mpsc::channel(4);
        tx.send(Ok(ListAndWatchResponse {
            devices: two_devices(),
        }))
        .await
        .map_err(|_| Status::internal("receiver gone"))?;
        self.streams.lock().unwrap().push(tx);
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        let container_responses = request
            .into_inner()
            .container_requests
            .into_iter()
            .map(|c| {
                let size = usize::try_from(c.allocation_size).unwrap_or(0);
                let mut ids = c.must_include_device_i_ds;
                let rest: Vec<_> = c
                    .available_device_i_ds
                    .into_iter()
                    .filter(|id| !ids.contains(id))
                    .collect();
                ids.extend(rest);
                ids.truncate(size);
                ContainerPreferredAllocationResponse { device_i_ds: ids }
            })
            .collect();
        Ok(Response::new(PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        request: Request<AllocateRequest>,
    ) -> Result<Response<AllocateResponse>, Status> {
        let container_responses = request
            .into_inner()
            .container_requests
            .into_iter()
            .map(|c| ContainerAllocateResponse {
                envs: [("TEST_DEVICES".to_owned(), c.devices_ids.join(","))].into(),
                ..ContainerAllocateResponse::default()
            })
            .collect();
        Ok(Response::new(AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        request: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        self.pre_started
            .lock()
            .unwrap()
            .push(request.into_inner().devices_ids);
        Ok(Response::new(PreStartContainerResponse {}))
    }
}

/// Runs a test body under [`TEST_TIMEOUT`].
async fn within(body: impl Future<Output = ()>) {
    tokio::time::timeout(TEST_TIMEOUT, body)
        .await
        .expect("test timed out");
}

fn bind_plugin(dir: &Path) -> UnixListener {
    proto::unix::bind_fresh(&dir.join(ENDPOINT)).expect("bind the plugin socket")
}

fn serve(listener: UnixListener, plugin: &TestPlugin) -> JoinHandle<()> {
    let service = DevicePluginServer::new(plugin.clone());
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(proto::unix::incoming(listener))
            .await
            .expect("serve the test plugin");
    })
}

/// Serves `plugin` on `<dir>/test.sock` (on its own task) and registers it.
async fn serve_and_register(kubelet: &FakeKubelet, plugin: &TestPlugin) -> JoinHandle<()> {
    let server = serve(bind_plugin(kubelet.dir()), plugin);
    register(kubelet, plugin.request()).await.expect("register");
    server
}

/// One `Register` call over a fresh connection to kubelet.sock.
async fn register(kubelet: &FakeKubelet, request: RegisterRequest) -> Result<(), Status> {
    let channel = proto::unix::channel(&kubelet.socket())
        .await
        .map_err(|e| Status::unavailable(format!("connect to kubelet.sock: {e}")))?;
    RegistrationClient::new(channel)
        .register(request)
        .await
        .map(|_| ())
}

fn is_socket(path: &Path) -> bool {
    fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket())
}

#[tokio::test]
async fn registration_is_recorded_and_devices_received() {
    within(async {
        let kubelet = FakeKubelet::start().await.unwrap();
        let plugin = TestPlugin::new(false, false);
        let _server = serve_and_register(&kubelet, &plugin).await;

        let registered = kubelet.wait_registrations(1, WAIT).await.unwrap();
        assert_eq!(registered, plugin.request());
        assert_eq!(kubelet.registrations(), vec![plugin.request()]);

        let devices = kubelet.wait_devices(WAIT, |d| !d.is_empty()).await.unwrap();
        assert_eq!(devices, two_devices());
        kubelet.wait_stream(true, WAIT).await.unwrap();
        assert_eq!(kubelet.list_and_watch_updates(), 1);

        // Every message replaces the whole list.
        let healthy_only = vec![two_devices().remove(0)];
        plugin
            .last_stream()
            .send(Ok(ListAndWatchResponse {
                devices: healthy_only.clone(),
            }))
            .await
            .unwrap();
        let devices = kubelet.wait_devices(WAIT, |d| d.len() == 1).await.unwrap();
        assert_eq!(devices, healthy_only);
        assert_eq!(kubelet.devices(), healthy_only);
        assert_eq!(kubelet.list_and_watch_updates(), 2);
        assert_eq!(kubelet.device_history(), vec![two_devices(), healthy_only]);

        // A stream the plugin ends is seen closed, and nothing reopens it.
        plugin.streams.lock().unwrap().clear();
        kubelet.wait_stream(false, WAIT).await.unwrap();
        assert!(!kubelet.stream_open());
        assert!(kubelet.stream_end().unwrap().contains("ended"));
        kubelet.stop().await;
    })
    .await;
}

#[tokio::test]
async fn calls_the_plugin_as_kubelet_does() {
    within(async {
        let kubelet = FakeKubelet::start().await.unwrap();
        let plugin = TestPlugin::new(true, true);
        let _server = serve_and_register(&kubelet, &plugin).await;
        kubelet.wait_registrations(1, WAIT).await.unwrap();

        assert_eq!(kubelet.options().await.unwrap(), plugin.options);
        let ids = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let preferred = kubelet
            .preferred_allocation(ids(&["gpu-0", "gpu-1"]), ids(&["gpu-1"]), 1)
            .await
            .unwrap();
        assert_eq!(preferred, ids(&["gpu-1"]));
        let allocated = kubelet.allocate(ids(&["gpu-0"])).await.unwrap();
        assert_eq!(
            allocated.envs.get("TEST_DEVICES").map(String::as_str),
            Some("gpu-0")
        );
        kubelet.pre_start(ids(&["gpu-0"])).await.unwrap();
        assert_eq!(*plugin.pre_started.lock().unwrap(), vec![ids(&["gpu-0"])]);
        kubelet.stop().await;
    })
    .await;
}

#[tokio::test]
async fn calls_kubelet_would_skip_are_refused() {
    within(async {
        let kubelet = FakeKubelet::start().await.unwrap();
        assert_eq!(
            kubelet.allocate(vec![]).await.unwrap_err().code(),
            Code::FailedPrecondition
        );
        let plugin = TestPlugin::new(false, false);
        let _server = serve_and_register(&kubelet, &plugin).await;
        kubelet.wait_registrations(1, WAIT).await.unwrap();

        let err = kubelet
            .preferred_allocation(vec![], vec![], 1)
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition);
        assert!(
            err.message().contains("get_preferred_allocation_available"),
            "{err}"
        );
        let err = kubelet.pre_start(vec![]).await.unwrap_err();
        assert!(err.message().contains("pre_start_required"), "{err}");
        assert!(plugin.pre_started.lock().unwrap().is_empty());
        kubelet.stop().await;
    })
    .await;
}

#[tokio::test]
async fn bad_version_and_resource_names_are_refused_by_name() {
    within(async {
        let kubelet = FakeKubelet::start().await.unwrap();
        let plugin = TestPlugin::new(false, false);
        let _server = serve(bind_plugin(kubelet.dir()), &plugin);

        let wrong_version = RegisterRequest {
            version: "v1alpha1".into(),
            ..plugin.request()
        };
        let err = register(&kubelet, wrong_version).await.unwrap_err();
        assert_eq!(err.code(), Code::Unknown);
        assert!(
            err.message().contains("\"v1alpha1\" is not supported"),
            "{err}"
        );

        for name in [
            "gpu",
            "kubernetes.io/gpu",
            "requests.example.com/gpu",
            "Example.com/gpu",
        ] {
            let request = RegisterRequest {
                resource_name: name.into(),
                ..plugin.request()
            };
            let err = register(&kubelet, request).await.unwrap_err();
            assert_eq!(err.code(), Code::Unknown);
            assert!(
                err.message()
                    .contains(&format!("ResourceName {name:?} is invalid")),
                "{err}"
            );
        }
        assert!(kubelet.registrations().is_empty());
        assert_eq!(kubelet.register_attempts().len(), 5);
        assert_eq!(kubelet.rejections().len(), 5);
        assert!(
            plugin.streams.lock().unwrap().is_empty(),
            "kubelet never dialled back"
        );
        kubelet.stop().await;
    })
    .await;
}

#[tokio::test]
async fn an_endpoint_given_as_a_full_path_is_not_found() {
    within(async {
        let kubelet = FakeKubelet::start().await.unwrap();
        kubelet.set_dial_timeout(SHORT_DIAL);
        let plugin = TestPlugin::new(false, false);
        let _server = serve(bind_plugin(kubelet.dir()), &plugin);
        let full_path = kubelet.dir().join(ENDPOINT).display().to_string();
        let request = RegisterRequest {
            endpoint: full_path,
            ..plugin.request()
        };
        let err = register(&kubelet, request).await.unwrap_err();
        assert!(
            err.message().starts_with("failed to dial device plugin"),
            "{err}"
        );
        assert!(kubelet.registrations().is_empty());
    })
    .await;
}

#[tokio::test]
async fn registering_before_serving_fails_the_dial_back() {
    within(async {
        let kubelet = FakeKubelet::start().await.unwrap();
        kubelet.set_dial_timeout(SHORT_DIAL);
        let plugin = TestPlugin::new(false, false);

        // Nothing at the endpoint yet.
        let err = register(&kubelet, plugin.request()).await.unwrap_err();
        assert_eq!(err.code(), Code::Unknown);
        assert!(
            err.message().starts_with("failed to dial device plugin"),
            "{err}"
        );

        // Bound but not served: the socket accepts, yet no HTTP/2 server answers.
        let listener = bind_plugin(kubelet.dir());
        let err = register(&kubelet, plugin.request()).await.unwrap_err();
        assert!(
            err.message().starts_with("failed to dial device plugin"),
            "{err}"
        );
        assert!(err.message().contains("deadline exceeded"), "{err}");
        assert!(kubelet.registrations().is_empty());

        // The same socket, served first, registers.
        let _server = serve(listener, &plugin);
        register(&kubelet, plugin.request()).await.unwrap();
        kubelet.wait_registrations(1, WAIT).await.unwrap();
        kubelet.stop().await;
    })
    .await;
}

#[tokio::test]
async fn the_dial_back_retries_until_its_deadline() {
    within(async {
        let kubelet = FakeKubelet::start().await.unwrap();
        let plugin = TestPlugin::new(false, false);
        let request = plugin.request();
        let socket = kubelet.socket();
        // Register while nothing serves, then start serving on another task: grpc-go's
        // blocking dial retries after 1 s and finds the plugin.
        let registering = tokio::spawn(async move {
            let channel = proto::unix::channel(&socket).await.unwrap();
            RegistrationClient::new(channel)
                .register(request)
                .await
                .map(|_| ())
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        let _server = serve(bind_plugin(kubelet.dir()), &plugin);
        registering.await.unwrap().unwrap();
        kubelet.wait_devices(WAIT, |d| d.len() == 2).await.unwrap();
        kubelet.stop().await;
    })
    .await;
}

#[tokio::test]
async fn restart_cleans_sockets_only_and_drops_the_stream() {
    within(async {
        let mut kubelet = FakeKubelet::start().await.unwrap();
        let dir = kubelet.dir().to_path_buf();
        fs::write(dir.join("notes.txt"), "keep").unwrap();
        fs::write(dir.join(CHECKPOINT_FILE), "{}").unwrap();
        fs::create_dir(dir.join("sub")).unwrap();
        let _stray = std::os::unix::net::UnixListener::bind(dir.join("stray.sock")).unwrap();
        let plugin = TestPlugin::new(false, false);
        let _server = serve_and_register(&kubelet, &plugin).await;
        kubelet.wait_devices(WAIT, |d| d.len() == 2).await.unwrap();
        kubelet.wait_stream(true, WAIT).await.unwrap();
        let stream = plugin.last_stream();

        kubelet.restart().await.unwrap();

        assert!(!dir.join(ENDPOINT).exists(), "the plugin socket is deleted");
        assert!(!dir.join("stray.sock").exists(), "every socket is deleted");
        assert!(dir.join("notes.txt").is_file());
        assert!(dir.join(CHECKPOINT_FILE).is_file());
        assert!(dir.join("sub").is_dir());
        assert!(is_socket(&dir.join(KUBELET_SOCKET)));
        assert!(!kubelet.stream_open());
        assert!(kubelet.devices().is_empty());
        tokio::time::timeout(WAIT, stream.closed())
            .await
            .expect("the plugin sees its stream closed");

        // The plugin re-binds a fresh socket and registers with the new kubelet.
        let _server = serve_and_register(&kubelet, &plugin).await;
        let again = kubelet.wait_registrations(2, WAIT).await.unwrap();
        assert_eq!(again, plugin.request());
        kubelet.wait_devices(WAIT, |d| d.len() == 2).await.unwrap();
        assert_eq!(kubelet.list_and_watch_updates(), 2);
        kubelet.stop().await;
    })
    .await;
}

#[tokio::test]
async fn a_socket_bound_during_the_downtime_is_deleted_by_the_new_kubelet() {
    within(async {
        let mut kubelet = FakeKubelet::start().await.unwrap();
        kubelet.set_dial_timeout(SHORT_DIAL);
        let plugin = TestPlugin::new(false, false);
        let _server = serve_and_register(&kubelet, &plugin).await;
        kubelet.wait_stream(true, WAIT).await.unwrap();
        let stream = plugin.last_stream();
        let socket = kubelet.socket();
        let dir = kubelet.dir().to_path_buf();

        // The plugin re-binds as soon as its stream closes, before the new kubelet is up.
        let early = tokio::spawn(async move {
            stream.closed().await;
            let plugin = TestPlugin::new(false, false);
            let server = serve(bind_plugin(&dir), &plugin);
            // Well inside the downtime, after the old server has let go of its listener.
            tokio::time::sleep(Duration::from_millis(100)).await;
            let refused = proto::unix::channel(&socket).await.is_err();
            (server, refused)
        });
        kubelet
            .restart_after(Duration::from_millis(300))
            .await
            .unwrap();
        let (_early_server, refused) = early.await.unwrap();
        assert!(refused, "the dead kubelet's socket refuses connections");
        assert!(
            !kubelet.dir().join(ENDPOINT).exists(),
            "the early socket is deleted"
        );
        let err = register(&kubelet, plugin.request()).await.unwrap_err();
        assert!(
            err.message().starts_with("failed to dial device plugin"),
            "{err}"
        );
        kubelet.stop().await;
    })
    .await;
}

#[tokio::test]
async fn fail_next_registrations_fails_that_many_with_unavailable() {
    within(async {
        let kubelet = FakeKubelet::start().await.unwrap();
        let plugin = TestPlugin::new(false, false);
        let _server = serve(bind_plugin(kubelet.dir()), &plugin);
        kubelet.fail_next_registrations(2);
        for _ in 0..2 {
            let err = register(&kubelet, plugin.request()).await.unwrap_err();
            assert_eq!(err.code(), Code::Unavailable, "{err}");
        }
        assert!(kubelet.registrations().is_empty());
        register(&kubelet, plugin.request()).await.unwrap();
        assert_eq!(kubelet.registrations().len(), 1);
        assert_eq!(kubelet.register_attempts().len(), 3);
        kubelet.stop().await;
    })
    .await;
}

#[tokio::test]
async fn waits_say_what_they_waited_for() {
    within(async {
        let kubelet = FakeKubelet::start().await.unwrap();
        let short = Duration::from_millis(50);
        let err = kubelet.wait_registrations(1, short).await.unwrap_err();
        assert!(err.contains("waiting for 1 accepted registration"), "{err}");
        let err = kubelet.wait_devices(short, |_| true).await.unwrap_err();
        assert!(err.contains("device list"), "{err}");
        let err = kubelet.wait_stream(true, short).await.unwrap_err();
        assert!(err.contains("ListAndWatch stream to open"), "{err}");
        kubelet.stop().await;
    })
    .await;
}

#[tokio::test]
async fn start_in_keeps_the_given_directory() {
    within(async {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("device-plugins");
        let kubelet = FakeKubelet::start_in(&dir).await.unwrap();
        assert_eq!(kubelet.dir(), dir);
        assert!(is_socket(&dir.join(KUBELET_SOCKET)));
        kubelet.stop().await;
        assert!(dir.is_dir(), "a given directory is not removed");
    })
    .await;
}

#[test]
fn extended_resource_names() {
    for ok in [
        "amd.com/gpu",
        "example.com/gpu-memory",
        "hami.io/vgpu_cores",
        "a/b",
    ] {
        assert!(is_extended_resource_name(ok), "{ok}");
    }
    let long = format!("example.com/{}", "x".repeat(64));
    for bad in [
        "gpu",
        "kubernetes.io/gpu",
        "foo.kubernetes.io/gpu",
        "requests.example.com/gpu",
        "Example.com/gpu",
        "example.com/-gpu",
        "example.com/gpu/0",
        "example.com/",
        "/gpu",
        long.as_str(),
    ] {
        assert!(!is_extended_resource_name(bad), "{bad}");
    }
}
