//! `node-sim` on the default examples: the whole stack (private bus,
//! amd-gpud with the fake AMD SMI, the plugin, the fake kubelet, the fake API
//! server, HAMi's Filter and Bind emulated) on an MI300X node in cu mode and
//! a CPX node in partition mode. Checks the JSON report's structure and
//! values, and that the text report carries the same story. Runs as root
//! (shipped bus policy) and as any other user (a policy that lets the user
//! own the name).

// An integration-test file is itself the test module, and a failed unwrap is a
// failed test here.
#![allow(clippy::tests_outside_test_module, clippy::unwrap_used)]

mod common;

use std::{collections::BTreeSet, process::Command, time::Duration};

use common::examples::{
    EXAMPLE_PODS, admitted, containers, default_examples, gpus, pod_named, pod_names, sliced,
};
use serde_json::Value;
use tests::node_sim::report::id_ranges;

/// The first run may build the fake AMD SMI library with cargo.
const LIMIT: Duration = Duration::from_secs(300);

fn node_sim(args: &[&str]) -> (i32, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_node-sim"));
    cmd.args(args);
    common::run_with_timeout(cmd, LIMIT)
}

use common::have_dbus;

/// node-sim `--json` on the RX 9070 XT node with `yaml` as the pods (and
/// `extra` arguments): exit code, report, stderr.
fn rdna_pods(yaml: &str, extra: &[&str]) -> (i32, Value, String) {
    let mut args = vec!["--node", "rx9070xt"];
    args.extend_from_slice(extra);
    json_pods(yaml, &args)
}

/// node-sim `--json` with `yaml` as the pods and `args`: exit code,
/// report, stderr.
fn json_pods(yaml: &str, extra: &[&str]) -> (i32, Value, String) {
    let dir = tempfile::tempdir().unwrap();
    let pods = dir.path().join("pods.yaml");
    std::fs::write(&pods, yaml).unwrap();
    let mut args = vec!["--json", "--pods", pods.to_str().unwrap()];
    args.extend_from_slice(extra);
    let (code, stdout, stderr) = node_sim(&args);
    let report = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("no JSON report ({e}), exit {code}:\n{stderr}"));
    (code, report, stderr)
}

#[test]
fn the_default_examples_report() {
    if !have_dbus() {
        return;
    }
    let (code, stdout, stderr) = node_sim(&["--json"]);
    assert_eq!(code, 0, "node-sim failed:\n{stderr}");
    let report: Value = serde_json::from_str(&stdout).unwrap();
    default_examples(&report);
    assert!(stderr.contains("plugin registered"), "progress: {stderr}");
}

#[test]
fn the_text_report_tells_the_same() {
    if !have_dbus() {
        return;
    }
    let (code, stdout, stderr) = node_sim(&["--quiet"]);
    assert_eq!(code, 0, "node-sim failed:\n{stderr}");
    assert!(stderr.is_empty(), "--quiet: {stderr}");
    for want in [
        "hami.io/node-amd-register (what HAMi reads):",
        "━━ pod quarter-gpu [A]",
        "CUs 0-75 (76), VRAM limit 4096 MiB",
        "HSA_CU_MASK=0:0-75",
        "NOT SCHEDULED: container main: 0 of 1 GPU(s) fit (8/8 CardInsufficientMemory)",
        "━━ CU occupancy on mi300x-8-spx-cu (one cell = 8 CUs",
        "pods: A quarter-gpu, B two-gpus, C two-containers, D whole-gpu",
        "━━ CU occupancy on mi300x-8-cpx-partition (one cell = 1 CU,",
        "/vram 4096 MiB",
    ] {
        assert!(stdout.contains(want), "missing {want:?} in:\n{stdout}");
    }
}

