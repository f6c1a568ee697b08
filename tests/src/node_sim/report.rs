//! What `node-sim` found, as data: per node its register annotation and CU
//! occupancy, per pod HAMi's decision and what each container got. `--json`
//! prints it as is; [`super::render`] writes it for people.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use super::{
    admit::is_sidecar,
    node::SimNode,
    options::Mode,
    overlap::{Span, Timed},
    picture::DeviceOccupancy,
    pods::ExamplePod,
};
use crate::{
    grants::{Held, parse_id_list},
    hami_emulator::{Grant, request::ContainerRequest},
    kubelet::ContainerAllocateResponse,
};

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The private bus's policy (`Shipped` as root).
    pub bus_policy: String,
    /// HAMi's GPU policy for pods that name none.
    pub gpu_policy: String,
    pub nodes: Vec<NodeReport>,
    pub pods: Vec<PodReport>,
    /// Containers of admitted pods that hold the same CUs at the same time
    /// (the plugin's first promise broken); empty when all is well.
    pub overlaps: Vec<String>,
    /// Wall time from start to report.
    pub elapsed_ms: u64,
}

/// One simulated node.
#[derive(Debug, Clone, Serialize)]
pub struct NodeReport {
    /// Its name on the API server.
    pub name: String,
    /// The builder fixture.
    pub fixture: String,
    pub mode: Mode,
    /// The ABI of the fake AMD SMI library amd-gpud loaded; `None`: sysfs only.
    pub amdsmi: Option<String>,
    /// Devices the plugin offers kubelet.
    pub kubelet_devices: usize,
    /// Where its plugin serves HAMi's vGPU monitor series
    /// (`http://127.0.0.N:9394/metrics`); `None`: no monitor.
    pub monitor: Option<String>,
    /// The Node's taints as kubectl shows them (`key=value:Effect`): none
    /// once it is Ready, as a real scheduler needs.
    pub taints: Vec<String>,
    /// `hami.io/node-amd-register`, parsed.
    pub register: Value,
    /// Per registered device: who holds what.
    pub occupancy: Vec<DeviceOccupancy>,
}

/// One pod.
#[derive(Debug, Clone, Serialize)]
pub struct PodReport {
    pub name: String,
    pub namespace: String,
    /// The manifest it came from.
    pub file: String,
    pub description: Option<String>,
    /// The node it was tried on.
    pub node: String,
    pub mode: Mode,
    /// Its letter in the occupancy picture (scheduled and admitted pods).
    pub letter: Option<char>,
    /// Whether HAMi's Filter placed it.
    pub scheduled: bool,
    /// Why not: HAMi's reasons, with every device's.
    pub reason: Option<String>,
    /// The same without the per-device details.
    pub summary: Option<String>,
    /// Per device, when devices were tried.
    pub rejections: Vec<Rejection>,
    pub uid: Option<String>,
    /// `hami.io/bind-phase` at the end (`success` when every container got its devices).
    pub bind_phase: Option<String>,
    /// `hami.io/amd-devices-allocated` (HAMi's usage record).
    pub devices_allocated: Option<String>,
    /// `hami.io/amd-cu-allocated` (the plugin's CU record), parsed.
    pub cu_allocated: Option<Value>,
    /// The AMD containers, init containers first.
    pub containers: Vec<ContainerReport>,
    /// Its pod cgroup on the fake host, below the cgroup mount; `None`:
    /// kubelet made none (not admitted, no PreStartContainer asked for, or
    /// `node-sim/pod-cgroup: absent`).
    pub pod_cgroup: Option<String>,
    /// The pod cgroup's `dmem.max` as amd-gpud wrote it at
    /// PreStartContainer: the VRAM cap in bytes per region
    /// (`drm/<BDF>/vram`; `null`: `max`); `None`: nothing written.
    pub vram_cap: Option<BTreeMap<String, Option<u64>>>,
    /// Its init containers that are sidecars (`restartPolicy: Always`).
    #[serde(skip)]
    pub sidecars: Vec<String>,
}

/// One device HAMi's Filter skipped.
#[derive(Debug, Clone, Serialize)]
pub struct Rejection {
    pub id: String,
    /// HAMi's reason constant, e.g. `CardInsufficientMemory`.
    pub reason: String,
    pub message: String,
}

