//! The node annotation `hami.io/node-amd-register` (docs/hami-protocol.md §1).
//!
//! The value is a compact JSON array of [`DeviceInfo`] objects (§1.1), decoded
//! by HAMi with a plain `encoding/json` unmarshal. Every Go field carries
//! `omitempty`, so zero values are left out (§1.2); in particular an absent
//! `health` means *unhealthy*.

use std::collections::{BTreeMap, HashSet};

use serde::{Deserialize, Deserializer, Serialize};

use super::{HamiError, REGISTER_KEY, field_problem};

/// What the Go plugin sends as `devicevendor`; HAMi overwrites it with `AMD` (§1.2).
pub(crate) const DEVICE_VENDOR: &str = "amd";
/// The product type the Go plugin sends when AMD SMI has no market name (§1.2).
pub(crate) const UNKNOWN_TYPE: &str = "amd-gpu";

/// One GPU (or one KFD partition, §1.6) as HAMi's `DeviceInfo` JSON.
///
/// Fields are serialised in declaration order, which is the order of the
/// spec's example, so the output is stable. `migProfiles` and `migtemplate`
/// are NVIDIA-only and never sent; on input they, like any unknown key, are
/// ignored.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DeviceInfo {
    /// Stable identity, matched exactly against pod annotations; free of `,` `:` `;`.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "str::is_empty"
    )]
    pub(crate) id: String,
    /// Metrics label only (the DRM card minor in the Go plugin); `0` is omitted.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "is_zero_u32"
    )]
    pub(crate) index: u32,
    /// How many containers may share the GPU (`Used >= Count` means full).
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "is_zero_i32"
    )]
    pub(crate) count: i32,
    /// Total memory in MiB.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "is_zero_i32"
    )]
    pub(crate) devmem: i32,
    /// Total compute units (for AMD the CU count, not 100).
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "is_zero_i32"
    )]
    pub(crate) devcore: i32,
    /// Product name; must start with `AMD` (case-insensitive) and be free of `,` `:` `;`.
    #[serde(
        rename = "type",
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "str::is_empty"
    )]
    pub(crate) device_type: String,
    /// NUMA node; may be `-1`. Always written: `0` is a real node, and the
    /// spec's example carries `"numa":0`.
    #[serde(default, deserialize_with = "null_default")]
    pub(crate) numa: i64,
    /// Ignored by HAMi's AMD code, but `"mig"` gets the device marked unhealthy.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "str::is_empty"
    )]
    pub(crate) mode: String,
    /// Absent (false) means HAMi skips the device.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "is_false"
    )]
    pub(crate) health: bool,
    /// Overwritten by HAMi; the Go plugin sends [`DEVICE_VENDOR`].
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "str::is_empty"
    )]
    pub(crate) devicevendor: String,
    /// Free-form; HAMi's AMD `Fit` does not read it.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "CustomInfo::is_empty"
    )]
    pub(crate) custominfo: CustomInfo,
}

/// The `custominfo` object: `pciBDF` plus any other keys, kept sorted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct CustomInfo {
    /// PCI address, for example `0000:83:00.0`.
    #[serde(
        rename = "pciBDF",
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "str::is_empty"
    )]
    pub(crate) pci_bdf: String,
    /// Other keys, such as newer upstream's `computeQueues` or `partitionProfile`.
    #[serde(flatten)]
    pub(crate) extra: BTreeMap<String, serde_json::Value>,
}

impl CustomInfo {
    /// True when nothing would be serialised.
    pub(crate) fn is_empty(&self) -> bool {
        self.pci_bdf.is_empty() && self.extra.is_empty()
    }
}

impl DeviceInfo {
    /// Turns a raw market name into a valid `type`: separators become spaces,
    /// whitespace is collapsed, an empty name becomes [`UNKNOWN_TYPE`], and
    /// `AMD ` is prefixed unless the name already starts with `amd` in any case.
    pub(crate) fn product_type(raw: &str) -> String {
        let cleaned = raw.replace(super::SEPARATORS, " ");
        let cleaned = cleaned.split_whitespace().collect::<Vec<_>>().join(" ");
        if cleaned.is_empty() {
            UNKNOWN_TYPE.to_owned()
        } else if starts_with_amd(&cleaned) {
            cleaned
        } else {
            format!("AMD {cleaned}")
        }
    }

