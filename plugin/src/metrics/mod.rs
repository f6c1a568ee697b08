//! The plugin's Prometheus metrics, in a `prometheus-client` registry that
//! knows nothing of HTTP: [`server`] serves it, the rest of the plugin feeds
//! it (Allocate outcomes, the kubelet registration, the connection states, per
//! GPU values refreshed from the inventory and the pod cache at each scrape).
//!
//! | metric | type | labels |
//! | --- | --- | --- |
//! | `amdgpu_dp_gpu_health` | gauge, 1 for the current state | `gpu`, `pci_bdf`, `state` (`Healthy`, `Unhealthy`, `Missing`) |
//! | `amdgpu_dp_gpu_compute_units` | gauge | `gpu`, `pci_bdf` |
//! | `amdgpu_dp_gpu_compute_units_allocated` | gauge | `gpu`, `pci_bdf` |
//! | `amdgpu_dp_gpu_vram_bytes` | gauge | `gpu`, `pci_bdf` |
//! | `amdgpu_dp_gpu_vram_allocated_bytes` | gauge | `gpu`, `pci_bdf` |
//! | `amdgpu_dp_gpu_slots` | gauge (kubelet devices offered) | `gpu`, `pci_bdf` |
//! | `amdgpu_dp_gpu_slots_used` | gauge (containers holding the GPU) | `gpu`, `pci_bdf` |
//! | `amdgpu_dp_allocate_requests_total` | counter (one per container) | |
//! | `amdgpu_dp_allocate_errors_total` | counter | `reason` |
//! | `amdgpu_dp_allocate_duration_seconds` | histogram | |
//! | `amdgpu_dp_apiserver_connected` | gauge 0/1 | |
//! | `amdgpu_dp_gpud_connected` | gauge 0/1 | |
//! | `amdgpu_dp_kubelet_registered` | gauge 0/1 | |
//! | `amdgpu_dp_landlock_status` | gauge, 1 for the current status | `status` |

mod exporter;
pub mod hami;
pub(crate) mod server;
pub(crate) mod usage;

use std::{
    borrow::Cow,
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

pub(crate) use exporter::NodeExporter;
use ipc::Health;
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};
pub(crate) use server::Exporter;
pub use usage::Usage;
pub(crate) use usage::usage;

use crate::{inventory::Snapshot, inventory::slots_of};

/// Labels of the per-GPU series.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct GpuLabels {
    gpu: String,
    pci_bdf: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct HealthLabels {
    gpu: String,
    pci_bdf: String,
    state: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReasonLabel {
    reason: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct StatusLabel {
    status: String,
}

/// The plugin's Landlock sandbox, as the `amdgpu_dp_landlock_status` metric
/// reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LandlockStatus {
    /// No ruleset was applied (yet).
    NotApplied,
    /// The kernel has no Landlock, or refused the ruleset.
    NotEnforced,
    /// Applied with only the rights this kernel's ABI knows.
    PartiallyEnforced,
    FullyEnforced,
}

impl LandlockStatus {
    const ALL: [Self; 4] = [
        Self::NotApplied,
        Self::NotEnforced,
        Self::PartiallyEnforced,
        Self::FullyEnforced,
    ];

    /// The `status` label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::NotApplied => "not_applied",
            Self::NotEnforced => "not_enforced",
            Self::PartiallyEnforced => "partially_enforced",
            Self::FullyEnforced => "fully_enforced",
        }
    }
}

/// Health states a GPU can show.
const STATES: [Health; 3] = [Health::Healthy, Health::Unhealthy, Health::Missing];

/// Seconds: 1 ms to ~4 s, doubling. Allocate answers from caches in well
/// under a millisecond plus one or two API writes.
fn latency_buckets() -> impl Iterator<Item = f64> {
    prometheus_client::metrics::histogram::exponential_buckets(0.001, 2.0, 13)
}

