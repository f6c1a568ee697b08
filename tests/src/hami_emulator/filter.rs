//! HAMi's Filter for AMD (hami-protocol §1.2, §3.2, §4.2): the node's devices
//! from `hami.io/node-amd-register`, their usage rebuilt from the pods'
//! `hami.io/amd-devices-allocated`, and for each AMD container the devices
//! that fit, in HAMi's order, as [`Grant`]s.
//!
//! Per container: the devices whose `type` contains `amd` are scored (slots,
//! CUs and memory in use after the request, as fractions), sorted ascending
//! for `binpack` and descending for `spread`, and scanned from the end. A
//! device is skipped, with HAMi's reason, when it is unhealthy
//! (`CardUnhealthy`), filtered out by type or UUID (`CardTypeMismatch`,
//! `CardUuidMismatch`), full (`Used >= Count`: `CardTimeSlicingExhausted`),
//! used at all under `mutex` (`ExclusiveDeviceAllocateConflict`), short of
//! memory (`CardInsufficientMemory`) or of CUs (`CardInsufficientCore`).
//! Memory asked is `gpumem` or the whole device; CUs are `devcore × pct /
//! 100`, clamped to `[1, devcore]`. A grant adds one slot, its memory and CUs
//! to the device before the next container is placed.
//!
//! Not modelled: the `numa` policy, node scoring across nodes, and the
//! collapse of init-container usage (every entry of a pod counts).

use std::fmt;

use serde::Deserialize;
use serde_json::Value;

use super::{
    Grant,
    request::{ContainerRequest, GpuPolicy, RequestError, Selection},
};

/// The node annotation HAMi reads.
pub const REGISTER_KEY: &str = "hami.io/node-amd-register";
/// HAMi's usage record on each pod.
pub const ALLOCATED_KEY: &str = "hami.io/amd-devices-allocated";
/// The node a pod was placed on by HAMi.
pub const VGPU_NODE_KEY: &str = "hami.io/vgpu-node";

/// One device of the register annotation, decoded as Go's `encoding/json`
/// would into `DeviceInfo` (absent keys are zero values: `health` false).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct NodeDevice {
    pub id: String,
    pub index: u32,
    pub count: i32,
    pub devmem: i32,
    pub devcore: i32,
    #[serde(rename = "type")]
    pub device_type: String,
    pub numa: i64,
    pub mode: String,
    pub health: bool,
}

/// What the scheduler counts as used on one device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Containers sharing it.
    pub used: i64,
    pub mem_mib: i64,
    pub cores: i64,
}

/// A device and its usage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceUsage {
    pub device: NodeDevice,
    pub usage: Usage,
}

/// Why one device did not take a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CardReason {
    Unhealthy,
    TypeMismatch { device_type: String },
    UuidMismatch,
    TimeSlicingExhausted { used: i64, count: i32 },
    ExclusiveConflict { used: i64 },
    InsufficientMemory { free: i64, asked: i64 },
    InsufficientCore { free: i64, asked: i64 },
}

impl CardReason {
    /// HAMi's reason constant.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Unhealthy => "CardUnhealthy",
            Self::TypeMismatch { .. } => "CardTypeMismatch",
            Self::UuidMismatch => "CardUuidMismatch",
            Self::TimeSlicingExhausted { .. } => "CardTimeSlicingExhausted",
            Self::ExclusiveConflict { .. } => "ExclusiveDeviceAllocateConflict",
            Self::InsufficientMemory { .. } => "CardInsufficientMemory",
            Self::InsufficientCore { .. } => "CardInsufficientCore",
        }
    }
}

/// One device skipped for one container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CardRejection {
    pub id: String,
    pub reason: CardReason,
}

