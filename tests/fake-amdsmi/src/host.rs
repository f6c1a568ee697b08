//! What a switch through the fake does to the fake host, when the fixture
//! names one (`host_root`): the real library writes the kernel's partition
//! file, so the fake writes the fake host's `current_compute_partition`
//! (a fake driver then re-creates the partitions, as the kernel does), and
//! it appends the call to `<host_root>/amdsmi-calls.log`, one line per
//! successful setter call, so that a test can tell which path switched.

use std::{io::Write as _, path::Path};

use crate::status;

/// The call log, relative to the host root.
pub(crate) const CALL_LOG: &str = "amdsmi-calls.log";

/// Records `call <bdf> <argument>` and writes `mode` to the GPU's
/// `current_compute_partition` when its PCI directory exists.
///
/// # Errors
/// `UNKNOWN_ERROR` when the log or the partition file cannot be written.
pub(crate) fn record_switch(
    host_root: &Path,
    call: &str,
    bdf: &str,
    argument: u32,
    mode: &str,
) -> Result<(), u32> {
    let pci = host_root.join("sys/bus/pci/devices").join(bdf);
    if pci.is_dir() {
        std::fs::write(pci.join("current_compute_partition"), format!("{mode}\n"))
            .map_err(|_| status::UNKNOWN_ERROR)?;
    }
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(host_root.join(CALL_LOG))
        .map_err(|_| status::UNKNOWN_ERROR)?;
    writeln!(log, "{call} {bdf} {argument}").map_err(|_| status::UNKNOWN_ERROR)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_switch_writes_the_partition_file_and_logs_the_call() {
        let dir = std::env::temp_dir().join(format!("fake-amdsmi-host-{}", std::process::id()));
        let pci = dir.join("sys/bus/pci/devices/0000:05:00.0");
        std::fs::create_dir_all(&pci).unwrap();
        record_switch(&dir, "amdsmi_set_x", "0000:05:00.0", 3, "CPX").unwrap();
        record_switch(&dir, "amdsmi_set_x", "0000:15:00.0", 0, "SPX").unwrap();
        let mode = std::fs::read_to_string(pci.join("current_compute_partition")).unwrap();
        assert_eq!(mode, "CPX\n");
        let log = std::fs::read_to_string(dir.join(CALL_LOG)).unwrap();
        assert_eq!(
            log,
            "amdsmi_set_x 0000:05:00.0 3\namdsmi_set_x 0000:15:00.0 0\n"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
