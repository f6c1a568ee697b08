use serde_json::json;

use super::*;
use crate::hami_emulator::{order::DeviceOrder, usage::node_usage};

const T: &str = "AMD Instinct MI300X";

fn device(id: &str) -> NodeDevice {
    NodeDevice {
        id: id.to_owned(),
        count: 10,
        devmem: 196_608,
        devcore: 304,
        device_type: T.to_owned(),
        health: true,
        ..NodeDevice::default()
    }
}

fn idle(n: usize) -> Vec<DeviceUsage> {
    (0..n)
        .map(|i| DeviceUsage {
            device: device(&format!("G{i}")),
            usage: Usage::default(),
        })
        .collect()
}

fn req(nums: u32, mem: Option<u32>, pct: u32) -> ContainerRequest {
    ContainerRequest {
        container: "c".into(),
        init: false,
        nums,
        mem_mib: mem,
        cores_pct: pct,
    }
}

fn ids(grants: &[Vec<Grant>]) -> Vec<Vec<&str>> {
    grants
        .iter()
        .map(|c| c.iter().map(|g| g.id.as_str()).collect())
        .collect()
}

fn spread() -> Selection {
    Selection::default()
}

#[test]
fn percent_to_cus_as_the_spec_table() {
    for (pct, cus) in [(25, 76), (33, 100), (67, 203), (1, 3), (100, 304)] {
        assert_eq!(cores_for(304, pct), cus, "{pct} %");
    }
    assert_eq!(cores_for(60, 1), 1, "clamped to at least one CU");
}

#[test]
fn decodes_device_lists_like_hami() {
    let got = decode_devices("A,T,16384,76:B,T,16384,76:;").unwrap();
    assert_eq!(ids(&got), [vec!["A", "B"], vec![]]);
    assert_eq!((got[0][1].mem_mib, got[0][1].cus), (16384, 76));
    let two = decode_devices("A,T,8192,38:;A,T,8192,38:;").unwrap();
    assert_eq!(ids(&two), [vec!["A"], vec!["A"], vec![]]);
    let empty: Vec<Vec<&str>> = vec![vec![]; 3];
    assert_eq!(ids(&decode_devices(";junk:;").unwrap()), empty);
    assert!(
        decode_devices("A,T,8192:;")
            .unwrap_err()
            .contains("fewer than 4")
    );
    assert!(decode_devices("A,T,lots,3:;").is_err());
}

#[test]
fn usage_comes_from_live_pods_on_this_node() {
    let pod = |name: &str, node: &str, phase: &str, value: &str| {
        json!({"metadata": {"name": name, "annotations": {
            VGPU_NODE_KEY: node, ALLOCATED_KEY: value}}, "status": {"phase": phase}})
    };
    let pods = [
        pod("a", "n", "Running", "G0,T,4096,76:;G0,T,2048,38:;"),
        pod("b", "n", "Pending", "G1,T,196608,304:GHOST,T,1,1:;"),
        pod("done", "n", "Succeeded", "G2,T,1,1:;"),
        pod("elsewhere", "m", "Running", "G2,T,1,1:;"),
        pod("broken", "n", "Running", "G2,T,x,1:;"),
    ];
    let devices: Vec<NodeDevice> = idle(3).into_iter().map(|d| d.device).collect();
    let usage = node_usage(&devices, "n", &pods);
    let got: Vec<Usage> = usage.iter().map(|d| d.usage).collect();
    assert_eq!(
        got,
        [
            Usage {
                used: 2,
                mem_mib: 6144,
                cores: 114
            },
            Usage {
                used: 1,
                mem_mib: 196_608,
                cores: 304
            },
            Usage::default(),
        ]
    );
}

#[test]
fn spread_scans_from_the_end_and_avoids_used_devices() {
    let mut devices = idle(4);
    let got = fit("n", &devices, &[req(1, Some(4096), 25)], &spread()).unwrap();
    assert_eq!(
        ids(&got),
        [vec!["G3"]],
        "ties keep register order, scanned from the end"
    );
    assert_eq!((got[0][0].mem_mib, got[0][0].cus), (4096, 76));
    devices[3].usage = Usage {
        used: 1,
        mem_mib: 4096,
        cores: 76,
    };
    let got = fit("n", &devices, &[req(2, Some(4096), 25)], &spread()).unwrap();
    assert_eq!(ids(&got), [vec!["G2", "G1"]], "the least used first");
}

#[test]
fn app_containers_see_each_other_and_init_containers_see_neither() {
    let devices = idle(2);
    let init = ContainerRequest {
        init: true,
        ..req(1, Some(4096), 50)
    };
    let pod = [
        init.clone(),
        init,
        req(1, Some(4096), 50),
        req(1, Some(4096), 50),
    ];
    let got = fit("n", &devices, &pod, &spread()).unwrap();
    assert_eq!(
        ids(&got),
        [vec!["G1"], vec!["G1"], vec!["G1"], vec!["G0"]],
        "each init container on a fresh copy; the second app container \
         avoids the first, not the init containers"
    );
}

#[test]
fn binpack_prefers_the_fullest_device() {
    let mut devices = idle(4);
    devices[1].usage = Usage {
        used: 1,
        mem_mib: 1024,
        cores: 38,
    };
    let binpack = Selection {
        order: DeviceOrder::Binpack,
        ..Selection::default()
    };
    let got = fit("n", &devices, &[req(1, Some(1024), 10)], &binpack).unwrap();
    assert_eq!(ids(&got), [vec!["G1"]]);
}

