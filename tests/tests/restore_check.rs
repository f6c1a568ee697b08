//! `amd-gpud restore-check` as a process: checkpoint images written by the test helper
//! (`tests::criu_image`) for the builder's layouts and a real MI300X capture, in the
//! old and new formats, checked against fake host roots.

// An integration-test file is itself the test module, and a failed unwrap is a
// failed test here.
#![allow(clippy::tests_outside_test_module, clippy::unwrap_used)]

mod common;

use std::{path::Path, process::Command, time::Duration};

use serde_json::Value;
use tests::{
    criu_image::{self, Format, ImageOptions, build_kfd, layouts, write_image},
    fixture::{self, link_capture},
};

/// `amd-gpud restore-check IMAGE --host-root ROOT ARGS...`: (exit code, stdout, stderr).
fn restore_check(image: &Path, root: &Path, args: &[&str]) -> (i32, String, String) {
    let mut cmd = Command::new(common::fake_node_exe());
    cmd.args(["gpud", "restore-check"])
        .arg(image)
        .arg("--host-root")
        .arg(root)
        .args(args);
    common::run_with_timeout(cmd, Duration::from_secs(120))
}

fn json(image: &Path, root: &Path, args: &[&str]) -> (i32, Value) {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let (code, stdout, stderr) = restore_check(image, root, &all);
    let value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("no JSON ({e}); stdout {stdout:?}, stderr {stderr}"));
    (code, value)
}

#[test]
fn every_layout_in_both_formats_restores_onto_its_own_node() {
    for (name, spec) in layouts() {
        let root = fixture::scratch_dir().unwrap();
        build_kfd(&spec, root.path()).unwrap();
        let gpus = spec.gpus.len();
        for format in [Format::V3_17, Format::Newest] {
            let images = tempfile::tempdir().unwrap();
            write_image(root.path(), &ImageOptions::new(format), images.path()).unwrap();
            for mode in ["explain", "criu"] {
                let (code, v) = json(images.path(), root.path(), &["--mode", mode]);
                assert_eq!(code, 0, "{name} {format:?} {mode}: {v:#}");
                assert_eq!(v["restorable"], true);
                assert_eq!(v["mode"], mode);
                assert_eq!(v["mapping"].as_array().unwrap().len(), gpus, "{name}");
                assert_eq!(v["refusals"], Value::Array(Vec::new()));
                let want = match format {
                    Format::V3_17 => "criu-3.17-to-4.2",
                    Format::Newest => "criu-after-4.2",
                };
                assert_eq!(v["checkpoint"]["format"], want);
            }
        }
    }
}

#[test]
fn layouts_do_not_restore_onto_each_other() {
    let specs = layouts();
    let roots: Vec<_> = specs
        .iter()
        .map(|(_, spec)| {
            let root = fixture::scratch_dir().unwrap();
            build_kfd(spec, root.path()).unwrap();
            root
        })
        .collect();
    let images = tempfile::tempdir().unwrap();
    let opts = ImageOptions::new(Format::Newest);
    // The 8 PCIe-only GPUs of the multi-NUMA layout onto the 8-GPU hive: same GPUs,
    // but io_links_count counts the XGMI links (1 against 8), and no option relaxes it.
    let image = write_image(roots[2].path(), &opts, images.path()).unwrap();
    let all_off = [
        "--env",
        "KFD_FW_VER_CHECK=0,KFD_SDMA_FW_VER_CHECK=0,KFD_CACHES_COUNT_CHECK=0",
        "--env",
        "KFD_NUM_GWS_CHECK=0,KFD_VRAM_SIZE_CHECK=0,KFD_CAPABILITY_CHECK=0,KFD_NUMA_CHECK=0",
    ];
    let (code, v) = json(&image, roots[1].path(), &all_off);
    assert_eq!(code, 1, "{v:#}");
    let refusals = v["refusals"].as_array().unwrap();
    assert_eq!(refusals.len(), 8, "{v:#}");
    for r in refusals {
        assert_eq!(r["property"], "io_links_count");
        assert_eq!(
            (r["checkpoint_value"].as_u64(), r["local_value"].as_u64()),
            (Some(1), Some(8))
        );
        assert_eq!(r["option"], Value::Null);
    }
    // The hive onto PCIe-only GPUs: CRIU stops at the hive count.
    let image = write_image(roots[1].path(), &opts, images.path()).unwrap();
    let (code, v) = json(&image, roots[2].path(), &["--mode", "criu"]);
    assert_eq!(code, 1);
    assert_eq!(
        v["reason"],
        "Number of xgmi groups mismatch (checkpointed:1 local:0)"
    );
    // One GPU onto eight: the counts differ.
    let image = write_image(roots[0].path(), &opts, images.path()).unwrap();
    let (code, v) = json(&image, roots[1].path(), &[]);
    assert_eq!(code, 1);
    assert_eq!(v["refusals"][0]["property"], "gpu_count");
    assert_eq!(v["refusals"][0]["checkpoint_gpu"], Value::Null);
}

