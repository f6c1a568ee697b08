//! The local side read from a small sysfs tree.

use std::{fs, path::Path};

use crate::{
    hostpaths::HostPaths,
    restore_check::{local, model::LinkKind},
};

fn write(root: &Path, rel: &str, text: &str) {
    let path = root.join("sys/class/kfd/kfd/topology/nodes").join(rel);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, text).unwrap();
}

/// CPU node 0, GPU nodes 1 and 2 (partitions 0 and 1 of 0000:05:00.0) in a
/// hive, and node 3 without a gpu_id file.
fn tree() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    write(root, "0/gpu_id", "0\n");
    write(root, "0/properties", "cpu_cores_count 96\nsimd_count 0\n");
    write(
        root,
        "0/io_links/0/properties",
        "type 2\nnode_from 0\nnode_to 1\n",
    );
    write(
        root,
        "0/io_links/1/properties",
        "type 2\nnode_from 0\nnode_to 2\n",
    );
    for (node, gpu_id, function, minor) in [(1, 41_000, 0, 128), (2, 41_001, 1, 129)] {
        write(root, &format!("{node}/gpu_id"), &format!("{gpu_id}\n"));
        let props = format!(
            "simd_count 152\nfw_version 177\ncapability 2893521536\nio_links_count 2\n\
             location_id {}\ndomain 0\ndrm_render_minor {minor}\nhive_id 5\n",
            0x0500 | function
        );
        write(root, &format!("{node}/properties"), &props);
        write(
            root,
            &format!("{node}/mem_banks/0/properties"),
            "heap_type 1\nsize_in_bytes 25769803776\n",
        );
        write(
            root,
            &format!("{node}/io_links/0/properties"),
            &format!("type 2\nnode_from {node}\nnode_to 0\n"),
        );
        write(
            root,
            &format!("{node}/io_links/1/properties"),
            &format!("type 11\nnode_from {node}\nnode_to {}\n", 3 - node),
        );
        // CRIU ignores other link types.
        write(
            root,
            &format!("{node}/io_links/2/properties"),
            &format!("type 1\nnode_from {node}\nnode_to 0\n"),
        );
    }
    write(root, "3/properties", "simd_count 152\n");
    dir
}

#[test]
fn reads_what_criu_reads() {
    let dir = tree();
    let local = local::read(&HostPaths::under(dir.path())).unwrap();
    let ids: Vec<u32> = local.topo.nodes.iter().map(|n| n.id).collect();
    // In directory-listing order, as CRIU walks them.
    let nodes = dir.path().join("sys/class/kfd/kfd/topology/nodes");
    let listed: Vec<u32> = fs::read_dir(&nodes)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_str().unwrap().parse().unwrap())
        .filter(|&i| i != 3)
        .collect();
    assert_eq!(ids, listed);
    let mut sorted = ids.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, [0, 1, 2], "node 3 has no gpu_id");
    assert!(
        local.notes.iter().any(|n| n.contains("KFD node 3")),
        "{:?}",
        local.notes
    );
    let gpu = local.topo.nodes.iter().find(|n| n.id == 2).unwrap();
    assert_eq!(gpu.gpu_id, 41_001);
    assert_eq!(gpu.props.fw_version, 177);
    assert_eq!(gpu.props.capability, 2_893_521_536);
    assert_eq!(gpu.props.vram_size, 24 << 30);
    assert_eq!(gpu.props.vram_public, 1);
    assert_eq!(gpu.links.len(), 2);
    assert_eq!(
        gpu.links
            .iter()
            .filter(|l| l.kind == LinkKind::Xgmi)
            .count(),
        1
    );
    // Links in the order io_links/ lists them, as CRIU reads them.
    let listed: Vec<u32> = fs::read_dir(nodes.join("2/io_links"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_str().unwrap().parse().unwrap())
        .filter(|&i: &u32| i != 2)
        .collect();
    // Link 0 goes to node 0, link 1 to node 1.
    let got: Vec<u32> = gpu.links.iter().map(|l| l.to).collect();
    assert_eq!(got, listed);
    assert_eq!(gpu.location.bdf.as_deref(), Some("0000:05:00.1"));
    assert_eq!(gpu.location.render_minor, Some(129));
}

#[test]
fn gpu_ids_render_nodes_and_pci_addresses_select_gpus() {
    let dir = tree();
    let local = local::read(&HostPaths::under(dir.path())).unwrap();
    let gpus = |ids: &[&str]| {
        let ids: Vec<String> = ids.iter().map(|s| (*s).to_owned()).collect();
        let topo = local.visible(&ids).unwrap();
        let mut out: Vec<u32> = topo
            .nodes
            .iter()
            .filter(|n| n.is_gpu())
            .map(|n| n.id)
            .collect();
        out.sort_unstable();
        (out, topo.nodes.len() - topo.gpu_count())
    };
    assert_eq!(gpus(&[]), (vec![1, 2], 1));
    assert_eq!(gpus(&["41000"]), (vec![1], 1));
    assert_eq!(gpus(&["0xa029"]), (vec![2], 1));
    assert_eq!(gpus(&["renderD129"]), (vec![2], 1));
    assert_eq!(gpus(&["0000:05:00.1"]), (vec![2], 1));
    assert_eq!(gpus(&["0000:05:00.0"]), (vec![1, 2], 1), "the whole GPU");
    assert_eq!(gpus(&[" 41000 ", "renderD128"]), (vec![1], 1));
    for bad in ["41002", "renderD130", "0000:06:00.0", "gpu0", ""] {
        assert!(local.visible(&[bad.to_owned()]).is_err(), "{bad:?}");
    }
}
