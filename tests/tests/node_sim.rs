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

use std::{
    collections::{BTreeMap, BTreeSet},
    process::Command,
    time::Duration,
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
    let dir = tempfile::tempdir().unwrap();
    let pods = dir.path().join("pods.yaml");
    std::fs::write(&pods, yaml).unwrap();
    let mut args = vec![
        "--json",
        "--node",
        "rx9070xt",
        "--pods",
        pods.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let (code, stdout, stderr) = node_sim(&args);
    let report = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("no JSON report ({e}), exit {code}:\n{stderr}"));
    (code, report, stderr)
}

fn pod_named<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["pods"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("no pod {name} in the report"))
}

fn containers(pod: &Value) -> &Vec<Value> {
    pod["containers"].as_array().unwrap()
}

fn gpus(container: &Value) -> &Vec<Value> {
    container["gpus"].as_array().unwrap()
}

#[test]
fn the_default_examples_report() {
    if !have_dbus() {
        return;
    }
    let (code, stdout, stderr) = node_sim(&["--json"]);
    assert_eq!(code, 0, "node-sim failed:\n{stderr}");
    let report: Value = serde_json::from_str(&stdout).unwrap();
    nodes(&report);
    quarter(&report);
    two_gpus_and_two_containers(&report);
    whole_and_partition(&report);
    too_big(&report);
    occupancy(&report);
    assert!(stderr.contains("plugin registered"), "progress: {stderr}");
}

