//! Which pod and container a process belongs to, from its cgroup v2 path
//! (`/proc/<pid>/cgroup`, line `0::<path>`) and kubelet's pod cgroup naming
//! ([`crate::dmem::layout`]). A path is a pod's only when it is exactly the
//! cgroup kubelet makes for a valid pod UID under kubepods (any QoS class),
//! or below it; anything else (system services, a look-alike name outside
//! kubepods, a malformed UID) is no pod's.

use std::path::PathBuf;

use crate::dmem::{
    layout::{Layout, Qos},
    uid::PodUid,
};

/// Longest runtime container ID kept (containerd and CRI-O use 64 hex).
const MAX_CONTAINER_ID: usize = 128;

/// A process's pod, and its container when the path names one.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct PodRef {
    pub uid: String,
    /// Hex runtime ID; empty when the process sits in the pod cgroup itself
    /// or the container cgroup has a name of another form.
    pub container_id: String,
    /// The pod cgroup, relative to the cgroup mount.
    pub cgroup: PathBuf,
}

/// The cgroup v2 path in the text of `/proc/<pid>/cgroup`.
pub(crate) fn unified_path(text: &str) -> Option<&str> {
    text.lines().find_map(|line| line.strip_prefix("0::"))
}

/// The pod of a process in cgroup `path` (as `/proc/<pid>/cgroup` shows it),
/// under any of `layouts`.
pub(crate) fn pod_of(path: &str, layouts: &[Layout]) -> Option<PodRef> {
    let rel = path.strip_prefix('/')?;
    let parts: Vec<&str> = rel.split('/').collect();
    if parts
        .iter()
        .any(|p| p.is_empty() || *p == "." || *p == "..")
    {
        return None;
    }
    layouts.iter().find_map(|layout| pod_in(&parts, layout))
}

fn components(path: &std::path::Path) -> Vec<String> {
    path.iter()
        .map(|c| c.to_string_lossy().into_owned())
        .collect()
}

fn pod_in(parts: &[&str], layout: &Layout) -> Option<PodRef> {
    let kubepods = components(&layout.kubepods());
    if parts.len() <= kubepods.len() || parts[..kubepods.len()] != kubepods[..] {
        return None;
    }
    let rest = &parts[kubepods.len()..];
    Qos::ALL.iter().find_map(|&qos| {
        let depth = if qos == Qos::Guaranteed { 1 } else { 2 };
        let name = rest.get(depth - 1)?;
        let uid = uid_in(name)?;
        let expected = components(&layout.pod_dir(qos, &uid));
        if rest.get(..depth)? != expected.as_slice() {
            return None;
        }
        Some(PodRef {
            uid: uid.as_str().to_owned(),
            container_id: rest
                .get(depth)
                .map_or_else(String::new, |c| container_id(c)),
            cgroup: parts[..kubepods.len() + depth].iter().collect(),
        })
    })
}

/// The UID a pod cgroup name spells: `pod<uid>` or `...-pod<uid_>.slice`.
fn uid_in(name: &str) -> Option<PodUid> {
    let stem = name.strip_suffix(".slice").unwrap_or(name);
    let (_, raw) = stem.rsplit_once("pod")?;
    PodUid::parse(&raw.replace('_', "-")).ok()
}

/// The hex ID in a container cgroup name: `cri-containerd-<id>.scope`,
/// `crio-<id>.scope`, `docker-<id>.scope` or a bare `<id>`.
fn container_id(name: &str) -> String {
    let stem = name.strip_suffix(".scope").unwrap_or(name);
    let id = stem.rsplit_once('-').map_or(stem, |(_, id)| id);
    let hex = !id.is_empty()
        && id.len() <= MAX_CONTAINER_ID
        && id
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase());
    if hex { id.to_owned() } else { String::new() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dmem::layout::Driver;

    const UID: &str = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
    const CID: &str = "4e5d6c7b8a9f0e1d2c3b4a5f6e7d8c9b0a1f2e3d4c5b6a7f8e9d0c1b2a3f4e5d";

    fn both() -> Vec<Layout> {
        vec![
            Layout::new(Driver::Systemd, "/").unwrap(),
            Layout::new(Driver::Cgroupfs, "/").unwrap(),
        ]
    }

    #[test]
    fn systemd_and_cgroupfs_pods_are_found_with_their_container() {
        let u = UID.replace('-', "_");
        let systemd = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/cri-containerd-{CID}.scope"
        );
        let got = pod_of(&systemd, &both()).unwrap();
        assert_eq!(got.uid, UID);
        assert_eq!(got.container_id, CID);
        assert_eq!(
            got.cgroup,
            PathBuf::from(format!(
                "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice"
            ))
        );
        let cgroupfs = format!("/kubepods/pod{UID}/{CID}");
        let got = pod_of(&cgroupfs, &both()).unwrap();
        assert_eq!((got.uid.as_str(), got.container_id.as_str()), (UID, CID));
        let in_pod = pod_of(&format!("/kubepods/besteffort/pod{UID}"), &both()).unwrap();
        assert_eq!(in_pod.container_id, "");
    }

    #[test]
    fn paths_that_are_not_a_pods_are_no_pods() {
        let u = UID.replace('-', "_");
        for path in [
            "/system.slice/containerd.service".to_owned(),
            format!("/system.slice/kubepods-pod{u}.slice/x"),
            format!("/kubepods.slice/kubepods-burstable.slice/kubepods-pod{u}.slice/x"),
            format!("/kubepods.slice/kubepods-pod{}.slice/x", u.to_uppercase()),
            format!("/kubepods/pod{UID}/../../system.slice"),
            format!("/kubepods/notpod{UID}x"),
            "/kubepods.slice".to_owned(),
            "/kubepods/burstable".to_owned(),
            format!("kubepods/pod{UID}"),
            "/".to_owned(),
        ] {
            assert_eq!(pod_of(&path, &both()), None, "{path}");
        }
        assert_eq!(unified_path("12:memory:/a\n0::/b/c\n"), Some("/b/c"));
        assert_eq!(unified_path("12:memory:/a\n"), None);
        assert_eq!(container_id("crio-ZZ.scope"), "");
    }
}
