//! The DevicePlugin gRPC service kubelet calls, over the device table.

use std::{pin::Pin, sync::Arc, time::Instant};

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

use crate::{
    inventory::DeviceTable,
    metrics::Metrics,
    preferred::{self, AllocationHint},
};

/// What the service answers with.
#[derive(Debug, Clone)]
pub(crate) struct PluginService {
    pub(crate) devices: watch::Receiver<DeviceTable>,
    pub(crate) policy: preferred::Policy,
    /// Notified when kubelet's ListAndWatch stream goes away.
    pub(crate) stream_closed: Arc<Notify>,
    /// HAMi's choice, when the allocation protocol provides one.
    pub(crate) hint: Option<Arc<dyn AllocationHint>>,
    /// HAMi's Allocate, when the Kubernetes API is available.
    pub(crate) allocator: Option<Arc<crate::allocate::Allocator>>,
    /// VRAM caps at PreStartContainer, when the Kubernetes API is available.
    pub(crate) vram: Option<Arc<crate::vram::VramCaps>>,
    /// The loader check at PreStartContainer (`--loader-check`).
    pub(crate) loader: Option<Arc<crate::loader::LoaderCheck>>,
    /// Turns true when this server stops: open streams end so that the
    /// server's graceful shutdown does not wait on kubelet.
    pub(crate) stopping: watch::Receiver<bool>,
    /// Allocate counts, errors and latency.
    pub(crate) metrics: Arc<Metrics>,
}

