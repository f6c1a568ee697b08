//! Issue 36, point 1: a node switching from HAMi's Go AMD plugin (whose
//! image ships AMD SMI) to amd-gpud without AMD SMI keeps what it registers.
//! The same node is registered twice, through amd-gpud and the plugin to the
//! fake API server: once with the fake AMD SMI (which derives its UUIDs as
//! the real 7.0 library does) and once with `--amdsmi none`; the
//! `hami.io/node-amd-register` entries have the same IDs and types. The KFD
//! captures, which have no `/dev` for a plugin, are compared at the
//! inventory. Needs root (the private bus loads the shipped policy).

// An integration-test file is itself the test module, and a failed unwrap is a
// failed test here.
#![allow(clippy::tests_outside_test_module, clippy::unwrap_used)]

mod common;

use std::{
    path::Path,
    time::{Duration, Instant},
};

use serde_json::{Value, json};
use tests::{
    apiserver::{FakeApiServer, Kind},
    bus::{Policy, PrivateBus},
    fixture::{self, BuildOptions},
    kubelet::FakeKubelet,
    stack,
};

const NODE: &str = "gpu-node-1";

/// `(id, type)` of every entry of the register annotation, once it lists
/// `count` devices.
async fn registered(root: &Path, amdsmi: bool, count: usize) -> Vec<(String, String)> {
    let bus = PrivateBus::start(Policy::Shipped).unwrap();
    let fake_node = common::fake_node_exe();
    let _gpud = if amdsmi {
        let fixture = root.join(fixture::FIXTURE_FILE);
        let library = tests::fake_amdsmi::library_for("7.0");
        stack::gpud_with_amdsmi(&fake_node, &bus, root, library, &fixture).unwrap()
    } else {
        stack::gpud(&fake_node, &bus, root, 0).unwrap()
    };
    let api = FakeApiServer::start().unwrap();
    api.put_node(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}));
    let kube = api.kubeconfig(root).display().to_string();
    let kubelet = FakeKubelet::start().await.unwrap();
    let extra = [
        "--kube",
        kube.as_str(),
        "--node-name",
        NODE,
        "--register-interval",
        "1",
    ];
    let _plugin = stack::plugin(&fake_node, &bus, kubelet.dir(), extra).unwrap();
    let start = Instant::now();
    loop {
        let value = api.get(Kind::Node, "", NODE).and_then(|node| {
            let text = node["metadata"]["annotations"]["hami.io/node-amd-register"].as_str()?;
            serde_json::from_str::<Vec<Value>>(text).ok()
        });
        if let Some(devices) = value.filter(|d| d.len() == count) {
            return devices
                .iter()
                .map(|d| {
                    (
                        d["id"].as_str().unwrap().to_owned(),
                        d["type"].as_str().unwrap().to_owned(),
                    )
                })
                .collect();
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no register annotation of {count}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn node(name: &str, amdsmi: bool) -> tempfile::TempDir {
    let root = fixture::scratch_dir().unwrap();
    let opts = BuildOptions {
        drm: true,
        amdsmi_abi: amdsmi.then(|| "7.0".to_owned()),
    };
    fixture::build(&fixture::named(name).unwrap(), root.path(), &opts).unwrap();
    root
}

#[test]
fn the_register_entries_are_the_same_with_and_without_amd_smi() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(Duration::from_secs(240), async {
        for (name, count) in [
            ("mi300x-8-spx", 8),
            ("mi300x-8-cpx", 8),
            ("rx9070xt-igpu", 2),
        ] {
            let with = node(name, true);
            let without = node(name, false);
            let a = registered(with.path(), true, count).await;
            let b = registered(without.path(), false, count).await;
            assert_eq!(a, b, "{name}");
            // The Go plugin's form: AMD SMI 7.0's UUID and libdrm's name.
            for (id, ty) in &a {
                assert_eq!(&id[2..4], "ff", "{name}: {id}");
                assert!(
                    ty.starts_with("AMD ") && !ty.contains("gfx"),
                    "{name}: {ty}"
                );
            }
        }
    });
}

/// The real captures: amd-gpud with a fake AMD SMI describing the capture's
/// GPUs as the library would (serial from KFD `unique_id`, device id,
/// partition index) and without AMD SMI give the same IDs and names. A PCI
/// directory with the device's `device` and `revision` stands beside each
/// capture, and libdrm's lines for those devices (`mesa/drm:data/amdgpu.ids`).
#[test]
fn the_captures_have_the_same_ids_and_names_with_and_without_amd_smi() {
    for name in common::shared_captures() {
        let capture = common::shared_capture(&name).unwrap();
        let root = fixture::scratch_dir().unwrap();
        fixture::link_capture(&capture, root.path()).unwrap();
        let smi = capture_amdsmi(root.path());
        let fixture = fixture::write_fixture(root.path(), &smi).unwrap();
        let none = common::inventory(root.path(), &common::no_amdsmi());
        let with = common::inventory(
            root.path(),
            &common::fake_amdsmi(&fixture, Duration::from_secs(30)),
        );
        assert_eq!(
            with.amdsmi.state, "loaded",
            "{name}: {}",
            with.amdsmi.detail
        );
        assert_eq!(with.gpus.len(), none.gpus.len(), "{name}");
        for (a, b) in with.gpus.iter().zip(&none.gpus) {
            assert!(a.derived_uuid.is_some(), "{name} {}", a.bdf);
            assert_eq!(a.amdsmi_uuid, b.derived_uuid, "{name} {}", a.bdf);
            assert_eq!(a.derived_uuid, b.derived_uuid, "{name} {}", a.bdf);
            assert!(b.market_name.is_some(), "{name} {}", a.bdf);
            assert_eq!(a.market_name, b.market_name, "{name} {}", a.bdf);
        }
    }
}

/// libdrm's names of the captured devices, with the revision chosen for each
/// (the captures do not say).
const NAMES: [(u16, u8, &str); 3] = [
    (0x74a1, 0x00, "AMD Instinct MI300X"),
    (0x740f, 0x02, "AMD Instinct MI210"),
    (0x6860, 0x00, "AMD Radeon Instinct MI25"),
];

/// Writes the PCI directories and `amdgpu.ids` around the capture under
/// `root`, and returns the fake AMD SMI's fixture for its GPU nodes.
fn capture_amdsmi(root: &Path) -> Value {
    let mut ids = String::from("# List of AMDGPU IDs\n\n1.0.0\n");
    for (device, revision, name) in NAMES {
        ids.push_str(&format!("{device:04X},\t{revision:02X},\t{name}\n"));
    }
    // Another revision of the Vega 10 with another name: only the revision tells.
    ids.push_str("6860,\t03,\tAMD Radeon Pro V340\n");
    let ids_path = root.join(fixture::AMDGPU_IDS);
    std::fs::create_dir_all(ids_path.parent().unwrap()).unwrap();
    std::fs::write(ids_path, ids).unwrap();
    let topology = gpud::testing::topology::read_topology(&gpud::HostPaths::under(root)).unwrap();
    let mut sockets: Vec<(String, Vec<Value>)> = Vec::new();
    for node in topology.nodes.iter().filter(|n| n.is_gpu()) {
        let p = &node.properties;
        let location = p.get_or_zero("location_id");
        let (bus, devfn) = (location >> 8, location & 0xff);
        let bdf = format!(
            "{:04x}:{bus:02x}:{:02x}.0",
            p.get_or_zero("domain"),
            devfn >> 3
        );
        let device = u16::try_from(p.get_or_zero("device_id")).unwrap();
        let (_, revision, name) = NAMES.iter().find(|(d, _, _)| *d == device).unwrap();
        let pci = root.join("sys/bus/pci/devices").join(&bdf);
        std::fs::create_dir_all(&pci).unwrap();
        std::fs::write(pci.join("device"), format!("0x{device:04x}\n")).unwrap();
        std::fs::write(pci.join("revision"), format!("0x{revision:02x}\n")).unwrap();
        let unique_id = p.get_or_zero("unique_id");
        let processor = json!({
            "bdf": bdf,
            "partition_id": devfn & 0x7,
            "kfd_id": node.gpu_id,
            "kfd_node": node.index,
            "market_name": name,
            "device_id": device,
            "rev_id": revision,
            "asic_serial": fixture::asic_serial(unique_id),
            "hip_uuid": fixture::hip_uuid(unique_id),
        });
        match sockets.iter_mut().find(|(b, _)| *b == bdf) {
            Some((_, procs)) => procs.push(processor),
            None => sockets.push((bdf, vec![processor])),
        }
    }
    let sockets: Vec<Value> = sockets
        .into_iter()
        .map(|(_, processors)| json!({ "processors": processors }))
        .collect();
    json!({
        "abi": "7.0",
        "version": fixture::lib_version("7.0").unwrap(),
        "root": true,
        "faults": {},
        "sockets": sockets,
    })
}
