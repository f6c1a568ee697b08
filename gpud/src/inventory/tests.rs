//! Bad input: every problem is a warning naming the file or node, a device
//! that cannot be described is left out with the reason, and nothing panics.

use std::{fs, path::Path};

use super::discover;
use crate::{hostpaths::HostPaths, topology::TopologyError};

const GPU: &str = "cpu_cores_count 0\nsimd_count 416\nsimd_per_cu 4\ngfx_target_version 90010\n\
vendor_id 4098\ndevice_id 29711\nlocation_id 768\ndomain 0\ndrm_render_minor 128\n\
unique_id 1801979520617338022\nnum_xcc 1\n";

fn write(root: &Path, rel: &str, text: &str) {
    let path = root.join("sys/class/kfd/kfd/topology").join(rel);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, text).unwrap();
}

fn node_tree(root: &Path) {
    write(root, "generation_id", "3\n");
    write(
        root,
        "nodes/0/properties",
        "cpu_cores_count 64\nsimd_count 0\n",
    );
    write(root, "nodes/0/gpu_id", "0\n");
    write(root, "nodes/1/properties", GPU);
    write(root, "nodes/1/gpu_id", "12345\n");
    write(
        root,
        "nodes/1/mem_banks/0/properties",
        "heap_type 1\nsize_in_bytes 68702699520\n",
    );
    write(
        root,
        "nodes/1/io_links/0/properties",
        "type 2\nnode_from 1\nnode_to 0\nweight 20\n",
    );
    write(
        root,
        "nodes/1/io_links/1/properties",
        "type 2\nnode_from one\n",
    );
}

#[test]
fn a_well_formed_node_reads_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    node_tree(dir.path());
    fs::remove_file(
        dir.path()
            .join("sys/class/kfd/kfd/topology/nodes/1/io_links/1/properties"),
    )
    .unwrap();
    let inv = discover(&HostPaths::under(dir.path()), None).unwrap();
    assert!(inv.warnings.is_empty(), "{:?}", inv.warnings);
    assert_eq!(inv.gpus.len(), 1);
    let gpu = &inv.gpus[0];
    assert_eq!(gpu.bdf.to_string(), "0000:03:00.0");
    assert_eq!(gpu.compute_units, 104);
    assert_eq!(gpu.vram_bytes, 68_702_699_520);
    assert_eq!(gpu.numa_node, Some(0));
    assert_eq!(inv.generation_id, Some(3));
    assert_eq!(inv.cpus.len(), 1);
}

#[test]
fn each_bad_file_is_named_and_the_rest_still_counts() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    node_tree(root);
    // A GPU without simd_per_cu cannot be described.
    write(
        root,
        "nodes/2/properties",
        &GPU.replace("simd_per_cu 4\n", "").replace("768", "1024"),
    );
    write(root, "nodes/2/gpu_id", "222\n");
    // A non-numeric gpu_id: reported, the node classified by simd_count.
    write(
        root,
        "nodes/3/properties",
        &GPU.replace("768", "1280")
            .replace("simd_count 416", "simd_count 4x16"),
    );
    write(root, "nodes/3/gpu_id", "garbage\n");
    // A node directory whose properties vanished, and a non-numeric entry.
    fs::create_dir_all(root.join("sys/class/kfd/kfd/topology/nodes/4")).unwrap();
    fs::create_dir_all(root.join("sys/class/kfd/kfd/topology/nodes/notanode")).unwrap();

    let inv = discover(&HostPaths::under(root), None).unwrap();
    let text = inv.warnings.join("\n");
    assert!(
        text.contains("KFD node 2 skipped: simd_per_cu is missing"),
        "{text}"
    );
    assert!(
        text.contains("nodes/3/gpu_id") && text.contains("\"garbage\""),
        "{text}"
    );
    assert!(
        text.contains("nodes/3/properties:2") && text.contains("simd_count 4x16"),
        "{text}"
    );
    assert!(text.contains("KFD node 4 vanished"), "{text}");
    assert!(text.contains("nodes/1/io_links/1/properties"), "{text}");
    // Node 1 is intact; node 3 has no simd_count left, so it is not a GPU.
    assert_eq!(inv.gpus.len(), 1, "{:?}", inv.gpus);
    assert_eq!(inv.gpus[0].compute_units, 104);
    assert_eq!(inv.gpus[0].partitions[0].restore.io_links.len(), 1);
}

#[test]
fn garbage_everywhere_never_panics() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let junk = [
        "",
        "\n\n",
        "simd_count\n",
        "\u{0}\u{1}\u{2}",
        "x 1 2 3",
        "simd_per_cu 0\nsimd_count 8\nlocation_id 99999999\n",
    ];
    for (i, text) in junk.iter().enumerate() {
        write(root, &format!("nodes/{i}/properties"), text);
        write(root, &format!("nodes/{i}/gpu_id"), text);
        write(root, &format!("nodes/{i}/mem_banks/0/properties"), text);
        write(root, &format!("nodes/{i}/io_links/0/properties"), text);
    }
    write(root, "generation_id", "not a number");
    let inv = discover(&HostPaths::under(root), None).unwrap();
    assert!(inv.gpus.is_empty());
    assert!(!inv.warnings.is_empty());
}

#[test]
fn a_missing_topology_is_an_error_naming_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let err = discover(&HostPaths::under(dir.path()), None).unwrap_err();
    assert!(matches!(err, TopologyError::Missing { .. }));
    let text = err.to_string();
    assert!(text.contains("sys/class/kfd/kfd/topology/nodes"), "{text}");
    assert!(text.contains("amdgpu driver"), "{text}");
}

