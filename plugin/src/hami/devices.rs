//! The pod annotations `hami.io/amd-devices-to-allocate` and
//! `hami.io/amd-devices-allocated` (docs/hami-protocol.md §3.1, §3.2, §3.6).
//!
//! ```text
//! value     := container*
//! container := device* ";"
//! device    := uuid "," type "," memMiB "," cuCount ":"
//! ```
//!
//! Every device ends with `:` and every container with `;`, the last ones
//! included; there is no escaping. The parser follows this grammar strictly,
//! so it is stricter than HAMi's decoder (which skips `:`-pieces without a
//! comma and ignores missing terminators); every value HAMi's encoder, HAMi's
//! erase and the Go plugin's erase produce is accepted.

use super::{ALLOCATED_KEY, HamiError, MAX_VALUE_LEN, TO_ALLOCATE_KEY, field_problem};

/// How an emptied container entry is written: its terminator alone (§3.6).
pub(crate) const EMPTY_ENTRY: &str = ";";

/// Largest number HAMi's `int32` fields hold.
const MAX_INT32: u32 = i32::MAX.unsigned_abs();

/// One device granted to one container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ContainerDevice {
    /// The registered `id` of the GPU.
    pub(crate) uuid: String,
    /// The registered product `type` (not the literal `AMD`).
    pub(crate) device_type: String,
    /// Memory granted, MiB.
    pub(crate) usedmem: u32,
    /// Number of CUs granted (not a percentage).
    pub(crate) usedcores: u32,
}

/// The devices of one container entry; empty for an erased or placeholder slot.
pub(crate) type ContainerDevices = Vec<ContainerDevice>;

/// Which of the two device-list annotations a value came from (for errors).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DevicesAnnotation {
    /// `hami.io/amd-devices-to-allocate`: consumed by the plugin.
    ToAllocate,
    /// `hami.io/amd-devices-allocated`: the scheduler's; never modify it.
    Allocated,
}

impl DevicesAnnotation {
    /// The annotation key.
    pub(crate) fn key(self) -> &'static str {
        match self {
            Self::ToAllocate => TO_ALLOCATE_KEY,
            Self::Allocated => ALLOCATED_KEY,
        }
    }
}

/// Decodes a device-list value into its container entries, in order, empty
/// entries kept. The empty string is zero entries.
///
/// # Errors
/// [`HamiError::DeviceList`] naming the annotation, the container entry, the
/// offending fragment and the reason; [`HamiError::TooLong`] for a value of
/// more than [`MAX_VALUE_LEN`] bytes.
pub(crate) fn parse_pod_devices(
    annotation: DevicesAnnotation,
    value: &str,
) -> Result<Vec<ContainerDevices>, HamiError> {
    let key = annotation.key();
    if value.is_empty() {
        return Ok(Vec::new());
    }
    if value.len() > MAX_VALUE_LEN {
        return Err(HamiError::TooLong {
            annotation: key,
            len: value.len(),
            limit: MAX_VALUE_LEN,
        });
    }
    let Some(body) = value.strip_suffix(';') else {
        let tail = value.rsplit(';').next().unwrap_or(value);
        let index = value.matches(';').count();
        return Err(list_error(
            key,
            index,
            tail,
            "container entry not terminated by ';'",
        ));
    };
    body.split(';')
        .enumerate()
        .map(|(index, entry)| parse_container(key, index, entry))
        .collect()
}

fn parse_container(
    key: &'static str,
    index: usize,
    entry: &str,
) -> Result<ContainerDevices, HamiError> {
    if entry.is_empty() {
        return Ok(Vec::new());
    }
    let Some(body) = entry.strip_suffix(':') else {
        let tail = entry.rsplit(':').next().unwrap_or(entry);
        return Err(list_error(key, index, tail, "device not terminated by ':'"));
    };
    body.split(':')
        .map(|device| {
            parse_device(device).map_err(|why| list_error(key, index, device, &why.to_string()))
        })
        .collect()
}

/// One device: `uuid,type,memMiB,cuCount`, then any further fields, which
/// are ignored. HAMi's decoder (Project-HAMi/HAMi:pkg/device/devices.go,
/// `DecodeContainerDevices`) refuses fewer than four and reads the first
/// four, so that a HAMi that appends a field still decodes everywhere.
fn parse_device(fragment: &str) -> Result<ContainerDevice, FieldError> {
    let mut fields = fragment.splitn(5, ',');
    let mut next = || fields.next();
    let (Some(uuid), Some(device_type), Some(mem), Some(cores)) = (next(), next(), next(), next())
    else {
        return Err(FieldError::TooFew {
            found: fragment.split(',').count(),
        });
    };
    if uuid.is_empty() {
        return Err(FieldError::Empty("uuid"));
    }
    if device_type.is_empty() {
        return Err(FieldError::Empty("type"));
    }
    Ok(ContainerDevice {
        uuid: uuid.to_owned(),
        device_type: device_type.to_owned(),
        usedmem: parse_int32("memMiB", mem)?,
        usedcores: parse_int32("cuCount", cores)?,
    })
}

