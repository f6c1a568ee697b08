//! The inventory of the real KFD captures (the folder beside the clone, when
//! there is one: `common::shared_captures`), read as
//! host roots that hold nothing but the KFD topology (as a capture nobody here
//! has seen would be), through the `amd-gpud inspect` command line.

// An integration-test file is itself the test module, and a failed unwrap is a
// failed test here.
#![allow(clippy::tests_outside_test_module, clippy::unwrap_used)]

mod common;

use std::path::Path;

use serde_json::Value;
use tests::fixture::link_capture;

/// Builds `DIR/sys/class/kfd/kfd/topology` around the capture and inspects it.
fn inspect_capture(name: &str) -> Option<(Value, tempfile::TempDir)> {
    let Some(capture) = common::shared_capture(name) else {
        eprintln!(
            "skipping: no capture {name} in {}",
            tests::fixture::captures_dir().display()
        );
        return None;
    };
    let dir = tests::fixture::scratch_dir().unwrap();
    link_capture(&capture, dir.path()).unwrap();
    Some((common::inspect_cli_json(dir.path()), dir))
}

fn gpus(v: &Value) -> &Vec<Value> {
    v["gpus"].as_array().expect("gpus array")
}

fn redact(mut v: Value, root: &Path) -> Value {
    let root = root.display().to_string();
    if let Some(warnings) = v["warnings"].as_array_mut() {
        for w in warnings {
            *w = Value::String(w.as_str().unwrap_or_default().replace(&root, "<root>"));
        }
    }
    common::compact(&mut v);
    v
}

#[test]
fn mi300x_cpx_capture_is_eight_gpus_of_eight_partitions() {
    let Some((v, dir)) = inspect_capture("mi300x-8gpu-cpx") else {
        return;
    };
    let gpus = gpus(&v);
    assert_eq!(gpus.len(), 8);
    let bdfs: Vec<&str> = gpus.iter().map(|g| g["bdf"].as_str().unwrap()).collect();
    let mut sorted = bdfs.clone();
    sorted.sort_unstable();
    assert_eq!(bdfs, sorted, "GPUs ordered by PCI address");
    assert_eq!(bdfs[0], "0000:05:00.0");
    // 8 GPUs x 8 XCPs would need 64 render minors; only 63 fit, so the
    // capture (like the kernel) lacks the last partition of the last GPU.
    for (g, gpu) in gpus.iter().enumerate() {
        let count = if g == 7 { 7 } else { 8 };
        assert_eq!(gpu["gfx"], "gfx942");
        assert_eq!(gpu["cus_per_wgp"], 1);
        assert_eq!(gpu["compute_units"], count * 38);
        assert_eq!(gpu["compute_partition"], "CPX");
        let parts = gpu["partitions"].as_array().unwrap();
        assert_eq!(parts.len(), count);
        for (i, part) in parts.iter().enumerate() {
            assert_eq!(part["index"], i);
            assert_eq!(part["compute_units"], 38);
            let bdf = part["bdf"].as_str().unwrap();
            assert!(
                bdf.ends_with(&format!(".{i}")),
                "{bdf} carries partition {i}"
            );
        }
    }
    let first = &gpus[0];
    assert_eq!(first["unique_id"], "16404946649897475633");
    assert_eq!(
        first["rocr_uuid"],
        format!("GPU-{:016x}", 16_404_946_649_897_475_633_u64)
    );
    assert_eq!(first["partitions"][0]["kfd_node"], 2);
    assert_eq!(first["partitions"][0]["render_minor"], 128);
    assert_eq!(first["numa_node"], 0);
    assert_eq!(gpus[7]["numa_node"], 1);
    let warnings = v["warnings"].as_array().unwrap();
    assert!(
        warnings.iter().any(|w| w
            .as_str()
            .unwrap()
            .contains("GPU 0000:e5:00.0: KFD shows 7 partitions")),
        "{warnings:?}"
    );
    let xgmi = first["links"].as_array().unwrap();
    assert_eq!(xgmi.len(), 7);
    assert!(
        xgmi.iter()
            .all(|l| l["link_type"] == "xgmi" && l["hops"] == 1),
        "{xgmi:?}"
    );
    insta::assert_json_snapshot!("capture-mi300x-8gpu-cpx", redact(v, dir.path()));
}

#[test]
fn mi210_capture_is_two_hives_of_four() {
    let Some((v, dir)) = inspect_capture("mi210-8gpu-xgmi") else {
        return;
    };
    let gpus = gpus(&v);
    assert_eq!(gpus.len(), 8);
    for gpu in gpus {
        assert_eq!(gpu["gfx"], "gfx90a");
        assert_eq!(gpu["compute_units"], 104);
        assert_eq!(gpu["partitions"].as_array().unwrap().len(), 1);
        assert_eq!(gpu["compute_partition"], Value::Null);
        let links = gpu["links"].as_array().unwrap();
        let xgmi = links.iter().filter(|l| l["link_type"] == "xgmi").count();
        assert_eq!(xgmi, 3, "{}: {links:?}", gpu["bdf"]);
    }
    // KFD node 4 is at location 768: bus 3, the lowest address.
    assert_eq!(gpus[0]["bdf"], "0000:03:00.0");
    assert_eq!(gpus[0]["partitions"][0]["kfd_node"], 4);
    assert_eq!(gpus[0]["numa_node"], 0);
    insta::assert_json_snapshot!("capture-mi210-8gpu-xgmi", redact(v, dir.path()));
}

#[test]
fn two_kfd_nodes_claiming_one_pci_address_keep_the_first() {
    let Some((v, dir)) = inspect_capture("one-gpu-copied") else {
        return;
    };
    let gpus = gpus(&v);
    assert_eq!(gpus.len(), 1, "{v:#}");
    let gpu = &gpus[0];
    assert_eq!(gpu["partitions"][0]["kfd_node"], 1);
    assert_eq!(gpu["unique_id"], "14073402507705256556");
    assert_eq!(gpu["compute_units"], 64);
    assert_eq!(
        gpu["gfx"], "gfx900",
        "old kernel: gfx from the PCI device id"
    );
    assert_eq!(gpu["vram_bytes"], 17_163_091_968_u64);
    let warnings = v["warnings"].as_array().unwrap();
    assert!(
        warnings.iter().any(|w| {
            let w = w.as_str().unwrap();
            w.contains("KFD node(s) 2 skipped") && w.contains(gpu["bdf"].as_str().unwrap())
        }),
        "{warnings:?}"
    );
    insta::assert_json_snapshot!("capture-one-gpu-copied", redact(v, dir.path()));
}

#[test]
fn every_capture_inventories_without_panicking() {
    for name in common::shared_captures() {
        let Some((v, _dir)) = inspect_capture(&name) else {
            continue;
        };
        assert!(!gpus(&v).is_empty(), "{name}: no GPU");
    }
}
