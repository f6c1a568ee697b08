//! VRAM caps over D-Bus: `amd-gpud serve` on a private bus with a fake host root whose
//! cgroup mount is a plain directory tree with the dmem controller (`--dmem-any-fs`):
//! `dmem.capacity` lists the fixture GPUs, kubepods has pods in every QoS class.
//! `SetPodVramLimits` as the plugin UID writes exactly one file; as another UID it is
//! refused; hostile UIDs and unknown GPUs are `InvalidArgument` and touch nothing; a
//! missing pod is `NotFound`; a node without dmem reports why and answers
//! `NotSupported`; `--dmem-backend on` on such a node refuses to start.
//!
//! Needs root (the shipped policy, setpriv); skips otherwise.

// An integration-test file is itself the test module, and a failed unwrap is a
// failed test here.
#![allow(clippy::tests_outside_test_module, clippy::unwrap_used)]

mod common;

use std::{
    collections::{BTreeMap, HashMap},
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use ipc::{ApiError, proxy::NodeProxy};
use tests::{
    bus::{self, OTHER_UID, PLUGIN_UID, Policy, PrivateBus},
    fixture::{
        self,
        cgroup::{CGROUP_MOUNT, CgroupDriver, QosClass, add_pod, write_dmem_cgroups},
    },
    stack::{self, Process},
};

const GPU0: &str = "0000:05:00.0";
const LAST_GPU: &str = "0000:b5:00.0";
const GUARANTEED: &str = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
const BURSTABLE: &str = "11111111-2222-4333-8444-555555555555";
const STATIC_POD: &str = "6f1e3a0e0c8b2d9f7a6b5c4d3e2f1a0b";
const GIB: u64 = 1 << 30;

struct Node {
    _daemon: Process,
    root: tempfile::TempDir,
    bus: PrivateBus,
}

fn can_run() -> bool {
    if !common::can_run_bus_tests() {
        return false;
    }
    bus::ensure_other_user().unwrap();
    true
}

/// mi300x-8-spx with a dmem cgroup tree for `driver` (when given) and three pods.
fn start(policy: Policy, driver: Option<CgroupDriver>, extra: &[&str]) -> Node {
    let bus = PrivateBus::start(policy).unwrap();
    let root = common::build_fixture("mi300x-8-spx");
    if let Some(driver) = driver {
        let spec = fixture::named("mi300x-8-spx").unwrap();
        write_dmem_cgroups(&spec, root.path(), driver).unwrap();
        add_pod(root.path(), driver, QosClass::Guaranteed, GUARANTEED).unwrap();
        add_pod(root.path(), driver, QosClass::Burstable, BURSTABLE).unwrap();
        add_pod(root.path(), driver, QosClass::BestEffort, STATIC_POD).unwrap();
    }
    let mut args = vec!["--dmem-any-fs"];
    args.extend_from_slice(extra);
    let daemon = stack::gpud_with(&common::fake_node_exe(), &bus, root.path(), 0, &args).unwrap();
    Node {
        _daemon: daemon,
        root,
        bus,
    }
}

/// Every file under the cgroup mount with its content (directories as `None`).
fn snapshot(root: &Path) -> BTreeMap<PathBuf, Option<String>> {
    let mount = root.join(CGROUP_MOUNT);
    let mut out = BTreeMap::new();
    let mut stack = vec![mount.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let rel = path.strip_prefix(&mount).unwrap().to_path_buf();
            if path.is_dir() {
                stack.push(path);
                out.insert(rel, None);
            } else {
                out.insert(rel, Some(std::fs::read_to_string(&path).unwrap()));
            }
        }
    }
    out
}

fn changed(
    before: &BTreeMap<PathBuf, Option<String>>,
    after: &BTreeMap<PathBuf, Option<String>>,
) -> Vec<(PathBuf, Option<String>)> {
    after
        .iter()
        .filter(|(k, v)| before.get(*k) != Some(*v))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// `busctl call ... SetPodVramLimits sa{st} UID 1 GPU BYTES` as `uid`.
fn busctl_set(node: &Node, uid: u32, pod: &str, gpu: &str, bytes: u64) -> bus::RunOutput {
    let bytes = bytes.to_string();
    let args = [
        "call",
        bus::BUS_NAME,
        ipc::ROOT_PATH,
        ipc::NODE_INTERFACE,
        "SetPodVramLimits",
        "sa{st}",
        pod,
        "1",
        gpu,
        bytes.as_str(),
    ];
    bus::busctl(&node.bus, uid, &args).unwrap()
}

async fn node_proxy(bus: &PrivateBus) -> NodeProxy<'static> {
    let conn = zbus::connection::Builder::address(bus.address.as_str())
        .unwrap()
        .build()
        .await
        .unwrap();
    NodeProxy::new(&conn).await.unwrap()
}