/// Two pods on the RX 9070 XT (gfx12, WGP pairs), admitted one right after
/// the other: the second Allocate must count the first pod's CUs even when
/// the plugin's watch has not delivered that pod yet (issue 16), and both
/// containers must start.
#[test]
fn back_to_back_pods_get_disjoint_cus_and_start() {
    if !have_dbus() {
        return;
    }
    let pod = |name: &str, cores: u32| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  containers:\n  \
             - name: c\n    image: x\n    resources: {{limits: {{amd.com/gpu: 1, \
             amd.com/gpucores: {cores}, amd.com/gpumem: 1024}}}}\n"
        )
    };
    let yaml = format!("{}---\n{}", pod("first", 25), pod("second", 40));
    let (code, report, stderr) = rdna_pods(&yaml, &[]);
    assert_eq!(code, 0, "node-sim failed:\n{stderr}");
    assert_eq!(report["overlaps"], serde_json::json!([]));
    let mut masks = Vec::new();
    for name in ["first", "second"] {
        let c = &containers(pod_named(&report, name))[0];
        let pre_start = c["pre_start"].as_str().unwrap_or_default();
        assert!(pre_start.starts_with("ok"), "{name}: PreStart {pre_start}");
        let ranges = gpus(c)[0]["cu_ranges"].as_str().unwrap().to_owned();
        masks.push(id_ranges(&ranges).collect::<Vec<_>>());
    }
    let cus = |m: &[(u32, u32)]| {
        m.iter()
            .flat_map(|(a, b)| *a..=*b)
            .collect::<BTreeSet<u32>>()
    };
    assert!(
        cus(&masks[0]).is_disjoint(&cus(&masks[1])),
        "overlapping CU masks: {masks:?}"
    );
}

/// A container whose PreStartContainer fails (here: kubelet made no pod
/// cgroup, so amd-gpud has nowhere to put the VRAM cap) is reported as not
/// started, and node-sim exits 2.
#[test]
fn a_failed_pre_start_is_reported_and_exits_2() {
    if !have_dbus() {
        return;
    }
    let yaml = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: no-cgroup\n  annotations: \
                {node-sim/pod-cgroup: absent}\nspec:\n  containers:\n  - name: c\n    image: x\n    \
                resources: {limits: {amd.com/gpu: 1, amd.com/gpucores: 25, amd.com/gpumem: 1024}}\n";
    let (code, report, stderr) = rdna_pods(yaml, &["--amdsmi", "none"]);
    assert_eq!(code, 2, "node-sim:\n{stderr}");
    let c = &containers(pod_named(&report, "no-cgroup"))[0];
    assert!(c["error"].is_null(), "Allocate itself worked: {c}");
    let why = c["start_error"].as_str().unwrap();
    assert!(
        why.contains("PreStartContainer failed") && why.contains("no cgroup for pod"),
        "{why}"
    );
    assert!(stderr.contains("did not start"), "progress: {stderr}");
    let pod = pod_named(&report, "no-cgroup");
    assert_eq!(
        (&pod["pod_cgroup"], &pod["vram_cap"]),
        (&Value::Null, &Value::Null)
    );
}

/// The report shows the VRAM cap amd-gpud wrote at PreStartContainer: the
/// pod cgroup's `dmem.max` on the fake host, for the one GPU of a slice.
#[test]
fn a_sliced_pods_report_shows_its_vram_cap() {
    if !have_dbus() {
        return;
    }
    let example = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/01-quarter-gpu.yaml"
    );
    let args = [
        "--json", "--mode", "cu", "--amdsmi", "none", "--pods", example,
    ];
    let (code, stdout, stderr) = node_sim(&args);
    assert_eq!(code, 0, "node-sim failed:\n{stderr}");
    let report: Value = serde_json::from_str(&stdout).unwrap();
    let pod = pod_named(&report, "quarter-gpu");
    let cgroup = pod["pod_cgroup"].as_str().unwrap();
    assert!(
        cgroup.starts_with("kubepods.slice/")
            && cgroup.contains(pod["uid"].as_str().unwrap().replace('-', "_").as_str()),
        "{pod}"
    );
    let caps = pod["vram_cap"].as_object().unwrap();
    assert_eq!(caps.len(), 1, "{pod}");
    let (region, cap) = caps.iter().next().unwrap();
    assert!(
        region.starts_with("drm/0000:") && region.ends_with("/vram"),
        "{region}"
    );
    assert_eq!(cap, 4096_u64 * 1024 * 1024, "{pod}");
}