#[test]
fn the_gpus_the_container_sees_decide() {
    // A one-GPU checkpoint of the RX 9070 XT on the desktop that also has an iGPU.
    let (_, single) = &layouts()[0];
    let src = fixture::scratch_dir().unwrap();
    build_kfd(single, src.path()).unwrap();
    let dst = common::build_fixture("rx9070xt-igpu");
    let images = tempfile::tempdir().unwrap();
    let image = write_image(src.path(), &ImageOptions::new(Format::V3_17), images.path()).unwrap();
    let (code, v) = json(&image, dst.path(), &["--mode", "criu"]);
    assert_eq!(code, 1);
    assert_eq!(
        v["reason"],
        "Number of devices mismatch (checkpointed:1 local:2)"
    );
    let (code, v) = json(&image, dst.path(), &["--gpus", "renderD128"]);
    assert_eq!(code, 0, "{v:#}");
    assert_eq!(v["mapping"][0]["local_render_minor"], 128);
    assert_eq!(v["mapping"][0]["local_bdf"], "0000:03:00.0");
    // The iGPU is another device altogether: every difference is listed, and those no
    // option relaxes say so.
    let (code, v) = json(&image, dst.path(), &["--gpus", "0000:7c:00.0"]);
    assert_eq!(code, 1);
    let refusals = v["refusals"].as_array().unwrap();
    let option_of = |name: &str| {
        refusals
            .iter()
            .find(|r| r["property"] == name)
            .map(|r| r["option"].clone())
    };
    assert_eq!(option_of("device_id"), Some(Value::Null), "{v:#}");
    assert_eq!(option_of("simd_count"), Some(Value::Null));
    assert_eq!(
        option_of("fw_version"),
        Some(Value::from("KFD_FW_VER_CHECK"))
    );
    let (code, _, stderr) = restore_check(&image, dst.path(), &["--gpus", "renderD200"]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("no KFD GPU node matches \"renderD200\""),
        "{stderr}"
    );
}

#[test]
fn options_are_read_as_criu_reads_them() {
    let root = common::build_fixture("mi300x-8-spx");
    let images = tempfile::tempdir().unwrap();
    let image = write_image(
        root.path(),
        &ImageOptions::new(Format::Newest),
        images.path(),
    )
    .unwrap();
    let (code, v) = json(&image, root.path(), &["--env", "KFD_NUMA_CHECK=NO"]);
    assert_eq!(code, 0);
    assert_eq!(v["options"]["KFD_NUMA_CHECK"], false);
    assert_eq!(v["options"]["KFD_FW_VER_CHECK"], true);
    let (code, v) = json(&image, root.path(), &["--env", "KFD_NUMA_CHECK=false"]);
    assert_eq!(code, 0);
    assert_eq!(v["options"]["KFD_NUMA_CHECK"], true, "ignored value");
    assert!(
        v["notes"][0].as_str().unwrap().contains("ignored by CRIU"),
        "{v:#}"
    );
    for bad in ["KFD_NUMA=0", "KFD_NUMA_CHECK"] {
        let (code, stdout, stderr) = restore_check(&image, root.path(), &["--env", bad]);
        assert_eq!(code, 2, "{bad}: {stdout}");
        assert!(stderr.starts_with("amd-gpud restore-check: "), "{stderr}");
    }
    let (code, _, stderr) = restore_check(&image, root.path(), &["--mode", "strict"]);
    assert_eq!(code, 2, "{stderr}");

    // As for CRIU, the command's own environment counts; --env wins.
    let mut cmd = Command::new(common::fake_node_exe());
    cmd.args(["gpud", "restore-check", "--json"])
        .arg(&image)
        .arg("--host-root")
        .arg(root.path())
        .args(["--env", "KFD_NUMA_CHECK=1"])
        .env("KFD_FW_VER_CHECK", "0")
        .env("KFD_NUMA_CHECK", "0");
    let (code, stdout, stderr) = common::run_with_timeout(cmd, Duration::from_secs(120));
    assert_eq!(code, 0, "{stderr}");
    let v: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        v["options"]["KFD_FW_VER_CHECK"], false,
        "from the environment"
    );
    assert_eq!(v["options"]["KFD_NUMA_CHECK"], true, "--env wins");
}

