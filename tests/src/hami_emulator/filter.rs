//! HAMi's Filter for AMD on one node (docs/hami-protocol.md §1.2, §3.2, §4.2;
//! Project-HAMi/HAMi `pkg/scheduler/score.go`, `pkg/device/amd/device.go`):
//! the node's devices from `hami.io/node-amd-register`, their usage rebuilt
//! from the pods' `hami.io/amd-devices-allocated` ([`super::usage`]), and for
//! each AMD container the devices that fit, as [`Grant`]s.
//!
//! Each init container is fitted on its own copy of the node, and the app
//! containers one after the other on another copy that ignores the init
//! containers: an init container and an app container can get the same GPU.
//! Per container the node's devices are sorted in place ([`super::order`])
//! and the AMD ones (`type` contains `amd`) scanned from the end. A device is
//! skipped, with HAMi's reason, when it is unhealthy (`CardUnhealthy`),
//! filtered out by type or UUID (`CardTypeMismatch`, `CardUuidMismatch`),
//! full (`Used >= Count`: `CardTimeSlicingExhausted`), used at all under
//! `mutex` (`ExclusiveDeviceAllocateConflict`), short of memory
//! (`CardInsufficientMemory`) or of CUs (`CardInsufficientCore`). Memory
//! asked is `gpumem` or the whole device; CUs are `devcore × pct / 100`,
//! clamped to `[1, devcore]`. A grant adds one slot, its memory and CUs to
//! the node copy before the next container of that copy is placed.
//!
//! Not modelled: node scoring across nodes, NUMA binding (`numa-bind`), and
//! Go's unstable sort past 12 devices ([`super::order`]).

use std::fmt;

use serde::Deserialize;

use super::{
    Grant, order,
    request::{ContainerRequest, RequestError, Selection},
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

/// CUs HAMi grants for `pct` percent of `devcore`: rounded down, at least 1,
/// at most the device.
pub fn cores_for(devcore: i32, pct: u32) -> i64 {
    let total = i64::from(devcore);
    (total * i64::from(pct) / 100).clamp(1, total.max(1))
}

/// Places a pod's AMD requests (init containers first) on a node whose
/// devices are `devices`, as HAMi's `scoreNode` does: each init container on
/// a fresh copy of the node, the app containers one after the other on one
/// more copy that ignores the init containers' use. The grants per
/// container, init containers first.
///
/// # Errors
/// The first container that does not fit, with every device's reason.
pub fn fit(
    node: &str,
    devices: &[DeviceUsage],
    requests: &[ContainerRequest],
    selection: &Selection,
) -> Result<Vec<Vec<Grant>>, FilterError> {
    if requests.is_empty() {
        return Err(FilterError::NoAmdRequest);
    }
    let mut grants = Vec::with_capacity(requests.len());
    for request in requests.iter().filter(|r| r.init) {
        let mut copy = devices.to_vec();
        grants.push(fit_container(node, &mut copy, request, selection)?);
    }
    let mut apps = devices.to_vec();
    for request in requests.iter().filter(|r| !r.init) {
        grants.push(fit_container(node, &mut apps, request, selection)?);
    }
    Ok(grants)
}

/// One container's Fit on the node copy `devices`: sorted in place, scanned,
/// and the grants added to the copy's usage.
fn fit_container(
    node: &str,
    devices: &mut [DeviceUsage],
    request: &ContainerRequest,
    selection: &Selection,
) -> Result<Vec<Grant>, FilterError> {
    order::sort(devices, &selection.order);
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
    let wanted = usize::try_from(request.nums).unwrap_or(usize::MAX);
    let mut taken = Vec::new();
    let mut rejections = Vec::new();
    for &i in amd.iter().rev() {
        match check(&devices[i], request, selection) {
            Ok(grant) => taken.push((i, grant)),
            Err(reason) => rejections.push(CardRejection {
                id: devices[i].device.id.clone(),
                reason,
            }),
        }
        if taken.len() == wanted {
            break;
        }
    }
    if taken.len() < wanted {
        return Err(FilterError::NoFit {
            container: request.container.clone(),
            asked: request.nums,
            found: u32::try_from(taken.len()).unwrap_or(u32::MAX),
            considered: amd.len(),
            rejections,
        });
    }
    Ok(taken
        .into_iter()
        .map(|(i, grant)| {
            let usage = &mut devices[i].usage;
            usage.used += 1;
            usage.mem_mib += i64::from(grant.mem_mib);
            usage.cores += i64::from(grant.cus);
            grant
        })
        .collect())
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