/// Values a kernel (or a hostile host tree) can print that overflow
/// arithmetic: each is refused with a warning naming the file, and nothing
/// panics or wraps (issue 19).
#[test]
fn values_that_overflow_are_refused_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    node_tree(root);
    // Partitions of one GPU (functions 0 to 7 of 0000:04:00) with num_xcc
    // u32::MAX: their sum overflowed in inspect (a panic in a debug build).
    for f in 0..8_u32 {
        let node = 2 + f;
        let location = (4 << 8) | f;
        let props = GPU
            .replace("location_id 768", &format!("location_id {location}"))
            .replace("num_xcc 1", "num_xcc 4294967295");
        write(root, &format!("nodes/{node}/properties"), &props);
        write(
            root,
            &format!("nodes/{node}/gpu_id"),
            &format!("{}\n", 100 + f),
        );
    }
    // VRAM banks whose sizes overflow u64 together.
    write(
        root,
        "nodes/1/mem_banks/1/properties",
        "heap_type 1\nsize_in_bytes 18446744073709551615\n",
    );
    let inv = discover(&HostPaths::under(root), None).unwrap();
    let text = inv.warnings.join("\n");
    assert!(
        text.contains("nodes/2/properties") && text.contains("num_xcc 4294967295"),
        "{text}"
    );
    assert!(text.contains("nodes/1/mem_banks"), "{text}");
    for gpu in &inv.gpus {
        let xccs = gpu
            .partitions
            .iter()
            .try_fold(0_u32, |a, p| a.checked_add(p.num_xcc));
        assert!(xccs.is_some_and(|x| x <= 64), "{gpu:?}");
    }
}

/// A KFD node with a gpu_id but `simd_count 0` is no GPU to publish, and
/// the warning says which file made it so.
#[test]
fn a_gpu_node_without_simds_is_dropped_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    node_tree(root);
    write(
        root,
        "nodes/2/properties",
        &GPU.replace("768", "1024")
            .replace("simd_count 416", "simd_count 0"),
    );
    write(root, "nodes/2/gpu_id", "222\n");
    let inv = discover(&HostPaths::under(root), None).unwrap();
    assert_eq!(inv.gpus.len(), 1, "{:?}", inv.gpus);
    let text = inv.warnings.join("\n");
    assert!(
        text.contains("nodes/2/properties") && text.contains("simd_count 0"),
        "{text}"
    );
}

/// A topology of six nodes whose last `properties` is a FIFO: opening it
/// blocks, as a sysfs read of a hung driver does. Returns the FIFO; the
/// caller hands it to [`release`] once done.
pub(crate) fn blocked_tree(root: &Path) -> std::path::PathBuf {
    write(root, "generation_id", "3\n");
    for node in 0..5 {
        write(
            root,
            &format!("nodes/{node}/properties"),
            "cpu_cores_count 8\n",
        );
    }
    let fifo = root.join("sys/class/kfd/kfd/topology/nodes/5/properties");
    fs::create_dir_all(fifo.parent().unwrap()).unwrap();
    crate::state_file::tests::mkfifo(&fifo);
    fifo
}

/// Lets a read blocked on `fifo` return (a writer comes and goes).
pub(crate) fn release(fifo: &Path) {
    drop(fs::OpenOptions::new().write(true).open(fifo).unwrap());
}

/// Issue 38, item 7: the error of a read that misses its deadline names
/// the file it was blocked on, not only "the read of the host tree".
#[test]
fn a_read_that_misses_its_deadline_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = blocked_tree(dir.path());
    let paths = HostPaths::under(dir.path());
    let config = crate::amdsmi::AmdSmiConfig {
        library: crate::amdsmi::LibrarySource::Disabled,
        helper: Vec::new(),
        timeout: std::time::Duration::from_secs(1),
        child_env: Vec::new(),
    };
    let limit = std::time::Duration::from_millis(300);
    let err = crate::state_file::tests::within_seconds(move || {
        crate::cli::inventory_within(&paths, &config, limit).map_err(|e| format!("{e:#}"))
    })
    .unwrap_err();
    release(&fifo);
    assert!(err.contains("did not finish within 300ms"), "{err}");
    assert!(
        err.contains(&format!("blocked at {}", fifo.display())),
        "{err}"
    );
}

/// A whole MI300X at `0000:05:00.0` without partitions, name or UUIDs, for
/// tests of what is filled in later.
pub(crate) fn mi300x_gpu() -> super::Gpu {
    super::Gpu {
        bdf: "0000:05:00.0".parse().unwrap(),
        rocr_uuid: Some("GPU-af54e92b0a5d57c8".into()),
        unique_id: 0xaf54_e92b_0a5d_57c8,
        gfx: None,
        compute_units: 304,
        cus_per_wgp: 1,
        vram_bytes: 192 << 30,
        numa_node: None,
        market_name: None,
        amdsmi_uuid: None,
        derived_uuid: None,
        published_id: None,
        compute_partition: None,
        memory_partition: None,
        available_compute_partitions: vec![],
        supported_compute_partitions: vec![],
        available_memory_partitions: vec![],
        vendor_id: 0x1002,
        device_id: 0x74a1,
        revision: Some(0),
        hive_id: 0,
        partition_profile: None,
        partition_profiles: vec![],
        partitions: vec![],
        links: vec![],
    }
}

/// An inventory of `gpus` and nothing else.
pub(crate) fn inventory_of(gpus: Vec<super::Gpu>) -> super::Inventory {
    super::Inventory {
        gpus,
        cpus: vec![],
        generation_id: None,
        amdsmi: super::AmdSmiSummary::default(),
        product_names: None,
        warnings: vec![],
    }
}
