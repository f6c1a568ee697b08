//! Client proxies for the plugin (and for tests and tools).
//!
//! The generated proxies cache properties and follow `PropertiesChanged`;
//! [`read_gpu`] and [`read_partition`] read a whole object in one round trip.

use zbus::{Connection, fdo::PropertiesProxy, names::InterfaceName, proxy, zvariant::ObjectPath};

use crate::{
    ApiError,
    names::{GPU_INTERFACE, PARTITION_INTERFACE},
    types::{GpuInfo, PartitionInfo},
};

/// The node object: `io.hami.AmdGpu1.Node` at `/io/hami/AmdGpu1`.
#[proxy(
    interface = "io.hami.AmdGpu1.Node",
    default_service = "io.hami.AmdGpu1",
    default_path = "/io/hami/AmdGpu1"
)]
pub trait Node {
    /// Reads the inventory again now; returns the inventory generation after it.
    /// Root only; AMD SMI is probed again at most once per 10 s of calls.
    fn rescan(&self) -> Result<u64, ApiError>;

    /// Caps the VRAM of pod `pod_uid` (a lowercase UUID, or 32 hex digits for
    /// a static pod): for each GPU PCI address (`dddd:bb:dd.f`) in `limits`,
    /// the byte count goes to `dmem.max` of the pod's cgroup and is read
    /// back. Call it at PreStartContainer (the pod cgroup exists then; it does
    /// not at Allocate). Idempotent. Returns the pod's cgroup path.
    ///
    /// Errors: `InvalidArgument` (UID, unknown GPU, less than 1 MiB or more
    /// than the GPU's VRAM region), `NotFound` (no cgroup for the pod), `NotSupported` (the dmem
    /// backend is off; the message says why), `Failed` (the kernel refused or
    /// did not apply the limit), `AccessDenied`.
    fn set_pod_vram_limits(
        &self,
        pod_uid: &str,
        limits: std::collections::HashMap<&str, u64>,
    ) -> Result<String, ApiError>;

    /// Switches the compute partition of the GPU at PCI address `gpu` to
    /// `mode` (`SPX`, `DPX`, `TPX`, `QPX`, `CPX`; any case), waits until the
    /// driver shows the new partitions, and returns the inventory generation
    /// after it. The memory partition (NPS) is never changed. A GPU already in
    /// `mode` is left alone.
    ///
    /// Errors: `Busy` (a process uses the GPU through KFD, the caller says
    /// allocations exist, or the driver refused while in use), `NotSupported`
    /// (the GPU does not offer `mode` in its memory mode, or has no compute
    /// partitions), `NotFound` (no such GPU), `InvalidArgument` (a malformed
    /// mode), `Failed` (the write failed or the partitions did not appear in
    /// time), `AccessDenied`.
    fn set_compute_partition(
        &self,
        gpu: &str,
        mode: &str,
        allocations_exist: bool,
    ) -> Result<u64, ApiError>;

    /// Whether a CRIU checkpoint could be restored here: the contents of its
    /// `amdgpu-kfd-<id>.img`, the GPUs the restored container will see
    /// (gpu_id, `renderD<minor>` or PCI address; empty: all), the
    /// `KFD_*_CHECK` variables CRIU will run with, and the mode (`explain` or
    /// `criu`). Returns the verdict as JSON. Root only.
    fn restore_check(
        &self,
        image: &[u8],
        gpus: &[&str],
        options: std::collections::HashMap<&str, &str>,
        mode: &str,
    ) -> Result<String, ApiError>;

    /// What the pods and GPUs use now: the VRAM each container's processes
    /// hold per KFD GPU (from KFD's per-process files; processes outside pod
    /// cgroups are left out), each pod's `dmem.current`, and each GPU's VRAM
    /// used, activity, temperature and power. Read at most once per 2 s
    /// (callers within get the same answer), within a deadline. Root or the
    /// plugin. Errors: `Failed` (the read did not finish in time or is
    /// still blocked), `AccessDenied`.
    #[allow(clippy::type_complexity)]
    fn get_usage(
        &self,
    ) -> Result<
        (
            Vec<crate::usage::ContainerVram>,
            Vec<crate::usage::PodDmem>,
            Vec<crate::usage::GpuUse>,
        ),
        ApiError,
    >;

    /// The compute units the waves of each container's processes occupy
    /// per KFD GPU, from KFD's per-process `stats_<gpu_id>/cu_occupancy`
    /// (read for the processes holding VRAM on that GPU; none where the
    /// kernel has no such file). The same read as `GetUsage`, cached alike.
    /// Root or the plugin. Errors: as `GetUsage`.
    fn get_compute_usage(&self) -> Result<Vec<crate::usage::ContainerCompute>, ApiError>;

    /// Emitted after every change of the inventory: the new generation and the
    /// GPU and partition objects added, removed (gone from the host but kept
    /// with health `Missing`) and changed.
    #[zbus(signal)]
    fn inventory_changed(
        &self,
        generation: u64,
        added: Vec<ObjectPath<'_>>,
        missing: Vec<ObjectPath<'_>>,
        changed: Vec<ObjectPath<'_>>,
    ) -> zbus::Result<()>;

