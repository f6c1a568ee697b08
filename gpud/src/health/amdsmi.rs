//! Fatal device states in an AMD SMI report.
//!
//! The probe child records every library call that failed for a device
//! ([`CallError`]); most failures mean "not supported" or "busy", a few mean
//! the device or its driver is broken. Those count as a failed health probe
//! until a later AMD SMI probe no longer reports them.

use std::collections::BTreeMap;

use crate::{
    amdsmi::report::{AmdSmiReport, CallError},
    pci::PciAddress,
};

/// Statuses that mean the device cannot be used (names without the
/// `AMDSMI_STATUS_` prefix).
pub const FATAL: &[&str] = &[
    "DRIVER_NOT_LOADED",
    "DRM_ERROR",
    "IO",
    "AMDGPU_RESTART_ERR",
    "CORRUPTED_EEPROM",
];

/// Whether `error` reports a fatal state.
pub fn is_fatal(error: &CallError) -> bool {
    FATAL.contains(&error.status_name.as_str())
}

/// The fatal states of `report` by PCI address (a GPU's, or a partition's
/// whose function carries the partition index): `<call> returned <status>`.
pub fn fatal_states(report: &AmdSmiReport) -> BTreeMap<PciAddress, String> {
    let mut states = BTreeMap::new();
    for error in report.errors.iter().filter(|e| is_fatal(e)) {
        let Some(bdf) = error.device.as_deref().and_then(|d| d.parse().ok()) else {
            continue;
        };
        states
            .entry(bdf)
            .or_insert_with(|| format!("{} returned {}", error.call, error.status_name));
    }
    states
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::amdsmi::report::LibVersion;

    fn error(device: Option<&str>, name: &str) -> CallError {
        CallError {
            call: "amdsmi_get_gpu_asic_info".into(),
            device: device.map(str::to_owned),
            status: 6,
            status_name: name.into(),
        }
    }

    #[test]
    fn only_fatal_statuses_of_known_devices_count() {
        let report = AmdSmiReport {
            library: "libamd_smi.so".into(),
            version: LibVersion {
                year: None,
                major: 26,
                minor: 0,
                release: 0,
                build: None,
            },
            layout: "7.0".into(),
            processors: vec![],
            errors: vec![
                error(Some("0000:05:00.0"), "NOT_SUPPORTED"),
                error(Some("0000:05:00.0"), "DRM_ERROR"),
                error(Some("0000:05:00.0"), "IO"),
                error(Some("socket 0 processor 1"), "IO"),
                error(None, "DRIVER_NOT_LOADED"),
            ],
            profile_switch: None,
            usage: None,
        };
        let states = fatal_states(&report);
        assert_eq!(states.len(), 1);
        let bdf: PciAddress = "0000:05:00.0".parse().unwrap();
        assert_eq!(states[&bdf], "amdsmi_get_gpu_asic_info returned DRM_ERROR");
    }
}
