//! A plugin pod on a node where amd-gpud is missing, or where the bus will
//! not let the plugin call it: the plugin says why once, in its log and in a
//! Warning Event on the Node, with the command that fixes it; once amd-gpud
//! answers, one Normal Event says so. Without amd-gpud (a CPU node) it is
//! ready with no device and `/readyz` says why, so rollouts finish (issue
//! 37); refused by the bus, it stays unready. Private bus with the shipped
//! policy, fake API server and kubelet. Needs root.

// An integration-test file is itself the test module, and a failed unwrap is a
// failed test here.
#![allow(clippy::tests_outside_test_module, clippy::unwrap_used)]

mod common;

use std::{
    os::unix::fs::PermissionsExt,
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::{Value, json};
use tests::{
    apiserver::FakeApiServer,
    bus::{Policy, PrivateBus},
    kubelet::FakeKubelet,
    stack::{self, Process},
};

const NODE: &str = "gpu-node-1";
const UNREACHABLE: &str = "AMDGPUDaemonUnreachable";
const REACHABLE: &str = "AMDGPUDaemonReachable";
/// `--gpud-unreachable-after`: short, so that the test does not wait 30 s.
const GRACE_SECS: &str = "2";
/// A UID that names no user (nothing creates it).
const STRANGER_UID: &str = "60799";
/// `nobody`: a user, but not one the shipped policy names.
const NOBODY_UID: &str = "65534";

struct Scene {
    root: tempfile::TempDir,
    bus: PrivateBus,
    api: FakeApiServer,
    kubelet: FakeKubelet,
    metrics: std::net::SocketAddr,
}

async fn scene() -> Scene {
    let root = common::build_fixture("rx9070xt-igpu");
    let bus = PrivateBus::start(Policy::Shipped).unwrap();
    let api = FakeApiServer::start().unwrap();
    api.put_node(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}));
    let kubelet = FakeKubelet::start().await.unwrap();
    let metrics = std::net::SocketAddr::from(([127, 0, 0, 1], stack::free_port().unwrap()));
    Scene {
        root,
        bus,
        api,
        kubelet,
        metrics,
    }
}

/// `fake-node plugin` for `scene`, as `uid` when given (through setpriv).
fn plugin(s: &Scene, uid: Option<&str>) -> Process {
    let kubeconfig = s.api.kubeconfig(s.root.path());
    let mut command = match uid {
        None => Command::new(common::fake_node_exe()),
        Some(uid) => {
            // The stranger must read the kubeconfig and bind in kubelet's directory.
            allow_all(s.root.path(), 0o755);
            allow_all(&kubeconfig, 0o644);
            allow_all(s.kubelet.dir(), 0o777);
            let mut c = Command::new("setpriv");
            c.args(["--reuid", uid, "--regid", uid, "--clear-groups"])
                .arg(common::fake_node_exe());
            c
        }
    };
    command
        .args(["plugin", "--bus-address", &s.bus.address, "--kubelet-dir"])
        .arg(s.kubelet.dir())
        .arg("--kube")
        .arg(&kubeconfig)
        .args(["--node-name", NODE, "--sandbox", "off"])
        .args(["--gpud-unreachable-after", GRACE_SECS])
        .args(["--metrics-address", &s.metrics.to_string()])
        // Its tests run side by side: no two plugins on the default probe port.
        .args(["--probe-address", "none"])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    Process(command.spawn().unwrap())
}