#[test]
fn unreadable_images_exit_2_and_trailing_bytes_are_ignored() {
    let root = common::build_fixture("mi300x-8-spx");
    let dir = tempfile::tempdir().unwrap();
    let (code, _, stderr) = restore_check(dir.path(), root.path(), &[]);
    assert_eq!(code, 2);
    assert!(stderr.contains("no amdgpu-kfd-<id>.img"), "{stderr}");
    let bytes = criu_image::image_bytes(root.path(), &ImageOptions::new(Format::V3_17)).unwrap();
    let path = dir.path().join("amdgpu-kfd-5.img");
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    let (code, stdout, stderr) = restore_check(&path, root.path(), &["--json"]);
    assert_eq!((code, stdout.as_str()), (2, ""));
    assert!(stderr.contains("truncated"), "{stderr}");
    // CRIU reads the announced length and never looks past it: the image restores.
    let mut padded = bytes.clone();
    padded.extend_from_slice(b"junk");
    std::fs::write(&path, &padded).unwrap();
    let (code, v) = json(&path, root.path(), &["--mode", "criu"]);
    assert_eq!(code, 0, "{v:#}");
    assert_eq!(v["outcome"], "restorable");
    let notes = v["notes"].as_array().unwrap();
    assert!(
        notes
            .iter()
            .any(|n| n.as_str().unwrap().contains("4 bytes follow")),
        "{v:#}"
    );
}

/// The MI300X CPX capture as the checkpoint host. The capture has neither gpu_id files
/// nor mem_banks; a dump needs both, so the image gets made-up gpu_ids and the 24 GiB
/// public VRAM bank of one MI300X CPX partition (192 GiB / 8).
fn capture_image(format: Format, dir: &Path) -> Option<std::path::PathBuf> {
    let Some(capture) = common::shared_capture("mi300x-8gpu-cpx") else {
        eprintln!(
            "skipping: no capture mi300x-8gpu-cpx in {}",
            tests::fixture::captures_dir().display()
        );
        return None;
    };
    let host = fixture::scratch_dir().unwrap();
    link_capture(&capture, host.path()).unwrap();
    let opts = ImageOptions {
        vram_fallback: Some((1, 24 << 30)),
        ..ImageOptions::new(format)
    };
    Some(write_image(host.path(), &opts, dir).unwrap())
}

/// The builder's MI300X CPX node shaped like the capture (63 partitions: the kernel ran
/// out of render minors for the 64th), with GPU 3 (0000:35:00.0) one firmware lower.
fn cpx_node_with_older_firmware_on_gpu_3() -> tempfile::TempDir {
    cpx_node(true)
}

/// The builder's MI300X CPX node shaped like the capture, GPU 3 one firmware
/// lower when `older_gpu_3`.
fn cpx_node(older_gpu_3: bool) -> tempfile::TempDir {
    let mut spec = fixture::named("mi300x-8-cpx").unwrap();
    spec.max_gpu_nodes = Some(63);
    if older_gpu_3 {
        spec.gpus[3].model.fw_version -= 1;
    }
    let root = fixture::scratch_dir().unwrap();
    fixture::build(
        &spec,
        root.path(),
        &fixture::BuildOptions {
            drm: true,
            amdsmi_abi: None,
        },
    )
    .unwrap();
    root
}

