//! A fake of kubelet's pod-resources API (`PodResourcesLister` v1) on a Unix
//! socket of its own directory, as kubelet serves it on
//! `<root-dir>/pod-resources/kubelet.sock`: `List` names every pod with its
//! containers and their device ids per resource (no pod UID, as in kubelet).
//! Tests record what kubelet would have assigned with [`FakePodResources::assign`].

use std::{
    io,
    path::PathBuf,
    sync::{Arc, Mutex, PoisonError},
};

use proto::podresources::v1::{
    AllocatableResourcesRequest, AllocatableResourcesResponse, ContainerDevices,
    ContainerResources, GetPodResourcesRequest, GetPodResourcesResponse, ListPodResourcesRequest,
    ListPodResourcesResponse, PodResources,
    pod_resources_lister_server::{PodResourcesLister, PodResourcesListerServer},
};
use tempfile::TempDir;
use tokio::task::JoinHandle;
use tonic::{Request, Response, Status};

#[derive(Debug, Clone, Default)]
struct Lister {
    pods: Arc<Mutex<Vec<PodResources>>>,
}

#[tonic::async_trait]
impl PodResourcesLister for Lister {
    async fn list(
        &self,
        _: Request<ListPodResourcesRequest>,
    ) -> Result<Response<ListPodResourcesResponse>, Status> {
        let pods = self
            .pods
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        Ok(Response::new(ListPodResourcesResponse {
            pod_resources: pods,
        }))
    }

    async fn get_allocatable_resources(
        &self,
        _: Request<AllocatableResourcesRequest>,
    ) -> Result<Response<AllocatableResourcesResponse>, Status> {
        Err(Status::unimplemented("not faked"))
    }

    async fn get(
        &self,
        request: Request<GetPodResourcesRequest>,
    ) -> Result<Response<GetPodResourcesResponse>, Status> {
        let want = request.into_inner();
        let pods = self.pods.lock().unwrap_or_else(PoisonError::into_inner);
        pods.iter()
            .find(|p| p.name == want.pod_name && p.namespace == want.pod_namespace)
            .map(|p| {
                Response::new(GetPodResourcesResponse {
                    pod_resources: Some(p.clone()),
                })
            })
            .ok_or_else(|| {
                Status::not_found(format!(
                    "pod {}/{} not found",
                    want.pod_namespace, want.pod_name
                ))
            })
    }
}

/// The fake pod-resources endpoint; stops when dropped.
pub struct FakePodResources {
    lister: Lister,
    dir: TempDir,
    task: JoinHandle<()>,
}

impl FakePodResources {
    /// Serves on `<tempdir>/kubelet.sock`.
    ///
    /// # Errors
    /// When the directory or socket cannot be made.
    pub fn start() -> io::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("pod-resources-")
            .tempdir()?;
        let listener = proto::unix::bind_fresh(&dir.path().join("kubelet.sock"))?;
        let lister = Lister::default();
        let server = tonic::transport::Server::builder()
            .add_service(PodResourcesListerServer::new(lister.clone()))
            .serve_with_incoming(proto::unix::incoming(listener));
        let task = tokio::spawn(async move {
            let _ = server.await;
        });
        Ok(Self { lister, dir, task })
    }

    /// The socket path (what `--pod-resources-socket` takes).
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("kubelet.sock")
    }

    /// Records that kubelet gave `ids` of `resource` to `container` of
    /// `namespace/pod`.
    pub fn assign(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
        resource: &str,
        ids: &[String],
    ) {
        let mut pods = self
            .lister
            .pods
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let index = match pods
            .iter()
            .position(|p| p.name == pod && p.namespace == namespace)
        {
            Some(i) => i,
            None => {
                pods.push(PodResources {
                    name: pod.to_owned(),
                    namespace: namespace.to_owned(),
                    ..PodResources::default()
                });
                pods.len() - 1
            }
        };
        pods[index].containers.push(ContainerResources {
            name: container.to_owned(),
            devices: vec![ContainerDevices {
                resource_name: resource.to_owned(),
                device_ids: ids.to_vec(),
                topology: None,
            }],
            ..ContainerResources::default()
        });
    }
}

impl Drop for FakePodResources {
    fn drop(&mut self) {
        self.task.abort();
    }
}
