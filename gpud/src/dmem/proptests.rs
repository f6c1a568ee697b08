//! Property: whatever a caller sends, no write lands outside the kubepods
//! cgroup, and only `dmem.max`/`cgroup.subtree_control` are ever written.
//!
//! One fake tree holds ordinary pods and traps: pod cgroups that are
//! symlinks (relative and absolute) to cgroups outside kubepods, a
//! `dmem.max` that is a symlink, and pod-named
//! cgroups outside kubepods. Generated calls mix the UIDs of all of them,
//! mutations of those, random UUID-shaped strings, path-like strings and
//! arbitrary text, with addresses and byte counts both sane and not.

use std::{collections::BTreeMap, os::unix::fs::symlink, path::Path};

use proptest::{
    prelude::*,
    test_runner::{Config, TestRunner},
};

use super::testutil::*;

const PODS: [&str; 6] = [
    "00000000-0000-4000-8000-000000000001",
    "00000000-0000-4000-8000-000000000002",
    "00000000-0000-4000-8000-000000000003",
    "00000000-0000-4000-8000-000000000004",
    "00000000-0000-4000-8000-000000000005",
    "0123456789abcdef0123456789abcdef",
];

fn escaped(uid: &str) -> String {
    uid.replace('-', "_")
}

/// The tree: systemd layout with traps (a symlinked QoS cgroup, which
/// refuses every lookup, is a unit test of its own).
fn trap_tree() -> FakeTree {
    let tree = FakeTree::new(&SYSTEMD_DIRS);
    let mount = tree.mount();
    let kp = mount.join("kubepods.slice");
    // 1: an ordinary Guaranteed pod; 6: an ordinary static BestEffort pod.
    tree.pod(&format!(
        "kubepods.slice/kubepods-pod{}.slice",
        escaped(PODS[0])
    ));
    tree.pod(&format!(
        "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice",
        PODS[5]
    ));
    // 2, 3: pod cgroups that are symlinks out of kubepods.
    let victim = mount.join("system.slice/victim.service");
    let link = |uid: &str| kp.join(format!("kubepods-pod{}.slice", escaped(uid)));
    symlink("../system.slice/victim.service", link(PODS[1])).unwrap();
    symlink(&victim, link(PODS[2])).unwrap();
    // 4: a Burstable pod cgroup that is a symlink to a pod-named cgroup
    // outside kubepods.
    let name = format!("kubepods-burstable-pod{}.slice", escaped(PODS[3]));
    tree.pod(&format!("system.slice/{name}"));
    symlink(
        format!("../../system.slice/{name}"),
        kp.join("kubepods-burstable.slice").join(&name),
    )
    .unwrap();
    // 5: a pod whose dmem.max is a symlink to the victim's.
    let pod = tree.pod(&format!(
        "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice",
        escaped(PODS[4])
    ));
    std::fs::remove_file(pod.join("dmem.max")).unwrap();
    symlink(victim.join("dmem.max"), pod.join("dmem.max")).unwrap();
    // Pod-named cgroups outside kubepods, for every pod.
    for uid in PODS {
        tree.pod(&format!("pod{uid}"));
        tree.pod(&format!("system.slice/kubepods-pod{}.slice", escaped(uid)));
    }
    tree
}

fn uid() -> impl Strategy<Value = String> {
    let known = prop::sample::select(PODS.to_vec()).prop_map(str::to_owned);
    let mutated = (
        prop::sample::select(PODS.to_vec()),
        any::<prop::sample::Index>(),
        prop::sample::select(vec!["/", ".", "..", "_", "\0", "A", "-", "", "/..", " "]),
    )
        .prop_map(|(uid, at, with)| {
            let at = at.index(uid.len());
            format!("{}{with}{}", &uid[..at], &uid[at + 1..])
        });
    prop_oneof![
        3 => known,
        3 => mutated,
        1 => "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
        1 => "[0-9a-f]{32}",
        2 => "(\\.\\./|\\.\\.|/|[0-9a-f_-]|\\x00|%2e|kubepods|\\.slice){0,24}",
        1 => any::<String>(),
    ]
}

fn limits() -> impl Strategy<Value = BTreeMap<String, u64>> {
    let bdf = prop_oneof![
        4 => prop::sample::select(vec![GPU0, GPU1]).prop_map(str::to_owned),
        1 => Just("0000:00:02.0".to_owned()),
        1 => "[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\\.[0-9]",
        1 => any::<String>(),
    ];
    let bytes = prop_oneof![4 => 0..=CAPACITY, 1 => any::<u64>()];
    prop::collection::btree_map(bdf, bytes, 0..4)
}

#[test]
fn no_write_lands_outside_kubepods() {
    let tree = trap_tree();
    let kubepods = tree.mount().join("kubepods.slice").canonicalize().unwrap();
    let recording = Recording::default();
    let dmem = tree.dmem_with(FakeTree::config(), recording.clone());
    assert_eq!(dmem.status().off, None);
    let before = tree.snapshot();
    let mut runner = TestRunner::new(Config {
        cases: 2000,
        failure_persistence: None,
        ..Config::default()
    });
    let applied = std::cell::Cell::new(0_u32);
    runner
        .run(&(uid(), limits()), |(uid, limits)| {
            if dmem.set_pod_limits(&uid, &limits).is_ok() {
                applied.set(applied.get() + 1);
                prop_assert!(uid == PODS[0] || uid == PODS[5], "applied for {uid:?}");
            }
            for (path, _) in recording.writes.lock().unwrap().iter() {
                prop_assert!(path.starts_with(&kubepods), "wrote {}", path.display());
                let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
                prop_assert!(
                    super::beneath::WRITABLE.contains(&name),
                    "wrote {}",
                    path.display()
                );
            }
            Ok(())
        })
        .unwrap();
    assert!(applied.get() > 0, "the generator never hit a real pod");
    let top = tree.tmp.path();
    for (path, _, _) in diff(&before, &tree.snapshot()) {
        let full = top.join(&path);
        assert!(
            full.starts_with(tree.mount().join("kubepods.slice"))
                && full.file_name() == Some(Path::new("dmem.max").as_os_str()),
            "changed: {}",
            path.display()
        );
    }
}
