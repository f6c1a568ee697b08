//! amd-gpud against hung hardware and a hostile plugin UID (issue 19), on a
//! private bus with the shipped policy:
//!
//! - a sysfs read that never returns (a FIFO stands in for a hung driver)
//!   or an AMD SMI library that hangs blocks no D-Bus answer, and the read
//!   is abandoned at its deadline;
//! - the plugin's UID may call only what the plugin calls; caps of 0 bytes
//!   and absurd inputs are refused with short errors that echo no host path.
//!
//! Needs root (the shipped policy, setpriv); skips otherwise.

// An integration-test file is itself the test module, and a failed unwrap is a
// failed test here.
#![allow(clippy::tests_outside_test_module, clippy::unwrap_used)]

mod common;

use std::{
    path::Path,
    time::{Duration, Instant},
};

use ipc::proxy::NodeProxy;
use rustix::fs::{FileType, Mode, OFlags};
use tests::{
    bus::{self, PLUGIN_UID, Policy, PrivateBus},
    fixture::cgroup::{CgroupDriver, QosClass, add_pod, write_dmem_cgroups},
    stack,
};

const GPU0: &str = "/io/hami/AmdGpu1/gpu/0000_05_00_0";
/// KFD node 9 is the last GPU of mi300x-8-spx.
const LAST_NODE: &str = "sys/class/kfd/kfd/topology/nodes/9/properties";
const POD: &str = "11111111-2222-4333-8444-555555555555";

async fn node_proxy(bus: &PrivateBus) -> NodeProxy<'static> {
    let conn = zbus::connection::Builder::address(bus.address.as_str())
        .unwrap()
        .build()
        .await
        .unwrap();
    NodeProxy::new(&conn).await.unwrap()
}

/// The answers a blocked read must not hold up, each as the caller that
/// makes it: Ping (root), `Gpu.Health` and `Node.Generation` and
/// `SetPodVramLimits` (the plugin). Returns the slowest answer's time.
fn answers_while_blocked(bus: &PrivateBus) -> Duration {
    let calls: [(u32, &[&str]); 4] = [
        (
            0,
            &[
                "call",
                bus::BUS_NAME,
                "/",
                "org.freedesktop.DBus.Peer",
                "Ping",
            ],
        ),
        (
            PLUGIN_UID,
            &[
                "get-property",
                bus::BUS_NAME,
                GPU0,
                "io.hami.AmdGpu1.Gpu",
                "Health",
            ],
        ),
        (
            PLUGIN_UID,
            &[
                "get-property",
                bus::BUS_NAME,
                ipc::ROOT_PATH,
                ipc::NODE_INTERFACE,
                "Generation",
            ],
        ),
        (
            PLUGIN_UID,
            &[
                "call",
                bus::BUS_NAME,
                ipc::ROOT_PATH,
                ipc::NODE_INTERFACE,
                "SetPodVramLimits",
                "sa{st}",
                POD,
                "1",
                "0000:05:00.0",
                "1073741824",
            ],
        ),
    ];
    let mut slowest = Duration::ZERO;
    for (uid, args) in calls {
        let start = Instant::now();
        // busctl is killed after bus::CALL_TIMEOUT: an answer held up by the
        // read never comes.
        let out = bus::busctl(bus, uid, args)
            .unwrap_or_else(|e| panic!("{args:?} as {uid} got no answer: {e}"));
        slowest = slowest.max(start.elapsed());
        let method = args[4];
        if method == "SetPodVramLimits" {
            // No dmem backend on this node: an answer, and a refusal.
            assert!(
                out.stderr.contains("not supported") || out.stderr.contains("off"),
                "{}",
                out.stderr
            );
        } else {
            assert!(out.success(), "{args:?} as {uid}: {}", out.stderr);
        }
    }
    slowest
}

