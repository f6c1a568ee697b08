//! A device plugin that only records when kubelet calls it: two devices of
//! `example.com/probe`, GetPreferredAllocation offered, PreStartContainer
//! required. Registered with a real kubelet next to the plugin under test,
//! it shows kubelet's own order of calls (issue 22 needs to know whether
//! Allocate comes before the image pull).

use std::{
    path::Path,
    sync::{Arc, Mutex, PoisonError},
    time::{SystemTime, UNIX_EPOCH},
};

use proto::v1beta1::{
    AllocateRequest, AllocateResponse, ContainerAllocateResponse,
    ContainerPreferredAllocationResponse, Device, DevicePluginOptions, Empty, ListAndWatchResponse,
    PreStartContainerRequest, PreStartContainerResponse, PreferredAllocationRequest,
    PreferredAllocationResponse, RegisterRequest,
    device_plugin_server::{DevicePlugin, DevicePluginServer},
    registration_client::RegistrationClient,
};
use tokio::{sync::mpsc, task::JoinHandle};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

/// The probe's resource.
pub const PROBE_RESOURCE: &str = "example.com/probe";
const ENDPOINT: &str = "probe.sock";

type ListSender = mpsc::Sender<Result<ListAndWatchResponse, Status>>;

/// The probe; clones share its record.
#[derive(Clone, Default)]
pub struct CallProbe {
    /// (call, Unix nanoseconds), in order.
    calls: Arc<Mutex<Vec<(String, u64)>>>,
    streams: Arc<Mutex<Vec<ListSender>>>,
}

fn now_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

impl CallProbe {
    fn note(&self, call: &str) {
        let mut calls = self.calls.lock().unwrap_or_else(PoisonError::into_inner);
        calls.push((call.to_owned(), now_nanos()));
    }

    /// Every call so far, as (call, Unix nanoseconds).
    pub fn calls(&self) -> Vec<(String, u64)> {
        self.calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Serves the probe in `dir` (kubelet's device-plugin directory) and
    /// registers it with `dir/kubelet.sock`; the serving task.
    ///
    /// # Errors
    /// When the socket cannot be bound or kubelet refuses the registration.
    pub async fn start(&self, dir: &Path) -> Result<JoinHandle<()>, String> {
        let listener = proto::unix::bind_fresh(&dir.join(ENDPOINT)).map_err(|e| e.to_string())?;
        let service = DevicePluginServer::new(self.clone());
        let server = tokio::spawn(async move {
            let serving = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(proto::unix::incoming(listener));
            if let Err(err) = serving.await {
                eprintln!("the probe device plugin stopped: {err}");
            }
        });
        let channel = proto::unix::channel(&dir.join("kubelet.sock"))
            .await
            .map_err(|e| format!("connecting to kubelet.sock: {e}"))?;
        let request = RegisterRequest {
            version: proto::VERSION.into(),
            endpoint: ENDPOINT.into(),
            resource_name: PROBE_RESOURCE.into(),
            options: Some(options()),
        };
        RegistrationClient::new(channel)
            .register(request)
            .await
            .map_err(|s| format!("Register: {}", s.message()))?;
        Ok(server)
    }
}

fn options() -> DevicePluginOptions {
    DevicePluginOptions {
        pre_start_required: true,
        get_preferred_allocation_available: true,
    }
}

#[tonic::async_trait]
impl DevicePlugin for CallProbe {
    type ListAndWatchStream = ReceiverStream<Result<ListAndWatchResponse, Status>>;

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
        let (tx, rx) = mpsc::channel(4);
        let devices = ["probe-0", "probe-1"]
            .map(|id| Device {
                id: id.into(),
                health: proto::HEALTHY.into(),
                topology: None,
            })
            .into();
        tx.send(Ok(ListAndWatchResponse { devices }))
            .await
            .map_err(|_| Status::internal("receiver gone"))?;
        self.streams
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(tx);
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        self.note("GetPreferredAllocation");
        let container_responses = request
            .into_inner()
            .container_requests
            .into_iter()
            .map(|c| {
                let size = usize::try_from(c.allocation_size).unwrap_or(0);
                let mut ids = c.available_device_i_ds;
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
        self.note("Allocate");
        let count = request.into_inner().container_requests.len();
        Ok(Response::new(AllocateResponse {
            container_responses: vec![ContainerAllocateResponse::default(); count],
        }))
    }

    async fn pre_start_container(
        &self,
        _: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        self.note("PreStartContainer");
        Ok(Response::new(PreStartContainerResponse {}))
    }
}
