//! `amd-gpud serve` on a real private `dbus-daemon` whose system-type
//! configuration includes the shipped policy (`systemd/io.hami.AmdGpu1.conf`):
//! what busctl shows, who may call, what happens when the bus goes away, and
//! whether the served introspection still equals `ipc/interface.xml`.
//!
//! These tests need root (to own the name under the shipped policy and to
//! run callers as other UIDs with setpriv); CI runs as root. Elsewhere they
//! print why they skip.

// An integration-test file is itself the test module, and a failed unwrap is a
// failed test here.
#![allow(clippy::tests_outside_test_module, clippy::unwrap_used)]

mod common;

use std::{
    path::Path,
    process::{Child, Command, ExitStatus, Stdio},
    time::{Duration, Instant},
};

use tests::{
    bus::{self, OTHER_UID, PLUGIN_UID, Policy, PrivateBus},
    fixture::{self, BuildOptions},
    stack,
};

const GPU0: &str = "/io/hami/AmdGpu1/gpu/0000_05_00_0";
const LAST_GPU: &str = "/io/hami/AmdGpu1/gpu/0000_b5_00_0";
/// `busctl` arguments of a Rescan call.
const RESCAN: [&str; 5] = [
    "call",
    "io.hami.AmdGpu1",
    "/io/hami/AmdGpu1",
    "io.hami.AmdGpu1.Node",
    "Rescan",
];
const PART0: &str = "/io/hami/AmdGpu1/gpu/0000_05_00_0/partition/0";

