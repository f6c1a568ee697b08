//! The DevicePlugin gRPC service kubelet calls, over the device table.

use std::{pin::Pin, sync::Arc};

use futures_util::Stream;
use proto::v1beta1::{
    AllocateRequest, AllocateResponse, ContainerPreferredAllocationResponse, Device,
    DevicePluginOptions, Empty, ListAndWatchResponse, NumaNode, PreStartContainerRequest,
    PreStartContainerResponse, PreferredAllocationRequest, PreferredAllocationResponse,
    TopologyInfo, device_plugin_server::DevicePlugin,
};
use tokio::sync::{Notify, mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use tracing::{Instrument, debug, info, info_span, warn};

use crate::{allocator, config::KubeAccess, devices::DeviceTable};

/// What the service answers with.
#[derive(Debug, Clone)]
pub struct PluginService {
    pub devices: watch::Receiver<DeviceTable>,
    pub policy: allocator::Policy,
    pub kube: KubeAccess,
    /// Notified when kubelet's ListAndWatch stream goes away.
    pub stream_closed: Arc<Notify>,
}

/// The options, the same in Register and GetDevicePluginOptions.
pub fn options() -> DevicePluginOptions {
    DevicePluginOptions {
        pre_start_required: false,
        get_preferred_allocation_available: true,
    }
}

fn to_kubelet(table: &DeviceTable) -> ListAndWatchResponse {
    let devices = table
        .slots
        .iter()
        .map(|slot| Device {
            id: slot.id.clone(),
            health: if slot.healthy {
                proto::HEALTHY
            } else {
                proto::UNHEALTHY
            }
            .to_owned(),
            topology: slot.numa.map(|id| TopologyInfo {
                nodes: vec![NumaNode { id }],
            }),
        })
        .collect();
    ListAndWatchResponse { devices }
}

type DeviceStream = Pin<Box<dyn Stream<Item = Result<ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for PluginService {
    type ListAndWatchStream = DeviceStream;

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
        let mut devices = self.devices.clone();
        let closed = self.stream_closed.clone();
        let task = async move {
            loop {
                let answer = to_kubelet(&devices.borrow_and_update());
                info!(
                    devices = answer.devices.len(),
                    "ListAndWatch: sending the device list"
                );
                if tx.send(Ok(answer)).await.is_err() {
                    break;
                }
                tokio::select! {
                    changed = devices.changed() => {
                        if changed.is_err() {
                            return;
                        }
                    }
                    () = tx.closed() => break,
                }
            }
            info!("kubelet closed the ListAndWatch stream");
            closed.notify_one();
        };
        tokio::spawn(task.instrument(info_span!("list_and_watch")));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        let topology = self.devices.borrow().topology.clone();
        let container_responses = request
            .into_inner()
            .container_requests
            .into_iter()
            .map(|req| {
                let size = usize::try_from(req.allocation_size).unwrap_or(0);
                let ids = allocator::preferred(
                    self.policy,
                    &topology,
                    &req.available_device_i_ds,
                    &req.must_include_device_i_ds,
                    size,
                );
                debug!(?ids, size, "GetPreferredAllocation");
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
        let ids: Vec<String> = request
            .into_inner()
            .container_requests
            .into_iter()
            .flat_map(|c| c.devices_ids)
            .collect();
        let why = match &self.kube {
            KubeAccess::None => {
                "amd-device-plugin runs with --kube none: without the Kubernetes API it \
                                 cannot learn HAMi's decision for the pod, so it allocates nothing"
                    .to_owned()
            }
            _ => "this build of amd-device-plugin does not carry HAMi's allocation protocol yet; \
                  it allocates nothing rather than hand out devices HAMi did not assign"
                .to_owned(),
        };
        warn!(?ids, "Allocate refused: {why}");
        Err(Status::failed_precondition(why))
    }

    async fn pre_start_container(
        &self,
        _: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        Ok(Response::new(PreStartContainerResponse {}))
    }
}
