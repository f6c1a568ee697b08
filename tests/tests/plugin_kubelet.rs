//! amd-device-plugin between a fake kubelet and amd-gpud on a real private
//! bus: registration, the slot list and its NUMA topology, health changes,
//! kubelet restarts, amd-gpud restarts, and GetPreferredAllocation on the
//! MI210 capture. Needs root (the bus loads the shipped policy).

// An integration-test file is itself the test module, and a failed unwrap is a
// failed test here.
#![allow(clippy::tests_outside_test_module, clippy::unwrap_used)]

mod common;

use std::{collections::BTreeSet, time::Duration};

use proto::v1beta1::Device;
use tests::{
    bus::{Policy, PrivateBus},
    fixture,
    kubelet::FakeKubelet,
    stack,
};

const WAIT: Duration = Duration::from_secs(20);

fn gpus_of(devices: &[Device]) -> BTreeSet<String> {
    devices
        .iter()
        .filter_map(|d| d.id.rsplit_once('#').map(|(g, _)| g.to_owned()))
        .collect()
}

fn numa(d: &Device) -> Option<i64> {
    d.topology
        .as_ref()
        .and_then(|t| t.nodes.first())
        .map(|n| n.id)
}

struct Stack {
    bus: PrivateBus,
    gpud: stack::Process,
    plugin: stack::Process,
    kubelet: FakeKubelet,
    root: tempfile::TempDir,
}

async fn start(root: tempfile::TempDir, extra: &[&str]) -> Stack {
    let bus = PrivateBus::start(Policy::Shipped).unwrap();
    let fake_node = common::fake_node_exe();
    let gpud = stack::gpud(&fake_node, &bus, root.path(), 0).unwrap();
    let kubelet = FakeKubelet::start().await.unwrap();
    let plugin = stack::plugin(&fake_node, &bus, kubelet.dir(), extra).unwrap();
    Stack {
        bus,
        gpud,
        plugin,
        kubelet,
        root,
    }
}

#[test]
fn registers_and_lists_slots_with_numa_for_eight_mi300x() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(Duration::from_secs(60), async {
        let s = start(common::build_fixture("mi300x-8-spx"), &[]).await;
        let reg = s.kubelet.wait_registrations(1, WAIT).await.unwrap();
        assert_eq!(reg.version, "v1beta1");
        assert_eq!(reg.resource_name, "amd.com/gpu");
        assert_eq!(reg.endpoint, "amd.com_gpu.sock");
        let devices = s
            .kubelet
            .wait_devices(WAIT, |d| d.len() == 80)
            .await
            .unwrap();
        assert_eq!(gpus_of(&devices).len(), 8);
        assert!(devices.iter().all(|d| d.health == "Healthy"));
        let on_numa1 = devices.iter().filter(|d| numa(d) == Some(1)).count();
        assert_eq!(on_numa1, 40, "GPUs 4..7 sit on NUMA node 1");
        assert!(devices.iter().all(|d| numa(d).is_some()));
        let options = s.kubelet.options().await.unwrap();
        assert!(options.get_preferred_allocation_available);
        let refused = s
            .kubelet
            .allocate(vec![devices[0].id.clone()])
            .await
            .unwrap_err();
        assert!(refused.message().contains("--kube none"), "{refused:?}");
        drop(s);
    });
}

#[test]
fn radeon_slots_follow_the_gfx_generation() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(Duration::from_secs(60), async {
        let s = start(common::build_fixture("rx9070xt-igpu"), &[]).await;
        // gfx1201 gets 2 slots; the gfx1036 iGPU would get 10, but its 2 CUs
        // are one WGP: one slot.
        let devices = s
            .kubelet
            .wait_devices(WAIT, |d| d.len() == 3)
            .await
            .unwrap();
        assert_eq!(gpus_of(&devices).len(), 2);
        assert!(devices.iter().all(|d| numa(d) == Some(0)));
        drop(s);
        let s = start(
            common::build_fixture("rx9070xt-igpu"),
            &["--split-count", "4"],
        )
        .await;
        s.kubelet
            .wait_devices(WAIT, |d| d.len() == 4 + 1)
            .await
            .unwrap();
    });
}