#[test]
fn a_capture_checkpoint_onto_a_node_with_one_older_firmware_names_it() {
    let images = tempfile::tempdir().unwrap();
    let node = cpx_node_with_older_firmware_on_gpu_3();
    for format in [Format::Newest, Format::V3_17] {
        let Some(image) = capture_image(format, images.path()) else {
            return;
        };
        let (code, v) = json(&image, node.path(), &[]);
        assert_eq!(code, 1, "{format:?}: {v:#}");
        assert_eq!(v["checkpoint"]["gpus"], 63);
        let refusals = v["refusals"].as_array().unwrap();
        assert_eq!(refusals.len(), 8, "one per partition of GPU 3: {v:#}");
        for r in refusals {
            assert_eq!(r["property"], "fw_version", "{r:#}");
            assert_eq!(r["checkpoint_value"], 177);
            assert_eq!(r["local_value"], 176);
            assert_eq!(r["option"], "KFD_FW_VER_CHECK");
            let bdf = r["local_bdf"].as_str().unwrap();
            assert!(bdf.starts_with("0000:35:00."), "{bdf}");
            assert!(r["checkpoint_gpu"].is_u64() && r["local_gpu"].is_u64());
        }
        let (code, stdout, _) = restore_check(&image, node.path(), &[]);
        assert_eq!(code, 1);
        assert!(
            stdout.contains("fw_version: 177 in the checkpoint, 176 here"),
            "{stdout}"
        );
        assert!(stdout.contains("0000:35:00."), "{stdout}");
        assert!(
            stdout.contains("KFD_FW_VER_CHECK=0 would relax it"),
            "{stdout}"
        );
        // With the check off a mapping exists. CRIU 3.17.1 never gets to it:
        // the names of its search lists of 63 (442 bytes) run past their
        // 200-byte buffer over restore_maps, which it walks next, check or
        // no check.
        let args = ["--mode", "explain", "--env", "KFD_FW_VER_CHECK=0"];
        let (code, v) = json(&image, node.path(), &args);
        assert_eq!(code, 0, "{v:#}");
        assert_eq!(v["mapping"].as_array().unwrap().len(), 63);
        assert_eq!(v["criu_outcome"], "criu-would-crash");
        for env in ["KFD_FW_VER_CHECK=1", "KFD_FW_VER_CHECK=0"] {
            let (code, v) = json(&image, node.path(), &["--mode", "criu", "--env", env]);
            assert_eq!(code, 1, "{v:#}");
            assert_eq!(v["outcome"], "criu-would-crash");
            assert_eq!(v["criu_version"], "3.17.1");
        }
    }
}

/// The whole-node checkpoint of the MI300X CPX capture (one hive of 63
/// partitions) onto a node like it (the capture itself has no gpu_id files
/// to read), as CRIU answers it: the hive's name (452
/// bytes) runs past p2pgroup_to_str's buffer onto nothing CRIU reads, but
/// each search list of 63 (442 bytes from byte 224 of the topology file's
/// .bss) covers restore_maps, whose CPU list the NUMA check walks at the
/// first pair and whose GPU list maps_push walks
/// (checkpoint-restore/criu:plugins/amdgpu/amdgpu_plugin_topology.c:1097,
/// :353; gpud's criu::printbuf has the layout).
#[test]
fn the_capture_checkpointed_whole_is_answered_as_criu_answers_it() {
    let images = tempfile::tempdir().unwrap();
    let Some(image) = capture_image(Format::Newest, images.path()) else {
        return;
    };
    let host = cpx_node(false);
    for (env, head) in [
        ("KFD_NUMA_CHECK=1", "restore_maps.cpu_maps"),
        ("KFD_NUMA_CHECK=0", "restore_maps.gpu_maps"),
    ] {
        let (code, v) = json(&image, host.path(), &["--mode", "criu", "--env", env]);
        assert_eq!(code, 1, "{v:#}");
        assert_eq!(v["outcome"], "criu-would-crash", "{}", v["reason"]);
        let reason = v["reason"].as_str().unwrap();
        assert!(
            reason.contains("442 bytes") && reason.contains(head),
            "{reason}"
        );
        let notes = v["notes"].as_array().unwrap();
        assert!(
            notes.iter().any(|n| {
                let n = n.as_str().unwrap();
                n.contains("takes 452 bytes") && n.contains("changes nothing")
            }),
            "{v:#}"
        );
    }
    // The exhaustive search finds a mapping.
    let (code, v) = json(&image, host.path(), &[]);
    assert_eq!(code, 0, "{v:#}");
    assert_eq!(v["mapping"].as_array().unwrap().len(), 63);
    assert_eq!(v["criu_outcome"], "criu-would-crash");
}