impl fmt::Display for CardRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} on {}", self.reason.name(), self.id)?;
        match &self.reason {
            CardReason::Unhealthy | CardReason::UuidMismatch => Ok(()),
            CardReason::TypeMismatch { device_type } => write!(f, ": type {device_type:?}"),
            CardReason::TimeSlicingExhausted { used, count } => {
                write!(f, ": {used} of {count} slots used")
            }
            CardReason::ExclusiveConflict { used } => {
                write!(f, ": mutex asked, {used} container(s) on it")
            }
            CardReason::InsufficientMemory { free, asked } => {
                write!(f, ": {free} MiB free, {asked} asked")
            }
            CardReason::InsufficientCore { free, asked } => {
                write!(f, ": {free} CUs free, {asked} asked")
            }
        }
    }
}

/// Why HAMi would not place the pod on the node.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FilterError {
    #[error("the manifest is not a Pod: {message}")]
    BadPod { message: String },
    #[error(transparent)]
    Request(#[from] RequestError),
    #[error(
        "the pod asks for no {}: HAMi leaves it to other schedulers",
        super::request::GPU
    )]
    NoAmdRequest,
    #[error("node {node} carries no {REGISTER_KEY}: the plugin has not registered it")]
    NotRegistered { node: String },
    #[error("node {node}: {REGISTER_KEY} does not decode as a DeviceInfo list: {message}")]
    BadRegister { node: String, message: String },
    #[error(
        "container {container} asks for {asked} GPU(s), node {node} has {have} AMD device(s) \
         (NodeInsufficientDevice)"
    )]
    TooFewDevices {
        node: String,
        container: String,
        asked: u32,
        have: usize,
    },
    #[error("container {container}: {found} of {asked} GPU(s) fit ({}): {}",
            summary(.rejections, *.found, *.considered), details(.rejections))]
    NoFit {
        container: String,
        asked: u32,
        found: u32,
        /// Devices scanned (the node's AMD devices).
        considered: usize,
        rejections: Vec<CardRejection>,
    },
}

impl FilterError {
    /// The message without the per-device details of [`Self::NoFit`].
    pub fn summary(&self) -> String {
        match self {
            Self::NoFit {
                container,
                asked,
                found,
                considered,
                rejections,
            } => format!(
                "container {container}: {found} of {asked} GPU(s) fit ({})",
                summary(rejections, *found, *considered)
            ),
            other => other.to_string(),
        }
    }
}

