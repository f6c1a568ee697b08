//! The whole path on fake cgroup trees: both drivers, every QoS class,
//! static pods, custom kubelet cgroup roots. Each test snapshots the whole
//! host root before and after and checks that exactly the expected files
//! changed, with exactly the expected content. Paths are spelled out here
//! rather than built with [`super::layout`], so that these tests check it.

mod hostile;

use std::{collections::BTreeMap, path::PathBuf};

use super::{testutil::*, *};

fn limits(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
    pairs.iter().map(|(b, n)| ((*b).to_owned(), *n)).collect()
}

fn line(bdf: &str, bytes: u64) -> String {
    format!("drm/{bdf}/vram {bytes}\n")
}

/// Sets 8 GiB on GPU0 for `uid`, whose cgroup is at `pod_rel`, and checks
/// that only `pod_rel/dmem.max` changed, to exactly the one line.
fn caps_only_the_pod(tree: &FakeTree, config: DmemConfig, uid: &str, pod_rel: &str, qos: Qos) {
    let recording = Recording::default();
    let dmem = tree.dmem_with(config, recording.clone());
    assert_eq!(dmem.status().off, None, "{:?}", dmem.status());
    let before = tree.snapshot();
    let applied = dmem
        .set_pod_limits(uid, &limits(&[(GPU0, 8 << 30)]))
        .unwrap();
    assert_eq!(applied.qos, qos);
    assert_eq!(applied.cgroup, PathBuf::from(pod_rel));
    assert_eq!(applied.outcome.written.len(), 1);
    let file = tree.mount().join(pod_rel).join("dmem.max");
    assert_eq!(
        *recording.writes.lock().unwrap(),
        [(file.clone(), line(GPU0, 8 << 30))]
    );
    let changed = diff(&before, &tree.snapshot());
    let rel = file.strip_prefix(tree.tmp.path()).unwrap().to_path_buf();
    assert_eq!(
        changed,
        [(
            rel,
            Some(Node::File(String::new())),
            Some(Node::File(line(GPU0, 8 << 30)))
        )]
    );
}

#[test]
fn systemd_driver_every_qos_class() {
    let cases = [
        (
            format!("kubepods.slice/kubepods-pod{UID_}.slice"),
            Qos::Guaranteed,
        ),
        (
            format!("kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice"),
            Qos::Burstable,
        ),
        (
            format!("kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice"),
            Qos::BestEffort,
        ),
    ];
    for (rel, qos) in cases {
        let tree = FakeTree::new(&SYSTEMD_DIRS);
        tree.pod(&rel);
        caps_only_the_pod(&tree, FakeTree::config(), UID, &rel, qos);
        assert_eq!(tree.dmem().status().driver, Some(Driver::Systemd));
    }
}

#[test]
fn cgroupfs_driver_every_qos_class() {
    let cases = [
        (format!("kubepods/pod{UID}"), Qos::Guaranteed),
        (format!("kubepods/burstable/pod{UID}"), Qos::Burstable),
        (format!("kubepods/besteffort/pod{UID}"), Qos::BestEffort),
    ];
    for (rel, qos) in cases {
        let tree = FakeTree::new(&CGROUPFS_DIRS);
        tree.pod(&rel);
        caps_only_the_pod(&tree, FakeTree::config(), UID, &rel, qos);
        assert_eq!(tree.dmem().status().driver, Some(Driver::Cgroupfs));
    }
}

#[test]
fn static_pods_under_both_drivers() {
    let tree = FakeTree::new(&SYSTEMD_DIRS);
    let rel = format!(
        "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{STATIC_UID}.slice"
    );
    tree.pod(&rel);
    caps_only_the_pod(&tree, FakeTree::config(), STATIC_UID, &rel, Qos::BestEffort);
    let tree = FakeTree::new(&CGROUPFS_DIRS);
    let rel = format!("kubepods/pod{STATIC_UID}");
    tree.pod(&rel);
    caps_only_the_pod(&tree, FakeTree::config(), STATIC_UID, &rel, Qos::Guaranteed);
}