#[test]
fn the_plugin_caps_a_pod_and_only_its_dmem_max_changes() {
    if !can_run() {
        return;
    }
    let node = start(Policy::Shipped, Some(CgroupDriver::Systemd), &[]);
    let before = snapshot(node.root.path());
    let out = busctl_set(&node, PLUGIN_UID, BURSTABLE, GPU0, 8 * GIB);
    assert!(out.success(), "{out:?}");
    let cgroup = "kubepods.slice/kubepods-burstable.slice/\
                  kubepods-burstable-pod11111111_2222_4333_8444_555555555555.slice";
    assert_eq!(out.stdout.trim(), format!("s \"/{cgroup}\""));
    let after = snapshot(node.root.path());
    assert_eq!(
        changed(&before, &after),
        [(
            PathBuf::from(cgroup).join("dmem.max"),
            Some(format!("drm/{GPU0}/vram {}\n", 8 * GIB))
        )]
    );
    // Again: idempotent, nothing written.
    assert!(busctl_set(&node, PLUGIN_UID, BURSTABLE, GPU0, 8 * GIB).success());
    assert_eq!(changed(&after, &snapshot(node.root.path())), []);
}

#[test]
fn other_uids_are_refused_by_the_bus_and_by_the_method() {
    if !can_run() {
        return;
    }
    let node = start(Policy::Shipped, Some(CgroupDriver::Cgroupfs), &[]);
    let before = snapshot(node.root.path());
    let out = busctl_set(&node, OTHER_UID, GUARANTEED, GPU0, GIB);
    assert!(!out.success(), "{out:?}");
    assert!(
        out.stderr.to_lowercase().contains("access denied"),
        "{out:?}"
    );
    assert_eq!(changed(&before, &snapshot(node.root.path())), []);
    drop(node);
    let node = start(Policy::Relaxed, Some(CgroupDriver::Cgroupfs), &[]);
    let before = snapshot(node.root.path());
    let out = busctl_set(&node, OTHER_UID, GUARANTEED, GPU0, GIB);
    assert!(!out.success(), "{out:?}");
    assert!(
        out.stderr
            .contains("uid 60701 may not call SetPodVramLimits"),
        "{out:?}"
    );
    assert_eq!(changed(&before, &snapshot(node.root.path())), []);
    assert!(busctl_set(&node, 0, GUARANTEED, GPU0, GIB).success());
}

#[test]
fn typed_errors_and_properties_through_the_ipc_proxy() {
    if !can_run() {
        return;
    }
    let node = start(Policy::Shipped, Some(CgroupDriver::Cgroupfs), &[]);
    let before = snapshot(node.root.path());
    common::run_async(Duration::from_secs(30), async {
        let proxy = node_proxy(&node.bus).await;
        assert_eq!(proxy.dmem_backend().await.unwrap(), "on");
        assert_eq!(proxy.dmem_cgroup_driver().await.unwrap(), "cgroupfs");
        assert_eq!(proxy.dmem_kubepods().await.unwrap(), "/kubepods");
        let regions = proxy.dmem_regions().await.unwrap();
        assert_eq!(regions.len(), 8, "{regions:?}");
        assert_eq!(regions[LAST_GPU], 192 * GIB);
        let one = |gpu: &'static str, bytes| HashMap::from([(gpu, bytes)]);
        let huge = "a".repeat(10 * 1024);
        for (uid, limits) in [
            ("../../system.slice/victim.service", one(GPU0, GIB)),
            ("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f/", one(GPU0, GIB)),
            ("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e..", one(GPU0, GIB)),
            (huge.as_str(), one(GPU0, GIB)),
            (GUARANTEED, one("0000:99:00.0", GIB)),
            (GUARANTEED, one("../../../etc", GIB)),
            (GUARANTEED, one(GPU0, 193 * GIB)),
        ] {
            let err = proxy.set_pod_vram_limits(uid, limits).await.unwrap_err();
            assert!(matches!(err, ApiError::InvalidArgument(_)), "{err:?}");
        }
        let missing = "99999999-2222-4333-8444-555555555555";
        let err = proxy
            .set_pod_vram_limits(missing, one(GPU0, GIB))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, ApiError::NotFound(m) if m.contains("no cgroup for pod")),
            "{err:?}"
        );
        let cgroup = proxy
            .set_pod_vram_limits(STATIC_POD, one(LAST_GPU, 3 * GIB))
            .await
            .unwrap();
        assert_eq!(cgroup, format!("/kubepods/besteffort/pod{STATIC_POD}"));
    });
    let diff = changed(&before, &snapshot(node.root.path()));
    assert_eq!(
        diff,
        [(
            PathBuf::from(format!("kubepods/besteffort/pod{STATIC_POD}/dmem.max")),
            Some(format!("drm/{LAST_GPU}/vram {}\n", 3 * GIB))
        )]
    );
}