#[test]
fn bad_options_and_pods_fail_clearly() {
    let (code, _, stderr) = node_sim(&["--node", "mi999"]);
    assert_eq!(code, 1);
    assert!(stderr.contains("unknown node \"mi999\""), "{stderr}");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("x.yaml");
    std::fs::write(&file, "apiVersion: apps/v1\nkind: Deployment\n").unwrap();
    let (code, _, stderr) = node_sim(&["--pods", file.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(stderr.contains("is not a Pod"), "{stderr}");
}

/// As a user the shipped bus policy knows nothing about: the simulator's
/// own policy lets it own amd-gpud's name, and amd-gpud lets its UID call.
#[test]
fn runs_as_an_ordinary_user() {
    use std::os::unix::fs::PermissionsExt;

    use tests::bus::{OTHER_UID, effective_uid, ensure_other_user};

    if !have_dbus() || effective_uid().unwrap() != 0 {
        eprintln!("skipping: needs root to run node-sim as another user");
        return;
    }
    ensure_other_user().unwrap();
    let exe = env!("CARGO_BIN_EXE_node-sim");
    let as_other = |args: &[&str]| {
        let mut cmd = Command::new("setpriv");
        cmd.arg(format!("--reuid={OTHER_UID}"))
            .arg(format!("--regid={OTHER_UID}"))
            .args(["--clear-groups", "--", exe])
            .args(args);
        common::run_with_timeout(cmd, LIMIT)
    };
    if as_other(&["--version"]).0 != 0 {
        eprintln!("skipping: uid {OTHER_UID} cannot run {exe}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let pod = dir.path().join("quarter.yaml");
    let example = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/01-quarter-gpu.yaml"
    );
    std::fs::copy(example, &pod).unwrap();
    let (code, stdout, stderr) = as_other(&[
        "--json",
        "--amdsmi",
        "none",
        "--mode",
        "cu",
        "--pods",
        pod.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "node-sim as uid {OTHER_UID} failed:\n{stderr}");
    let report: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["bus_policy"], "Unprivileged");
    let p = pod_named(&report, "quarter-gpu");
    admitted(p, &[1]);
    sliced(&containers(p)[0], 76, 4096);
}

/// Kubelet's device manager hands an init container's devices to the next
/// containers of the pod (`devicesToReuse`): in partition mode HAMi grants
/// an init container and an app container of one size the same partition,
/// and the fake kubelet must give the app container the init container's
/// device ids, as kubelet does, for the pod to start.
#[test]
fn an_app_container_reuses_its_init_containers_partition() {
    if !have_dbus() {
        return;
    }
    let yaml = "apiVersion: v1\nkind: Pod\nmetadata: {name: staged}\nspec:\n  initContainers:\n  \
                - name: prep\n    image: x\n    resources: {limits: {amd.com/gpu: 1}}\n  \
                containers:\n  - name: main\n    image: x\n    resources: {limits: {amd.com/gpu: 1}}\n";
    let (code, report, stderr) = json_pods(yaml, &["--mode", "partition", "--amdsmi", "none"]);
    assert_eq!(code, 0, "node-sim failed:\n{stderr}");
    let pod = pod_named(&report, "staged");
    admitted(pod, &[1, 1]);
    let [init, app] = [&containers(pod)[0], &containers(pod)[1]];
    assert_eq!(init["init"], true, "{init}");
    assert_eq!(app["kubelet_ids"], init["kubelet_ids"], "{pod}");
    assert_eq!(report["overlaps"], serde_json::json!([]));
}

/// `--all-at-once`: HAMi binds every pod of a node before kubelet admits
/// any (one pod holding the node lock at a time, as HAMi's Bind does);
/// the examples end as they do one at a time.
#[test]
fn all_at_once_binds_every_example_before_admitting_any() {
    if !have_dbus() {
        return;
    }
    let (code, stdout, stderr) = node_sim(&["--json", "--all-at-once"]);
    assert_eq!(code, 0, "node-sim failed:\n{stderr}");
    let report: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(pod_names(&report), EXAMPLE_PODS);
    default_examples(&report);
    assert!(
        stderr
            .contains("HAMi's Bind of pod two-gpus waits: default/quarter-gpu holds the node lock"),
        "{stderr}"
    );
}

/// Issue 35, point 1, replayed with `--all-at-once`: a pod whose AMD
/// request is in an init container only is bound without the node lock
/// and admitted while the lock names an app pod not yet bound; both pods
/// are admitted, on CUs of their own.
#[test]
fn all_at_once_replays_an_init_only_pod_beside_the_lock() {
    if !have_dbus() {
        return;
    }
    let res = "resources: {limits: {amd.com/gpu: 1, amd.com/gpucores: 25, amd.com/gpumem: 1024}}";
    let yaml = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: r-init}}\nspec:\n  initContainers:\n  \
         - name: prep\n    image: x\n    {res}\n  containers:\n  - name: main\n    image: x\n\
         ---\napiVersion: v1\nkind: Pod\nmetadata: {{name: r-app}}\nspec:\n  containers:\n  \
         - name: main\n    image: x\n    {res}\n"
    );
    let (code, report, stderr) = rdna_pods(&yaml, &["--all-at-once", "--amdsmi", "none"]);
    assert_eq!(code, 0, "node-sim failed:\n{stderr}");
    for name in ["r-init", "r-app"] {
        let pod = pod_named(&report, name);
        assert_eq!(pod["bind_phase"], "success", "{pod}");
        assert_eq!(containers(pod)[0]["error"], Value::Null, "{pod}");
    }
    assert_eq!(report["overlaps"], serde_json::json!([]));
}

