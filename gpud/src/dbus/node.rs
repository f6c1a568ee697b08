//! The node object: inventory-wide properties, `Rescan`, `InventoryChanged`,
//! and the VRAM caps (`SetPodVramLimits`, `Dmem*` properties).
//!
//! Properties answer from the last published [`Snapshot`]; `Rescan` and
//! `SetComputePartition` are requests to the service task. Nothing here
//! waits for a read of the hardware but `Rescan`, which asks for one.

use std::{collections::HashMap, sync::Arc};

use ipc::{
    ApiError,
    usage::{ContainerCompute, ContainerVram, GpuUse, PodDmem},
};
use tokio::sync::watch;
use tracing::{Instrument, info_span};
use zbus::{
    Connection, interface,
    message::Header,
    object_server::SignalEmitter,
    zvariant::{ObjectPath, OwnedObjectPath},
};

use super::{auth, switch, vram};
use crate::{
    HostPaths,
    dmem::Dmem,
    health::Stats,
    restore_check,
    service::{Handle, Origin, Snapshot},
    usage::reader::{self, UsageReader},
};

/// `io.hami.AmdGpu1.Node` on `/io/hami/AmdGpu1`.
pub struct NodeObject {
    /// Requests to the service task.
    pub service: Handle,
    /// The inventory as last published (replaced as each change is applied).
    pub state: watch::Receiver<Arc<Snapshot>>,
    /// The dmem backend (internally synchronized).
    pub dmem: Arc<Dmem>,
    /// UIDs allowed to call methods.
    pub allowed_uids: Arc<[u32]>,
    /// The health counters (atomics the service task counts in).
    pub health: Arc<Stats>,
    /// Seconds between health pulses; 0 when off.
    pub health_pulse: u32,
    /// `GetUsage`'s cache and read gate.
    pub usage: Arc<UsageReader>,
    /// Where `RestoreCheck` reads the host.
    pub paths: HostPaths,
}

impl NodeObject {
    /// The inventory as last published.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.state.borrow().clone()
    }
}

