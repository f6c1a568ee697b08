//! Unix-socket transport: `bind_fresh`, and gRPC round trips through
//! `incoming` and `channel` on real sockets in a temp dir.

use std::{collections::HashMap, future::Future, sync::Arc, time::Duration};

use tokio::sync::Mutex;
use tokio_stream::{Once, Pending, StreamExt, adapters::Chain};
use tonic::{Request, Response, Status, transport::Server};

use super::*;
use crate::{
    HEALTHY, VERSION,
    v1beta1::{
        AllocateRequest, AllocateResponse, ContainerAllocateRequest, ContainerAllocateResponse,
        Device, DevicePluginOptions, Empty, ListAndWatchResponse, NumaNode,
        PreStartContainerRequest, PreStartContainerResponse, PreferredAllocationRequest,
        PreferredAllocationResponse, RegisterRequest, TopologyInfo,
        device_plugin_client::DevicePluginClient,
        device_plugin_server::{DevicePlugin, DevicePluginServer},
        registration_client::RegistrationClient,
        registration_server::{Registration, RegistrationServer},
    },
};

/// Runs `test` under a deadline, so a hung socket fails instead of blocking.
async fn within<T>(test: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), test)
        .await
        .expect("test timed out")
}

fn options() -> DevicePluginOptions {
    DevicePluginOptions {
        pre_start_required: false,
        get_preferred_allocation_available: true,
    }
}

fn devices() -> Vec<Device> {
    vec![
        Device {
            id: "0000:03:00.0#0".into(),
            health: HEALTHY.into(),
            topology: Some(TopologyInfo {
                nodes: vec![NumaNode { id: 1 }],
            }),
        },
        Device {
            id: "0000:83:00.0#0".into(),
            health: crate::UNHEALTHY.into(),
            topology: None,
        },
    ]
}

/// Test-only plugin: fixed options and devices; Allocate echoes the IDs.
struct FakePlugin;

#[tonic::async_trait]
impl DevicePlugin for FakePlugin {
    /// The first list, then silence: the stream never ends, as kubelet expects.
    type ListAndWatchStream = Chain<
        Once<Result<ListAndWatchResponse, Status>>,
        Pending<Result<ListAndWatchResponse, Status>>,
    >;

    async fn get_device_plugin_options(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(options()))
    }

    async fn list_and_watch(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let first = ListAndWatchResponse { devices: devices() };
        Ok(Response::new(
            tokio_stream::once(Ok(first)).chain(tokio_stream::pending()),
        ))
    }

    async fn get_preferred_allocation(
        &self,
        _: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        Ok(Response::new(PreferredAllocationResponse::default()))
    }

    async fn allocate(
        &self,
        request: Request<AllocateRequest>,
    ) -> Result<Response<AllocateResponse>, Status> {
        let container_responses = request
            .into_inner()
            .container_requests
            .into_iter()
            .map(|req| ContainerAllocateResponse {
                envs: HashMap::from([("AMD_VISIBLE_DEVICES".into(), req.devices_ids.join(","))]),
                ..ContainerAllocateResponse::default()
            })
            .collect();
        Ok(Response::new(AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        _: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        Err(Status::unimplemented("pre_start_required is false"))
    }
}

/// Test-only kubelet registration server. Like kubelet >= 1.25 it dials the
/// plugin back and asks for its options before answering Register.
struct FakeKubelet {
    dir: PathBuf,
    seen: Mutex<Vec<(RegisterRequest, DevicePluginOptions)>>,
}

#[tonic::async_trait]
impl Registration for FakeKubelet {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let request = request.into_inner();
        let plugin = channel(&self.dir.join(&request.endpoint))
            .await
            .map_err(|e| Status::unknown(format!("failed to dial device plugin: {e}")))?;
        let options = DevicePluginClient::new(plugin)
            .get_device_plugin_options(Empty {})
            .await?
            .into_inner();
        self.seen.lock().await.push((request, options));
        Ok(Response::new(Empty {}))
    }
}

/// Serves the fake plugin at `path` on its own task.
fn serve_plugin(path: &Path) -> tokio::task::JoinHandle<Result<(), tonic::transport::Error>> {
    let listener = bind_fresh(path).expect("bind plugin socket");
    tokio::spawn(
        Server::builder()
            .add_service(DevicePluginServer::new(FakePlugin))
            .serve_with_incoming(incoming(listener)),
    )
}

#[tokio::test]
async fn device_plugin_round_trip() {
    within(async {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("amd.com_gpu.sock");
        let server = serve_plugin(&path);

        let mut client = DevicePluginClient::new(channel(&path).await.expect("dial plugin"));
        let got = client
            .get_device_plugin_options(Empty {})
            .await
            .expect("options");
        assert_eq!(got.into_inner(), options());

        let mut stream = client
            .list_and_watch(Empty {})
            .await
            .expect("ListAndWatch")
            .into_inner();
        let first = stream
            .next()
            .await
            .expect("a first message")
            .expect("not an error");
        assert_eq!(first.devices, devices());

        let request = AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: vec!["a#0".into(), "b#1".into()],
            }],
        };
        let response = client
            .allocate(request)
            .await
            .expect("Allocate")
            .into_inner();
        assert_eq!(response.container_responses.len(), 1);
        assert_eq!(
            response.container_responses[0].envs["AMD_VISIBLE_DEVICES"],
            "a#0,b#1"
        );

        let status = client
            .pre_start_container(PreStartContainerRequest::default())
            .await
            .expect_err("fake refuses PreStartContainer");
        assert_eq!(status.code(), tonic::Code::Unimplemented);
        server.abort();
    })
    .await;
}