#[test]
fn custom_cgroup_root_from_the_flags() {
    let tree = FakeTree::new(&[
        "kubelet.slice",
        "kubelet.slice/kubelet-kubepods.slice",
        "kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice",
    ]);
    let rel = format!(
        "kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/\
         kubelet-kubepods-burstable-pod{UID_}.slice"
    );
    tree.pod(&rel);
    let config = DmemConfig {
        driver: Some(Driver::Systemd),
        cgroup_root: Some("/kubelet".to_owned()),
        ..FakeTree::config()
    };
    caps_only_the_pod(&tree, config, UID, &rel, Qos::Burstable);
}

#[test]
fn custom_cgroup_root_and_driver_from_the_kubelet_config() {
    // Both kubepods forms exist at the top, which alone would be ambiguous;
    // the kubelet config settles it.
    let tree = FakeTree::new(&["kubepods.slice", "kubepods", "kubelet", "kubelet/kubepods"]);
    tree.kubelet_config(
        "kind: KubeletConfiguration\ncgroupDriver: cgroupfs\ncgroupRoot: /kubelet\n",
    );
    let rel = format!("kubelet/kubepods/pod{UID}");
    tree.pod(&rel);
    caps_only_the_pod(&tree, FakeTree::config(), UID, &rel, Qos::Guaranteed);
    let status = tree.dmem().status();
    assert_eq!(status.kubepods, Some(PathBuf::from("kubelet/kubepods")));
}

#[test]
fn a_second_identical_call_writes_nothing() {
    let tree = FakeTree::new(&CGROUPFS_DIRS);
    tree.pod(&format!("kubepods/burstable/pod{UID}"));
    let recording = Recording::default();
    let dmem = tree.dmem_with(FakeTree::config(), recording.clone());
    let want = limits(&[(GPU0, 1 << 30)]);
    dmem.set_pod_limits(UID, &want).unwrap();
    let before = tree.snapshot();
    let again = dmem.set_pod_limits(UID, &want).unwrap();
    assert_eq!(again.outcome.written, []);
    assert_eq!(again.outcome.unchanged.len(), 1);
    assert_eq!(recording.writes.lock().unwrap().len(), 1);
    assert_eq!(diff(&before, &tree.snapshot()), []);
}

#[test]
fn one_write_per_region_in_address_order() {
    let tree = FakeTree::new(&SYSTEMD_DIRS);
    let pod = tree.pod(&format!("kubepods.slice/kubepods-pod{UID_}.slice"));
    let recording = Recording::default();
    let dmem = tree.dmem_with(FakeTree::config(), recording.clone());
    let applied = dmem
        .set_pod_limits(
            UID,
            &limits(&[(GPU1, 2_000_000_000), (GPU0, 1_000_000_000)]),
        )
        .unwrap();
    assert_eq!(applied.outcome.written.len(), 2);
    let file = pod.join("dmem.max");
    assert_eq!(
        *recording.writes.lock().unwrap(),
        [
            (file.clone(), line(GPU0, 1_000_000_000)),
            (file, line(GPU1, 2_000_000_000)),
        ]
    );
}

#[test]
fn dmem_is_enabled_where_missing_and_only_there() {
    let tree = FakeTree::new(&SYSTEMD_DIRS);
    let qos = tree.mount().join("kubepods.slice/kubepods-burstable.slice");
    std::fs::write(qos.join("cgroup.subtree_control"), "cpu memory pids\n").unwrap();
    let rel = format!("kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice");
    let pod = tree.pod(&rel);
    let recording = Recording::default();
    let dmem = tree.dmem_with(FakeTree::config(), recording.clone());
    let before = tree.snapshot();
    let applied = dmem.set_pod_limits(UID, &limits(&[(GPU0, 4096)])).unwrap();
    assert_eq!(
        applied.outcome.enabled,
        [PathBuf::from("kubepods.slice/kubepods-burstable.slice")]
    );
    assert_eq!(
        *recording.writes.lock().unwrap(),
        [
            (qos.join("cgroup.subtree_control"), "+dmem".to_owned()),
            (pod.join("dmem.max"), line(GPU0, 4096)),
        ]
    );
    let changed: Vec<PathBuf> = diff(&before, &tree.snapshot())
        .into_iter()
        .map(|(p, _, _)| p)
        .collect();
    let top = |p: PathBuf| p.strip_prefix(tree.tmp.path()).unwrap().to_path_buf();
    assert_eq!(
        changed,
        [
            top(qos.join("cgroup.subtree_control")),
            top(pod.join("dmem.max"))
        ]
    );
}

