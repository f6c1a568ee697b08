//! `node-sim --cluster real` (issue 18): every example pod goes through the
//! real API server and a real kubelet (1.36) per node, which calls
//! GetPreferredAllocation, Allocate and PreStartContainer itself and hands
//! the result to the runtime (`recording-cri`). The report must hold the
//! same checks as the fake cluster's, and every container must have been
//! given exactly what the fake kubelet got from the plugin: the fake is
//! checked against the real one. Needs root (kubelet).

// An integration-test file is itself the test module, and a failed unwrap is a
// failed test here.
#![allow(clippy::tests_outside_test_module, clippy::unwrap_used)]

mod common;

use std::{process::Command, time::Duration};

use common::examples::{EXAMPLE_PODS, containers, default_examples, pod_named, pod_names};
use serde_json::Value;

/// The first run builds the Kubernetes components (minutes).
const LIMIT: Duration = Duration::from_secs(1500);

fn node_sim_json(args: &[&str]) -> Value {
    node_sim_json_status(args, 0)
}

/// node-sim's JSON report, which must end with exit status `status`.
fn node_sim_json_status(args: &[&str], status: i32) -> Value {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_node-sim"));
    // The emulator places the pods unless a test names HAMi's scheduler.
    cmd.env_remove("HAMI_SCHEDULER");
    cmd.arg("--json").args(args);
    let (code, stdout, stderr) = common::run_with_timeout(cmd, LIMIT);
    assert_eq!(code, status, "node-sim {args:?}:\n{stderr}");
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("no JSON report ({e}):\n{stderr}"))
}

/// A host path with the run's scratch directory cut off.
fn unrooted(path: &str) -> String {
    match path.find("/root/") {
        Some(at) if path.starts_with("/dev/shm/") || path.starts_with("/tmp/") => {
            path[at + "/root".len()..].to_owned()
        }
        _ => path.to_owned(),
    }
}

/// What a container was given, as both clusters must agree on it: the
/// environment, devices and mounts (host paths below the fake root), CDI
/// names, the per-GPU view, PreStartContainer's outcome. Kubelet's device
/// ids are left out: kubelet picks among the GPU's slots.
fn given(c: &Value) -> Value {
    let mut c = c.clone();
    for field in ["devices", "mounts"] {
        for item in c[field].as_array_mut().unwrap() {
            let host = unrooted(item["host_path"].as_str().unwrap());
            item["host_path"] = Value::from(host);
        }
    }
    c.as_object_mut().unwrap().remove("kubelet_ids");
    c
}