fn allow_all(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// The Node Events with `reason`, oldest first.
fn node_events(api: &FakeApiServer, reason: &str) -> Vec<Value> {
    api.events()
        .into_iter()
        .filter(|e| e["regarding"]["kind"] == "Node" && e["regarding"]["name"] == NODE)
        .filter(|e| e["reason"] == reason)
        .collect()
}

async fn wait_event(api: &FakeApiServer, reason: &str, limit: Duration) -> Value {
    let start = Instant::now();
    loop {
        if let Some(event) = node_events(api, reason).into_iter().next() {
            return event;
        }
        assert!(
            start.elapsed() < limit,
            "no {reason} Event on the Node within {limit:?}: {:?}",
            api.events()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn note(event: &Value) -> &str {
    event["note"].as_str().unwrap_or_default()
}

#[test]
fn without_amd_gpud_the_node_says_why_once_and_then_that_it_is_back() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(Duration::from_secs(90), async {
        let s = scene().await;
        let _plugin = plugin(&s, None);
        let warning = wait_event(&s.api, UNREACHABLE, Duration::from_secs(30)).await;
        assert_eq!(warning["type"], "Warning");
        let text = note(&warning);
        assert!(text.contains("amd-gpud is not running"), "{text}");
        assert!(text.contains("systemctl enable --now amd-gpud"), "{text}");
        // A node without amd-gpud: ready, no device, and the body says why.
        let (status, body) = stack::http_get(s.metrics, "/readyz").unwrap();
        assert_eq!(status, 200, "ready without amd-gpud: {body}");
        assert!(body.contains("no device"), "{body}");
        assert!(body.contains("io.hami.AmdGpu1"), "{body}");
        assert!(s.kubelet.devices().is_empty(), "no device listed");
        // Several retries and pulses later, still said once.
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert_eq!(node_events(&s.api, UNREACHABLE).len(), 1, "said once");

        let fake_node = common::fake_node_exe();
        let _gpud = stack::gpud(&fake_node, &s.bus, s.root.path(), 0).unwrap();
        let back = wait_event(&s.api, REACHABLE, Duration::from_secs(30)).await;
        assert_eq!(back["type"], "Normal");
        s.kubelet
            .wait_devices(Duration::from_secs(20), |d| d.len() == 3)
            .await
            .unwrap();
        assert_eq!(node_events(&s.api, UNREACHABLE).len(), 1);
        assert_eq!(node_events(&s.api, REACHABLE).len(), 1);
        let (status, body) = stack::http_get(s.metrics, "/readyz").unwrap();
        assert_eq!(
            (status, body.as_str()),
            (200, "ok\n"),
            "serving with amd-gpud"
        );
    });
}

/// `uid` must not be amdgpu-plugin: what the note says, once.
async fn refused_as(uid: &str) -> String {
    let s = scene().await;
    let fake_node = common::fake_node_exe();
    let _gpud = stack::gpud(&fake_node, &s.bus, s.root.path(), 0).unwrap();
    let _plugin = plugin(&s, Some(uid));
    let warning = wait_event(&s.api, UNREACHABLE, Duration::from_secs(30)).await;
    // amd-gpud is there, the bus refuses the plugin: unready, so the
    // rollout shows it.
    let (status, _) = stack::http_get(s.metrics, "/readyz").unwrap();
    assert_eq!(status, 503, "unready while refused");
    assert!(s.kubelet.devices().is_empty(), "no device listed");
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(node_events(&s.api, UNREACHABLE).len(), 1, "said once");
    note(&warning).to_owned()
}

/// A user of the node that the policy does not name (`nobody`): the bus
/// answers AccessDenied.
#[test]
fn a_plugin_the_policy_does_not_name_says_its_uid_and_the_fix() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(Duration::from_secs(90), async {
        let text = refused_as(NOBODY_UID).await;
        assert!(text.contains(&format!("UID {NOBODY_UID}")), "{text}");
        assert!(text.contains("systemctl reload dbus"), "{text}");
        assert!(text.contains("runAsUser"), "{text}");
    });
}

/// A UID that names no user on the node: dbus-daemon drops the connection
/// during authentication (it cannot look up the user's groups), which is
/// not a missing bus.
#[test]
fn a_plugin_whose_uid_names_no_user_is_told_so_not_told_the_bus_is_missing() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(Duration::from_secs(90), async {
        let text = refused_as(STRANGER_UID).await;
        assert!(text.contains(&format!("UID {STRANGER_UID}")), "{text}");
        assert!(text.contains("names no user on the node"), "{text}");
        assert!(!text.contains("/run/dbus mounted"), "{text}");
    });
}