/// Every metric of the plugin.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    gpu_health: Family<HealthLabels, Gauge>,
    gpu_cus: Family<GpuLabels, Gauge>,
    gpu_cus_allocated: Family<GpuLabels, Gauge>,
    gpu_vram: Family<GpuLabels, Gauge>,
    gpu_vram_allocated: Family<GpuLabels, Gauge>,
    gpu_slots: Family<GpuLabels, Gauge>,
    gpu_slots_used: Family<GpuLabels, Gauge>,
    allocate_requests: Counter,
    allocate_errors: Family<ReasonLabel, Counter>,
    allocate_duration: Histogram,
    apiserver_connected: Gauge,
    gpud_connected: Gauge,
    kubelet_registered: Gauge,
    registered: AtomicBool,
    landlock: Family<StatusLabel, Gauge>,
    /// HAMi's usage series and ours beside them.
    hami: hami::HamiMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

fn gauge(value: impl TryInto<i64>) -> i64 {
    value.try_into().unwrap_or(i64::MAX)
}

impl Metrics {
    /// Every metric registered, the Landlock status `not_applied`.
    pub fn new() -> Self {
        let mut m = Self {
            registry: Registry::default(),
            gpu_health: Family::default(),
            gpu_cus: Family::default(),
            gpu_cus_allocated: Family::default(),
            gpu_vram: Family::default(),
            gpu_vram_allocated: Family::default(),
            gpu_slots: Family::default(),
            gpu_slots_used: Family::default(),
            allocate_requests: Counter::default(),
            allocate_errors: Family::default(),
            allocate_duration: Histogram::new(latency_buckets()),
            apiserver_connected: Gauge::default(),
            gpud_connected: Gauge::default(),
            kubelet_registered: Gauge::default(),
            registered: AtomicBool::new(false),
            landlock: Family::default(),
            hami: hami::HamiMetrics::default(),
        };
        let mut registry = Registry::default();
        m.register(registry.sub_registry_with_prefix("amdgpu_dp"));
        let zone = (Cow::Borrowed("zone"), Cow::Borrowed("vGPU"));
        m.hami.register_hami(registry.sub_registry_with_label(zone));
        m.hami
            .register_ours(registry.sub_registry_with_prefix("amdgpu_dp"));
        m.registry = registry;
        m.set_landlock(LandlockStatus::NotApplied);
        m
    }

    fn register(&self, r: &mut Registry) {
        let m = self;
        r.register(
            "gpu_health",
            "Health of each GPU as amd-gpud reports it: 1 for the current state",
            m.gpu_health.clone(),
        );
        r.register(
            "gpu_compute_units",
            "Compute units of each GPU",
            m.gpu_cus.clone(),
        );
        r.register(
            "gpu_compute_units_allocated",
            "Compute units HAMi granted to the live pods on each GPU",
            m.gpu_cus_allocated.clone(),
        );
        r.register("gpu_vram_bytes", "VRAM of each GPU", m.gpu_vram.clone());
        r.register(
            "gpu_vram_allocated_bytes",
            "VRAM HAMi granted to the live pods on each GPU",
            m.gpu_vram_allocated.clone(),
        );
        r.register(
            "gpu_slots",
            "Kubelet devices offered per GPU (containers that may share it)",
            m.gpu_slots.clone(),
        );
        r.register(
            "gpu_slots_used",
            "Containers of live pods holding a share of each GPU",
            m.gpu_slots_used.clone(),
        );
        r.register(
            "allocate_requests",
            "Allocate calls from kubelet, one per container",
            m.allocate_requests.clone(),
        );
        r.register(
            "allocate_errors",
            "Allocate calls that failed, by reason",
            m.allocate_errors.clone(),
        );
        r.register(
            "allocate_duration_seconds",
            "Time to answer one container's Allocate",
            m.allocate_duration.clone(),
        );
        r.register(
            "apiserver_connected",
            "Whether the watches of the Kubernetes API server are working (1) or failing (0)",
            m.apiserver_connected.clone(),
        );
        r.register(
            "gpud_connected",
            "Whether amd-gpud answered the last inventory read over D-Bus",
            m.gpud_connected.clone(),
        );
        r.register(
            "kubelet_registered",
            "Whether the plugin is registered with kubelet",
            m.kubelet_registered.clone(),
        );
        r.register(
            "landlock_status",
            "The plugin's Landlock sandbox: 1 for the current status",
            m.landlock.clone(),
        );
    }