#[test]
fn the_score_ignores_the_request() {
    // A large GPU with one container on it and a small idle one: counted
    // with the request, the small one would be the fuller after placement
    // and spread would pick the large one; HAMi scores the use only.
    let mut devices = idle(2);
    devices[0].usage.used = 1;
    devices[1].device.devmem = 16_384;
    devices[1].device.devcore = 60;
    let got = fit("n", &devices, &[req(1, Some(8192), 50)], &spread()).unwrap();
    assert_eq!(ids(&got), [vec!["G1"]], "G0 scores 1.0, G1 0");
}

#[test]
fn a_whole_gpu_is_recorded_as_all_of_it_and_containers_share() {
    let devices = idle(1);
    let got = fit("n", &devices, &[req(1, None, 100)], &spread()).unwrap();
    assert_eq!((got[0][0].mem_mib, got[0][0].cus), (196_608, 304));
    let two = [req(1, Some(2048), 25), req(1, Some(2048), 50)];
    let got = fit("n", &devices, &two, &spread()).unwrap();
    assert_eq!(ids(&got), [vec!["G0"], vec!["G0"]]);
    assert_eq!((got[0][0].cus, got[1][0].cus), (76, 152));
    let three = [req(1, None, 50), req(1, None, 50), req(1, None, 1)];
    let err = fit("n", &devices, &three, &spread()).unwrap_err();
    assert!(err.to_string().contains("CardInsufficientMemory"), "{err}");
}

#[test]
fn too_little_memory_names_each_device() {
    let mut devices = idle(2);
    devices[0].usage.mem_mib = 196_608 - 4096;
    devices[1].usage.mem_mib = 196_608 - 4096;
    let err = fit("n", &devices, &[req(1, Some(8192), 10)], &spread()).unwrap_err();
    let FilterError::NoFit { rejections, .. } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(
        rejections[0].to_string(),
        "CardInsufficientMemory on G1: 4096 MiB free, 8192 asked"
    );
    let text = err.to_string();
    assert!(
        text.starts_with("container c: 0 of 1 GPU(s) fit (2/2 CardInsufficientMemory): "),
        "{text}"
    );
    assert_eq!(
        err.summary(),
        "container c: 0 of 1 GPU(s) fit (2/2 CardInsufficientMemory)"
    );
}

#[test]
fn each_check_gives_hamis_reason() {
    let mut devices = idle(6);
    devices[0].device.health = false;
    devices[1].device.device_type = "AMD Radeon RX 9070 XT".into();
    devices[2].device.id = "banned".into();
    devices[3].usage.used = 10;
    devices[4].usage.cores = 300;
    devices[5].usage.used = 1;
    let selection = Selection {
        mutex: true,
        use_types: vec!["mi300".into()],
        nouse_uuids: vec!["banned".into()],
        ..Selection::default()
    };
    let err = fit("n", &devices, &[req(1, Some(1), 25)], &selection).unwrap_err();
    let FilterError::NoFit { rejections, .. } = err else {
        panic!("{err:?}")
    };
    let names: Vec<&str> = rejections.iter().map(|r| r.reason.name()).collect();
    assert_eq!(
        names,
        [
            "CardUuidMismatch",
            "CardTypeMismatch",
            "CardUnhealthy",
            "ExclusiveDeviceAllocateConflict",
            "CardInsufficientCore",
            "CardTimeSlicingExhausted",
        ],
        "idle devices from the end first, then by how full they are"
    );
    assert_eq!(
        rejections[4].to_string(),
        "CardInsufficientCore on G4: 4 CUs free, 76 asked"
    );
}

#[test]
fn count_beyond_the_node_and_partial_fits() {
    let mut devices = idle(2);
    let err = fit("n", &devices, &[req(3, None, 100)], &spread()).unwrap_err();
    assert!(matches!(
        err,
        FilterError::TooFewDevices {
            asked: 3,
            have: 2,
            ..
        }
    ));
    assert!(err.to_string().contains("NodeInsufficientDevice"), "{err}");
    devices[0].usage.used = 10;
    let err = fit("n", &devices, &[req(2, None, 100)], &spread()).unwrap_err();
    assert!(
        matches!(err, FilterError::NoFit { found: 1, .. }),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .contains("1/2 CardTimeSlicingExhausted, 1/2 AllocatedCardsInsufficientRequest"),
        "{err}"
    );
    assert_eq!(
        fit("n", &devices, &[], &spread()).unwrap_err(),
        FilterError::NoAmdRequest
    );
}

#[test]
fn only_devices_whose_type_says_amd_count() {
    let mut devices = idle(2);
    devices[1].device.device_type = "gpu".into();
    let err = fit("n", &devices, &[req(2, None, 100)], &spread()).unwrap_err();
    assert!(matches!(err, FilterError::TooFewDevices { have: 1, .. }));
}

#[test]
fn the_register_annotation_decodes_with_go_defaults() {
    let value = r#"[{"id":"A","count":10,"devmem":196608,"devcore":304,"type":"AMD Instinct MI300X",
        "numa":-1,"health":true,"devicevendor":"amd","custominfo":{"pciBDF":"0000:05:00.0"}},{"id":"B"}]"#;
    let devices = decode_register(value).unwrap();
    assert_eq!((devices[0].numa, devices[0].health), (-1, true));
    assert!(!devices[1].health, "absent health is unhealthy");
    assert!(decode_register("[{\"count\":1.5}]").is_err());
}