fn nodes(report: &Value) {
    let nodes = report["nodes"].as_array().unwrap();
    let got: Vec<(&str, &str, usize, u64)> = nodes
        .iter()
        .map(|n| {
            (
                n["name"].as_str().unwrap(),
                n["mode"].as_str().unwrap(),
                n["register"].as_array().unwrap().len(),
                n["kubelet_devices"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("mi300x-8-spx-cu", "cu", 8, 80),
            ("mi300x-8-cpx-partition", "partition", 64, 64)
        ]
    );
    let first = &nodes[0]["register"][0];
    assert_eq!(first["type"], "AMD Instinct MI300X", "{first}");
    assert_eq!(
        (&first["devcore"], &first["devmem"]),
        (&Value::from(304), &Value::from(196_608))
    );
    let expected_policy = if tests::bus::effective_uid().unwrap() == 0 {
        "Shipped"
    } else {
        "Unprivileged"
    };
    assert_eq!(report["bus_policy"], expected_policy);
}

/// Every admitted container: one grant per GPU, kubelet's ids the GPUs HAMi
/// chose, /dev/kfd plus a card and a render node per GPU, PreStart ok.
fn admitted(pod: &Value, gpus_per_container: &[usize]) {
    assert_eq!(pod["scheduled"], true, "{pod}");
    assert_eq!(pod["bind_phase"], "success", "{pod}");
    let cs = containers(pod);
    assert_eq!(cs.len(), gpus_per_container.len(), "{pod}");
    for (c, n) in cs.iter().zip(gpus_per_container) {
        assert_eq!(c["error"], Value::Null, "{c}");
        assert_eq!(gpus(c).len(), *n, "{c}");
        assert_eq!(c["grants"].as_array().unwrap().len(), *n);
        assert_eq!(c["kubelet_ids"].as_array().unwrap().len(), *n);
        assert_eq!(c["preferred_followed_hami"], true, "{c}");
        let devices = c["devices"].as_array().unwrap();
        assert_eq!(devices.len(), 1 + 2 * n, "{c}");
        assert_eq!(devices[0]["container_path"], "/dev/kfd");
        assert!(c["pre_start"].as_str().unwrap().starts_with("ok"), "{c}");
        let rocr = c["envs"]["ROCR_VISIBLE_DEVICES"].as_str().unwrap();
        assert_eq!(rocr.split(',').count(), *n, "{c}");
    }
}

/// A CU slice: mask, per-GPU memory limit, the hook.
fn sliced(c: &Value, cus: u64, mem: u64) {
    for (i, g) in gpus(c).iter().enumerate() {
        assert_eq!(g["cu_count"], cus, "{c}");
        assert_eq!(g["vram_limit_mib"], mem, "{c}");
        assert_eq!(
            c["envs"][format!("HIP_DEVICE_MEMORY_LIMIT_{i}")],
            format!("{mem}m")
        );
        assert_eq!(c["grants"][i]["cus"], cus);
        assert_eq!(c["grants"][i]["mem_mib"], mem);
    }
    assert_eq!(c["envs"]["LD_AUDIT"], "/usr/local/vgpu/libamvgpu.so");
    let mounts = c["mounts"].as_array().unwrap();
    assert_eq!(mounts.len(), 1, "{c}");
    assert_eq!(mounts[0]["read_only"], true);
}

/// A whole device: no mask, no limit, no hook.
fn whole(c: &Value) {
    for g in gpus(c) {
        assert_eq!(
            (&g["cu_ranges"], &g["vram_limit_mib"]),
            (&Value::Null, &Value::Null)
        );
    }
    for key in ["HSA_CU_MASK", "LD_AUDIT", "HIP_DEVICE_MEMORY_LIMIT_0"] {
        assert!(c["envs"].get(key).is_none(), "{key}: {c}");
    }
    assert!(c["mounts"].as_array().unwrap().is_empty(), "{c}");
}

fn quarter(report: &Value) {
    let p = pod_named(report, "quarter-gpu");
    admitted(p, &[1]);
    let c = &containers(p)[0];
    sliced(c, 76, 4096);
    assert_eq!(c["request"]["cores_percent"], 25);
    assert_eq!(gpus(c)[0]["cu_ranges"], "0-75", "the first pod on its GPU");
    assert_eq!(c["envs"]["HSA_CU_MASK"], "0:0-75");
    assert_eq!(p["letter"], "A");
}

fn two_gpus_and_two_containers(report: &Value) {
    let two = pod_named(report, "two-gpus");
    admitted(two, &[2]);
    let c = &containers(two)[0];
    sliced(c, 152, 16_384);
    let ids: BTreeSet<&str> = gpus(c).iter().map(|g| g["id"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), 2, "two different GPUs");

    let both = pod_named(report, "two-containers");
    admitted(both, &[1, 1]);
    let cs = containers(both);
    assert_eq!(
        (cs[0]["name"].as_str(), cs[1]["name"].as_str()),
        (Some("trainer"), Some("sidecar"))
    );
    sliced(&cs[0], 152, 8192);
    sliced(&cs[1], 76, 2048);
    // Binpack put them on two-gpus' GPUs, on CUs of their own.
    let mut owner: BTreeMap<(String, u32), String> = BTreeMap::new();
    for p in [two, both] {
        for (id, list) in p["cu_allocated"].as_object().unwrap() {
            assert!(
                ids.contains(id.as_str()),
                "{id} is not one of two-gpus' GPUs"
            );
            for (a, b) in id_ranges(list.as_str().unwrap()) {
                for cu in a..=b {
                    let name = p["name"].as_str().unwrap().to_owned();
                    assert_eq!(
                        owner.insert((id.clone(), cu), name),
                        None,
                        "CU {cu} of {id} twice"
                    );
                }
            }
        }
    }
}

fn whole_and_partition(report: &Value) {
    let w = pod_named(report, "whole-gpu");
    admitted(w, &[1]);
    let c = &containers(w)[0];
    whole(c);
    assert_eq!(
        (&c["grants"][0]["cus"], &c["grants"][0]["mem_mib"]),
        (&Value::from(304), &Value::from(196_608))
    );

    let p = pod_named(report, "partition");
    assert_eq!(
        (&p["node"], &p["mode"]),
        (
            &Value::from("mi300x-8-cpx-partition"),
            &Value::from("partition")
        )
    );
    admitted(p, &[1]);
    let c = &containers(p)[0];
    whole(c);
    assert_eq!(
        (&c["grants"][0]["cus"], &c["grants"][0]["mem_mib"]),
        (&Value::from(38), &Value::from(24_576))
    );
    assert_eq!(
        c["envs"]["ROCR_VISIBLE_DEVICES"], "0",
        "partitions are selected by index"
    );
    assert!(gpus(c)[0]["id"].as_str().unwrap().ends_with("-cpx7"), "{c}");
}

fn too_big(report: &Value) {
    let p = pod_named(report, "too-big");
    assert_eq!(p["scheduled"], false);
    assert!(containers(p).is_empty());
    assert_eq!(
        p["summary"],
        "container main: 0 of 1 GPU(s) fit (8/8 CardInsufficientMemory)"
    );
    let rejections = p["rejections"].as_array().unwrap();
    assert_eq!(rejections.len(), 8);
    for r in rejections {
        assert_eq!(r["reason"], "CardInsufficientMemory");
        assert!(
            r["message"]
                .as_str()
                .unwrap()
                .ends_with("MiB free, 262144 asked"),
            "{r}"
        );
    }
    assert_eq!(p["letter"], Value::Null);
}

fn occupancy(report: &Value) {
    let cu = report["nodes"][0]["occupancy"].as_array().unwrap();
    assert_eq!(cu.len(), 8);
    let used: i64 = cu.iter().map(|d| d["used_cus"].as_i64().unwrap()).sum();
    assert_eq!(used, 76 + 2 * 152 + 152 + 76 + 304);
    let busy: Vec<(&str, &str)> = cu
        .iter()
        .filter(|d| d["used_cus"] != 0)
        .map(|d| (d["label"].as_str().unwrap(), d["bar"].as_str().unwrap()))
        .collect();
    assert_eq!(busy.len(), 4, "{busy:?}");
    for (_, bar) in &busy {
        assert_eq!(bar.chars().count(), 38, "{bar}");
    }
    let whole = busy.iter().find(|(_, bar)| bar.chars().all(|c| c == 'D'));
    assert!(whole.is_some(), "whole-gpu (D) fills a bar: {busy:?}");
    let parts = report["nodes"][1]["occupancy"].as_array().unwrap();
    let held: Vec<&Value> = parts.iter().filter(|d| d["slots_used"] == 1).collect();
    assert_eq!(held.len(), 1);
    assert_eq!(held[0]["bar"], "E".repeat(38));
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
