//! HAMi's Allocate (docs/hami-protocol.md §3.4–3.6, §5): find the pod being bound,
//! take its next device entry, choose CU slices, answer kubelet with devices
//! and environment, and write back in one merge patch of the pod; release the
//! node lock when the pod is complete. Reads come from the watch caches.

mod admitted;
mod deadline;
mod error;
mod hint;
mod lock;
mod lookup;
mod occupancy;
mod ours;
mod pod;
mod report;
mod reported;
mod response;
mod reuse;
mod versions;
mod write_back;

use std::{
    collections::{HashMap, HashSet},
    path::PathBuf,
    sync::Arc,
};

use admitted::Admitted;
pub(crate) use deadline::ALLOCATE_DEADLINE;
use deadline::hold_until;
pub(crate) use error::{AllocateError, Reason};
pub(crate) use hint::HamiHint;
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, Client, ResourceExt,
    api::{Patch, PatchParams},
};
use proto::v1beta1::ContainerAllocateResponse;
pub(crate) use reuse::CU_SPARE_KEY;
use serde_json::{Value, json};
use tokio::{
    sync::{Mutex, watch},
    time::Instant,
};
use tracing::{info, warn};

use crate::{
    cu::CuBitmap,
    hami::{ContainerDevice, TO_ALLOCATE_KEY, containers::next_container, pop_next},
    inventory::Snapshot,
    kube::{CALL_TIMEOUT, Caches, Events},
    vram::{Owners, owners::PodRef},
};

/// Where the host's device nodes and the memory hook are.
#[derive(Debug, Clone)]
pub(crate) struct AllocateConfig {
    pub(crate) dev_dir: PathBuf,
    pub(crate) hook_dir: PathBuf,
    /// The count resource kubelet allocates (`amd.com/gpu`), to tell which
    /// of the pod's containers HAMi's entries belong to.
    pub(crate) resource_name: String,
    /// Answer with CDI device names (amd-gpud's spec) instead of device nodes.
    pub(crate) cdi: bool,
    /// Kubelet's pod-resources socket: which pods it admitted with our
    /// devices (only their grants count); `None` when turned off.
    pub(crate) pod_resources: Option<PathBuf>,
    /// HAMi's pod annotations are protected by admission (`--annotations-protected`).
    pub(crate) annotations_protected: bool,
    /// With the loader check (`--loader-check`): the host directory under
    /// which amd-gpud stages each container's hook (`--loader-hook-root`).
    pub(crate) staged_hooks: Option<PathBuf>,
    /// `LIBHIP_LOG_LEVEL` for containers with the hook; 0: not set
    /// (`--hip-log-level`).
    pub(crate) hip_log_level: u8,
    /// `--split-count`: the slots a GPU offers, to tell which device HAMi's
    /// (up to v2.9) `<node>-AMDGPU-<n>` names.
    pub(crate) split_count: u32,
}

/// Serialised Allocate over the caches.
pub(crate) struct Allocator {
    client: Client,
    caches: Caches,
    snapshots: watch::Receiver<Snapshot>,
    config: AllocateConfig,
    serial: Arc<Mutex<()>>,
    /// Pods known ahead of the cache, laid over it (see [`ours`]).
    ours: Arc<ours::Ours>,
    /// The cached pods' CU claims, judged once per pod version.
    claims: occupancy::Claims,
    events: Events,
    /// The forged claims already reported (bounded).
    reported: std::sync::Mutex<reported::Reported>,
    /// Which pod each container's devices went to, for PreStartContainer.
    owners: Arc<Owners>,
}

impl std::fmt::Debug for Allocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Allocator")
            .field("node", &self.caches.node_name)
            .finish_non_exhaustive()
    }
}