#[test]
fn without_dmem_the_backend_is_off_and_says_why() {
    if !can_run() {
        return;
    }
    let node = start(Policy::Shipped, None, &[]);
    common::run_async(Duration::from_secs(30), async {
        let proxy = node_proxy(&node.bus).await;
        let backend = proxy.dmem_backend().await.unwrap();
        assert!(
            backend.starts_with("off: cannot read")
                && backend.ends_with("cgroup.controllers: No such file or directory (os error 2)"),
            "{backend}"
        );
        assert!(proxy.dmem_regions().await.unwrap().is_empty());
        let err = proxy
            .set_pod_vram_limits(GUARANTEED, HashMap::from([(GPU0, GIB)]))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, ApiError::NotSupported(m) if m.contains("cgroup.controllers")),
            "{err:?}"
        );
    });
}

#[test]
fn dmem_backend_on_refuses_to_start_without_dmem() {
    if !can_run() {
        return;
    }
    let bus = PrivateBus::start(Policy::Shipped).unwrap();
    let root = common::build_fixture("mi300x-8-spx");
    let mut cmd = Command::new(common::fake_node_exe());
    cmd.args(["gpud", "serve", "--amdsmi", "none", "--dmem-backend", "on"])
        .arg("--bus-address")
        .arg(&bus.address)
        .arg("--host-root")
        .arg(root.path());
    let (code, _, stderr) = common::run_with_timeout(cmd, Duration::from_secs(30));
    assert_ne!(code, 0, "{stderr}");
    assert!(stderr.contains("--dmem-backend on"), "{stderr}");
    assert!(stderr.contains("is not a cgroup v2 mount"), "{stderr}");
    assert_eq!(
        stderr.matches("is not a cgroup v2 mount").count(),
        1,
        "{stderr}"
    );
}

/// amd-gpud (systemd driver tree, `--dmem-any-fs`) in a private mount namespace where
/// `script` ran first, in `sh` with `$MOUNT` the fake cgroup mount. `None` (and a note)
/// when mount namespaces are not available here.
fn start_in_namespace(script: &str) -> Option<Node> {
    let probe = Command::new("unshare").args(["-m", "true"]).status();
    if !probe.is_ok_and(|s| s.success()) {
        eprintln!("skipping: unshare -m is not available");
        return None;
    }
    let bus = PrivateBus::start(Policy::Shipped).unwrap();
    let root = common::build_fixture("mi300x-8-spx");
    let spec = fixture::named("mi300x-8-spx").unwrap();
    write_dmem_cgroups(&spec, root.path(), CgroupDriver::Systemd).unwrap();
    add_pod(
        root.path(),
        CgroupDriver::Systemd,
        QosClass::Burstable,
        BURSTABLE,
    )
    .unwrap();
    let child = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c"])
        .arg(format!("set -e\n{script}\nexec \"$@\""))
        .arg("sh")
        .arg(common::fake_node_exe())
        .args(["gpud", "--log", "info", "serve", "--amdsmi", "none"])
        .args(["--rescan-interval", "0", "--dmem-any-fs", "--bus-address"])
        .arg(&bus.address)
        .arg("--host-root")
        .arg(root.path())
        .env("MOUNT", root.path().join(CGROUP_MOUNT))
        .spawn()
        .unwrap();
    let mut daemon = Process(child);
    let start = std::time::Instant::now();
    while !stack::name_has_owner(&bus).unwrap() {
        if let Some(status) = daemon.0.try_wait().unwrap() {
            panic!("amd-gpud exited early: {status}");
        }
        assert!(start.elapsed() < Duration::from_secs(20), "no name");
        std::thread::sleep(Duration::from_millis(50));
    }
    Some(Node {
        _daemon: daemon,
        root,
        bus,
    })
}

#[test]
fn works_under_the_bind_mounts_of_the_systemd_unit() {
    if !can_run() {
        return;
    }
    // What ProtectControlGroups=yes + ReadWritePaths=/sys/fs/cgroup/kubepods.slice make:
    // the cgroup mount read-only, kubepods.slice a writable bind mount onto itself.
    let script = "mount --bind \"$MOUNT\" \"$MOUNT\"\n\
                  mount --bind \"$MOUNT/kubepods.slice\" \"$MOUNT/kubepods.slice\"\n\
                  mount -o remount,bind,ro \"$MOUNT\"";
    let Some(node) = start_in_namespace(script) else {
        return;
    };
    let out = busctl_set(&node, PLUGIN_UID, BURSTABLE, GPU0, GIB);
    assert!(out.success(), "{out:?}");
    // The namespace's mounts are the daemon's alone; the write shows through.
    let file = node.root.path().join(CGROUP_MOUNT).join(
        "kubepods.slice/kubepods-burstable.slice/\
         kubepods-burstable-pod11111111_2222_4333_8444_555555555555.slice/dmem.max",
    );
    assert_eq!(
        std::fs::read_to_string(file).unwrap(),
        format!("drm/{GPU0}/vram {GIB}\n")
    );
}