#[tokio::test]
async fn registration_round_trip_with_dial_back() {
    within(async {
        let dir = tempfile::tempdir().expect("tempdir");
        let plugin = serve_plugin(&dir.path().join("amd.sock"));
        let kubelet = Arc::new(FakeKubelet {
            dir: dir.path().to_owned(),
            seen: Mutex::default(),
        });
        let kubelet_path = dir.path().join(crate::KUBELET_SOCKET);
        let listener = bind_fresh(&kubelet_path).expect("bind kubelet.sock");
        let server = tokio::spawn(
            Server::builder()
                .add_service(RegistrationServer::from_arc(Arc::clone(&kubelet)))
                .serve_with_incoming(incoming(listener)),
        );

        let mut client = RegistrationClient::new(channel(&kubelet_path).await.expect("dial"));
        let request = RegisterRequest {
            version: VERSION.into(),
            endpoint: "amd.sock".into(),
            resource_name: "amd.com/gpu".into(),
            options: Some(options()),
        };
        client.register(request.clone()).await.expect("Register");
        assert_eq!(*kubelet.seen.lock().await, [(request.clone(), options())]);

        // An endpoint nobody serves: the dial-back fails and so does Register.
        let wrong = RegisterRequest {
            endpoint: "missing.sock".into(),
            ..request
        };
        let status = client
            .register(wrong)
            .await
            .expect_err("dial-back must fail");
        assert_eq!(status.code(), tonic::Code::Unknown);
        assert!(status.message().contains("failed to dial"), "{status:?}");
        assert_eq!(kubelet.seen.lock().await.len(), 1);
        server.abort();
        plugin.abort();
    })
    .await;
}

#[tokio::test]
async fn channel_to_a_missing_socket_fails() {
    within(async {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(channel(&dir.path().join("nobody.sock")).await.is_err());
    })
    .await;
}

#[tokio::test]
async fn bind_fresh_replaces_a_stale_socket() {
    within(async {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("stale.sock");
        // A socket file left behind by a listener that is gone.
        drop(std::os::unix::net::UnixListener::bind(&path).expect("std bind"));
        assert!(
            fs::symlink_metadata(&path)
                .expect("stale file")
                .file_type()
                .is_socket()
        );
        assert!(
            UnixListener::bind(&path).is_err(),
            "plain bind fails on the stale file"
        );

        let listener = bind_fresh(&path).expect("bind_fresh over a stale socket");
        let (connected, accepted) = tokio::join!(UnixStream::connect(&path), listener.accept());
        connected.expect("connect");
        accepted.expect("accept");
    })
    .await;
}

/// Kubelet's start-up cleanup can unlink the stale socket after
/// `bind_fresh` saw it and before it unlinks it: the socket is gone, which
/// is what the unlink was for. Before, that was "removing stale socket
/// ...: No such file or directory" and the plugin's kubelet loop ended.
#[test]
fn a_stale_socket_someone_else_removed_first_is_fine() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&path).expect("std bind"));
    fs::remove_file(&path).expect("kubelet's cleanup");
    remove_stale_socket(&path).expect("already gone is fine");
    let in_a_missing_dir = dir.path().join("gone").join("stale.sock");
    remove_stale_socket(&in_a_missing_dir).expect("so is a directory that is gone");
}

#[tokio::test]
async fn bind_fresh_refuses_a_regular_file_and_a_directory() {
    within(async {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("config.yaml");
        fs::write(&file, "keep me").expect("write");
        let err = bind_fresh(&file).expect_err("must not replace a regular file");
        assert_eq!(err.kind(), io::ErrorKind::AlreadyExists);
        let msg = err.to_string();
        assert!(
            msg.contains(&file.display().to_string()) && msg.contains("regular file"),
            "{msg}"
        );
        assert_eq!(fs::read_to_string(&file).expect("still there"), "keep me");

        let sub = dir.path().join("sub");
        fs::create_dir(&sub).expect("mkdir");
        let err = bind_fresh(&sub).expect_err("must not replace a directory");
        assert!(err.to_string().contains("directory"), "{err}");
        assert!(sub.is_dir());
    })
    .await;
}

/// A path of exactly `len` bytes inside `dir`.
fn path_of_len(dir: &Path, len: usize) -> PathBuf {
    let base = dir.as_os_str().len() + 1;
    assert!(len > base, "temp dir path too long for the test");
    dir.join("s".repeat(len - base))
}

#[tokio::test]
async fn bind_fresh_checks_the_sun_path_limit() {
    within(async {
        let dir = tempfile::tempdir().expect("tempdir");
        let long = path_of_len(dir.path(), 200);
        let err = bind_fresh(&long).expect_err("200 bytes cannot fit sun_path");
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        let msg = err.to_string();
        assert!(
            msg.contains(&long.display().to_string()) && msg.contains("200 bytes"),
            "{msg}"
        );

        // The boundary: 107 bytes plus the NUL fit, 108 do not.
        let err = bind_fresh(&path_of_len(dir.path(), SUN_PATH_LEN)).expect_err("108 bytes");
        assert!(
            err.to_string().contains("is 108 bytes"),
            "our check, not bind's: {err}"
        );
        bind_fresh(&path_of_len(dir.path(), SUN_PATH_LEN - 1)).expect("107 bytes fit");
    })
    .await;
}