/// HAMi's monitor-side series (issue 37 point 5: those its dashboard
/// queries, and the host temperature and power), with the labels the
/// dashboard's queries filter, join or group by and its legends print
/// (Project-HAMi/HAMi:dashboards/hami-vgpu-dashboard.json).
const MONITOR_SERIES: [(&str, &[&str]); 7] = [
    ("hami_container_device_utilization_ratio", CONTAINER),
    ("hami_vgpu_memory_used_bytes", CONTAINER),
    ("hami_vgpu_memory_limit_bytes", CONTAINER),
    ("hami_host_gpu_memory_used_bytes", HOST),
    ("hami_host_gpu_utilization_ratio", HOST),
    ("hami_host_gpu_temperature_celsius", HOST),
    ("hami_host_gpu_power_usage_watts", HOST),
];
const CONTAINER: &[&str] = &[
    "namespace",
    "pod",
    "container",
    "vdevice_index",
    "device_uuid",
];
const HOST: &[&str] = &["node", "device_index", "device_uuid", "device_type"];

/// Each node's plugin serves HAMi's monitor on port 9394 at a loopback
/// address of its own, named in the report; a scrape finds every series
/// HAMi's dashboard reads, with its labels, for the pod that holds a slice.
#[test]
fn each_node_serves_hamis_monitor_on_9394() {
    if !have_dbus() {
        return;
    }
    let example = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/01-quarter-gpu.yaml"
    );
    let args = [
        "--json",
        "--keep-running",
        "--mode",
        "cu",
        "--amdsmi",
        "none",
        "--pods",
        example,
    ];
    let running = Running::start(&args);
    let nodes = running.report["nodes"].as_array().unwrap().clone();
    assert!(!nodes.is_empty());
    // The slice's KFD process fills its CUs: its ratio is their share of
    // the MI300X's 304, from cu_occupancy, not the GPU's activity (42).
    let pod = pod_named(&running.report, "quarter-gpu");
    let cus = pod["containers"][0]["gpus"][0]["cu_count"]
        .as_f64()
        .unwrap();
    let want = format!(" {}", (cus * 100.0 / 304.0).round());
    let slice = |text: &str| {
        text.lines()
            .find(|l| {
                l.starts_with("hami_container_device_utilization_ratio{")
                    && l.contains("pod=\"quarter-gpu\"")
            })
            .map(str::to_owned)
    };
    for node in &nodes {
        let url = node["monitor"].as_str().unwrap_or_else(|| panic!("{node}"));
        let rest = url.strip_prefix("http://127.0.0.").unwrap();
        assert!(rest.contains(":9394/metrics"), "{url}");
        let text = scrape_until(url, |t| {
            MONITOR_SERIES
                .iter()
                .all(|(name, _)| t.contains(&format!("{name}{{")))
                && slice(t).is_some_and(|l| l.ends_with(&want))
        });
        for (name, labels) in MONITOR_SERIES {
            let line = text
                .lines()
                .find(|l| l.starts_with(&format!("{name}{{")))
                .unwrap_or_else(|| panic!("{name} missing at {url}:\n{text}"));
            for label in labels {
                assert!(
                    line.contains(&format!("{label}=\""))
                        && !line.contains(&format!("{label}=\"\"")),
                    "{name} lacks {label}: {line}"
                );
            }
        }
        let ratio = slice(&text).unwrap_or_else(|| panic!("no utilization for the slice:\n{text}"));
        assert!(ratio.ends_with(&want), "{ratio}, want{want}");
    }
}