/// The options, the same in Register and GetDevicePluginOptions;
/// PreStartContainer only when VRAM caps need it.
pub(crate) fn options(pre_start_required: bool) -> DevicePluginOptions {
    DevicePluginOptions {
        pre_start_required,
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
        let pre_start =
            self.loader.is_some() || self.vram.as_ref().is_some_and(|v| v.pre_start_required());
        Ok(Response::new(options(pre_start)))
    }

    async fn list_and_watch(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let (tx, rx) = mpsc::channel(4);
        let mut devices = self.devices.clone();
        let closed = self.stream_closed.clone();
        let mut stopping = self.stopping.clone();
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
                    Ok(_) = stopping.wait_for(|stop| *stop) => return,
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
        let mut container_responses = Vec::new();
        for req in request.into_inner().container_requests {
            let size = usize::try_from(req.allocation_size).unwrap_or(0);
            let (available, must) = (&req.available_device_i_ds, &req.must_include_device_i_ds);
            let hinted = match &self.hint {
                Some(hint) => hint.preferred(available, must, size).await,
                None => None,
            };
            let ids = hinted.unwrap_or_else(|| {
                preferred::preferred(self.policy, &topology, available, must, size)
            });
            debug!(?ids, size, "GetPreferredAllocation");
            container_responses.push(ContainerPreferredAllocationResponse { device_i_ds: ids });
        }
        Ok(Response::new(PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        request: Request<AllocateRequest>,
    ) -> Result<Response<AllocateResponse>, Status> {
        let requests = request.into_inner().container_requests;
        if let Some(allocator) = &self.allocator {
            let mut container_responses = Vec::with_capacity(requests.len());
            for req in &requests {
                let started = Instant::now();
                let answer = allocator
                    .allocate(&req.devices_ids)
                    .instrument(info_span!("allocate", devices = ?req.devices_ids))
                    .await;
                let outcome = answer.as_ref().map(drop).map_err(|e| e.reason().label());
                self.metrics.record_allocate(started.elapsed(), outcome);
                container_responses
                    .push(answer.map_err(|e| Status::failed_precondition(e.to_string()))?);
            }
            return Ok(Response::new(AllocateResponse {
                container_responses,
            }));
        }
        let ids: Vec<String> = requests.into_iter().flat_map(|c| c.devices_ids).collect();
        let why = "amd-device-plugin runs with --kube none: without the Kubernetes API it \
                   cannot learn HAMi's decision for the pod, so it allocates nothing";
        warn!(?ids, "Allocate refused: {why}");
        self.metrics
            .record_allocate(std::time::Duration::ZERO, Err("no_kube"));
        Err(Status::failed_precondition(why))
    }

    async fn pre_start_container(
        &self,
        request: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        let ids = request.into_inner().devices_ids;
        let span = info_span!("pre_start", devices = ?ids);
        async {
            // Without the hook, the container's VRAM cap is its only limit.
            let capped = self.vram.as_ref().is_some_and(|v| v.pre_start_required());
            let cap_mandatory = match &self.loader {
                Some(loader) => loader
                    .pre_start(&ids, capped)
                    .await
                    .map_err(|e| Status::failed_precondition(e.to_string()))?,
                None => false,
            };
            if let Some(vram) = &self.vram {
                vram.pre_start(&ids, cap_mandatory)
                    .await
                    .map_err(|e| Status::failed_precondition(e.to_string()))?;
            }
            Ok(Response::new(PreStartContainerResponse {}))
        }
        .instrument(span)
        .await
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures_util::StreamExt;
    use proto::v1beta1::ContainerPreferredAllocationRequest;

    use super::*;
    use crate::inventory::Slot;

    #[derive(Debug)]
    struct Fixed(Vec<String>);

    impl AllocationHint for Fixed {
        fn preferred<'a>(
            &'a self,
            _: &'a [String],
            _: &'a [String],
            _: usize,
        ) -> Pin<Box<dyn Future<Output = Option<Vec<String>>> + Send + 'a>> {
            Box::pin(std::future::ready(Some(self.0.clone())))
        }
    }

    fn table(healthy: bool) -> DeviceTable {
        DeviceTable {
            slots: (0..2)
                .map(|s| Slot {
                    id: format!("g#{s}"),
                    healthy,
                    numa: (s == 0).then_some(1),
                })
                .collect(),
            topology: vec![],
        }
    }

    fn service(
        tx: &watch::Sender<DeviceTable>,
        hint: Option<Arc<dyn AllocationHint>>,
    ) -> PluginService {
        PluginService {
            devices: tx.subscribe(),
            policy: preferred::Policy::BestEffort,
            stream_closed: Arc::new(Notify::new()),
            hint,
            allocator: None,
            vram: None,
            loader: None,
            stopping: watch::channel(false).1,
            metrics: Arc::new(Metrics::new()),
        }
    }

    fn request(size: i32) -> Request<PreferredAllocationRequest> {
        Request::new(PreferredAllocationRequest {
            container_requests: vec![ContainerPreferredAllocationRequest {
                available_device_i_ds: vec!["g#0".into(), "g#1".into()],
                must_include_device_i_ds: vec![],
                allocation_size: size,
            }],
        })
    }

    #[tokio::test]
    async fn list_and_watch_sends_the_list_then_every_change() {
        tokio::time::timeout(Duration::from_secs(10), async {
            let (tx, _) = watch::channel(table(true));
            let svc = service(&tx, None);
            let mut stream = svc
                .list_and_watch(Request::new(Empty {}))
                .await
                .unwrap()
                .into_inner();
            let first = stream.next().await.unwrap().unwrap();
            assert_eq!(first.devices.len(), 2);
            assert_eq!(first.devices[0].health, "Healthy");
            assert_eq!(
                first.devices[0].topology.as_ref().map(|t| t.nodes[0].id),
                Some(1)
            );
            assert!(first.devices[1].topology.is_none(), "no empty TopologyInfo");
            tx.send_replace(table(false));
            let second = stream.next().await.unwrap().unwrap();
            assert!(second.devices.iter().all(|d| d.health == "Unhealthy"));
        })
        .await
        .expect("timed out");
    }

    #[tokio::test]
    async fn the_hint_wins_and_the_allocator_answers_without_one() {
        tokio::time::timeout(Duration::from_secs(10), async {
            let (tx, _) = watch::channel(table(true));
            let hinted = service(&tx, Some(Arc::new(Fixed(vec!["g#1".into()]))));
            let answer = hinted
                .get_preferred_allocation(request(1))
                .await
                .unwrap()
                .into_inner();
            assert_eq!(answer.container_responses[0].device_i_ds, ["g#1"]);
            let plain = service(&tx, None);
            let answer = plain
                .get_preferred_allocation(request(1))
                .await
                .unwrap()
                .into_inner();
            assert_eq!(answer.container_responses[0].device_i_ds.len(), 1);
            let refused = plain
                .allocate(Request::new(AllocateRequest::default()))
                .await
                .unwrap_err();
            assert!(refused.message().contains("--kube none"));
        })
        .await
        .expect("timed out");
    }
}
