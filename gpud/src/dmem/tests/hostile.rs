//! Hostile input and failure modes: each refused with the right kind of
//! error, and (except where the kernel is the one refusing) nothing in the
//! host root touched.

use std::os::unix::fs::symlink;

use super::{limits, line};
use crate::dmem::{testutil::*, *};

/// Runs `call` on `tree` and checks it fails with `kind` and changes nothing.
fn refused(tree: &FakeTree, uid: &str, limits: &BTreeMap<String, u64>, kind: Kind) -> DmemError {
    let recording = Recording::default();
    let dmem = tree.dmem_with(FakeTree::config(), recording.clone());
    let before = tree.snapshot();
    let err = dmem.set_pod_limits(uid, limits).unwrap_err();
    assert_eq!(err.kind(), kind, "{err}");
    assert_eq!(*recording.writes.lock().unwrap(), [], "{err}");
    assert_eq!(diff(&before, &tree.snapshot()), [], "{err}");
    err
}

fn systemd_tree_with_pod() -> FakeTree {
    let tree = FakeTree::new(&SYSTEMD_DIRS);
    tree.pod(&format!("kubepods.slice/kubepods-pod{UID_}.slice"));
    tree
}

#[test]
fn malformed_uids_are_invalid_arguments() {
    let tree = systemd_tree_with_pod();
    let ok = limits(&[(GPU0, 1)]);
    let huge = "a".repeat(10 * 1024);
    let with_nul = format!("{}\0", &UID[..35]);
    for uid in [
        "",
        "..",
        "../../../system.slice/victim.service",
        "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1/0",
        "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e/..",
        with_nul.as_str(),
        huge.as_str(),
        &UID.to_uppercase(),
        UID_,
        "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0\n",
    ] {
        refused(&tree, uid, &ok, Kind::InvalidArgument);
    }
}

#[test]
fn unknown_or_malformed_gpu_addresses_are_invalid_arguments() {
    let tree = systemd_tree_with_pod();
    let err = refused(
        &tree,
        UID,
        &limits(&[("0000:99:00.0", 1)]),
        Kind::InvalidArgument,
    );
    assert!(err.to_string().contains("0000:99:00.0"), "{err}");
    // xe's region of that address is not an amdgpu VRAM region.
    refused(
        &tree,
        UID,
        &limits(&[("0000:00:02.0", 1)]),
        Kind::InvalidArgument,
    );
    for bad in [
        "0000:05:00.0/../..",
        "drm/0000:05:00.0/vram",
        "0000:05:00.0 1",
        "0000:05:00.0\0",
        "0000:05:00.0\n0000:26:00.0",
        "",
    ] {
        refused(&tree, UID, &limits(&[(bad, 1)]), Kind::InvalidArgument);
    }
    // One bad entry spoils the call: nothing is written for the good one.
    refused(
        &tree,
        UID,
        &limits(&[(GPU0, 1), ("0000:99:00.0", 1)]),
        Kind::InvalidArgument,
    );
    let err = refused(
        &tree,
        UID,
        &limits(&[(GPU0, CAPACITY + 1)]),
        Kind::InvalidArgument,
    );
    assert!(err.to_string().contains("exceed"), "{err}");
    refused(&tree, UID, &BTreeMap::new(), Kind::InvalidArgument);
    let many: BTreeMap<String, u64> = (0..=MAX_LIMITS).map(|i| (format!("{i}"), 1)).collect();
    refused(&tree, UID, &many, Kind::InvalidArgument);
}

#[test]
fn a_symlinked_pod_cgroup_is_refused() {
    let tree = FakeTree::new(&SYSTEMD_DIRS);
    let mount = tree.mount();
    symlink(
        "../system.slice/victim.service",
        mount.join(format!("kubepods.slice/kubepods-pod{UID_}.slice")),
    )
    .unwrap();
    let err = refused(&tree, UID, &limits(&[(GPU0, 1)]), Kind::InvalidArgument);
    assert!(err.to_string().contains("symlink"), "{err}");
    // Also when the symlink is absolute, and in a QoS class.
    let tree = FakeTree::new(&SYSTEMD_DIRS);
    let victim = tree.mount().join("system.slice/victim.service");
    symlink(
        &victim,
        tree.mount().join(format!(
            "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice"
        )),
    )
    .unwrap();
    refused(&tree, UID, &limits(&[(GPU0, 1)]), Kind::InvalidArgument);
}

#[test]
fn a_symlinked_qos_cgroup_is_refused() {
    let tree = FakeTree::new(&["kubepods.slice", "elsewhere"]);
    tree.pod(&format!("elsewhere/kubepods-burstable-pod{UID_}.slice"));
    symlink(
        "../elsewhere",
        tree.mount().join("kubepods.slice/kubepods-burstable.slice"),
    )
    .unwrap();
    refused(&tree, UID, &limits(&[(GPU0, 1)]), Kind::InvalidArgument);
}

