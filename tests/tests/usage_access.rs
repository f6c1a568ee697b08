//! Who may call `GetUsage`: root and the plugin's UID; any other UID is
//! refused by the shipped bus policy and, under a policy that lets it
//! through, by the method's own UID check. Needs root.

// An integration-test file is itself the test module, and a failed unwrap is a
// failed test here.
#![allow(clippy::tests_outside_test_module, clippy::unwrap_used)]

mod common;

use tests::{
    bus::{self, OTHER_UID, PLUGIN_UID, Policy, PrivateBus},
    stack,
};

fn get_usage(bus: &PrivateBus, uid: u32) -> bus::RunOutput {
    let args = [
        "call",
        bus::BUS_NAME,
        ipc::ROOT_PATH,
        ipc::NODE_INTERFACE,
        "GetUsage",
    ];
    bus::busctl(bus, uid, &args).unwrap()
}

#[test]
fn root_and_the_plugin_may_read_usage_and_no_one_else() {
    if !common::can_run_bus_tests() {
        return;
    }
    bus::ensure_other_user().unwrap();
    let root = common::build_fixture("mi300x-8-spx");
    for policy in [Policy::Shipped, Policy::Relaxed] {
        let bus = PrivateBus::start(policy).unwrap();
        let _gpud = stack::gpud(&common::fake_node_exe(), &bus, root.path(), 0).unwrap();
        for uid in [0, PLUGIN_UID] {
            let out = get_usage(&bus, uid);
            assert!(out.success(), "uid {uid} under {policy:?}: {out:?}");
            // No KFD process: no container, no pod; the 8 GPUs from sysfs.
            assert!(
                out.stdout
                    .starts_with("a(sstut)a(sst)a(sxxxxs) 0 0 8 \"0000:05:00.0\" "),
                "{out:?}"
            );
        }
        let out = get_usage(&bus, OTHER_UID);
        assert!(!out.success(), "{out:?}");
        let why = match policy {
            Policy::Shipped => "access denied",
            _ => "uid 60701 may not call getusage",
        };
        assert!(
            out.stderr.to_lowercase().contains(why),
            "{policy:?}: {out:?}"
        );
    }
}