#[test]
fn status_reports_regions_driver_and_kubepods() {
    let tree = FakeTree::new(&SYSTEMD_DIRS);
    let status = tree.dmem().status();
    assert_eq!(status.backend(), "on");
    assert_eq!(
        status.regions.keys().collect::<Vec<_>>(),
        [GPU0, GPU1],
        "the xe region is left out"
    );
    assert_eq!(status.regions[GPU0], CAPACITY);
    assert_eq!(status.kubepods, Some(PathBuf::from("kubepods.slice")));
}

#[test]
fn the_backend_is_off_with_the_reason() {
    let off = |tree: &FakeTree, config: DmemConfig| {
        let dmem = tree.dmem_with(config, Recording::default());
        dmem.status().backend()
    };
    let tree = FakeTree::new(&SYSTEMD_DIRS);
    let config = FakeTree::config;
    let mode_off = DmemConfig {
        mode: Mode::Off,
        ..config()
    };
    assert_eq!(off(&tree, mode_off), "off: disabled by --dmem-backend off");
    let strict = DmemConfig {
        require_cgroup2: true,
        ..config()
    };
    assert!(off(&tree, strict).contains("is not a cgroup v2 mount"));
    let mount = tree.mount();
    tree.kubelet_config("cgroupsPerQOS: false\n");
    assert!(off(&tree, config()).contains("cgroupsPerQOS: false"));
    tree.kubelet_config("cgroupDriver: cgroupfs\n");
    assert!(off(&tree, config()).contains("cannot open the kubepods cgroup"));
    tree.kubelet_config("");
    std::fs::create_dir(mount.join("kubepods")).unwrap();
    assert!(off(&tree, config()).contains("both"));
    std::fs::remove_dir(mount.join("kubepods")).unwrap();
    std::fs::write(mount.join("dmem.capacity"), "drm/0000:00:02.0/vram0 1\n").unwrap();
    assert!(off(&tree, config()).contains("no amdgpu VRAM region"));
    std::fs::write(mount.join("cgroup.controllers"), "cpu memory\n").unwrap();
    assert!(off(&tree, config()).contains("the dmem controller is not available"));
    let empty = FakeTree::new(&[]);
    assert!(off(&empty, config()).contains("no kubepods cgroup"));
}

#[test]
fn on_requires_every_part_and_a_call_sees_a_late_kubelet() {
    let tree = FakeTree::new(&[]);
    let on = DmemConfig {
        mode: Mode::On,
        ..FakeTree::config()
    };
    let dmem = tree.dmem_with(on, Recording::default());
    let err = dmem.check_required().unwrap_err();
    assert_eq!(err.kind(), Kind::NotSupported);
    assert!(err.to_string().contains("no kubepods cgroup"), "{err}");
    // kubelet comes up later: the next call detects again.
    for dir in CGROUPFS_DIRS {
        tree.cgroup(dir);
    }
    tree.pod(&format!("kubepods/besteffort/pod{UID}"));
    dmem.set_pod_limits(UID, &limits(&[(GPU1, 1)])).unwrap();
    assert_eq!(dmem.status().off, None);
    assert!(dmem.check_required().is_ok());
    assert!(!dmem.refresh(), "nothing changed since the call");
}