/// HAMi's `GenReason`: `"<n>/<total> <Reason>"` per reason, comma-separated.
fn summary(rejections: &[CardRejection], found: u32, considered: usize) -> String {
    let mut counts: Vec<(&'static str, usize)> = Vec::new();
    for r in rejections {
        match counts.iter_mut().find(|(name, _)| *name == r.reason.name()) {
            Some((_, n)) => *n += 1,
            None => counts.push((r.reason.name(), 1)),
        }
    }
    let mut parts: Vec<String> = counts
        .iter()
        .map(|(name, n)| format!("{n}/{considered} {name}"))
        .collect();
    if found > 0 {
        parts.push(format!(
            "{found}/{considered} AllocatedCardsInsufficientRequest"
        ));
    }
    parts.join(", ")
}

fn details(rejections: &[CardRejection]) -> String {
    rejections
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Decodes the register annotation.
///
/// # Errors
/// When it is not a JSON list of DeviceInfo objects.
pub fn decode_register(value: &str) -> Result<Vec<NodeDevice>, serde_json::Error> {
    serde_json::from_str(value)
}

/// Decodes a device-list annotation (§3.2) as HAMi's `DecodePodDevices`:
/// containers split on `;` (empty ones kept), devices on `:`, fields on `,`;
/// a piece without a comma is skipped; numbers are strict.
///
/// # Errors
/// A device with fewer than 4 fields or a bad number (the message says which).
pub fn decode_devices(value: &str) -> Result<Vec<Vec<Grant>>, String> {
    let mut containers = Vec::new();
    for container in value.split(';') {
        let mut devices = Vec::new();
        for device in container.split(':').filter(|d| d.contains(',')) {
            let fields: Vec<&str> = device.split(',').collect();
            let [id, device_type, mem, cus, ..] = fields.as_slice() else {
                return Err(format!("device {device:?} has fewer than 4 fields"));
            };
            let number = |s: &str| {
                s.parse::<u32>()
                    .map_err(|e| format!("device {device:?}: {s:?}: {e}"))
            };
            devices.push(Grant {
                id: (*id).to_owned(),
                device_type: (*device_type).to_owned(),
                mem_mib: number(mem)?,
                cus: number(cus)?,
            });
        }
        containers.push(devices);
    }
    Ok(containers)
}

/// The node's devices with the usage of every non-terminal pod HAMi placed on
/// `node` (`hami.io/vgpu-node`), from their allocated annotation. Entries of
/// unknown ids and pods whose annotation does not decode are ignored, as HAMi
/// does (it logs them).
pub fn node_usage<'a>(
    devices: &[NodeDevice],
    node: &str,
    pods: impl IntoIterator<Item = &'a Value>,
) -> Vec<DeviceUsage> {
    let mut out: Vec<DeviceUsage> = devices
        .iter()
        .map(|d| DeviceUsage {
            device: d.clone(),
            usage: Usage::default(),
        })
        .collect();
    for pod in pods {
        let annotations = &pod["metadata"]["annotations"];
        let phase = pod["status"]["phase"].as_str().unwrap_or("");
        if annotations[VGPU_NODE_KEY] != node || matches!(phase, "Succeeded" | "Failed") {
            continue;
        }
        let Some(Ok(containers)) = annotations[ALLOCATED_KEY].as_str().map(decode_devices) else {
            continue;
        };
        for grant in containers.iter().flatten() {
            if let Some(d) = out.iter_mut().find(|d| d.device.id == grant.id) {
                d.usage.used += 1;
                d.usage.mem_mib += i64::from(grant.mem_mib);
                d.usage.cores += i64::from(grant.cus);
            }
        }
    }
    out
}

/// CUs HAMi grants for `pct` percent of `devcore`: rounded down, at least 1,
/// at most the device.
pub fn cores_for(devcore: i32, pct: u32) -> i64 {
    let total = i64::from(devcore);
    (total * i64::from(pct) / 100).clamp(1, total.max(1))
}

/// Places every request on `devices` (updating their usage), in order; the
/// grants per container.
///
/// # Errors
/// The first container that does not fit, with every device's reason.
pub fn fit(
    node: &str,
    devices: &mut [DeviceUsage],
    requests: &[ContainerRequest],
    selection: &Selection,
) -> Result<Vec<Vec<Grant>>, FilterError> {
    if requests.is_empty() {
        return Err(FilterError::NoAmdRequest);
    }
    let mut grants = Vec::with_capacity(requests.len());
    for request in requests {
        let taken = fit_container(node, devices, request, selection)?;
        let mut container = Vec::with_capacity(taken.len());
        for (i, grant) in taken {
            let usage = &mut devices[i].usage;
            usage.used += 1;
            usage.mem_mib += i64::from(grant.mem_mib);
            usage.cores += i64::from(grant.cus);
            container.push(grant);
        }
        grants.push(container);
    }
    Ok(grants)
}

/// The devices (index into `devices`, grant) one container gets.
fn fit_container(
    node: &str,
    devices: &[DeviceUsage],
    request: &ContainerRequest,
    selection: &Selection,
) -> Result<Vec<(usize, Grant)>, FilterError> {
    let amd: Vec<usize> = (0..devices.len())
        .filter(|&i| devices[i].device.device_type.to_lowercase().contains("amd"))
        .collect();
    if usize::try_from(request.nums).map_or(true, |n| n > amd.len()) {
        return Err(FilterError::TooFewDevices {
            node: node.to_owned(),
            container: request.container.clone(),
            asked: request.nums,
            have: amd.len(),
        });
    }
    let order = scan_order(devices, &amd, request, selection.policy);
    let mut taken = Vec::new();
    let mut rejections = Vec::new();
    for i in order {
        let d = &devices[i];
        match check(d, request, selection) {
            Ok(grant) => taken.push((i, grant)),
            Err(reason) => rejections.push(CardRejection {
                id: d.device.id.clone(),
                reason,
            }),
        }
        if taken.len() == usize::try_from(request.nums).unwrap_or(usize::MAX) {
            return Ok(taken);
        }
    }
    Err(FilterError::NoFit {
        container: request.container.clone(),
        asked: request.nums,
        found: u32::try_from(taken.len()).unwrap_or(u32::MAX),
        considered: amd.len(),
        rejections,
    })
}

/// The AMD devices in the order HAMi's `Fit` tries them: sorted by score
/// (ascending for binpack, descending for spread; ties keep register order),
/// then scanned from the end.
fn scan_order(
    devices: &[DeviceUsage],
    amd: &[usize],
    request: &ContainerRequest,
    policy: GpuPolicy,
) -> Vec<usize> {
    let mut scored: Vec<(usize, f64)> = amd
        .iter()
        .map(|&i| (i, score(&devices[i], request)))
        .collect();
    scored.sort_by(|a, b| {
        let ord = a.1.total_cmp(&b.1);
        match policy {
            GpuPolicy::Binpack => ord,
            GpuPolicy::Spread => ord.reverse(),
        }
    });
    scored.into_iter().rev().map(|(i, _)| i).collect()
}

/// How full the device would be with the request: slots, CUs and memory as
/// fractions of the device, added.
fn score(d: &DeviceUsage, request: &ContainerRequest) -> f64 {
    let fraction = |used: i64, total: i32| {
        if total > 0 {
            // Precision is irrelevant for an ordering.
            used as f64 / f64::from(total)
        } else {
            1.0
        }
    };
    let mem = request
        .mem_mib
        .map_or(i64::from(d.device.devmem), i64::from);
    let cores = cores_for(d.device.devcore, request.cores_pct);
    fraction(d.usage.used + 1, d.device.count)
        + fraction(d.usage.cores + cores, d.device.devcore)
        + fraction(d.usage.mem_mib + mem, d.device.devmem)
}

/// HAMi's per-device checks, in its order.
fn check(
    d: &DeviceUsage,
    request: &ContainerRequest,
    selection: &Selection,
) -> Result<Grant, CardReason> {
    let (dev, usage) = (&d.device, &d.usage);
    if !dev.health {
        return Err(CardReason::Unhealthy);
    }
    if !selection.type_ok(&dev.device_type) {
        return Err(CardReason::TypeMismatch {
            device_type: dev.device_type.clone(),
        });
    }
    if !selection.uuid_ok(&dev.id) {
        return Err(CardReason::UuidMismatch);
    }
    if usage.used >= i64::from(dev.count) {
        return Err(CardReason::TimeSlicingExhausted {
            used: usage.used,
            count: dev.count,
        });
    }
    if selection.mutex && usage.used > 0 {
        return Err(CardReason::ExclusiveConflict { used: usage.used });
    }
    let mem = request.mem_mib.map_or(i64::from(dev.devmem), i64::from);
    let free_mem = i64::from(dev.devmem) - usage.mem_mib;
    if free_mem < mem {
        return Err(CardReason::InsufficientMemory {
            free: free_mem,
            asked: mem,
        });
    }
    let cores = if dev.devcore > 0 {
        cores_for(dev.devcore, request.cores_pct)
    } else {
        1
    };
    let free_cores = i64::from(dev.devcore) - usage.cores;
    if free_cores < cores {
        return Err(CardReason::InsufficientCore {
            free: free_cores,
            asked: cores,
        });
    }
    Ok(Grant {
        id: dev.id.clone(),
        device_type: dev.device_type.clone(),
        mem_mib: u32::try_from(mem).unwrap_or(0),
        cus: u32::try_from(cores).unwrap_or(0),
    })
}

#[cfg(test)]
#[path = "filter_tests.rs"]
mod tests;
