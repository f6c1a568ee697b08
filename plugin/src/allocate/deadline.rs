//! The bound on one Allocate (issue 19): kubelet waits on it with no
//! deadline, and the node-wide order of Allocates (`serial`) must not wait
//! on a silent API server longer than that bound either.

use std::{sync::Arc, time::Duration};

use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams},
};
use serde_json::{Value, json};
use tokio::{sync::OwnedMutexGuard, time::Instant};
use tracing::warn;

use super::{Allocator, lock};
use crate::kube::CALL_TIMEOUT;

/// How long one Allocate may take, from kubelet's call to its answer, and
/// the longest `serial` (the node-wide order of Allocates) is held for it.
/// Kubelet sets no deadline of its own on Allocate
/// (kubernetes/kubernetes:pkg/kubelet/cm/devicemanager/manager.go `Allocate`
/// calls with `context.TODO()`, and endpoint.go `allocate` adds none) and
/// admits pods one at a time (kubelet.go `HandlePodAdditions`), so an
/// Allocate that waits on a silent API server stalls every admission on the
/// node; the one deadline kubelet puts on a device-plugin call is
/// PreStartContainer's 30 s (endpoint.go,
/// `KubeletPreStartContainerRPCTimeoutInSecs`). Twice [`CALL_TIMEOUT`], below
/// that.
pub(crate) const ALLOCATE_DEADLINE: Duration = Duration::from_secs(20);

impl Allocator {
    /// The lock's release for `pod`, as a task of its own.
    pub(super) fn release(&self, pod: Arc<Pod>) -> impl Future<Output = ()> + Send + 'static {
        let (client, caches) = (self.client.clone(), self.caches.clone());
        async move { lock::release(&client, &caches, &pod).await }
    }

    /// Marks the pod and releases the lock, logging (not returning)
    /// failures, as a task of its own.
    pub(super) fn finish_owned(
        &self,
        pod: Arc<Pod>,
        annotations: Value,
    ) -> impl Future<Output = ()> + Send + 'static {
        let (client, release) = (self.client.clone(), self.release(Arc::clone(&pod)));
        let ours = Arc::clone(&self.ours);
        async move {
            let ns = pod.namespace().unwrap_or_default();
            let api: Api<Pod> = Api::namespaced(client, &ns);
            let body = json!({ "metadata": { "annotations": annotations } });
            let (params, patch) = (PatchParams::default(), Patch::Merge(&body));
            match tokio::time::timeout(CALL_TIMEOUT, api.patch(&pod.name_any(), &params, &patch))
                .await
            {
                Ok(Ok(written)) => ours.learned(Arc::new(written)),
                Ok(Err(err)) => warn!("patching the pod: {err}"),
                Err(_) => warn!("patching the pod timed out after {CALL_TIMEOUT:?}"),
            }
            release.await;
        }
    }
}

/// Runs `work` holding `serial` until it is done or `deadline` has passed,
/// whichever comes first; past the deadline the next Allocate may go on
/// while `work` finishes. The release of HAMi's lock in `work` is guarded
/// by the lock's owner and the node's resourceVersion (see [`lock`]), so it
/// never releases another pod's lock, with or without `serial`.
pub(super) async fn hold_until(
    work: impl Future<Output = ()>,
    serial: OwnedMutexGuard<()>,
    deadline: Instant,
) {
    tokio::pin!(work);
    if tokio::time::timeout_at(deadline, &mut work).await.is_err() {
        drop(serial);
        warn!("the API server is slow: the next Allocate goes on while this one's writes finish");
        work.await;
    }
}