    /// Checks what HAMi needs of one entry (§1.2, §6.3–6.5).
    ///
    /// # Errors
    /// [`HamiError::Device`] naming the id and the reason.
    pub(crate) fn validate(&self) -> Result<(), HamiError> {
        let fail = |reason: String| {
            Err(HamiError::Device {
                id: self.id.clone(),
                reason,
            })
        };
        if let Some(problem) = field_problem(&self.id) {
            return fail(format!("id {problem}"));
        }
        if let Some(problem) = field_problem(&self.device_type) {
            return fail(format!("type {problem}"));
        }
        if !starts_with_amd(&self.device_type) {
            return fail(format!(
                "type {:?} does not start with \"AMD\" (HAMi only schedules types containing \
                 \"amd\", and its metrics need the prefix)",
                self.device_type
            ));
        }
        if self.mode.eq_ignore_ascii_case("mig") {
            return fail("mode \"mig\" gets the device marked unhealthy once used".to_owned());
        }
        for (name, value) in [
            ("count", self.count),
            ("devmem", self.devmem),
            ("devcore", self.devcore),
        ] {
            if value < 0 {
                return fail(format!("{name} {value} is negative"));
            }
        }
        Ok(())
    }
}

/// Encodes the registration value: compact JSON, fields in a fixed order.
///
/// # Errors
/// When the list is empty (HAMi ignores `[]`, §1.3), an entry fails
/// [`DeviceInfo::validate`], or two entries share an id.
pub(crate) fn register_annotation(devices: &[DeviceInfo]) -> Result<String, HamiError> {
    validate_all(devices)?;
    serde_json::to_string(devices).map_err(|e| HamiError::Json {
        annotation: REGISTER_KEY,
        reason: e.to_string(),
    })
}

#[cfg(test)]
/// Decodes a registration value and applies the same checks as the encoder.
///
/// Unknown keys are ignored and JSON `null` reads as the zero value, as in Go.
/// Unlike Go, key matching is case-sensitive and a repeated key is an error.
///
/// # Errors
/// Invalid JSON (including floats, quoted or out-of-range numbers, which fail
/// the whole array in HAMi too, §1.2), an empty array, or an invalid entry.
pub(crate) fn parse_register(s: &str) -> Result<Vec<DeviceInfo>, HamiError> {
    let devices: Vec<DeviceInfo> = serde_json::from_str(s).map_err(|e| HamiError::Json {
        annotation: REGISTER_KEY,
        reason: e.to_string(),
    })?;
    validate_all(&devices)?;
    Ok(devices)
}

fn validate_all(devices: &[DeviceInfo]) -> Result<(), HamiError> {
    if devices.is_empty() {
        return Err(HamiError::NoDevices);
    }
    let mut seen = HashSet::new();
    for device in devices {
        device.validate()?;
        if !seen.insert(device.id.as_str()) {
            return Err(HamiError::Device {
                id: device.id.clone(),
                reason: "id registered twice".to_owned(),
            });
        }
    }
    Ok(())
}

/// HAMi's metrics test: upper-cased, the type starts with `AMD` (§1.2).
fn starts_with_amd(s: &str) -> bool {
    s.get(..3).is_some_and(|p| p.eq_ignore_ascii_case("amd"))
}

/// Reads JSON `null` as the type's zero value, as Go's `encoding/json` does.
fn null_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Option::<T>::deserialize(deserializer).map(Option::unwrap_or_default)
}

fn is_zero_u32(v: &u32) -> bool {
    *v == 0
}

fn is_zero_i32(v: &i32) -> bool {
    *v == 0
}

fn is_false(v: &bool) -> bool {
    !*v
}

#[cfg(test)]
mod tests;