/// One AMD container.
#[derive(Debug, Clone, Serialize)]
pub struct ContainerReport {
    pub name: String,
    pub init: bool,
    pub request: RequestView,
    /// What HAMi granted, per device.
    pub grants: Vec<GrantView>,
    /// The kubelet device ids allocated.
    pub kubelet_ids: Vec<String>,
    /// Whether GetPreferredAllocation named the GPUs HAMi chose.
    pub preferred_followed_hami: bool,
    /// Per GPU of the container, in `ROCR_VISIBLE_DEVICES` order.
    pub gpus: Vec<GpuView>,
    pub envs: BTreeMap<String, String>,
    pub devices: Vec<DeviceView>,
    pub mounts: Vec<MountView>,
    pub cdi_devices: Vec<String>,
    /// PreStartContainer's outcome (amd-gpud setting the pod's VRAM caps),
    /// when kubelet called it.
    pub pre_start: Option<String>,
    /// Why Allocate failed.
    pub error: Option<String>,
    /// Why the container could not start after Allocate (PreStartContainer
    /// failed, or could not be called).
    pub start_error: Option<String>,
    /// When it ran, as far as node-sim saw it (for the overlap check).
    #[serde(skip)]
    pub span: Span,
}

/// The container's limits as HAMi read them.
#[derive(Debug, Clone, Serialize)]
pub struct RequestView {
    pub gpus: u32,
    pub cores_percent: u32,
    /// `None`: the whole device.
    pub mem_mib: Option<u32>,
}

/// One device of a grant.
#[derive(Debug, Clone, Serialize)]
pub struct GrantView {
    pub id: String,
    pub mem_mib: u32,
    pub cus: u32,
}