#[test]
fn a_symlinked_kubepods_turns_the_backend_off() {
    let tree = FakeTree::new(&["elsewhere"]);
    tree.pod(&format!("elsewhere/kubepods-pod{UID_}.slice"));
    symlink("elsewhere", tree.mount().join("kubepods.slice")).unwrap();
    let err = refused(&tree, UID, &limits(&[(GPU0, 1)]), Kind::NotSupported);
    assert!(err.to_string().contains("kubepods"), "{err}");
}

#[test]
fn a_symlinked_dmem_max_is_refused() {
    let tree = FakeTree::new(&SYSTEMD_DIRS);
    let pod = tree.pod(&format!("kubepods.slice/kubepods-pod{UID_}.slice"));
    std::fs::remove_file(pod.join("dmem.max")).unwrap();
    symlink(
        tree.mount().join("system.slice/victim.service/dmem.max"),
        pod.join("dmem.max"),
    )
    .unwrap();
    refused(&tree, UID, &limits(&[(GPU0, 1)]), Kind::InvalidArgument);
}

#[test]
fn pod_cgroups_outside_kubepods_are_not_found() {
    let tree = FakeTree::new(&SYSTEMD_DIRS);
    tree.pod(&format!("system.slice/kubepods-pod{UID_}.slice"));
    tree.pod(&format!("kubepods-pod{UID_}.slice"));
    tree.pod(&format!("pod{UID}"));
    let err = refused(&tree, UID, &limits(&[(GPU0, 1)]), Kind::NotFound);
    assert!(err.to_string().contains("no cgroup for pod"), "{err}");
}

#[test]
fn a_pod_in_two_qos_classes_is_a_failure() {
    let tree = FakeTree::new(&CGROUPFS_DIRS);
    tree.pod(&format!("kubepods/pod{UID}"));
    tree.pod(&format!("kubepods/besteffort/pod{UID}"));
    refused(&tree, UID, &limits(&[(GPU0, 1)]), Kind::Failed);
}

#[test]
fn a_missing_dmem_max_is_a_failure_naming_it() {
    let tree = FakeTree::new(&CGROUPFS_DIRS);
    let pod = tree.pod(&format!("kubepods/pod{UID}"));
    std::fs::remove_file(pod.join("dmem.max")).unwrap();
    let err = refused(&tree, UID, &limits(&[(GPU0, 1)]), Kind::Failed);
    assert!(err.to_string().contains("dmem.max is missing"), "{err}");
}

#[test]
fn a_limit_that_does_not_take_is_reported() {
    let tree = FakeTree::new(&CGROUPFS_DIRS);
    tree.pod(&format!("kubepods/pod{UID}"));
    let lying = Lying {
        shown: format!("drm/{GPU0}/vram max\ndrm/{GPU1}/vram max\n"),
    };
    let dmem = tree.dmem_with(FakeTree::config(), lying);
    let err = dmem
        .set_pod_limits(UID, &limits(&[(GPU0, 1 << 30)]))
        .unwrap_err();
    assert_eq!(err.kind(), Kind::Failed);
    let text = err.to_string();
    assert!(text.contains("did not take"), "{text}");
    assert!(
        text.contains("wrote drm/0000:05:00.0/vram 1073741824"),
        "{text}"
    );
    assert!(text.contains("it reads max"), "{text}");
    assert!(matches!(
        err,
        DmemError::Write(write::WriteError::NotApplied {
            wrote: 1_073_741_824,
            ..
        })
    ));
}

#[test]
fn writes_the_kernel_refuses_are_failures_naming_file_and_line() {
    for (errno, kind) in [
        (rustix::io::Errno::INVAL, Kind::Failed),
        (rustix::io::Errno::BUSY, Kind::Failed),
        (rustix::io::Errno::NODEV, Kind::NotFound),
    ] {
        let tree = FakeTree::new(&CGROUPFS_DIRS);
        let pod = tree.pod(&format!("kubepods/burstable/pod{UID}"));
        let dmem = tree.dmem_with(
            FakeTree::config(),
            Refusing {
                errno: errno.raw_os_error(),
            },
        );
        let before = tree.snapshot();
        let err = dmem
            .set_pod_limits(UID, &limits(&[(GPU1, 42)]))
            .unwrap_err();
        assert_eq!(err.kind(), kind, "{err}");
        let text = err.to_string();
        assert!(
            text.contains(&pod.join("dmem.max").display().to_string()),
            "{text}"
        );
        if kind == Kind::Failed {
            assert!(text.contains(line(GPU1, 42).trim_end()), "{text}");
        }
        assert_eq!(diff(&before, &tree.snapshot()), []);
    }
}
