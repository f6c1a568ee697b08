//! A pod's VRAM cap as amd-gpud wrote it: the pod cgroup's `dmem.max` on
//! the fake host, read once kubelet has called PreStartContainer for every
//! container (amd-gpud writes the cap there for the plugin), one line per
//! GPU region (`drm/<BDF>/vram <bytes>`).
//!
//! On the fake host `dmem.max` is a plain file, not the kernel's: each
//! region amd-gpud writes replaces the file, so for a pod on several GPUs
//! only the last region written shows (the kernel keeps every region).

use std::{collections::BTreeMap, path::Path};

use super::report::PodReport;
use crate::fixture::cgroup::CGROUP_MOUNT;

/// Fills `report`'s `pod_cgroup` and `vram_cap` from the pod cgroup at
/// `cgroup` (absolute, on the fake host), `None` when kubelet made none.
pub fn read(cgroup: Option<&Path>, report: &mut PodReport) {
    let Some(cgroup) = cgroup else {
        report.pod_cgroup = None;
        report.vram_cap = None;
        return;
    };
    report.pod_cgroup = Some(below_mount(cgroup));
    let text = std::fs::read_to_string(cgroup.join("dmem.max")).unwrap_or_default();
    let caps = parse(&text);
    report.vram_cap = (!caps.is_empty()).then_some(caps);
}

/// The regions of a `dmem.max` text and their caps in bytes (`None`:
/// `max`, no cap); malformed lines are left out.
pub fn parse(text: &str) -> BTreeMap<String, Option<u64>> {
    text.lines()
        .filter_map(|line| {
            let (region, value) = line.trim().split_once(' ')?;
            let value = match value.trim() {
                "max" => None,
                bytes => Some(bytes.parse().ok()?),
            };
            Some((region.to_owned(), value))
        })
        .collect()
}

/// `cgroup` as a node shows it, below the cgroup mount (the whole path
/// when it is not below one).
fn below_mount(cgroup: &Path) -> String {
    let text = cgroup.display().to_string();
    let mount = format!("/{CGROUP_MOUNT}/");
    match text.find(&mount) {
        Some(at) => text[at + mount.len()..].to_owned(),
        None => text,
    }
}

/// The report's line about the pod's cap.
pub fn describe(pod: &PodReport) -> String {
    let Some(cgroup) = &pod.pod_cgroup else {
        return "VRAM cap: no pod cgroup (kubelet made none), nothing written".to_owned();
    };
    let Some(caps) = &pod.vram_cap else {
        return format!("VRAM cap: none written (dmem.max of {cgroup} is empty)");
    };
    let caps: Vec<String> = caps
        .iter()
        .map(|(region, cap)| match cap {
            Some(bytes) => format!("{region} {} MiB", bytes / (1024 * 1024)),
            None => format!("{region} max"),
        })
        .collect();
    let gpus: std::collections::BTreeSet<&str> = pod
        .containers
        .iter()
        .flat_map(|c| c.gpus.iter().map(|g| g.id.as_str()))
        .collect();
    let note = if gpus.len() > caps.len() {
        " (the fake host's dmem.max is a plain file: it keeps the last region written)"
    } else {
        ""
    };
    format!(
        "VRAM cap (dmem.max of {cgroup}, by amd-gpud): {}{note}",
        caps.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dmem_max_lines_parse_and_paths_show_below_the_mount() {
        let caps = parse("drm/0000:05:00.0/vram 4294967296\ndrm/0000:06:00.0/vram max\nbad\n");
        assert_eq!(caps.len(), 2);
        assert_eq!(caps["drm/0000:05:00.0/vram"], Some(4_294_967_296));
        assert_eq!(caps["drm/0000:06:00.0/vram"], None);
        let path = Path::new("/dev/shm/x/root/sys/fs/cgroup/kubepods.slice/pod.slice");
        assert_eq!(below_mount(path), "kubepods.slice/pod.slice");
    }
}