/// Opens the FIFO for writing once amd-gpud has opened it for reading (so
/// its read is under way, and blocks until this end is closed).
fn writer_once_read(fifo: &Path) -> std::os::fd::OwnedFd {
    let start = Instant::now();
    loop {
        match rustix::fs::open(fifo, OFlags::WRONLY | OFlags::NONBLOCK, Mode::empty()) {
            Ok(fd) => return fd,
            Err(rustix::io::Errno::NXIO) => {}
            Err(e) => panic!("opening {}: {e}", fifo.display()),
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "amd-gpud never read the FIFO"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_sysfs_read_that_never_returns_blocks_no_answer_and_misses_its_deadline() {
    if !common::can_run_bus_tests() {
        return;
    }
    let bus = PrivateBus::start(Policy::Shipped).unwrap();
    let root = common::build_fixture("mi300x-8-spx");
    let gpud = stack::gpud_with(&common::fake_node_exe(), &bus, root.path(), 0, &[]).unwrap();
    let idle = bus::busctl(
        &bus,
        PLUGIN_UID,
        &[
            "get-property",
            bus::BUS_NAME,
            GPU0,
            "io.hami.AmdGpu1.Gpu",
            "Health",
        ],
    );
    assert!(idle.unwrap().success());
    let hwm_idle = common::memcg::status_kib(gpud.0.id(), "VmHWM");
    let file = root.path().join(LAST_NODE);
    let saved = std::fs::read(&file).unwrap();
    std::fs::remove_file(&file).unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &file,
        FileType::Fifo,
        Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    common::run_async(Duration::from_secs(90), async {
        let node = node_proxy(&bus).await;
        let rescan = tokio::spawn({
            let node = node.clone();
            async move { node.rescan().await }
        });
        let writer = tokio::task::block_in_place(|| writer_once_read(&file));
        let slowest = tokio::task::block_in_place(|| answers_while_blocked(&bus));
        let err = rescan.await.unwrap().unwrap_err();
        assert!(err.to_string().contains("did not finish within"), "{err}");
        // The read is still blocked: no second one is started.
        let again = node.rescan().await.unwrap_err();
        assert!(again.to_string().contains("still blocked"), "{again}");
        drop(writer);
        restore(&file, &saved);
        let generation = wait_rescan(&node).await;
        eprintln!(
            "slowest answer while blocked: {slowest:?}; VmHWM idle {hwm_idle} KiB, after {} KiB; generation {generation}",
            common::memcg::status_kib(gpud.0.id(), "VmHWM")
        );
    });
}

fn restore(file: &Path, saved: &[u8]) {
    std::fs::remove_file(file).unwrap();
    std::fs::write(file, saved).unwrap();
}

/// Rescans until the read that was blocked has returned and a new one runs.
async fn wait_rescan(node: &NodeProxy<'_>) -> u64 {
    loop {
        match node.rescan().await {
            Ok(generation) => return generation,
            Err(e) if e.to_string().contains("still blocked") => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("{e}"),
        }
    }
}

/// `busctl call` of a Node method as `uid`.
fn call_node(bus: &PrivateBus, uid: u32, member: &str, args: &[&str]) -> bus::RunOutput {
    let mut all = vec![
        "call",
        bus::BUS_NAME,
        ipc::ROOT_PATH,
        ipc::NODE_INTERFACE,
        member,
    ];
    all.extend_from_slice(args);
    bus::busctl(bus, uid, &all).unwrap()
}

#[test]
fn the_plugin_uid_gets_only_what_it_calls_and_short_errors() {
    if !common::can_run_bus_tests() {
        return;
    }
    let bus = PrivateBus::start(Policy::Shipped).unwrap();
    let root = common::build_fixture("mi300x-8-spx");
    let driver = CgroupDriver::Systemd;
    let spec = tests::fixture::named("mi300x-8-spx").unwrap();
    write_dmem_cgroups(&spec, root.path(), driver).unwrap();
    add_pod(root.path(), driver, QosClass::Burstable, POD).unwrap();
    let args = ["--dmem-any-fs"];
    let gpud = stack::gpud_with(&common::fake_node_exe(), &bus, root.path(), 0, &args).unwrap();
    let hwm_idle = common::memcg::status_kib(gpud.0.id(), "VmHWM");
    refused_what_it_never_calls(&bus);
    tiny_caps_are_refused(&bus, root.path());
    errors_are_short(&bus, root.path());
    eprintln!(
        "VmHWM idle {hwm_idle} KiB, after {} KiB",
        common::memcg::status_kib(gpud.0.id(), "VmHWM")
    );
}

fn refused_what_it_never_calls(bus: &PrivateBus) {
    // Calls the plugin never makes: refused by the bus policy.
    let image = ["ayasa{ss}s", "0", "0", "0", ""];
    for (member, args) in [("Rescan", &[][..]), ("RestoreCheck", &image[..])] {
        let out = call_node(bus, PLUGIN_UID, member, args);
        assert!(
            !out.success() && out.stderr.contains("Access denied"),
            "{member}: {out:?}"
        );
    }
    let ping = [
        "call",
        bus::BUS_NAME,
        "/",
        "org.freedesktop.DBus.Peer",
        "Ping",
    ];
    assert!(
        bus::busctl(bus, PLUGIN_UID, &ping)
            .unwrap()
            .stderr
            .contains("Access denied")
    );
}

fn tiny_caps_are_refused(bus: &PrivateBus, root: &Path) {
    // A cap of 0 bytes (or below 1 MiB) would starve the pod: refused, and
    // dmem.max is not touched.
    let dmem_max = pod_dmem_max(root);
    let before = std::fs::read_to_string(&dmem_max).unwrap();
    for bytes in ["0", "4096"] {
        let out = call_node(
            bus,
            PLUGIN_UID,
            "SetPodVramLimits",
            &["sa{st}", POD, "1", "0000:05:00.0", bytes],
        );
        assert!(
            !out.success() && out.stderr.contains("at least"),
            "{bytes}: {out:?}"
        );
    }
    assert_eq!(std::fs::read_to_string(&dmem_max).unwrap(), before);
    let ok = call_node(
        bus,
        PLUGIN_UID,
        "SetPodVramLimits",
        &["sa{st}", POD, "1", "0000:05:00.0", "1073741824"],
    );
    assert!(ok.success(), "{ok:?}");
}

fn errors_are_short(bus: &PrivateBus, root: &Path) {
    // Errors to the plugin: no host path, and short however long the input.
    let missing = "99999999-2222-4333-8444-555555555555";
    let out = call_node(
        bus,
        PLUGIN_UID,
        "SetPodVramLimits",
        &["sa{st}", missing, "1", "0000:05:00.0", "1073741824"],
    );
    assert!(out.stderr.contains("no cgroup for pod"), "{out:?}");
    let root_text = root.to_str().unwrap();
    assert!(
        !out.stderr.contains(root_text) && !out.stderr.contains("kubepods.slice"),
        "{out:?}"
    );
    let huge = "x".repeat(100_000);
    let out = call_node(
        bus,
        PLUGIN_UID,
        "SetComputePartition",
        &["ssb", &huge, "CPX", "false"],
    );
    assert!(
        !out.success() && out.stderr.len() < 1024,
        "{} bytes of error",
        out.stderr.len()
    );
    let out = call_node(
        bus,
        PLUGIN_UID,
        "SetPodVramLimits",
        &["sa{st}", &huge, "1", "0000:05:00.0", "1073741824"],
    );
    assert!(
        !out.success() && out.stderr.len() < 1024,
        "{} bytes of error",
        out.stderr.len()
    );
    // Root still gets the whole story.
    let out = call_node(
        bus,
        0,
        "SetPodVramLimits",
        &["sa{st}", missing, "1", "0000:05:00.0", "1073741824"],
    );
    assert!(
        out.stderr.contains(root_text) || out.stderr.contains("kubepods"),
        "{out:?}"
    );
}

/// The burstable pod's `dmem.max` under the systemd driver.
fn pod_dmem_max(root: &Path) -> std::path::PathBuf {
    let pod = POD.replace('-', "_");
    root.join(tests::fixture::cgroup::CGROUP_MOUNT)
        .join(format!(
            "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{pod}.slice/dmem.max"
        ))
}

/// `amd-gpud inspect` on a host whose sysfs read never returns ends with an
/// error at its deadline instead of hanging (no root needed).
#[test]
fn inspect_gives_up_on_a_sysfs_read_that_never_returns() {
    let root = common::build_fixture("mi300x-8-spx");
    let file = root.path().join(LAST_NODE);
    std::fs::remove_file(&file).unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &file,
        FileType::Fifo,
        Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    let mut cmd = std::process::Command::new(common::fake_node_exe());
    cmd.args(["gpud", "inspect", "--amdsmi", "none", "--host-root"])
        .arg(root.path());
    let (code, _, stderr) = common::run_with_timeout(cmd, Duration::from_secs(60));
    assert_ne!(code, 0, "{stderr}");
    assert!(stderr.contains("did not finish within"), "{stderr}");
}