#[test]
fn another_file_system_mounted_over_a_pod_cgroup_is_refused() {
    if !can_run() {
        return;
    }
    let script = "pod=\"$MOUNT/kubepods.slice/kubepods-burstable.slice/\
                  kubepods-burstable-pod11111111_2222_4333_8444_555555555555.slice\"\n\
                  mount -t tmpfs amd-gpud-test \"$pod\"\n\
                  : > \"$pod/dmem.max\"";
    let Some(node) = start_in_namespace(script) else {
        return;
    };
    common::run_async(Duration::from_secs(30), async {
        let proxy = node_proxy(&node.bus).await;
        let err = proxy
            .set_pod_vram_limits(BURSTABLE, HashMap::from([(GPU0, GIB)]))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, ApiError::InvalidArgument(m) if m.contains("mount crossing")),
            "{err:?}"
        );
    });
}

/// Issue 19, defect 5: a cgroup write that never returns (a FIFO stands in
/// for a hung kernel) does not hold the answer past its 5 s deadline, other
/// answers go on meanwhile, a second write is refused as Busy instead of
/// piling up another blocked thread, and writes resume once it returns.
#[test]
fn a_cap_write_that_never_returns_misses_its_deadline_and_blocks_no_answer() {
    if !can_run() {
        return;
    }
    let node = start(Policy::Shipped, Some(CgroupDriver::Systemd), &[]);
    let pod_dir = fixture::cgroup::add_pod(
        node.root.path(),
        CgroupDriver::Systemd,
        QosClass::Guaranteed,
        GUARANTEED,
    )
    .unwrap();
    let max = pod_dir.join("dmem.max");
    let original = std::fs::read(&max).unwrap_or_default();
    let _ = std::fs::remove_file(&max);
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &max,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    let one = |gpu: &'static str, bytes: u64| HashMap::from([(gpu, bytes)]);
    common::run_async(Duration::from_secs(60), async {
        let proxy = node_proxy(&node.bus).await;
        let started = std::time::Instant::now();
        let blocked = proxy.set_pod_vram_limits(GUARANTEED, one(GPU0, GIB));
        let (blocked, generation) = tokio::join!(blocked, async {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let asked = std::time::Instant::now();
            let generation = proxy.generation().await;
            (generation, asked.elapsed())
        });
        let waited = started.elapsed();
        let err = blocked.unwrap_err();
        assert!(
            matches!(&err, ApiError::Failed(m) if m.contains("did not finish within")),
            "{err:?}"
        );
        assert!(waited < Duration::from_secs(9), "answered after {waited:?}");
        eprintln!(
            "blocked write answered after {waited:?}; Generation meanwhile in {:?}",
            generation.1
        );
        generation.0.unwrap();
        let err = proxy
            .set_pod_vram_limits(BURSTABLE, one(GPU0, GIB))
            .await
            .unwrap_err();
        assert!(matches!(&err, ApiError::Busy(_)), "{err:?}");
        // amd-gpud's thread is blocked opening the FIFO to read it: a writer
        // lets it in, a regular file takes the FIFO's place for the write
        // that follows, and closing the writer ends the read.
        let writer = fifo_writer(&max);
        rustix::io::write(&writer, &original).unwrap();
        let stand_in = pod_dir.join("dmem.max.regular");
        std::fs::write(&stand_in, &original).unwrap();
        std::fs::rename(&stand_in, &max).unwrap();
        drop(writer);
        let mut resumed = false;
        for _ in 0..50 {
            match proxy.set_pod_vram_limits(BURSTABLE, one(GPU0, GIB)).await {
                Ok(_) => {
                    resumed = true;
                    break;
                }
                Err(ApiError::Busy(_)) => tokio::time::sleep(Duration::from_millis(100)).await,
                Err(e) => panic!("{e:?}"),
            }
        }
        assert!(resumed, "writes resume once the blocked one returns");
    });
}

/// The FIFO opened for writing, once amd-gpud has opened it for reading.
fn fifo_writer(fifo: &Path) -> std::os::fd::OwnedFd {
    use rustix::fs::{Mode, OFlags};
    for _ in 0..1000 {
        match rustix::fs::open(fifo, OFlags::WRONLY | OFlags::NONBLOCK, Mode::empty()) {
            Ok(fd) => return fd,
            Err(rustix::io::Errno::NXIO) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("opening {}: {e}", fifo.display()),
        }
    }
    panic!("amd-gpud never opened {} for reading", fifo.display());
}
