//! Bounded reads of small host files, and each GPU's own use from its PCI
//! device directory (amdgpu's `mem_info_vram_used`, `gpu_busy_percent`, and
//! hwmon's `temp1_input`, `power1_average`/`power1_input`;
//! torvalds/linux:Documentation/gpu/amdgpu/thermal.rst).

use std::{fs, io::Read, path::Path};

use ipc::usage::GpuUse;

use crate::HostPaths;

/// Largest small file read (a cgroup file, a sysfs value), bytes.
pub(crate) const MAX_FILE: u64 = 4096;
/// hwmon directories looked at per GPU.
const MAX_HWMON: usize = 8;

/// The first [`MAX_FILE`] bytes of `path` as text; `None` when unreadable.
pub(crate) fn read_small(path: &Path) -> Option<String> {
    let mut text = String::new();
    crate::deadline::reading(path);
    fs::File::open(path)
        .ok()?
        .take(MAX_FILE)
        .read_to_string(&mut text)
        .ok()?;
    Some(text)
}

/// A decimal number file.
pub(crate) fn read_u64(path: &Path) -> Option<u64> {
    read_small(path)?.trim().parse().ok()
}

fn signed(value: Option<u64>) -> i64 {
    value.and_then(|v| i64::try_from(v).ok()).unwrap_or(-1)
}

/// The use of the GPU at `bdf`, from sysfs; -1 for what it does not show.
pub(crate) fn gpu_use(paths: &HostPaths, bdf: &str) -> GpuUse {
    let dir = paths.pci_device(bdf);
    let hwmon = first_hwmon(&dir.join("hwmon"));
    let in_hwmon = |name: &str| hwmon.as_ref().and_then(|h| read_u64(&h.join(name)));
    let power = in_hwmon("power1_average").or_else(|| in_hwmon("power1_input"));
    GpuUse {
        bdf: bdf.to_owned(),
        vram_used_bytes: signed(read_u64(&dir.join("mem_info_vram_used"))),
        busy_percent: signed(read_u64(&dir.join("gpu_busy_percent"))),
        temperature_millicelsius: signed(in_hwmon("temp1_input")),
        power_microwatts: signed(power),
        source: "sysfs".to_owned(),
    }
}

/// The first `hwmon<N>` directory (by name) under `dir`.
fn first_hwmon(dir: &Path) -> Option<std::path::PathBuf> {
    crate::deadline::reading(dir);
    let mut names: Vec<String> = fs::read_dir(dir)
        .ok()?
        .filter_map(Result::ok)
        .take(MAX_HWMON)
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with("hwmon"))
        .collect();
    names.sort();
    names.first().map(|n| dir.join(n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sysfs_values_and_what_is_missing() {
        let tmp = tempfile::tempdir().unwrap();
        let paths = HostPaths::under(tmp.path());
        let dir = paths.pci_device("0000:05:00.0");
        fs::create_dir_all(dir.join("hwmon/hwmon3")).unwrap();
        fs::write(dir.join("mem_info_vram_used"), "1048576\n").unwrap();
        fs::write(dir.join("gpu_busy_percent"), "42\n").unwrap();
        fs::write(dir.join("hwmon/hwmon3/temp1_input"), "51000\n").unwrap();
        fs::write(dir.join("hwmon/hwmon3/power1_input"), "150000000\n").unwrap();
        let got = gpu_use(&paths, "0000:05:00.0");
        assert_eq!(got.vram_used_bytes, 1_048_576);
        assert_eq!(got.busy_percent, 42);
        assert_eq!(got.temperature_millicelsius, 51_000);
        assert_eq!(got.power_microwatts, 150_000_000);
        fs::write(dir.join("gpu_busy_percent"), "x".repeat(10_000)).unwrap();
        let none = gpu_use(&paths, "0000:06:00.0");
        assert_eq!((none.vram_used_bytes, none.power_microwatts), (-1, -1));
        assert_eq!(gpu_use(&paths, "0000:05:00.0").busy_percent, -1);
    }
}