/// What the container sees of one GPU.
#[derive(Debug, Clone, Serialize)]
pub struct GpuView {
    pub id: String,
    /// CU ID list from `HSA_CU_MASK`; `None`: no mask (all CUs).
    pub cu_ranges: Option<String>,
    /// CUs in `cu_ranges`.
    pub cu_count: Option<u32>,
    /// `HIP_DEVICE_MEMORY_LIMIT_<i>` in MiB; `None`: no limit.
    pub vram_limit_mib: Option<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct DeviceView {
    pub container_path: String,
    pub host_path: String,
    pub permissions: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct MountView {
    pub container_path: String,
    pub host_path: String,
    pub read_only: bool,
}

impl PodReport {
    /// A pod not yet placed.
    pub fn new(pod: &ExamplePod, node: &SimNode) -> Self {
        Self::on(pod, &node.name, node.mode)
    }

    /// A pod not yet placed, to be tried on node `node` in `mode`.
    pub fn on(pod: &ExamplePod, node: &str, mode: Mode) -> Self {
        Self {
            name: pod.name.clone(),
            namespace: pod.namespace.clone(),
            file: super::shown_path(&pod.file),
            description: pod.description.clone(),
            node: node.to_owned(),
            mode,
            letter: None,
            scheduled: false,
            reason: None,
            summary: None,
            rejections: Vec::new(),
            uid: None,
            bind_phase: None,
            devices_allocated: None,
            cu_allocated: None,
            containers: Vec::new(),
            pod_cgroup: None,
            vram_cap: None,
            sidecars: sidecars(&pod.manifest),
        }
    }

    /// Placed, and every container got its devices.
    pub fn admitted(&self) -> bool {
        self.scheduled && self.containers.iter().all(|c| c.error.is_none())
    }

    /// Admitted, and every container's start went through.
    pub fn started(&self) -> bool {
        self.admitted() && self.containers.iter().all(|c| c.start_error.is_none())
    }

    /// What each container of this admitted pod holds, per device (devices
    /// named `<node>/<id>`); nothing for a pod that was not admitted.
    pub fn holds(&self) -> Vec<Held> {
        self.timed_holds().into_iter().map(|t| t.held).collect()
    }

    /// [`Self::holds`], each with when its container ran. A sidecar holds
    /// as an app container: it runs beside them.
    pub fn timed_holds(&self) -> Vec<Timed> {
        if !self.admitted() {
            return Vec::new();
        }
        let pod = format!("{}/{}", self.namespace, self.name);
        let mut held = Vec::new();
        for c in &self.containers {
            for gpu in &c.gpus {
                let held_here = Held {
                    pod: pod.clone(),
                    container: c.name.clone(),
                    init: c.init && !self.sidecars.contains(&c.name),
                    device: format!("{}/{}", self.node, gpu.id),
                    // A mask the report cannot read counts as every CU.
                    cus: gpu.cu_ranges.as_deref().and_then(|l| parse_id_list(l).ok()),
                };
                held.push(Timed {
                    held: held_here,
                    span: c.span,
                });
            }
        }
        held
    }
}

impl ContainerReport {
    /// A container HAMi granted `grants`, before kubelet's calls.
    pub fn new(request: &ContainerRequest, grants: &[Grant]) -> Self {
        Self {
            name: request.container.clone(),
            init: request.init,
            request: RequestView {
                gpus: request.nums,
                cores_percent: request.cores_pct,
                mem_mib: request.mem_mib,
            },
            grants: grants
                .iter()
                .map(|g| GrantView {
                    id: g.id.clone(),
                    mem_mib: g.mem_mib,
                    cus: g.cus,
                })
                .collect(),
            kubelet_ids: Vec::new(),
            preferred_followed_hami: false,
            gpus: Vec::new(),
            envs: BTreeMap::new(),
            devices: Vec::new(),
            mounts: Vec::new(),
            cdi_devices: Vec::new(),
            pre_start: None,
            error: None,
            start_error: None,
            span: Span::default(),
        }
    }

    /// Records Allocate's answer for kubelet ids `ids`.
    pub fn record(&mut self, ids: &[String], followed: bool, answer: &ContainerAllocateResponse) {
        self.kubelet_ids = ids.to_vec();
        self.preferred_followed_hami = followed;
        self.envs = answer
            .envs
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let masks = answer
            .envs
            .get("HSA_CU_MASK")
            .map(|m| parse_cu_mask(m))
            .unwrap_or_default();
        self.gpus = self
            .grants
            .iter()
            .enumerate()
            .map(|(i, g)| {
                let ranges = masks.get(&i).cloned();
                GpuView {
                    id: g.id.clone(),
                    cu_count: ranges.as_deref().map(count_ids),
                    cu_ranges: ranges,
                    vram_limit_mib: answer
                        .envs
                        .get(&format!("HIP_DEVICE_MEMORY_LIMIT_{i}"))
                        .and_then(|v| v.strip_suffix(['m', 'M']))
                        .and_then(|v| v.parse().ok()),
                }
            })
            .collect();
        self.devices = answer
            .devices
            .iter()
            .map(|d| DeviceView {
                container_path: d.container_path.clone(),
                host_path: d.host_path.clone(),
                permissions: d.permissions.clone(),
            })
            .collect();
        self.mounts = answer
            .mounts
            .iter()
            .map(|m| MountView {
                container_path: m.container_path.clone(),
                host_path: m.host_path.clone(),
                read_only: m.read_only,
            })
            .collect();
        self.cdi_devices = answer.cdi_devices.iter().map(|c| c.name.clone()).collect();
    }
}

/// The names of the sidecars (`restartPolicy: Always`) among the init
/// containers of `manifest`.
fn sidecars(manifest: &Value) -> Vec<String> {
    manifest["spec"]["initContainers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str())
        .filter(|name| is_sidecar(manifest, name))
        .map(str::to_owned)
        .collect()
}

/// `HSA_CU_MASK` (`i:a-b,c;j:…`) as GPU position → ID list.
pub fn parse_cu_mask(mask: &str) -> BTreeMap<usize, String> {
    mask.split(';')
        .filter_map(|set| set.split_once(':'))
        .filter_map(|(i, list)| Some((i.trim().parse().ok()?, list.trim().to_owned())))
        .collect()
}

/// How many ids an ID list (`0-3,8,10-12`) names.
pub fn count_ids(list: &str) -> u32 {
    id_ranges(list).map(|(a, b)| b.saturating_sub(a) + 1).sum()
}

/// The inclusive ranges of an ID list; malformed pieces are skipped.
pub fn id_ranges(list: &str) -> impl Iterator<Item = (u32, u32)> + '_ {
    list.split(',').filter_map(|piece| {
        let piece = piece.trim();
        match piece.split_once('-') {
            Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
            None => piece.parse().ok().map(|n| (n, n)),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An admitted pod on node `n` whose one container holds `cus` of GPU `G`.
    fn admitted(name: &str, cus: Option<&str>) -> PodReport {
        let request = ContainerRequest {
            container: "c".into(),
            init: false,
            nums: 1,
            mem_mib: None,
            cores_pct: 25,
        };
        let mut container = ContainerReport::new(&request, &[]);
        container.gpus = vec![GpuView {
            id: "G".into(),
            cu_ranges: cus.map(str::to_owned),
            cu_count: None,
            vram_limit_mib: None,
        }];
        PodReport {
            name: name.into(),
            namespace: "default".into(),
            file: "x.yaml".into(),
            description: None,
            node: "n".into(),
            mode: Mode::Cu,
            letter: None,
            scheduled: true,
            reason: None,
            summary: None,
            rejections: Vec::new(),
            uid: None,
            bind_phase: None,
            devices_allocated: None,
            cu_allocated: None,
            containers: vec![container],
            pod_cgroup: None,
            vram_cap: None,
            sidecars: Vec::new(),
        }
    }

    #[test]
    fn holds_come_from_what_containers_got_and_overlaps_are_found() {
        let a = admitted("a", Some("0-15"));
        let b = admitted("b", Some("10-25"));
        let held: Vec<Held> = [&a, &b].iter().flat_map(|p| p.holds()).collect();
        assert_eq!(held[0].device, "n/G");
        let found = crate::grants::overlaps(&held);
        assert_eq!(found.len(), 1);
        assert!(
            found[0].to_string().contains("both hold 10-15"),
            "{}",
            found[0]
        );
        let whole = admitted("w", None);
        assert_eq!(whole.holds()[0].cus, None, "no mask: the whole device");
        let mut failed = admitted("f", Some("0-15"));
        failed.containers[0].error = Some("Allocate: no".into());
        assert!(
            failed.holds().is_empty(),
            "a pod not admitted holds nothing"
        );
        failed.containers[0].error = None;
        failed.containers[0].start_error = Some("PreStartContainer failed".into());
        assert!(failed.admitted() && !failed.started());
    }

    /// `--cluster real` ran pod `a`'s init container to its end before
    /// pod `b` was created on the same CUs: no overlap. A sidecar runs
    /// beside its pod's app container: an overlap.
    #[test]
    fn only_containers_that_ran_together_overlap() {
        let mut a = admitted("a", Some("0-15"));
        a.containers[0].init = true;
        a.containers[0].span = Span {
            from: Some(10),
            ended_by: Some(20),
        };
        let mut b = admitted("b", Some("0-15"));
        b.containers[0].span.from = Some(30);
        assert_eq!(
            super::super::overlap::of_pods(&[a.clone(), b.clone()]),
            Vec::<String>::new()
        );
        a.containers[0].span.ended_by = None;
        assert_eq!(
            super::super::overlap::of_pods(&[a.clone(), b]).len(),
            1,
            "still running"
        );
        a.sidecars = vec!["c".into()];
        let mut app = a.containers[0].clone();
        app.init = false;
        app.name = "app".into();
        a.containers.push(app);
        assert_eq!(
            super::super::overlap::of_pods(&[a]).len(),
            1,
            "a sidecar beside its app"
        );
    }

    #[test]
    fn cu_masks_and_id_lists() {
        let masks = parse_cu_mask("0:0-75;1:76-151,200");
        assert_eq!(masks[&0], "0-75");
        assert_eq!(count_ids(&masks[&1]), 77);
        assert_eq!(count_ids(""), 0);
        let ranges: Vec<(u32, u32)> = id_ranges("0-3,8,x,10-12").collect();
        assert_eq!(ranges, [(0, 3), (8, 8), (10, 12)]);
    }
}