/// What is wrong with one device's fields `uuid,type,memMiB,cuCount`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum FieldError {
    #[error("expected at least 4 comma-separated fields uuid,type,memMiB,cuCount, found {found}")]
    TooFew { found: usize },
    #[error("{0} is empty")]
    Empty(&'static str),
    #[error("{name} {value:?} is not a non-negative decimal integer")]
    NotDecimal { name: &'static str, value: String },
    #[error("{name} {value} exceeds {MAX_INT32}")]
    TooLarge { name: &'static str, value: String },
}

/// A non-negative decimal that fits HAMi's `int32`: ASCII digits only.
fn parse_int32(name: &'static str, s: &str) -> Result<u32, FieldError> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(FieldError::NotDecimal {
            name,
            value: s.to_owned(),
        });
    }
    match s.parse::<u32>() {
        Ok(n) if n <= MAX_INT32 => Ok(n),
        _ => Err(FieldError::TooLarge {
            name,
            value: s.to_owned(),
        }),
    }
}

fn list_error(key: &'static str, container: usize, fragment: &str, reason: &str) -> HamiError {
    HamiError::DeviceList {
        annotation: key,
        container,
        fragment: fragment.to_owned(),
        reason: reason.to_owned(),
    }
}

/// Encodes container entries; an empty entry becomes [`EMPTY_ENTRY`].
///
/// # Errors
/// When a uuid or type is empty or contains `,` `:` `;`, or a number exceeds
/// HAMi's `int32`: the value could not be decoded back.
pub(crate) fn encode_pod_devices(
    annotation: DevicesAnnotation,
    containers: &[ContainerDevices],
) -> Result<String, HamiError> {
    let mut out = String::new();
    for (index, container) in containers.iter().enumerate() {
        for device in container {
            check_encodable(annotation.key(), index, device)?;
            out.push_str(&format!(
                "{},{},{},{}:",
                device.uuid, device.device_type, device.usedmem, device.usedcores
            ));
        }
        out.push_str(EMPTY_ENTRY);
    }
    Ok(out)
}

fn check_encodable(
    key: &'static str,
    index: usize,
    device: &ContainerDevice,
) -> Result<(), HamiError> {
    for (name, field) in [("uuid", &device.uuid), ("type", &device.device_type)] {
        if let Some(problem) = field_problem(field) {
            return Err(list_error(key, index, field, &format!("{name} {problem}")));
        }
    }
    for (name, n) in [("memMiB", device.usedmem), ("cuCount", device.usedcores)] {
        if n > MAX_INT32 {
            let why = format!("{name} {n} exceeds {MAX_INT32}");
            return Err(list_error(key, index, &device.uuid, &why));
        }
    }
    Ok(())
}

/// The first entry with at least one device, and its position (§3.2: never
/// map positions to container indices; take the first non-empty entry).
pub(crate) fn first_non_empty(
    containers: &[ContainerDevices],
) -> Option<(usize, &ContainerDevices)> {
    containers.iter().enumerate().find(|(_, c)| !c.is_empty())
}

/// Removes the first non-empty entry's devices, leaving its slot empty
/// (HAMi's style: every slot kept, §3.6), and returns them with the position.
pub(crate) fn take_first_non_empty(
    containers: &mut [ContainerDevices],
) -> Option<(usize, ContainerDevices)> {
    let (index, slot) = containers
        .iter_mut()
        .enumerate()
        .find(|(_, c)| !c.is_empty())?;
    Some((index, std::mem::take(slot)))
}

/// True while some entry still holds a device; the pod is complete when the
/// re-read to-allocate value has none (§3.6).
pub(crate) fn has_pending(containers: &[ContainerDevices]) -> bool {
    first_non_empty(containers).is_some()
}

/// The whole erase step on a to-allocate value: decodes it, takes the first
/// non-empty entry, and re-encodes the rest with that entry emptied.
///
/// Returns `None` when no entry is left. For example `A:;B:;` (with full
/// devices) yields `A` and `;B:;`, which is what to patch back.
///
/// # Errors
/// When the value does not parse.
pub(crate) fn pop_next(value: &str) -> Result<Option<(ContainerDevices, String)>, HamiError> {
    let mut containers = parse_pod_devices(DevicesAnnotation::ToAllocate, value)?;
    let Some((_, taken)) = take_first_non_empty(&mut containers) else {
        return Ok(None);
    };
    let rest = encode_pod_devices(DevicesAnnotation::ToAllocate, &containers)?;
    Ok(Some((taken, rest)))
}

#[cfg(test)]
mod tests;
