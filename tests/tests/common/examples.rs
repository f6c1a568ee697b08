//! What `node-sim --json` must report for the default examples, whichever
//! cluster it ran them on (`--cluster fake` or `real`).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;
use tests::node_sim::report::id_ranges;

/// Every check of the default examples' report.
pub fn default_examples(report: &Value) {
    nodes(report);
    quarter(report);
    two_gpus_and_two_containers(report);
    whole_and_partition(report);
    too_big(report);
    occupancy(report);
}

/// The default examples' pods, in the order node-sim reports them.
pub const EXAMPLE_PODS: [&str; 6] = [
    "quarter-gpu",
    "two-gpus",
    "two-containers",
    "whole-gpu",
    "too-big",
    "partition",
];

/// The names of the report's pods, in its order.
pub fn pod_names(report: &Value) -> Vec<&str> {
    report["pods"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect()
}

pub fn pod_named<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["pods"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("no pod {name} in the report"))
}

pub fn containers(pod: &Value) -> &Vec<Value> {
    pod["containers"].as_array().unwrap()
}

pub fn gpus(container: &Value) -> &Vec<Value> {
    container["gpus"].as_array().unwrap()
}

pub fn nodes(report: &Value) {
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
pub fn admitted(pod: &Value, gpus_per_container: &[usize]) {
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
pub fn sliced(c: &Value, cus: u64, mem: u64) {
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