#[test]
fn a_vanished_gpu_turns_its_slots_unhealthy() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(Duration::from_secs(60), async {
        let s = start(common::build_fixture("mi300x-8-spx"), &[]).await;
        s.kubelet
            .wait_devices(WAIT, |d| d.len() == 80)
            .await
            .unwrap();
        // KFD node 9 is the last GPU of mi300x-8-spx.
        std::fs::remove_dir_all(s.root.path().join("sys/class/kfd/kfd/topology/nodes/9")).unwrap();
        stack::rescan(&s.bus).unwrap();
        let devices = s
            .kubelet
            .wait_devices(WAIT, |d| {
                d.iter().filter(|x| x.health != "Healthy").count() == 10
            })
            .await
            .unwrap();
        assert_eq!(devices.len(), 80, "still listed, as unhealthy");
    });
}

/// 20 restarts of the fake kubelet: the plugin registers again after each
/// and lists its 80 devices. How long it takes is printed, not asserted
/// (a shared machine under load is slow): the limit only catches a plugin
/// that never comes back.
#[test]
fn twenty_kubelet_restarts_each_end_in_a_new_registration() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(Duration::from_secs(900), async {
        let mut s = start(common::build_fixture("mi300x-8-spx"), &[]).await;
        s.kubelet.wait_registrations(1, WAIT).await.unwrap();
        let limit = Duration::from_secs(30);
        for round in 2..=21 {
            s.kubelet.restart().await.unwrap();
            let started = std::time::Instant::now();
            s.kubelet
                .wait_registrations(round, limit)
                .await
                .unwrap_or_else(|e| panic!("restart {}: {e}", round - 1));
            s.kubelet
                .wait_devices(limit, |d| d.len() == 80)
                .await
                .unwrap();
            eprintln!(
                "restart {}: registered again after {:?}",
                round - 1,
                started.elapsed()
            );
        }
        assert!(
            s.plugin.0.try_wait().unwrap().is_none(),
            "the plugin kept running"
        );
    });
}

#[test]
fn sigterm_stops_the_plugin_cleanly_and_removes_its_socket() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(Duration::from_secs(60), async {
        let mut s = start(common::build_fixture("rx9070xt-igpu"), &[]).await;
        s.kubelet
            .wait_devices(WAIT, |d| d.len() == 3)
            .await
            .unwrap();
        let socket = s.kubelet.dir().join("amd.com_gpu.sock");
        assert!(socket.exists());
        let pid = s.plugin.0.id().to_string();
        assert!(
            std::process::Command::new("kill")
                .args(["-TERM", &pid])
                .status()
                .unwrap()
                .success()
        );
        let status = s.plugin.wait_exit(Duration::from_secs(10)).unwrap();
        assert!(status.success(), "{status}");
        assert!(!socket.exists(), "the plugin removed its socket");
    });
}

/// A kubelet that is down for a while deletes the socket the plugin bound
/// meanwhile when it comes back; the plugin must bind again and register.
#[test]
fn a_kubelet_down_for_seconds_is_registered_with_when_it_returns() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(Duration::from_secs(60), async {
        let mut s = start(common::build_fixture("mi300x-8-spx"), &[]).await;
        s.kubelet.wait_registrations(1, WAIT).await.unwrap();
        for (round, downtime) in [(2, 1500), (3, 3000)] {
            s.kubelet
                .restart_after(Duration::from_millis(downtime))
                .await
                .unwrap();
            s.kubelet
                .wait_registrations(round, Duration::from_secs(5))
                .await
                .unwrap();
            s.kubelet
                .wait_devices(Duration::from_secs(5), |d| d.len() == 80)
                .await
                .unwrap();
        }
    });
}

