//! HAMi's wire formats for AMD GPUs, as pure functions with no transport.
//!
//! Specification: `docs/hami-protocol.md`. This module covers:
//!
//! * the node annotation `hami.io/node-amd-register` (§1), in [`register`];
//! * the pod annotations `hami.io/amd-devices-to-allocate` and
//!   `hami.io/amd-devices-allocated` (§3.1–3.2, §3.6), in [`devices`];
//! * the pod annotation `hami.io/amd-cu-allocated` (§5.1), in [`cu_allocated`];
//! * which container each entry is for (§3.2), in [`containers`].
//!
//! Every parser returns a [`HamiError`] naming the annotation, the offending
//! fragment and the reason; none of them panics on any input.

pub(crate) mod containers;
pub(crate) mod cu_allocated;
pub(crate) mod devices;
pub(crate) mod register;

#[cfg(test)]
mod fuzz_tests;

pub(crate) use cu_allocated::{CuAllocated, CuList, MAX_VALUE_LEN, parse_cu_allocated};
pub(crate) use devices::{
    ContainerDevice, DevicesAnnotation, has_pending, parse_pod_devices, pop_next,
};
pub(crate) use register::{DeviceInfo, register_annotation};
#[cfg(test)]
pub(crate) use {devices::encode_pod_devices, register::parse_register};

/// Node annotation holding the JSON array of [`DeviceInfo`] (§1.1).
pub(crate) const REGISTER_KEY: &str = "hami.io/node-amd-register";
/// Pod annotation the plugin consumes, one container entry per `Allocate` (§3.1).
pub(crate) const TO_ALLOCATE_KEY: &str = "hami.io/amd-devices-to-allocate";
/// Pod annotation that is the scheduler's usage source; never modified (§3.1, §6.7).
pub(crate) const ALLOCATED_KEY: &str = "hami.io/amd-devices-allocated";
/// Pod annotation with the pod's CU occupancy per GPU (§5.1).
pub(crate) const CU_ALLOCATED_KEY: &str = "hami.io/amd-cu-allocated";

/// HAMi's separators; ids and types must not contain them (§1.2, §3.2, §6.3–6.4).
pub(crate) const SEPARATORS: [char; 3] = [',', ':', ';'];

/// Everything that can be wrong with a HAMi annotation value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum HamiError {
    /// The value is not the JSON the annotation requires.
    #[error("{annotation}: invalid JSON: {reason}")]
    Json {
        annotation: &'static str,
        reason: String,
    },
    /// A device registration that HAMi would reject or mis-handle (§1.2, §6).
    #[error("{REGISTER_KEY}: device {id:?}: {reason}")]
    Device { id: String, reason: String },
    /// The registration array is empty; HAMi ignores it and keeps stale devices (§1.3).
    #[error(
        "{REGISTER_KEY}: no devices (HAMi ignores an empty array; publish health:false instead)"
    )]
    NoDevices,
    /// A fragment of a device-list value does not follow the grammar of §3.2.
    #[error("{annotation}: container entry {container}: {fragment:?}: {reason}")]
    DeviceList {
        annotation: &'static str,
        container: usize,
        fragment: String,
        reason: String,
    },
    /// A CU list of `hami.io/amd-cu-allocated` is malformed (§5.1).
    #[error("{CU_ALLOCATED_KEY}: device {id:?}: {list:?}: {reason}")]
    CuList {
        id: String,
        list: String,
        reason: String,
    },
    /// A value longer than the plugin reads (users can write pod annotations).
    #[error("{annotation}: {len} bytes, more than the {limit} accepted")]
    TooLong {
        annotation: &'static str,
        len: usize,
        limit: usize,
    },
    /// A value holding more items than the plugin reads.
    #[error("{annotation}: {count} {what}, more than the {limit} accepted")]
    TooMany {
        annotation: &'static str,
        what: &'static str,
        count: usize,
        limit: usize,
    },
}

/// Why `s` cannot be an id or type in HAMi's `,` `:` `;`-separated formats.
fn field_problem(s: &str) -> Option<&'static str> {
    if s.is_empty() {
        Some("is empty")
    } else if s.contains(SEPARATORS) {
        Some("contains one of HAMi's separators ',' ':' ';'")
    } else {
        None
    }
}
