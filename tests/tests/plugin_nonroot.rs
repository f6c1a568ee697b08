//! The plugin as its fixed non-root UID (60700, through `setpriv`) against the
//! fake kubelet in a root-owned 0750 device-plugin directory: amd-gpud (root)
//! gives the UID its ACL entries, the plugin registers, and after a kubelet
//! restart (a new kubelet.sock without the entry) amd-gpud grants it again and
//! the plugin registers again. Needs root and POSIX ACLs on the scratch file
//! system; skips otherwise.

// An integration-test file is itself the test module, and a failed unwrap is a
// failed test here.
#![allow(clippy::tests_outside_test_module, clippy::unwrap_used)]

mod common;

use std::{
    os::unix::fs::PermissionsExt,
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use tests::{
    bus::{PLUGIN_UID, Policy, PrivateBus},
    kubelet::FakeKubelet,
    stack::{self, Process},
};

#[test]
fn the_plugin_registers_as_its_own_uid() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(Duration::from_secs(120), nonroot());
}

/// Opens every directory from `root` down to `dir` for traversal (tempdirs
/// are 0700), as a host's /var/lib is.
fn traversable(root: &Path, dir: &Path) {
    let mut path = root.to_path_buf();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    for part in dir.strip_prefix(root).unwrap().components() {
        path.push(part);
        std::fs::create_dir_all(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
}

fn plugin_as_uid(bus: &PrivateBus, kubelet_dir: &Path) -> Process {
    let uid = PLUGIN_UID.to_string();
    let child = Command::new("setpriv")
        .args(["--reuid", &uid, "--regid", &uid, "--clear-groups", "--"])
        .arg(common::fake_node_exe())
        .args(["plugin", "--kube", "none", "--bus-address"])
        .arg(&bus.address)
        .arg("--kubelet-dir")
        .arg(kubelet_dir)
        .args([
            "--pod-resources-socket",
            "none",
            "--sandbox",
            common::sandbox_mode(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    Process(child)
}

async fn nonroot() {
    let root = common::build_fixture("mi300x-8-spx");
    let kubelet_root = root.path().join("var/lib/kubelet");
    traversable(root.path(), &kubelet_root);
    let plugin_dir = kubelet_root.join("device-plugins");
    let mut kubelet = FakeKubelet::start_in(&plugin_dir).await.unwrap();
    let mode = std::fs::metadata(&plugin_dir).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o750, "kubelet's directory, as on a node");
    let bus = PrivateBus::start(Policy::Shipped).unwrap();
    let _gpud = stack::gpud(&common::fake_node_exe(), &bus, root.path(), 0).unwrap();
    let _plugin = plugin_as_uid(&bus, &plugin_dir);
    if kubelet
        .wait_registrations(1, Duration::from_secs(20))
        .await
        .is_err()
    {
        let acl = std::fs::read_dir(&plugin_dir)
            .map(|d| d.count())
            .unwrap_or(0);
        panic!("the plugin (uid {PLUGIN_UID}) did not register; {acl} entries in the dir");
    }
    kubelet
        .wait_devices(Duration::from_secs(20), |d| d.len() == 80)
        .await
        .unwrap();
    let socket = plugin_dir.join("amd.com_gpu.sock");
    let owner = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&socket).unwrap());
    assert_eq!(owner, PLUGIN_UID, "the socket was made by the plugin's UID");

    // A kubelet restart: a fresh kubelet.sock; amd-gpud grants it again.
    kubelet.restart().await.unwrap();
    kubelet
        .wait_registrations(2, Duration::from_secs(30))
        .await
        .unwrap();
    kubelet
        .wait_devices(Duration::from_secs(20), |d| d.len() == 80)
        .await
        .unwrap();
}