    /// Counts changes of the inventory since the daemon started.
    #[zbus(property)]
    fn generation(&self) -> zbus::Result<u64>;
    /// KFD `generation_id` at the last read; 0 when the kernel has none.
    #[zbus(property)]
    fn kfd_generation(&self) -> zbus::Result<u64>;
    /// Every GPU object, ordered by PCI address.
    #[zbus(property)]
    fn gpus(&self) -> zbus::Result<Vec<zbus::zvariant::OwnedObjectPath>>;
    /// `loaded: ...`, `unavailable: <reason>` or `disabled: ...`.
    #[zbus(property)]
    fn amd_smi(&self) -> zbus::Result<String>;
    /// Problems found at the last read, each naming its file or device.
    #[zbus(property)]
    fn warnings(&self) -> zbus::Result<Vec<String>>;
    /// VRAM caps: `on`, or `off: <reason>`.
    #[zbus(property)]
    fn dmem_backend(&self) -> zbus::Result<String>;
    /// GPUs that can be capped: PCI address to the bytes of its VRAM region.
    #[zbus(property)]
    fn dmem_regions(&self) -> zbus::Result<std::collections::HashMap<String, u64>>;
    /// kubelet's cgroup driver (`systemd`, `cgroupfs`), empty when unknown.
    #[zbus(property)]
    fn dmem_cgroup_driver(&self) -> zbus::Result<String>;
    /// The kubepods cgroup (`/kubepods.slice`...), empty when unknown.
    #[zbus(property)]
    fn dmem_kubepods(&self) -> zbus::Result<String>;
    /// Seconds between two rounds of health probes; 0 when they are off.
    #[zbus(property)]
    fn health_pulse(&self) -> zbus::Result<u32>;
    /// Rounds of health probes run since the daemon started.
    #[zbus(property)]
    fn health_checks(&self) -> zbus::Result<u64>;
    /// Failed probes of GPUs and partitions since the daemon started.
    #[zbus(property)]
    fn health_probe_failures(&self) -> zbus::Result<u64>;
    /// Health transitions of GPUs and partitions (both ways) since start.
    #[zbus(property)]
    fn health_transitions(&self) -> zbus::Result<u64>;
    /// GPUs and partitions that pass their probes but are held unhealthy by
    /// flap damping.
    #[zbus(property)]
    fn health_held(&self) -> zbus::Result<u32>;
}

crate::gpu_properties!(proxy);
crate::partition_properties!(proxy);

async fn get_all(
    conn: &Connection,
    path: &ObjectPath<'_>,
    interface: &'static str,
) -> Result<std::collections::HashMap<String, zbus::zvariant::OwnedValue>, ApiError> {
    let props = PropertiesProxy::builder(conn)
        .destination(crate::BUS_NAME)?
        .path(path.to_owned())?
        .cache_properties(zbus::proxy::CacheProperties::No)
        .build()
        .await?;
    let name = InterfaceName::from_static_str_unchecked(interface);
    Ok(props.get_all(name).await.map_err(zbus::Error::from)?)
}

/// Reads every property of the GPU object at `path` in one round trip.
///
/// # Errors
/// When the call fails or an answer is missing or mistyped.
pub async fn read_gpu(conn: &Connection, path: &ObjectPath<'_>) -> Result<GpuInfo, ApiError> {
    GpuInfo::from_properties(get_all(conn, path, GPU_INTERFACE).await?)
}

/// Reads every property of the partition object at `path` in one round trip.
///
/// # Errors
/// When the call fails or an answer is missing or mistyped.
pub async fn read_partition(
    conn: &Connection,
    path: &ObjectPath<'_>,
) -> Result<PartitionInfo, ApiError> {
    PartitionInfo::from_properties(get_all(conn, path, PARTITION_INTERFACE).await?)
}

/// The loader check: `io.hami.AmdGpu1.Loader` at `/io/hami/AmdGpu1`.
#[proxy(
    interface = "io.hami.AmdGpu1.Loader",
    default_service = "io.hami.AmdGpu1",
    default_path = "/io/hami/AmdGpu1"
)]
pub trait Loader {
    /// Which dynamic loader the entrypoint of `image` (as a pod spec names
    /// it) runs under, from containerd's content store: `(loader, glibc,
    /// digest, evidence)`, `loader` one of `glibc`, `musl`, `static`,
    /// `unknown`, `glibc` the newest `GLIBC_x.y` (e.g. `2.36`) or empty.
    ///
    /// Errors: `NotFound` (image not on the node), `NotSupported` (no
    /// containerd), `Busy` (still running: retry; or too many running),
    /// `InvalidArgument`, `Failed`, `AccessDenied`.
    fn inspect_image(&self, image: &str) -> Result<(String, String, String, String), ApiError>;

    /// As `InspectImage`, for a container its pod starts as `command`,
    /// `args`, `working_dir` and the `PATH` of its env say (each empty: the
    /// image's; `path_unknown`: the pod sets `PATH` from a source the plugin
    /// cannot read), kubelet's `$(VAR)` references expanded: the program
    /// that will run is judged (issue 38, F8). `InvalidArgument` also when
    /// they exceed the check's bounds (1,024 entries, 32 KiB).
    fn inspect_container(
        &self,
        image: &str,
        command: &[&str],
        args: &[&str],
        working_dir: &str,
        path: &str,
        path_unknown: bool,
    ) -> Result<(String, String, String, String), ApiError>;

    /// Creates `<state>/loader-hook/<pod_uid>/<key>/` (the directory
    /// Allocate mounted for a container's memory hook) with a copy of the
    /// hook in it (`hook`) or empty; returns the directory.
    ///
    /// Errors: `InvalidArgument` (UID, key), `Failed`, `AccessDenied`.
    fn stage_memory_hook(&self, pod_uid: &str, key: &str, hook: bool) -> Result<String, ApiError>;
}