fn same_as_the_fake(real: &Value, fake: &Value) {
    let names = |r: &Value| -> Vec<String> {
        r["pods"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["name"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(names(real), names(fake));
    for name in names(fake) {
        let (r, f) = (pod_named(real, &name), pod_named(fake, &name));
        for key in [
            "scheduled",
            "bind_phase",
            "devices_allocated",
            "cu_allocated",
        ] {
            assert_eq!(r[key], f[key], "pod {name}: {key}");
        }
        let (rc, fc) = (containers(r), containers(f));
        assert_eq!(rc.len(), fc.len(), "pod {name}");
        for (a, b) in rc.iter().zip(fc) {
            assert_eq!(given(a), given(b), "pod {name}: real kubelet vs fake");
        }
    }
}

#[test]
fn every_example_goes_through_the_real_kubelet() {
    if !common::can_run_bus_tests() {
        return;
    }
    let real = node_sim_json(&["--cluster", "real"]);
    default_examples(&real);
    assert_eq!(real["overlaps"], Value::Array(Vec::new()));
    let fake = node_sim_json(&["--cluster", "fake"]);
    same_as_the_fake(&real, &fake);
    for node in real["nodes"].as_array().unwrap() {
        // Lifted as the node lifecycle controller would: a real scheduler
        // places nothing on a node with the not-ready taint.
        assert_eq!(node["taints"], Value::Array(Vec::new()), "{node}");
    }
}

/// With `--cdi` the plugin names CDI devices instead of device nodes, and
/// kubelet passes them to the runtime (CreateContainer's CDI devices).
#[test]
fn cdi_device_names_reach_the_runtime() {
    if !common::can_run_bus_tests() {
        return;
    }
    let pods = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/01-quarter-gpu.yaml"
    );
    let real = node_sim_json(&["--cluster", "real", "--cdi", "--pods", pods]);
    let c = &containers(pod_named(&real, "quarter-gpu"))[0];
    let names = c["cdi_devices"].as_array().unwrap();
    assert_eq!(names.len(), 1, "{c}");
    let name = names[0].as_str().unwrap();
    assert!(name.starts_with("amd.com/gpu="), "{name}");
    assert_eq!(c["envs"]["HSA_CU_MASK"], "0:0-75", "{c}");
    let fake = node_sim_json(&["--cluster", "fake", "--cdi", "--pods", pods]);
    same_as_the_fake(&real, &fake);
}

/// Issue 35: a real HAMi scheduler (`HAMI_SCHEDULER` names a binary built
/// from Project-HAMi/HAMi's `cmd/scheduler`; the project never builds it)
/// behind a kube-scheduler configured as HAMi's chart configures it places
/// every example, the plugin serves every decision, and HAMi's choices are
/// the emulator's.
#[test]
fn the_real_hami_scheduler_places_every_example() {
    let Some(hami) = std::env::var_os("HAMI_SCHEDULER") else {
        eprintln!(
            "skipped: HAMI_SCHEDULER names no HAMi scheduler binary (build Project-HAMi/HAMi's \
             cmd/scheduler outside the repository and point HAMI_SCHEDULER at it)"
        );
        return;
    };
    if !common::can_run_bus_tests() {
        return;
    }
    let hami = hami.to_string_lossy().into_owned();
    let real = node_sim_json(&["--cluster", "real", "--hami-scheduler", &hami]);
    assert_eq!(real["overlaps"], Value::Array(Vec::new()));
    for pod in real["pods"].as_array().unwrap() {
        if pod["name"] == "too-big" {
            // kube-scheduler's message, with HAMi's reason in it.
            assert_eq!(pod["scheduled"], false, "{pod}");
            let reason = pod["reason"].as_str().unwrap();
            assert!(reason.contains("8/8 CardInsufficientMemory"), "{reason}");
        } else {
            assert_eq!(pod["bind_phase"], "success", "{pod}");
        }
    }
    let emulated = node_sim_json(&["--cluster", "real"]);
    same_as_the_fake(&real, &emulated);
}

/// Issue 35: an init container that ran to its end (`recording-cri` ends
/// it at once: `RECORDING_CRI_EXIT_ON` names a path that exists) gives its
/// CUs back; HAMi places a later pod on them, and the report does not
/// count the two as overlapping (they never ran at the same time).
#[test]
fn a_finished_init_container_overlaps_no_later_pod() {
    if !common::can_run_bus_tests() {
        return;
    }
    let share =
        "resources: {limits: {amd.com/gpu: 1, amd.com/gpucores: 100, amd.com/gpumem: 1024}}";
    let pod = |name: &str, spec: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  annotations: \
             {{hami.io/gpu-scheduler-policy: binpack}}\nspec:\n{spec}"
        )
    };
    let first = pod(
        "init-first",
        &format!(
            "  initContainers:\n  - name: prep\n    image: x\n    env: [{{name: \
             RECORDING_CRI_EXIT_ON, value: /}}]\n    {share}\n  containers:\n  - name: main\n    \
             image: x\n"
        ),
    );
    let later = pod(
        "later",
        &format!("  containers:\n  - name: main\n    image: x\n    {share}\n"),
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pods.yaml");
    std::fs::write(&file, format!("{first}---\n{later}")).unwrap();
    let path = file.to_str().unwrap();
    let real = node_sim_json(&["--cluster", "real", "--mode", "cu", "--pods", path]);
    let gpu = |name: &str| {
        let c = &containers(pod_named(&real, name))[0];
        c["gpus"][0]["id"].as_str().unwrap().to_owned()
    };
    assert_eq!(
        gpu("init-first"),
        gpu("later"),
        "HAMi reuses the GPU: {real}"
    );
    assert_eq!(real["overlaps"], Value::Array(Vec::new()));
}

/// `--all-at-once` on the real cluster: every example is created and bound
/// before node-sim waits for any, the real kubelet admitting each as soon
/// as it is bound (and HAMi's emulated Bind waiting for the node lock);
/// every example ends as it does one at a time.
#[test]
fn all_at_once_every_example_goes_through_the_real_kubelet() {
    if !common::can_run_bus_tests() {
        return;
    }
    let real = node_sim_json(&["--cluster", "real", "--all-at-once"]);
    assert_eq!(pod_names(&real), EXAMPLE_PODS);
    default_examples(&real);
    assert_eq!(real["overlaps"], Value::Array(Vec::new()));
}

/// Issue 35: on a sidecar pod, a pod HAMi then places on the sidecar's CUs,
/// a memory limit HAMi drops and cores without a count, the emulator gives
/// the outcome the real HAMi v2.10.0 gives (`HAMI_SCHEDULER`), and that
/// outcome is the one `docs/hami-protocol.md` §3.9 and §4.2 describe.
#[test]
fn sidecars_and_dropped_requests_end_as_with_hami() {
    if !common::can_run_bus_tests() {
        return;
    }
    let pods = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/fixtures/pods/hami-v2.10-outcomes.yaml"
    );
    // What HAMi granted each pod, and how the pods it placed on a running
    // sidecar's CUs and without devices ended. (The sidecar pod itself is
    // left out of the phases: its bind-phase is read right after it runs.)
    let outcome = |report: &Value| -> Vec<(Value, Value)> {
        report["pods"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| (p["name"].clone(), p["devices_allocated"].clone()))
            .collect()
    };
    let phases = |report: &Value| -> Vec<(String, String)> {
        report["pods"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["name"] != "with-sidecar")
            .map(|p| {
                let text = |k: &str| p[k].as_str().unwrap_or_default().to_owned();
                (text("name"), text("bind_phase"))
            })
            .collect()
    };
    let emulated = node_sim_json_status(&["--cluster", "real", "--pods", pods], 2);
    let want: Vec<(String, String)> = [
        ("second", "failed"),
        ("mem-16gi", "allocating"),
        ("cores-only", "allocating"),
    ]
    .iter()
    .map(|(n, p)| ((*n).to_owned(), (*p).to_owned()))
    .collect();
    assert_eq!(phases(&emulated), want);
    let sidecar = &outcome(&emulated)[0].1;
    assert_eq!(
        sidecar.as_str().unwrap().matches(":;").count(),
        2,
        "{sidecar}"
    );
    for pod in ["mem-16gi", "cores-only"] {
        assert_eq!(pod_named(&emulated, pod)["devices_allocated"], Value::Null);
    }
    let Some(hami) = std::env::var_os("HAMI_SCHEDULER") else {
        eprintln!(
            "skipped the comparison with HAMi: HAMI_SCHEDULER names no HAMi scheduler binary"
        );
        return;
    };
    let hami = hami.to_string_lossy().into_owned();
    let args = [
        "--cluster",
        "real",
        "--hami-scheduler",
        &hami,
        "--pods",
        pods,
    ];
    let real = node_sim_json_status(&args, 2);
    assert_eq!(outcome(&real), outcome(&emulated));
    assert_eq!(phases(&real), want);
}