#[test]
fn the_plugin_follows_amd_gpud_through_a_restart() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(Duration::from_secs(90), async {
        let mut s = start(common::build_fixture("mi300x-8-spx"), &[]).await;
        s.kubelet
            .wait_devices(WAIT, |d| d.len() == 80)
            .await
            .unwrap();
        s.gpud.kill();
        // The plugin keeps serving what it has.
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(s.kubelet.devices().len(), 80);
        std::fs::remove_dir_all(s.root.path().join("sys/class/kfd/kfd/topology/nodes/9")).unwrap();
        s.gpud = stack::gpud(&common::fake_node_exe(), &s.bus, s.root.path(), 0).unwrap();
        // The new amd-gpud's first read already misses the GPU (it never saw
        // it); the plugin notices without restarting and keeps the GPU's
        // slots listed, unhealthy, as the old amd-gpud would have.
        let devices = s
            .kubelet
            .wait_devices(WAIT, |d| {
                d.iter().filter(|x| x.health != "Healthy").count() == 10 && d.len() == 80
            })
            .await
            .unwrap();
        let unhealthy: Vec<Device> = devices
            .iter()
            .filter(|d| d.health != "Healthy")
            .cloned()
            .collect();
        assert_eq!(gpus_of(&unhealthy).len(), 1, "one GPU's slots");
        assert_eq!(gpus_of(&devices).len(), 8);
        assert!(
            s.plugin.0.try_wait().unwrap().is_none(),
            "the plugin kept running"
        );
        assert_eq!(
            s.kubelet.registrations().len(),
            1,
            "no re-registration was needed"
        );
    });
}

/// GetPreferredAllocation on the real MI210 capture: two xGMI hives of four.
#[test]
fn preferred_allocation_on_the_mi210_capture() {
    let Some(capture) = common::shared_capture("mi210-8gpu-xgmi") else {
        eprintln!(
            "skipping: no capture mi210-8gpu-xgmi in {}",
            tests::fixture::captures_dir().display()
        );
        return;
    };
    if !common::can_run_bus_tests() {
        return;
    }
    let root = fixture::scratch_dir().unwrap();
    fixture::link_capture(&capture, root.path()).unwrap();
    common::run_async(Duration::from_secs(90), async {
        let bus = PrivateBus::start(Policy::Shipped).unwrap();
        let fake_node = common::fake_node_exe();
        let _gpud = stack::gpud(&fake_node, &bus, root.path(), 0).unwrap();
        for policy in ["besteffort", "spread"] {
            let kubelet = FakeKubelet::start().await.unwrap();
            let _plugin = stack::plugin(
                &fake_node,
                &bus,
                kubelet.dir(),
                ["--allocator-policy", policy],
            )
            .unwrap();
            let devices = kubelet.wait_devices(WAIT, |d| d.len() == 80).await.unwrap();
            check_mi210(&kubelet, &devices, policy).await;
        }
    });
}

/// Checks every request size; a GPU's hive is its NUMA node (each hive sits on one).
async fn check_mi210(kubelet: &FakeKubelet, devices: &[Device], policy: &str) {
    let available: Vec<String> = devices.iter().map(|d| d.id.clone()).collect();
    let hive = |id: &str| {
        let gpu = id.rsplit_once('#').map_or(id, |(g, _)| g);
        devices
            .iter()
            .find(|d| d.id.starts_with(gpu))
            .and_then(numa)
    };
    for size in 1..=8_i32 {
        let ids = kubelet
            .preferred_allocation(available.clone(), vec![], size)
            .await
            .unwrap();
        assert_eq!(ids.len(), size as usize, "{policy} size {size}: {ids:?}");
        let gpus: BTreeSet<&str> = ids.iter().map(|i| i.rsplit_once('#').unwrap().0).collect();
        assert_eq!(
            gpus.len(),
            ids.len(),
            "{policy} size {size}: one slot per GPU"
        );
        let hives: BTreeSet<Option<i64>> = ids.iter().map(|i| hive(i)).collect();
        match (policy, size) {
            ("besteffort", 2..=4) => assert_eq!(hives.len(), 1, "{policy} {size}: {ids:?}"),
            ("spread", 2..) => assert_eq!(hives.len(), 2, "{policy} {size}: {ids:?}"),
            _ => {}
        }
    }
    // Impossible requests still get a valid answer, never an error.
    let few: Vec<String> = available.iter().take(3).cloned().collect();
    let ids = kubelet
        .preferred_allocation(few.clone(), vec![], 5)
        .await
        .unwrap();
    assert!(
        ids.len() <= 5 && ids.iter().all(|i| few.contains(i)),
        "{ids:?}"
    );
    let must = vec![available[79].clone()];
    let ids = kubelet
        .preferred_allocation(available.clone(), must.clone(), 2)
        .await
        .unwrap();
    assert!(ids.contains(&must[0]) && ids.len() == 2, "{ids:?}");
}
