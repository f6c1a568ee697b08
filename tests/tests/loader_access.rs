//! Who may call the loader check's methods (`InspectImage`,
//! `StageMemoryHook`): root and the plugin's UID; any other UID is refused by
//! the shipped bus policy and, under a policy that lets it through, by the
//! method's own UID check. And what a caller that may call them cannot do: a
//! pod UID or key that spells a path outside amd-gpud's staging directory
//! is refused and creates nothing. Needs root.

// An integration-test file is itself the test module, and a failed unwrap is a
// failed test here.
#![allow(clippy::tests_outside_test_module, clippy::unwrap_used)]

mod common;

use tests::{
    bus::{self, OTHER_UID, PLUGIN_UID, Policy, PrivateBus},
    stack,
};

const LOADER: &str = bus::LOADER_INTERFACE;
const POD: &str = "0b4c6c1e-5d0e-4d3c-9a43-4b0c2f4e0a01";
const KEY: &str = "00112233aabbccdd";

fn stage(bus: &PrivateBus, uid: u32, pod: &str, key: &str) -> bus::RunOutput {
    let args = [
        "call",
        bus::BUS_NAME,
        ipc::ROOT_PATH,
        LOADER,
        "StageMemoryHook",
        "ssb",
        pod,
        key,
        "true",
    ];
    bus::busctl(bus, uid, &args).unwrap()
}

fn inspect(bus: &PrivateBus, uid: u32, image: &str) -> bus::RunOutput {
    bus::inspect_image(bus, uid, image).unwrap()
}

#[test]
fn root_and_the_plugin_may_stage_hooks_and_no_one_else() {
    if !common::can_run_bus_tests() {
        return;
    }
    bus::ensure_other_user().unwrap();
    let root = common::build_fixture("mi300x-8-spx");
    common::world::install_hook(root.path());
    let staged = root
        .path()
        .join("var/lib/amd-gpud/loader-hook")
        .join(POD)
        .join(KEY);
    for policy in [Policy::Shipped, Policy::Relaxed] {
        let bus = PrivateBus::start(policy).unwrap();
        let _gpud = stack::gpud(&common::fake_node_exe(), &bus, root.path(), 0).unwrap();
        for uid in [0, PLUGIN_UID] {
            let _ = std::fs::remove_dir_all(&staged);
            let out = stage(&bus, uid, POD, KEY);
            assert!(out.success(), "uid {uid} under {policy:?}: {out:?}");
            assert_eq!(
                std::fs::read(staged.join("libamvgpu.so")).unwrap(),
                b"placeholder"
            );
        }
        let out = stage(&bus, OTHER_UID, POD, KEY);
        assert!(!out.success(), "{out:?}");
        let why = match policy {
            Policy::Shipped => "access denied",
            _ => "uid 60701 may not call stagememoryhook",
        };
        assert!(
            out.stderr.to_lowercase().contains(why),
            "{policy:?}: {out:?}"
        );
        let out = inspect(&bus, OTHER_UID, "x");
        assert!(!out.success(), "{out:?}");
        let out = bus::inspect_container(&bus, OTHER_UID, "x", &["/static"], &[]).unwrap();
        assert!(!out.success(), "{out:?}");
        let why = match policy {
            Policy::Shipped => "access denied",
            _ => "uid 60701 may not call inspectcontainer",
        };
        assert!(
            out.stderr.to_lowercase().contains(why),
            "{policy:?}: {out:?}"
        );
    }
}

#[test]
fn the_plugin_cannot_stage_outside_the_staging_directory() {
    if !common::can_run_bus_tests() {
        return;
    }
    let root = common::build_fixture("mi300x-8-spx");
    common::world::install_hook(root.path());
    let bus = PrivateBus::start(Policy::Shipped).unwrap();
    let _gpud = stack::gpud(&common::fake_node_exe(), &bus, root.path(), 0).unwrap();
    let attempts = [
        ("../../../../etc", KEY),
        ("../../../tmp/x/0b4c6c1e-5d0e-4d3c-9a43", KEY),
        (POD, "../../../../etc/cron.d"),
        (POD, "/etc/cron.d"),
    ];
    for (pod, key) in attempts {
        let out = stage(&bus, PLUGIN_UID, pod, key);
        assert!(!out.success(), "{pod} {key}: {out:?}");
        let refused_by_check = out.stderr.contains("pod UID") || out.stderr.contains("staging key");
        assert!(refused_by_check, "{pod} {key}: {out:?}");
    }
    let staging = root.path().join("var/lib/amd-gpud/loader-hook");
    let made: Vec<_> = std::fs::read_dir(&staging)
        .map(|d| d.flatten().collect())
        .unwrap_or_default();
    assert!(made.is_empty(), "{made:?}");
    assert!(!root.path().join("etc/cron.d").exists());
    // The containerd socket amd-gpud reads is its own; none here: NotSupported.
    let out = inspect(&bus, PLUGIN_UID, "alpine");
    assert!(!out.success(), "{out:?}");
    assert!(out.stderr.contains("containerd"), "{out:?}");
    let out = bus::inspect_container(&bus, PLUGIN_UID, "alpine", &["/static"], &["-x"]).unwrap();
    assert!(out.stderr.contains("containerd"), "{out:?}");
}

/// A pod spec larger than the loader check reads is refused before anything
/// is asked of containerd, naming the bound (issue 38, F8's bounds).
#[test]
fn an_oversized_container_spec_is_refused_naming_its_bound() {
    if !common::can_run_bus_tests() {
        return;
    }
    let root = common::build_fixture("mi300x-8-spx");
    let bus = PrivateBus::start(Policy::Shipped).unwrap();
    let _gpud = stack::gpud(&common::fake_node_exe(), &bus, root.path(), 0).unwrap();
    let many = vec!["x"; 1025];
    let out = bus::inspect_container(&bus, PLUGIN_UID, "alpine", &["/bin/sh"], &many).unwrap();
    assert!(!out.success(), "{out:?}");
    assert!(
        out.stderr
            .contains("1026 entries, above the loader check's bound of 1024"),
        "{out:?}"
    );
    let long = "y".repeat(33 << 10);
    let out = bus::inspect_container(&bus, PLUGIN_UID, "alpine", &[&long], &[]).unwrap();
    assert!(
        out.stderr
            .contains("above the loader check's bound of 32768"),
        "{out:?}"
    );
}