/// A running `amd-gpud serve` on a fake mi300x-8-spx node and a private bus.
struct Daemon {
    child: Child,
    root: tempfile::TempDir,
    bus: PrivateBus,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn can_run() -> bool {
    match bus::effective_uid() {
        Ok(0) => {
            bus::ensure_plugin_user().unwrap();
            bus::ensure_other_user().unwrap();
            true
        }
        _ => {
            eprintln!("skipping: needs root for the shipped policy and setpriv");
            false
        }
    }
}

fn serve(bus: &PrivateBus, root: &Path) -> Child {
    Command::new(common::fake_node_exe())
        .args([
            "gpud",
            "--log",
            "info",
            "serve",
            "--amdsmi",
            "none",
            "--rescan-interval",
            "0",
        ])
        .arg("--bus-address")
        .arg(&bus.address)
        .arg("--host-root")
        .arg(root)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn start(policy: Policy) -> Option<Daemon> {
    if !can_run() {
        return None;
    }
    let bus = PrivateBus::start(policy).unwrap();
    let root = fixture::scratch_dir().unwrap();
    let spec = fixture::named("mi300x-8-spx").unwrap();
    fixture::build(
        &spec,
        root.path(),
        &BuildOptions {
            drm: true,
            amdsmi_abi: None,
        },
    )
    .unwrap();
    let child = serve(&bus, root.path());
    let mut daemon = Daemon { child, root, bus };
    let start = Instant::now();
    while !stack::name_has_owner(&daemon.bus).unwrap() {
        if let Some(status) = daemon.child.try_wait().unwrap() {
            panic!("amd-gpud serve exited early: {status}");
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "amd-gpud did not take its name"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Some(daemon)
}

fn busctl_ok(daemon: &Daemon, uid: u32, args: &[&str]) -> String {
    let out = bus::busctl(&daemon.bus, uid, args).unwrap();
    assert!(
        out.success(),
        "busctl {args:?} as {uid} failed: {}",
        out.stderr
    );
    out.stdout
}

fn wait_exit(child: &mut Child, limit: Duration) -> ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(
            start.elapsed() < limit,
            "amd-gpud did not exit within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn busctl_introspects_and_reads_the_inventory() {
    let Some(daemon) = start(Policy::Shipped) else {
        return;
    };
    let tree = busctl_ok(&daemon, 0, &["tree", "io.hami.AmdGpu1"]);
    assert_eq!(tree.matches("/partition/0").count(), 8, "{tree}");
    // Introspection is for operators: the plugin never introspects.
    let intro = busctl_ok(&daemon, 0, &["introspect", "io.hami.AmdGpu1", GPU0]);
    for line in [
        ".ComputeUnits",
        ".CusPerWgp",
        ".Links",
        ".Health",
        ".NumaNode",
        ".VramBytes",
    ] {
        assert!(intro.contains(line), "{line} missing from\n{intro}");
    }
    let get = |path: &str, iface: &str, prop: &str| {
        busctl_ok(
            &daemon,
            PLUGIN_UID,
            &["get-property", "io.hami.AmdGpu1", path, iface, prop],
        )
        .trim()
        .to_owned()
    };
    let gpu = "io.hami.AmdGpu1.Gpu";
    assert_eq!(get(GPU0, gpu, "Bdf"), "s \"0000:05:00.0\"");
    assert_eq!(get(GPU0, gpu, "ComputeUnits"), "u 304");
    assert_eq!(get(GPU0, gpu, "Gfx"), "s \"gfx942\"");
    assert_eq!(get(GPU0, gpu, "VramBytes"), format!("t {}", 192_u64 << 30));
    assert_eq!(get(GPU0, gpu, "NumaNode"), "i 0");
    assert_eq!(get(GPU0, gpu, "Health"), "s \"Healthy\"");
    assert_eq!(get(LAST_GPU, gpu, "NumaNode"), "i 1");
    assert_eq!(
        get(PART0, "io.hami.AmdGpu1.Partition", "RenderMinor"),
        "u 128"
    );
    assert_eq!(
        get(PART0, "io.hami.AmdGpu1.Partition", "Gpu"),
        format!("o \"{GPU0}\"")
    );
    let gpus = get("/io/hami/AmdGpu1", "io.hami.AmdGpu1.Node", "Gpus");
    assert!(gpus.starts_with("ao 8 "), "{gpus}");
}

#[test]
fn policy_matrix_under_the_shipped_policy() {
    let Some(daemon) = start(Policy::Shipped) else {
        return;
    };
    let rescan = RESCAN;
    let read = [
        "get-property",
        "io.hami.AmdGpu1",
        GPU0,
        "io.hami.AmdGpu1.Gpu",
        "Bdf",
    ];
    assert!(busctl_ok(&daemon, 0, &rescan).starts_with("t "));
    assert!(busctl_ok(&daemon, PLUGIN_UID, &read).contains("0000:05:00.0"));
    // The plugin never rescans (issue 19): the policy refuses it.
    let calls = [
        (PLUGIN_UID, &rescan[..]),
        (OTHER_UID, &rescan[..]),
        (OTHER_UID, &read[..]),
    ];
    for (uid, args) in calls {
        let out = bus::busctl(&daemon.bus, uid, args).unwrap();
        assert!(!out.success(), "uid {uid} got through: {}", out.stdout);
        assert!(
            out.stderr.to_lowercase().contains("access denied"),
            "refused by the bus policy, not the daemon: {}",
            out.stderr
        );
    }
}

#[test]
fn the_method_check_refuses_other_uids_when_the_policy_lets_them_through() {
    let Some(daemon) = start(Policy::Relaxed) else {
        return;
    };
    let rescan = RESCAN;
    let out = bus::busctl(&daemon.bus, OTHER_UID, &rescan).unwrap();
    assert!(
        !out.success(),
        "uid {OTHER_UID} got through: {}",
        out.stdout
    );
    assert!(
        out.stderr.contains("uid 60701 may not call Rescan"),
        "{}",
        out.stderr
    );
    // Rescan and RestoreCheck are root's: the plugin's UID is refused too.
    let out = bus::busctl(&daemon.bus, PLUGIN_UID, &rescan).unwrap();
    assert!(
        out.stderr.contains("uid 60700 may not call Rescan"),
        "{}",
        out.stderr
    );
    assert!(busctl_ok(&daemon, 0, &rescan).starts_with("t "));
}

#[test]
fn losing_the_bus_makes_the_daemon_exit_non_zero() {
    let Some(mut daemon) = start(Policy::Shipped) else {
        return;
    };
    daemon.bus.kill();
    let status = wait_exit(&mut daemon.child, Duration::from_secs(15));
    assert!(!status.success(), "{status}");
    let mut stderr = String::new();
    std::io::Read::read_to_string(daemon.child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(
        stderr.contains("lost the connection to the bus"),
        "{stderr}"
    );
}

#[test]
fn a_second_daemon_cannot_take_the_name() {
    let Some(daemon) = start(Policy::Shipped) else {
        return;
    };
    let mut second = serve(&daemon.bus, daemon.root.path());
    let status = wait_exit(&mut second, Duration::from_secs(20));
    assert!(!status.success());
    let mut stderr = String::new();
    std::io::Read::read_to_string(second.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(
        stderr.contains("another process owns io.hami.AmdGpu1"),
        "{stderr}"
    );
}

/// Runs `body` on a fresh runtime, failing the test after `limit`.
fn with_timeout<F: std::future::Future<Output = ()>>(limit: Duration, body: F) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        tokio::time::timeout(limit, body)
            .await
            .expect("test timed out");
    });
}

async fn client(bus: &PrivateBus) -> zbus::Connection {
    zbus::connection::Builder::address(bus.address.as_str())
        .unwrap()
        .build()
        .await
        .unwrap()
}

#[test]
fn object_manager_enumerates_every_gpu_and_partition() {
    let Some(daemon) = start(Policy::Shipped) else {
        return;
    };
    with_timeout(Duration::from_secs(30), async {
        let conn = client(&daemon.bus).await;
        let om = zbus::fdo::ObjectManagerProxy::builder(&conn)
            .destination(ipc::BUS_NAME)
            .unwrap()
            .path(ipc::ROOT_PATH)
            .unwrap()
            .build()
            .await
            .unwrap();
        let objects = om.get_managed_objects().await.unwrap();
        let count = |iface: &str| {
            objects
                .values()
                .filter(|i| i.keys().any(|k| k.as_str() == iface))
                .count()
        };
        assert_eq!(count(ipc::GPU_INTERFACE), 8);
        assert_eq!(count(ipc::PARTITION_INTERFACE), 8);
        let gpu = ipc::proxy::read_gpu(&conn, &ipc::gpu_path("0000:05:00.0").as_ref())
            .await
            .unwrap();
        assert_eq!(gpu.compute_units, 304);
        assert_eq!(gpu.links.len(), 7);
        assert_eq!(gpu.health, ipc::HEALTHY);
        let part = ipc::proxy::read_partition(&conn, &gpu.partitions[0].as_ref())
            .await
            .unwrap();
        assert_eq!(part.gpu.as_str(), GPU0);
    });
}

#[test]
fn a_vanished_gpu_is_reported_missing_with_a_signal() {
    let Some(daemon) = start(Policy::Shipped) else {
        return;
    };
    with_timeout(Duration::from_secs(30), async {
        let conn = client(&daemon.bus).await;
        let node = ipc::proxy::NodeProxy::new(&conn).await.unwrap();
        let mut changes = node.receive_inventory_changed().await.unwrap();
        // The last GPU is KFD node 9 of mi300x-8-spx (2 CPU nodes, then one node per GPU).
        let nodes = daemon.root.path().join("sys/class/kfd/kfd/topology/nodes");
        std::fs::remove_dir_all(nodes.join("9")).unwrap();
        let generation = node.rescan().await.unwrap();
        let signal = futures_util::StreamExt::next(&mut changes).await.unwrap();
        let args = signal.args().unwrap();
        assert_eq!(*args.generation(), generation);
        let missing: Vec<String> = args.missing().iter().map(ToString::to_string).collect();
        assert_eq!(
            missing,
            [LAST_GPU.to_owned(), format!("{LAST_GPU}/partition/0")]
        );
        let gpu = ipc::proxy::read_gpu(&conn, &ipc::gpu_path("0000:b5:00.0").as_ref())
            .await
            .unwrap();
        assert_eq!(gpu.health, ipc::MISSING);
        assert_eq!(node.gpus().await.unwrap().len(), 8, "kept, not dropped");
    });
}

/// The `io.hami.AmdGpu1.*` interface blocks of an introspection document.
fn our_interfaces(xml: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = xml;
    while let Some(start) = rest.find("<interface name=\"io.hami.AmdGpu1.") {
        let end = rest[start..].find("</interface>").unwrap() + start + "</interface>".len();
        let block: Vec<&str> = rest[start..end]
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        out.push(block.join("\n"));
        rest = &rest[end..];
    }
    out
}

#[test]
fn served_introspection_equals_ipc_interface_xml() {
    let Some(daemon) = start(Policy::Shipped) else {
        return;
    };
    let committed_path = tests::fake_amdsmi::workspace_root().join("ipc/interface.xml");
    with_timeout(Duration::from_secs(30), async {
        let conn = client(&daemon.bus).await;
        let mut served = Vec::new();
        for path in [ipc::ROOT_PATH, GPU0, PART0] {
            let intro = zbus::fdo::IntrospectableProxy::builder(&conn)
                .destination(ipc::BUS_NAME)
                .unwrap()
                .path(path)
                .unwrap()
                .build()
                .await
                .unwrap();
            for block in our_interfaces(&intro.introspect().await.unwrap()) {
                // A node's introspection may nest its children's: keep each interface once.
                if !served
                    .iter()
                    .any(|b: &String| b.lines().next() == block.lines().next())
                {
                    served.push(block);
                }
            }
        }
        assert_eq!(served.len(), 4, "{served:#?}");
        let document = format!(
            "<!DOCTYPE node PUBLIC \"-//freedesktop//DTD D-BUS Object Introspection 1.0//EN\"\n \
             \"http://www.freedesktop.org/standards/dbus/1.0/introspect.dtd\">\n<node>\n{}\n</node>\n",
            served.join("\n")
        );
        if std::env::var_os("UPDATE_INTERFACE_XML").is_some() {
            std::fs::write(&committed_path, &document).unwrap();
        }
        let committed = std::fs::read_to_string(&committed_path).unwrap();
        assert_eq!(
            our_interfaces(&committed),
            served,
            "ipc/interface.xml differs from what amd-gpud serves; \
             if the change is intended, rerun with UPDATE_INTERFACE_XML=1"
        );
    });
}

#[test]
fn restore_check_answers_over_the_bus_and_refuses_bad_input() {
    let Some(daemon) = start(Policy::Shipped) else {
        return;
    };
    // A checkpoint taken on this very node (the daemon's fake mi300x-8-spx).
    let opts = tests::criu_image::ImageOptions::new(tests::criu_image::Format::Newest);
    let image = tests::criu_image::image_bytes(daemon.root.path(), &opts).unwrap();
    with_timeout(Duration::from_secs(60), async {
        let conn = client(&daemon.bus).await;
        let node = ipc::proxy::NodeProxy::new(&conn).await.unwrap();
        let none = std::collections::HashMap::new();
        let verdict = node
            .restore_check(&image, &[], none.clone(), "criu")
            .await
            .unwrap();
        let v: serde_json::Value = serde_json::from_str(&verdict).unwrap();
        assert_eq!(v["restorable"], true, "{v:#}");
        assert_eq!(v["outcome"], "restorable");
        assert_eq!(v["criu_version"], "3.17.1");
        assert_eq!(v["mode"], "criu");
        assert_eq!(v["mapping"].as_array().unwrap().len(), 8);
        // One GPU visible: the counts differ.
        let options = [("KFD_NUMA_CHECK", "0")].into_iter().collect();
        let verdict = node
            .restore_check(&image, &["0000:05:00.0"], options, "")
            .await
            .unwrap();
        let v: serde_json::Value = serde_json::from_str(&verdict).unwrap();
        assert_eq!(v["restorable"], false);
        assert_eq!(v["mode"], "explain");
        assert_eq!(v["options"]["KFD_NUMA_CHECK"], false);
        assert_eq!(v["refusals"][0]["property"], "gpu_count");
        // Bad input is InvalidArgument, naming what is wrong.
        let bad_option = [("KFD_NUMA", "0")].into_iter().collect();
        let cases: [(&[u8], &[&str], _, &str, &str); 4] = [
            (&image[..20], &[], none.clone(), "explain", "truncated"),
            (&image, &[], bad_option, "explain", "KFD_NUMA"),
            (&image, &[], none.clone(), "strict", "unknown mode"),
            (&image, &["renderD999"], none.clone(), "criu", "renderD999"),
        ];
        for (bytes, gpus, options, mode, needle) in cases {
            let err = node
                .restore_check(bytes, gpus, options, mode)
                .await
                .unwrap_err();
            assert!(
                matches!(&err, ipc::ApiError::InvalidArgument(m) if m.contains(needle)),
                "{needle}: {err}"
            );
        }
    });
    let props = busctl_ok(
        &daemon,
        PLUGIN_UID,
        &[
            "get-property",
            "io.hami.AmdGpu1",
            PART0,
            "io.hami.AmdGpu1.Partition",
            "RestoreProps",
        ],
    );
    assert!(props.starts_with("a{st} 27 "), "{props}");
    assert!(props.contains("\"fw_version\" 177"), "{props}");
    assert!(props.contains("\"capability\" 2893521536"), "{props}");
    let links = busctl_ok(
        &daemon,
        PLUGIN_UID,
        &[
            "get-property",
            "io.hami.AmdGpu1",
            PART0,
            "io.hami.AmdGpu1.Partition",
            "RestoreLinks",
        ],
    );
    assert!(links.starts_with("a(su) 8 \"pcie\" 0 \"xgmi\""), "{links}");
}
