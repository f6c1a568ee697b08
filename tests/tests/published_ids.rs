//! Issue 20, point 1: a GPU's published ID does not change when AMD SMI is
//! missing, fails or comes back (and, issue 36, is the same when chosen
//! without it). amd-gpud first runs with the fake AMD SMI
//! (the ID is its UUID), then restarts without it: the ID stays, and so do
//! the device IDs the running plugin gives kubelet. Private bus with the shipped policy. Needs root.

// An integration-test file is itself the test module, and a failed unwrap is a
// failed test here.
#![allow(clippy::tests_outside_test_module, clippy::unwrap_used)]

mod common;

use std::{path::Path, time::Duration};

use tests::{
    bus::{Policy, PrivateBus},
    fixture::{self, BuildOptions},
    kubelet::FakeKubelet,
    stack,
};

const GPU0: &str = "0000:05:00.0";

async fn published(bus: &PrivateBus) -> ipc::types::GpuInfo {
    let conn = zbus::connection::Builder::address(bus.address.as_str())
        .unwrap()
        .build()
        .await
        .unwrap();
    ipc::proxy::read_gpu(&conn, &ipc::gpu_path(GPU0).as_ref())
        .await
        .unwrap()
}

/// Kills amd-gpud and waits until the bus has dropped its name, so that the
/// next one's is not mistaken for it.
async fn stop(gpud: &mut stack::Process, bus: &PrivateBus) {
    gpud.kill();
    while stack::name_has_owner(bus).unwrap() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn state_file(root: &Path) -> std::path::PathBuf {
    root.join("var/lib/amd-gpud/published-ids.json")
}

#[test]
fn the_published_id_survives_amd_smi_going_away() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(Duration::from_secs(120), async {
        let root = fixture::scratch_dir().unwrap();
        let spec = fixture::named("mi300x-8-spx").unwrap();
        let opts = BuildOptions {
            drm: true,
            amdsmi_abi: Some("7.0".into()),
        };
        fixture::build(&spec, root.path(), &opts).unwrap();
        let bus = PrivateBus::start(Policy::Shipped).unwrap();
        let fake_node = common::fake_node_exe();
        let library = tests::fake_amdsmi::library_for("7.0");
        let fixture = root.path().join(fixture::FIXTURE_FILE);
        let mut gpud =
            stack::gpud_with_amdsmi(&fake_node, &bus, root.path(), library, &fixture).unwrap();
        let kubelet = FakeKubelet::start().await.unwrap();
        let _plugin =
            stack::plugin(&fake_node, &bus, kubelet.dir(), ["--health-pulse", "1"]).unwrap();
        let with_smi = published(&bus).await;
        let listed = kubelet
            .wait_devices(Duration::from_secs(20), |d| d.len() == 80)
            .await
            .unwrap();
        let before: Vec<String> = listed.iter().map(|d| d.id.clone()).collect();
        assert!(
            before
                .iter()
                .any(|id| id.starts_with(&with_smi.amdsmi_uuid)),
            "{before:?}"
        );
        assert!(!with_smi.amdsmi_uuid.is_empty(), "{with_smi:?}");
        assert_eq!(with_smi.published_id, with_smi.amdsmi_uuid, "first choice");
        let text = std::fs::read_to_string(state_file(root.path())).unwrap();
        assert!(text.contains(&with_smi.amdsmi_uuid), "{text}");
        stop(&mut gpud, &bus).await;

        // AMD SMI gone: the UUID is no longer known, the ID is kept.
        let mut gpud = stack::gpud(&fake_node, &bus, root.path(), 0).unwrap();
        let without = published(&bus).await;
        assert!(without.amdsmi_uuid.is_empty(), "{without:?}");
        assert_eq!(without.published_id, with_smi.published_id);
        // The plugin reads the restarted amd-gpud (on its owner change, and
        // every 1 s pulse): kubelet's device IDs do not move.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let after: Vec<String> = kubelet.devices().iter().map(|d| d.id.clone()).collect();
        assert_eq!(after, before, "kubelet's devices keep their IDs");
        let table = plugin::testing::inventory::DeviceTable::build(
            &plugin::testing::inventory::Snapshot::from_gpud(
                std::slice::from_ref(&without),
                Default::default(),
                ipc::DmemBackend::default(),
            ),
            0,
        );
        assert!(
            table
                .slots
                .iter()
                .all(|s| s.id.starts_with(&with_smi.amdsmi_uuid)),
            "kubelet device IDs keep the first ID: {:?}",
            table.slots.first()
        );
        stop(&mut gpud, &bus).await;

        // Without the state file the ID is chosen again, and comes out the
        // same: AMD SMI's UUID computed from sysfs (issue 36, point 1).
        std::fs::remove_file(state_file(root.path())).unwrap();
        let _gpud = stack::gpud(&fake_node, &bus, root.path(), 0).unwrap();
        let fresh = published(&bus).await;
        assert!(fresh.amdsmi_uuid.is_empty(), "{fresh:?}");
        assert_eq!(fresh.published_id, with_smi.amdsmi_uuid);
        assert_ne!(fresh.published_id, fresh.rocr_uuid);
    });
}