impl Allocator {
    pub(crate) fn new(
        client: Client,
        caches: Caches,
        snapshots: watch::Receiver<Snapshot>,
        config: AllocateConfig,
        owners: Arc<Owners>,
    ) -> Self {
        Self {
            claims: occupancy::Claims::for_resource(&config.resource_name),
            owners,
            events: Events::new(client.clone(), &caches.node_name),
            reported: std::sync::Mutex::new(reported::Reported::default()),
            client,
            caches,
            snapshots,
            config,
            serial: Arc::new(Mutex::new(())),
            ours: Arc::default(),
        }
    }

    /// One kubelet Allocate of `ids` (one container), answered within
    /// [`ALLOCATE_DEADLINE`].
    ///
    /// # Errors
    /// A message for kubelet saying what failed; after the pod was found the
    /// pod is marked `bind-phase: failed` and the lock released first (in
    /// the background when that does not fit in the deadline).
    pub(crate) async fn allocate(
        &self,
        ids: &[String],
    ) -> Result<ContainerAllocateResponse, AllocateError> {
        let deadline = Instant::now() + ALLOCATE_DEADLINE;
        let late = |waiting| AllocateError::Deadline {
            waiting,
            limit: ALLOCATE_DEADLINE,
        };
        let lock = Arc::clone(&self.serial).lock_owned();
        let serial = tokio::time::timeout_at(deadline, lock)
            .await
            .map_err(|_| late("the Allocate before this one did not finish"))?;
        let resource = &self.config.resource_name;
        let pod_resources = self.config.pod_resources.as_deref();
        let admitted = tokio::time::timeout_at(deadline, Admitted::read(pod_resources, resource))
            .await
            .map_err(|_| late("kubelet's pod-resources did not answer"))?;
        let found = tokio::time::timeout_at(deadline, self.find_for(ids.len(), &admitted))
            .await
            .map_err(|_| late("no pod being bound was found"))?;
        let (pod, pods) = found.inspect_err(|err| {
            warn!(devices = ids.len(), "Allocate refused: {err}");
            self.report_no_pod(&err.to_string());
        })?;
        let who = format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any());
        let planned =
            tokio::time::timeout_at(deadline, self.allocate_for(&pod, &pods, ids, &admitted));
        match planned
            .await
            .unwrap_or_else(|_| Err(late("the pod was not written back")))
        {
            Ok((answer, complete)) => {
                if complete {
                    // Kubelet need not wait for the lock; the next Allocate
                    // does (it waits for `serial`, held until the release
                    // or the deadline).
                    let release = self.release(Arc::clone(&pod));
                    tokio::spawn(hold_until(release, serial, deadline));
                }
                info!(pod = %who, devices = ids.len(), "allocated");
                self.remember_owner(ids, &pod, &pods);
                if let Some(container) = next_container(&pod, &self.config.resource_name) {
                    self.owners.remember_container(ids, container.name);
                }
                let staged = self.config.staged_hooks.is_some() && !answer.mounts.is_empty();
                self.owners.remember_hook(ids, staged);
                Ok(answer)
            }
            Err(err) => {
                warn!(pod = %who, "Allocate failed: {err}");
                if err.reason() != Reason::Slice {
                    self.report_failed(&pod, &err.to_string());
                }
                let finish = self.finish_owned(pod, json!({ pod::BIND_PHASE_KEY: "failed" }));
                let mut finish = tokio::spawn(hold_until(finish, serial, deadline));
                if tokio::time::timeout_at(deadline, &mut finish)
                    .await
                    .is_err()
                {
                    warn!(pod = %who, "marking the pod failed and releasing the node lock go on in the background");
                }
                Err(AllocateError::ForPod {
                    pod: who,
                    source: Box::new(err),
                })
            }
        }
    }

    /// What kubelet is allocating: `count` devices of our resource here;
    /// `admitted` tells which pods kubelet has taken in.
    fn wanted<'a>(&'a self, count: usize, admitted: &'a Admitted) -> pod::Wanted<'a> {
        pod::Wanted {
            node_name: &self.caches.node_name,
            resource: &self.config.resource_name,
            count,
            annotations_protected: self.config.annotations_protected,
            kubelet_knows: admitted.known(),
        }
    }

    /// The pod being bound for a request of `count` devices and the view to
    /// plan on.
    async fn find_for(
        &self,
        count: usize,
        admitted: &Admitted,
    ) -> Result<(Arc<Pod>, Vec<Arc<Pod>>), AllocateError> {
        self.wait_for_pods_listed().await?;
        if self.ours.ahead_len() > ours::AHEAD_LIMIT {
            self.forget_gone_pods().await;
        }
        let node = self.caches.node();
        let pods = self.view();
        let wanted = self.wanted(count, admitted);
        match pod::find(node.as_deref(), &pods, wanted, pod::Source::Cache) {
            Ok(pod) => Ok((pod, pods)),
            Err(err) => {
                let pod = self.pod_from_api(wanted, err).await?;
                // The pod read joins the view (its earlier containers' CUs count).
                self.ours.learned(Arc::clone(&pod));
                Ok((pod, self.view()))
            }
        }
    }

    /// Waits until the watch has listed this node's pods once (just after a
    /// start): before that the cache holds none of the other pods' claims.
    async fn wait_for_pods_listed(&self) -> Result<(), AllocateError> {
        let ready = self.caches.pods.wait_until_ready();
        match tokio::time::timeout(CALL_TIMEOUT, ready).await {
            Ok(Ok(())) => Ok(()),
            _ => Err(AllocateError::PodsNotListed {
                node: self.caches.node_name.clone(),
                waited: CALL_TIMEOUT,
            }),
        }
    }

    /// The cached pods with those known ahead of the cache; edits of our
    /// records are reported.
    fn view(&self) -> Vec<Arc<Pod>> {
        let (mark, cached) = self.caches.pods_with_mark();
        let (pods, edited) = self.ours.view(mark, cached);
        self.report_distrust(edited, &pods);
        pods
    }

    /// Records that `ids` went to `pod`, for PreStartContainer; `pods` are
    /// the live ones (looked up only when the record is pruned).
    fn remember_owner(&self, ids: &[String], pod: &Pod, pods: &[Arc<Pod>]) {
        let owner = PodRef {
            namespace: pod.namespace().unwrap_or_default(),
            name: pod.name_any(),
            uid: pod.uid().unwrap_or_default(),
        };
        let uids = std::cell::OnceCell::new();
        let live = |uid: &str| {
            let uids: &HashSet<&str> = uids.get_or_init(|| {
                pods.iter()
                    .filter_map(|p| p.metadata.uid.as_deref())
                    .collect()
            });
            uids.contains(uid)
        };
        self.owners.remember(ids, owner, live);
    }

    async fn allocate_for(
        &self,
        pod: &Arc<Pod>,
        pods: &[Arc<Pod>],
        ids: &[String],
        admitted: &Admitted,
    ) -> Result<(ContainerAllocateResponse, bool), AllocateError> {
        let planned = match self.plan(pod, pods, ids, admitted) {
            // The cached view may still count pods that are gone or done
            // (the watch lags behind HAMi): plan once more on a fresh list.
            Err(err) if err.reason() == Reason::Slice => match self.listed_view(&err).await {
                Some(fresh) => self.plan(pod, &fresh, ids, admitted),
                None => Err(err),
            },
            planned => planned,
        };
        let (answer, annotations, complete) = planned.inspect_err(|err| {
            if err.reason() == Reason::Slice {
                self.report_conflict(pod, &err.to_string());
            }
        })?;
        let written = self.patch_pod(pod, annotations).await?;
        self.ours.recorded(&written);
        Ok((answer, complete))
    }

    /// Everything Allocate decides before it writes: the pod's next entry,
    /// the CU slices, kubelet's answer and the pod annotations to write (and
    /// whether they complete the pod).
    fn plan(
        &self,
        pod: &Pod,
        pods: &[Arc<Pod>],
        ids: &[String],
        admitted: &Admitted,
    ) -> Result<(ContainerAllocateResponse, Value, bool), AllocateError> {
        let count = ids.len();
        let value = pod
            .annotations()
            .get(TO_ALLOCATE_KEY)
            .map(String::as_str)
            .unwrap_or_default();
        let (entry, rest) = pop_next(value)?.ok_or(AllocateError::NoEntryLeft)?;
        if entry.len() != count {
            return Err(AllocateError::DeviceCount {
                asked: count,
                assigned: entry.len(),
            });
        }
        let totals = occupancy::Totals::of(&self.snapshots.borrow(), self.config.split_count);
        let mut entry = entry;
        crate::inventory::ids::rename_current(&totals.aliases, &mut entry)
            .map_err(AllocateError::Unresolved)?;
        let mut reuse = reuse::Reuse::for_pod(pod, &self.config.resource_name);
        let slices = self.slices(&entry, pods, &mut reuse, (admitted, &totals))?;
        // With the loader check, the hook's directory is this container's
        // staged one, filled at PreStartContainer (crate::loader).
        let staged = self.config.staged_hooks.as_ref().map(|root| {
            root.join(pod.uid().unwrap_or_default())
                .join(crate::loader::decide::staging_key(ids))
        });
        let answer = response::build(&slices, &self.config, staged.as_deref())?;
        let (mut annotations, complete) = write_back::write_back(pod, &slices, rest)?;
        if let Some(spare) = reuse.annotation()? {
            annotations[CU_SPARE_KEY] = Value::String(spare);
        }
        info!(role = ?reuse.role(), "CUs chosen");
        Ok((answer, annotations, complete))
    }

    /// The CU slice of each GPU of `entry`, around every live pod's claims.
    fn slices(
        &self,
        entry: &[ContainerDevice],
        pods: &[Arc<Pod>],
        reuse: &mut reuse::Reuse,
        (admitted, totals): (&Admitted, &occupancy::Totals),
    ) -> Result<Vec<response::Slice>, AllocateError> {
        let snapshot = self.snapshots.borrow();
        let mut occupancy = self.ours.with_recorded(|ours| {
            let counts = |p: &Pod| ours(p) || admitted.admits(p);
            self.claims.rebuild(pods, totals, ours, &counts)
        });
        self.report_distrust(std::mem::take(&mut occupancy.distrusted), pods);
        let mut maps: HashMap<String, CuBitmap> = std::mem::take(&mut occupancy.maps);
        let mut slices = Vec::with_capacity(entry.len());
        for device in entry {
            let gpu = snapshot
                .device(&device.uuid)
                .ok_or_else(|| AllocateError::GpuNotHere {
                    gpu: device.uuid.clone(),
                })?;
            let parts = snapshot
                .partitions
                .get(&gpu.bdf)
                .map(Vec::as_slice)
                .unwrap_or_default();
            let slice =
                response::slice(gpu, parts, device, &mut maps, reuse).map_err(|source| {
                    AllocateError::Slice {
                        gpu: device.uuid.clone(),
                        holders: occupancy.holders(&device.uuid),
                        source: Box::new(source),
                    }
                })?;
            slices.push(slice);
        }
        Ok(slices)
    }

    async fn patch_pod(&self, pod: &Pod, annotations: Value) -> Result<Arc<Pod>, AllocateError> {
        let ns = pod.namespace().unwrap_or_default();
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        let body = json!({ "metadata": { "annotations": annotations } });
        let (params, patch) = (PatchParams::default(), Patch::Merge(&body));
        match tokio::time::timeout(CALL_TIMEOUT, api.patch(&pod.name_any(), &params, &patch)).await
        {
            Ok(Ok(written)) => {
                let written = Arc::new(written);
                self.ours.learned(Arc::clone(&written));
                Ok(written)
            }
            Ok(Err(err)) => Err(AllocateError::Patch(err)),
            Err(_) => Err(AllocateError::PatchTimeout(CALL_TIMEOUT)),
        }
    }
}