/// Issue 35: under `--keep-running` a pod created afterwards (as with
/// kubectl, `schedulerName: hami-scheduler`) is placed by kube-scheduler
/// `hami-scheduler` with the emulator as HAMi's extender, admitted by the
/// real kubelet, and reported by node-sim.
#[test]
fn a_pod_created_later_is_placed_under_keep_running() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(LIMIT, created_later());
}

async fn created_later() {
    use std::io::{BufRead, BufReader};

    let quarter = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/01-quarter-gpu.yaml"
    );
    let mut child = Command::new(env!("CARGO_BIN_EXE_node-sim"))
        .env_remove("HAMI_SCHEDULER")
        .args(["--cluster", "real", "--keep-running", "--pods", quarter])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let _stop = StopOnDrop(child);
    let kubeconfig = tokio::task::spawn_blocking(move || {
        stdout.lines().map_while(Result::ok).find_map(|l| {
            l.trim()
                .strip_prefix("export KUBECONFIG=")
                .map(str::to_owned)
        })
    })
    .await
    .unwrap()
    .expect("node-sim printed no kubeconfig");
    let config = kube::config::Kubeconfig::read_from(&kubeconfig).unwrap();
    let options = kube::config::KubeConfigOptions::default();
    let config = kube::Config::from_custom_kubeconfig(config, &options)
        .await
        .unwrap();
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(kube::Client::try_from(config).unwrap(), "default");
    let pod = serde_json::json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "later"},
        "spec": {"schedulerName": "hami-scheduler", "containers": [{"name": "main",
            "image": "rocm", "resources": {"limits": {"amd.com/gpu": "1",
            "amd.com/gpucores": "25", "amd.com/gpumem": "8192"}}}]}});
    pods.create(&Default::default(), &serde_json::from_value(pod).unwrap())
        .await
        .unwrap();
    let reported = tokio::task::spawn_blocking(move || {
        stderr
            .lines()
            .map_while(Result::ok)
            .find(|l| l.contains("pod default/later on ") && l.contains("phase Running"))
    })
    .await
    .unwrap()
    .expect("node-sim never reported the pod running");
    assert!(reported.contains(",8192,76:;"), "{reported}");
    assert!(reported.contains("bind-phase \"success\""), "{reported}");
}

/// node-sim, sent SIGTERM when dropped (it then stops what it started) and
/// waited for, killed after 60 s.
struct StopOnDrop(std::process::Child);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        let pid = self.0.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let start = std::time::Instant::now();
        while start.elapsed() < Duration::from_secs(60) {
            if self.0.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