#[interface(name = "io.hami.AmdGpu1.Node")]
impl NodeObject {
    /// Reads the inventory again now and publishes what changed; returns the
    /// inventory generation after it. AMD SMI is probed again at most once
    /// per 10 s of calls (a call within that reads sysfs only). Root only
    /// (the plugin never rescans).
    async fn rescan(
        &self,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<u64, ApiError> {
        let uid = auth::caller_uid(conn, &header).await;
        let span = info_span!(
            "dbus",
            method = "Rescan",
            object = %header.path().map(ToString::to_string).unwrap_or_default(),
            caller_uid = uid.as_ref().map_or(-1, |u| i64::from(*u)),
        );
        async {
            auth::check_root(uid?, "Rescan").inspect_err(|e| tracing::warn!("{e}"))?;
            let state = self.service.rescan(Origin::Caller).await;
            state
                .map(|s| s.generation())
                .map_err(|e| ApiError::Failed(ipc::report::one_line(&e)))
        }
        .instrument(span)
        .await
    }

    /// Caps the VRAM of a pod through the dmem cgroup controller: for each
    /// GPU (PCI address `dddd:bb:dd.f`) in `limits`, writes the byte count to
    /// `dmem.max` of the pod's cgroup (any QoS class) and reads it back.
    /// `pod_uid` is the pod's UID (a lowercase UUID, or 32 hex digits for a
    /// static pod). Idempotent. Returns the pod's cgroup path. Errors:
    /// InvalidArgument (UID, unknown GPU, value below 1 MiB or above the VRAM
    /// region, a symlink in the cgroup tree), NotFound (no pod cgroup),
    /// NotSupported (backend off, with the reason), Failed (the kernel refused
    /// or did not apply a write), AccessDenied (not root or the plugin).
    /// Error texts to the plugin are short and name no host path.
    #[zbus(out_args("cgroup"))]
    async fn set_pod_vram_limits(
        &self,
        pod_uid: String,
        limits: HashMap<String, u64>,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        #[zbus(signal_emitter)] emitter: SignalEmitter<'_>,
    ) -> Result<String, ApiError> {
        let uid = auth::caller_uid(conn, &header).await;
        let span = info_span!(
            "dbus",
            method = "SetPodVramLimits",
            caller_uid = uid.as_ref().map_or(-1, |u| i64::from(*u)),
            pod = %crate::dmem::uid::excerpt(&pod_uid),
            gpus = limits.len(),
        );
        async {
            let uid = uid?;
            auth::check(uid, &self.allowed_uids, "SetPodVramLimits")
                .inspect_err(|e| tracing::warn!("{e}"))?;
            let before = self.dmem.status();
            let result = vram::set_pod_limits(self.dmem.clone(), pod_uid, limits).await;
            if self.dmem.status() != before {
                self.announce_dmem(&emitter).await;
            }
            result.map_err(|e| auth::for_caller(uid, e))
        }
        .instrument(span)
        .await
    }

    /// Switches the compute partition of GPU `gpu` (PCI address) to `mode`
    /// (SPX, DPX, TPX, QPX, CPX; any case) and waits until the driver shows
    /// the new partitions; returns the inventory generation after it. The
    /// memory partition (NPS) is never changed. Errors: Busy (a KFD process
    /// uses the GPU, `allocations_exist`, or the driver refused), NotSupported
    /// (mode not offered in the GPU's memory mode, or no compute partitions),
    /// NotFound, InvalidArgument, Failed (write failed or the partitions did
    /// not appear in time), AccessDenied (not root or the plugin).
    #[zbus(out_args("generation"))]
    async fn set_compute_partition(
        &self,
        gpu: String,
        mode: String,
        allocations_exist: bool,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<u64, ApiError> {
        let uid = auth::caller_uid(conn, &header).await;
        let span = info_span!(
            "dbus",
            method = "SetComputePartition",
            caller_uid = uid.as_ref().map_or(-1, |u| i64::from(*u)),
            gpu = %gpu.chars().take(32).collect::<String>(),
            mode = %mode.chars().take(8).collect::<String>(),
            allocations_exist,
        );
        async {
            let uid = uid?;
            auth::check(uid, &self.allowed_uids, "SetComputePartition")
                .inspect_err(|e| tracing::warn!("{e}"))?;
            switch::set_compute_partition(&self.service, &gpu, &mode, allocations_exist)
                .await
                .inspect_err(|e| tracing::warn!("SetComputePartition failed: {e}"))
                .map_err(|e| auth::for_caller(uid, e))
        }
        .instrument(span)
        .await
    }

    /// What the pods and GPUs use now: for each container, the VRAM its
    /// processes hold per KFD gpu_id (KFD's per-process vram_<gpu_id>,
    /// attributed through the process's cgroup to a kubelet pod cgroup;
    /// processes in no pod's cgroup are left out), each such pod's
    /// dmem.current per GPU, and each GPU's VRAM used, activity (percent),
    /// temperature (millidegrees C) and power (microwatts), -1 where
    /// unknown; VRAM used and activity from AMD SMI where it answers (a
    /// probe child), else sysfs, as each entry's source says. The host is
    /// read at most once per 2 s (later calls get the same answer) and
    /// within 3 s. Errors: Failed (the read was late or an
    /// earlier one is still blocked), AccessDenied (not root or the plugin).
    #[zbus(out_args("containers", "dmem", "gpus"))]
    async fn get_usage(
        &self,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<(Vec<ContainerVram>, Vec<PodDmem>, Vec<GpuUse>), ApiError> {
        let uid = auth::caller_uid(conn, &header).await;
        let span = info_span!(
            "dbus",
            method = "GetUsage",
            caller_uid = uid.as_ref().map_or(-1, |u| i64::from(*u)),
        );
        async {
            let reading = self.usage_for(uid?, "GetUsage").await?;
            let u = &reading.usage;
            Ok((u.containers.clone(), u.dmem.clone(), u.gpus.clone()))
        }
        .instrument(span)
        .await
    }

    /// The compute units the waves of each container's processes occupy per
    /// KFD gpu_id: KFD's per-process stats_<gpu_id>/cu_occupancy (waves in
    /// flight turned into CUs by the kernel, an instant's count), summed
    /// per container, read only where the process holds VRAM on that
    /// gpu_id; nothing where the kernel has no such file. The same read as
    /// GetUsage (cached alike, one read serves both). Errors: as GetUsage.
    #[zbus(out_args("compute"))]
    async fn get_compute_usage(
        &self,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<Vec<ContainerCompute>, ApiError> {
        let uid = auth::caller_uid(conn, &header).await;
        let span = info_span!(
            "dbus",
            method = "GetComputeUsage",
            caller_uid = uid.as_ref().map_or(-1, |u| i64::from(*u)),
        );
        async {
            let reading = self.usage_for(uid?, "GetComputeUsage").await?;
            Ok(reading.usage.compute.clone())
        }
        .instrument(span)
        .await
    }

    /// Says whether a CRIU checkpoint could be restored on this node.
    /// `image`: the contents of the checkpoint's amdgpu-kfd-<id>.img. Not a
    /// path: amd-gpud runs as root and opens no file a caller names, so the
    /// caller reads the image. `gpus`: the GPUs the restored container will
    /// see (KFD gpu_id, renderD<minor> or PCI address; empty: all).
    /// `options`: KFD_*_CHECK variables as CRIU would read them from its
    /// environment. `mode`: "explain" (default when empty) or "criu".
    /// Returns the verdict as JSON, as `amd-gpud restore-check --json`
    /// prints it (its `outcome` one of "restorable", "refused",
    /// "criu-would-not-finish", "criu-would-crash"). InvalidArgument for an unreadable image, an unknown
    /// option, mode or GPU. Root only (the plugin never calls it).
    async fn restore_check(
        &self,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        image: Vec<u8>,
        gpus: Vec<String>,
        options: HashMap<String, String>,
        mode: String,
    ) -> Result<String, ApiError> {
        let uid = auth::caller_uid(conn, &header).await;
        let span = info_span!(
            "dbus",
            method = "RestoreCheck",
            caller_uid = uid.as_ref().map_or(-1, |u| i64::from(*u)),
            image_bytes = image.len(),
        );
        async {
            auth::check_root(uid?, "RestoreCheck").inspect_err(|e| tracing::warn!("{e}"))?;
            let paths = self.paths.clone();
            let request = restore_request(gpus, &options, &mode)?;
            let verdict = tokio::task::spawn_blocking(move || {
                let image = restore_check::image::parse(&image, "image")
                    .map_err(|e| ApiError::InvalidArgument(e.to_string()))?;
                restore_check::check_host(&paths, &image, &request).map_err(|e| {
                    if e.is_invalid_input() {
                        ApiError::InvalidArgument(e.to_string())
                    } else {
                        ApiError::Failed(e.to_string())
                    }
                })
            })
            .await
            .map_err(|e| ApiError::Failed(format!("the restore check failed: {e}")))??;
            tracing::info!(restorable = verdict.restorable, "restore check");
            serde_json::to_string(&verdict).map_err(|e| ApiError::Failed(e.to_string()))
        }
        .instrument(span)
        .await
    }

    /// Emitted after every change of the inventory.
    #[zbus(signal)]
    pub async fn inventory_changed(
        emitter: &SignalEmitter<'_>,
        generation: u64,
        added: Vec<ObjectPath<'_>>,
        missing: Vec<ObjectPath<'_>>,
        changed: Vec<ObjectPath<'_>>,
    ) -> zbus::Result<()>;

    /// Counts changes of the inventory since the daemon started.
    #[zbus(property)]
    fn generation(&self) -> u64 {
        self.snapshot().generation()
    }

    /// KFD `generation_id` at the last read; 0 when the kernel has none.
    #[zbus(property)]
    fn kfd_generation(&self) -> u64 {
        self.snapshot().meta.kfd_generation.unwrap_or(0)
    }

    /// Every GPU object, ordered by PCI address (missing ones included).
    #[zbus(property)]
    fn gpus(&self) -> Vec<OwnedObjectPath> {
        self.snapshot()
            .registry
            .gpus()
            .map(|(g, _)| ipc::gpu_path(&g.bdf.to_string()))
            .collect()
    }

    /// `<state>: <detail>` of AMD SMI: loaded, unavailable or disabled.
    #[zbus(property)]
    fn amd_smi(&self) -> String {
        let state = self.snapshot();
        format!("{}: {}", state.meta.amdsmi.state, state.meta.amdsmi.detail)
    }

    /// Problems found at the last read, each naming its file or device.
    #[zbus(property)]
    fn warnings(&self) -> Vec<String> {
        self.snapshot().meta.warnings.clone()
    }

    /// VRAM caps: `on`, or `off: <reason>` (no cgroup v2, no dmem
    /// controller, no amdgpu region, no kubepods cgroup, `--dmem-backend off`...).
    #[zbus(property)]
    fn dmem_backend(&self) -> String {
        self.dmem.status().backend()
    }

    /// amdgpu VRAM regions of the root `dmem.capacity`: PCI address to bytes.
    /// Only these GPUs can be capped.
    #[zbus(property)]
    fn dmem_regions(&self) -> HashMap<String, u64> {
        vram::regions(&self.dmem.status())
    }

    /// The kubelet cgroup driver in use: `systemd`, `cgroupfs`, or empty when
    /// unknown.
    #[zbus(property)]
    fn dmem_cgroup_driver(&self) -> String {
        vram::driver(&self.dmem.status())
    }

    /// The kubepods cgroup (e.g. `/kubepods.slice`); empty when unknown.
    #[zbus(property)]
    fn dmem_kubepods(&self) -> String {
        vram::kubepods(&self.dmem.status())
    }

    /// Seconds between two rounds of health probes (`--health-pulse`); 0
    /// when health checks are off.
    #[zbus(property(emits_changed_signal = "const"))]
    fn health_pulse(&self) -> u32 {
        self.health_pulse
    }

    /// Rounds of health probes run since the daemon started.
    #[zbus(property(emits_changed_signal = "false"))]
    fn health_checks(&self) -> u64 {
        self.health.pulses()
    }

    /// Failed probes of GPUs and partitions since the daemon started.
    #[zbus(property(emits_changed_signal = "false"))]
    fn health_probe_failures(&self) -> u64 {
        self.health.failures()
    }

    /// Health transitions of GPUs and partitions, to Unhealthy and back,
    /// since the daemon started.
    #[zbus(property(emits_changed_signal = "false"))]
    fn health_transitions(&self) -> u64 {
        self.health.transitions()
    }

    /// GPUs and partitions that pass their probes but are held unhealthy by
    /// flap damping (their recent record is too unsteady).
    #[zbus(property(emits_changed_signal = "false"))]
    fn health_held(&self) -> u32 {
        self.health.held()
    }
}

impl NodeObject {
    /// The usage reading for `method` of caller `uid`: the caller checked,
    /// then the cached read (GetUsage and GetComputeUsage share it).
    async fn usage_for(
        &self,
        uid: u32,
        method: &'static str,
    ) -> Result<Arc<crate::usage::Reading>, ApiError> {
        auth::check(uid, &self.allowed_uids, method).inspect_err(|e| tracing::warn!("{e}"))?;
        let targets = reader::targets(&self.snapshot().registry);
        self.usage
            .get(targets)
            .await
            .map_err(|e| auth::for_caller(uid, ApiError::Failed(e.to_string())))
    }

    /// Emits `PropertiesChanged` for the `Dmem*` properties.
    async fn announce_dmem(&self, emitter: &SignalEmitter<'_>) {
        let sent = async {
            self.dmem_backend_changed(emitter).await?;
            self.dmem_regions_changed(emitter).await?;
            self.dmem_cgroup_driver_changed(emitter).await?;
            self.dmem_kubepods_changed(emitter).await
        };
        if let Err(e) = sent.await {
            tracing::warn!("cannot announce the dmem backend: {e}");
        }
    }
}

/// The request of a `RestoreCheck` call.
fn restore_request(
    gpus: Vec<String>,
    options: &HashMap<String, String>,
    mode: &str,
) -> Result<restore_check::Request, ApiError> {
    let invalid = |e: &dyn std::fmt::Display| ApiError::InvalidArgument(e.to_string());
    let mut pairs: Vec<(&str, &str)> = options
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    pairs.sort_unstable();
    Ok(restore_check::Request {
        mode: mode.parse().map_err(|e| invalid(&e))?,
        gpus,
        options: restore_check::Options::from_pairs(pairs).map_err(|e| invalid(&e))?,
    })
}