    /// One container's Allocate: how long it took, and the failure reason.
    pub(crate) fn record_allocate(&self, elapsed: Duration, outcome: Result<(), &str>) {
        self.allocate_requests.inc();
        self.allocate_duration.observe(elapsed.as_secs_f64());
        if let Err(reason) = outcome {
            let label = ReasonLabel {
                reason: reason.to_owned(),
            };
            self.allocate_errors.get_or_create(&label).inc();
        }
    }

    /// Whether the plugin is registered with kubelet now.
    pub(crate) fn set_kubelet_registered(&self, registered: bool) {
        self.registered.store(registered, Ordering::Relaxed);
        self.kubelet_registered.set(i64::from(registered));
    }

    pub(crate) fn kubelet_registered(&self) -> bool {
        self.registered.load(Ordering::Relaxed)
    }

    pub(crate) fn set_apiserver_connected(&self, connected: bool) {
        self.apiserver_connected.set(i64::from(connected));
    }

    /// The Landlock status (set once the sandbox is applied, at start).
    pub(crate) fn set_landlock(&self, status: LandlockStatus) {
        for s in LandlockStatus::ALL {
            let label = StatusLabel {
                status: s.label().to_owned(),
            };
            self.landlock
                .get_or_create(&label)
                .set(i64::from(s == status));
        }
    }

    /// Sets the per-GPU series (and `gpud_connected`) from the inventory and
    /// the usage by GPU id; GPUs no longer listed lose their series.
    pub fn observe_gpus(&self, snapshot: &Snapshot, split_count: u32, usage: &Usage) {
        self.gpud_connected.set(i64::from(snapshot.connected));
        for family in [
            &self.gpu_cus,
            &self.gpu_cus_allocated,
            &self.gpu_vram,
            &self.gpu_vram_allocated,
            &self.gpu_slots,
            &self.gpu_slots_used,
        ] {
            family.clear();
        }
        self.gpu_health.clear();
        for gpu in snapshot.devices() {
            let id = gpu.id.clone();
            let labels = GpuLabels {
                gpu: id.clone(),
                pci_bdf: gpu.bdf.clone(),
            };
            for state in &STATES {
                let health = HealthLabels {
                    gpu: id.clone(),
                    pci_bdf: gpu.bdf.clone(),
                    state: state.as_str().to_owned(),
                };
                let current = gpu.health == *state;
                self.gpu_health
                    .get_or_create(&health)
                    .set(i64::from(current));
            }
            let slots = slots_of(gpu, split_count);
            let used = usage.get(&id).copied().unwrap_or_default();
            let set = |family: &Family<GpuLabels, Gauge>, value: i64| {
                family.get_or_create(&labels).set(value);
            };
            set(&self.gpu_cus, i64::from(gpu.compute_units));
            set(&self.gpu_cus_allocated, gauge(used.compute_units));
            set(&self.gpu_vram, gauge(gpu.vram_bytes));
            set(&self.gpu_vram_allocated, gauge(used.vram_bytes));
            set(&self.gpu_slots, i64::from(slots));
            set(&self.gpu_slots_used, gauge(used.containers));
        }
    }

    /// Sets the usage series (HAMi's and ours) for this scrape.
    pub fn observe_usage(&self, inputs: &hami::Inputs<'_>) {
        self.hami.observe(inputs);
    }

    /// The OpenMetrics text exposition of every metric.
    ///
    /// # Errors
    /// Only when formatting fails (it writes to a `String`).
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)?;
        Ok(text)
    }
}

#[cfg(test)]
mod tests;