/// node-sim `--keep-running`, stopped (SIGTERM: it stops what it started)
/// when dropped; `report` is its `--json` report.
struct Running {
    child: std::process::Child,
    report: Value,
}

impl Running {
    fn start(args: &[&str]) -> Self {
        use std::io::BufRead;
        let mut child = Command::new(env!("CARGO_BIN_EXE_node-sim"))
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut text = String::new();
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                text.push_str(&line);
                text.push('\n');
                if let Ok(report) = serde_json::from_str::<Value>(&text) {
                    let _ = tx.send(report);
                }
            }
        });
        let mut running = Self {
            child,
            report: Value::Null,
        };
        running.report = rx
            .recv_timeout(LIMIT)
            .unwrap_or_else(|e| panic!("no JSON report from node-sim: {e}"));
        running
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let start = std::time::Instant::now();
        while self.child.try_wait().ok().flatten().is_none() {
            if start.elapsed() > Duration::from_secs(30) {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// `GET url` (plain HTTP on loopback) until `done` holds of the body, or
/// 60 s; the last body.
fn scrape_until(url: &str, done: impl Fn(&str) -> bool) -> String {
    use std::io::{Read, Write};
    let rest = url.strip_prefix("http://").unwrap();
    let (address, path) = rest.split_at(rest.find('/').unwrap());
    let start = std::time::Instant::now();
    let mut body = String::new();
    while start.elapsed() < Duration::from_secs(60) {
        if let Ok(mut stream) = std::net::TcpStream::connect(address) {
            let request = format!("GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n");
            let mut response = String::new();
            stream
                .set_read_timeout(Some(Duration::from_secs(10)))
                .unwrap();
            if stream.write_all(request.as_bytes()).is_ok()
                && stream.read_to_string(&mut response).is_ok()
            {
                body = response
                    .split_once("\r\n\r\n")
                    .map_or(response.clone(), |(_, b)| b.to_owned());
                if done(&body) {
                    return body;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    body
}
