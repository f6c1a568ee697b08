//! HAMi's Allocate end to end: amd-gpud on a private bus, amd-device-plugin
//! with the real kube-rs client against the fake API server, the fake
//! kubelet, and what HAMi's scheduler writes in Filter and Bind (emulated
//! here: the pod annotations, the node lock, the binding). Needs root.

// An integration-test file is itself the test module, and a failed unwrap is a
// failed test here.
#![allow(clippy::tests_outside_test_module, clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::world::{
    Gpu, NODE, Setup, World, grant, lock, pod_annotation, released, schedule, schedule_containers,
    world, world_on, world_with,
};
use serde_json::{Value, json};
use tests::hami_emulator::HamiEmulator;

#[test]
fn slices_whole_gpus_and_failures_end_to_end() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(Duration::from_secs(120), scenario());
}

async fn scenario() {
    let mut w = world().await;
    quarters_of_one_gpu(&w).await;
    whole_gpu(&w).await;
    missing_hook(&w).await;
    unknown_gpu(&w).await;
    preferred_follows_hami(&w).await;
    two_containers_across_a_plugin_restart(&mut w).await;
    memory_only(&w).await;
    two_gpus_in_one_container(&w).await;
    api_unreachable(&w).await;
}

async fn quarters_of_one_gpu(w: &World) {
    let (api, kubelet, g0) = (&w.api, &w.kubelet, &w.gpus[0]);

    // One GPU at 25 %: 76 of 304 CUs and 48 GiB.
    schedule(api, "quarter-a", &[(g0, 49_152, 76)], 100);
    tokio::time::sleep(Duration::from_millis(300)).await; // let the watch deliver the pod
    api.reset_requests();
    let answer = kubelet
        .allocate(vec![format!("{}#0", g0.id)])
        .await
        .unwrap();
    assert!(released(api).await, "the lock is released");
    let counts = api.requests();
    assert_eq!(
        counts.get + counts.list,
        0,
        "no reads on the happy path: {counts:?}"
    );
    assert_eq!(
        counts.patch, 2,
        "the pod patch and the lock release: {counts:?}"
    );
    assert_eq!(counts.total(), 2, "nothing else: {counts:?}");
    assert_eq!(answer.envs["ROCR_VISIBLE_DEVICES"], g0.rocr_uuid);
    assert_eq!(answer.envs["HSA_CU_MASK"], "0:0-75");
    assert_eq!(answer.envs["HIP_DEVICE_MEMORY_LIMIT_0"], "49152m");
    assert_eq!(answer.envs["LD_AUDIT"], "/usr/local/vgpu/libamvgpu.so");
    let hook = w.hook_dir().join("libamvgpu.so");
    assert_eq!(answer.mounts[0].host_path, hook.display().to_string());
    assert!(answer.mounts[0].read_only);
    let paths: Vec<&str> = answer
        .devices
        .iter()
        .map(|d| d.container_path.as_str())
        .collect();
    assert_eq!(paths, ["/dev/kfd", "/dev/dri/card0", "/dev/dri/renderD128"]);
    assert_eq!(
        pod_annotation(api, "quarter-a", "hami.io/amd-devices-to-allocate").as_deref(),
        Some(";")
    );
    assert_eq!(
        pod_annotation(api, "quarter-a", "hami.io/bind-phase").as_deref(),
        Some("success")
    );
    let cus = pod_annotation(api, "quarter-a", "hami.io/amd-cu-allocated").unwrap();
    assert_eq!(serde_json::from_str::<Value>(&cus).unwrap()[&g0.id], "0-75");
    assert!(released(api).await, "the lock is released");

    // A second quarter of the same GPU gets the next CUs, never the same ones.
    schedule(api, "quarter-b", &[(g0, 49_152, 76)], 101);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let answer = kubelet
        .allocate(vec![format!("{}#1", g0.id)])
        .await
        .unwrap();
    assert_eq!(answer.envs["HSA_CU_MASK"], "0:76-151");
}

async fn whole_gpu(w: &World) {
    let (api, kubelet, gpus) = (&w.api, &w.kubelet, &w.gpus);

    // A whole GPU: no mask, no hook, works with any image.
    schedule(api, "whole", &[(&gpus[1], 196_608, 304)], 102);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let answer = kubelet
        .allocate(vec![format!("{}#0", gpus[1].id)])
        .await
        .unwrap();
    assert!(!answer.envs.contains_key("HSA_CU_MASK"));
    assert!(!answer.envs.contains_key("LD_AUDIT"));
    assert!(answer.mounts.is_empty());
}

/// Without the memory hook on the node a slice is refused (its memory limit
/// would silently not apply); a whole GPU needs no hook.
async fn missing_hook(w: &World) {
    let (api, kubelet) = (&w.api, &w.kubelet);
    let hook = w.hook_dir().join("libamvgpu.so");
    std::fs::rename(&hook, hook.with_extension("away")).unwrap();
    schedule(api, "no-hook", &[(&w.gpus[6], 1024, 38)], 150);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let err = kubelet
        .allocate(vec![format!("{}#0", w.gpus[6].id)])
        .await
        .unwrap_err();
    assert!(
        err.message().contains("memory hook") && err.message().contains("libamvgpu.so"),
        "{err:?}"
    );
    assert_eq!(
        pod_annotation(api, "no-hook", "hami.io/bind-phase").as_deref(),
        Some("failed")
    );
    std::fs::rename(hook.with_extension("away"), &hook).unwrap();
}

async fn unknown_gpu(w: &World) {
    let (api, kubelet, g0) = (&w.api, &w.kubelet, &w.gpus[0]);

    // HAMi assigned a GPU this node does not have: a clear error, the pod
    // marked failed, the lock released.
    let ghost = Gpu {
        id: "GPU-00000000deadbeef".into(),
        device_type: "AMD X".into(),
        rocr_uuid: String::new(),
    };
    schedule(api, "ghost", &[(&ghost, 1024, 10)], 103);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let err = kubelet
        .allocate(vec![format!("{}#2", g0.id)])
        .await
        .unwrap_err();
    assert!(err.message().contains("GPU-00000000deadbeef"), "{err:?}");
    assert_eq!(
        pod_annotation(api, "ghost", "hami.io/bind-phase").as_deref(),
        Some("failed")
    );
    assert!(released(api).await, "the lock is released");
}

async fn preferred_follows_hami(w: &World) {
    let (api, kubelet, g3) = (&w.api, &w.kubelet, &w.gpus[3]);
    schedule(api, "preferred", &[(g3, 1024, 38)], 104);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let available: Vec<String> = kubelet.devices().iter().map(|d| d.id.clone()).collect();
    let ids = kubelet
        .preferred_allocation(available, vec![], 1)
        .await
        .unwrap();
    assert_eq!(ids, [format!("{}#0", g3.id)], "the GPU HAMi chose");
    kubelet.allocate(ids).await.unwrap();
}

/// The real kubelet asks for its preference as soon as it sees the pod
/// bound, when the plugin's watch has often not delivered it yet (measured
/// with kubelet 1.36 in `node-sim --cluster real`): the plugin must still
/// name the GPU HAMi chose, reading the pod from the API server.
#[test]
fn the_preference_follows_hami_when_the_watch_lags() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(Duration::from_secs(120), async {
        let w = world().await;
        let (api, kubelet, g5) = (&w.api, &w.kubelet, &w.gpus[5]);
        let lag = tests::apiserver::WatchDelay {
            fixed: Duration::from_secs(3),
            random: Duration::ZERO,
        };
        api.set_watch_delay(lag, 1);
        schedule(api, "lagged", &[(g5, 1024, 38)], 110);
        api.reset_requests();
        let available: Vec<String> = kubelet.devices().iter().map(|d| d.id.clone()).collect();
        let ids = kubelet
            .preferred_allocation(available, vec![], 1)
            .await
            .unwrap();
        assert_eq!(ids, [format!("{}#0", g5.id)], "the GPU HAMi chose");
        let reads = api.requests();
        assert!(reads.get > 0, "read from the API server: {reads:?}");
        let answer = kubelet.allocate(ids).await.unwrap();
        assert_eq!(answer.envs["HSA_CU_MASK"], "0:0-37");
    });
}

async fn two_containers_across_a_plugin_restart(w: &mut World) {
    let g2 = &w.gpus[2];
    let one: &[(&Gpu, u32, u32)] = &[(g2, 1024, 38)];
    schedule_containers(&w.api, "two", &[one, one], 105);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let first = w
        .kubelet
        .allocate(vec![format!("{}#0", g2.id)])
        .await
        .unwrap();
    assert_eq!(first.envs["HSA_CU_MASK"], "0:0-37");
    assert_eq!(
        pod_annotation(&w.api, "two", "hami.io/bind-phase").as_deref(),
        Some("allocating")
    );
    assert!(
        lock(&w.api).is_some(),
        "the lock stays until the last container"
    );
    let g2 = w.gpus[2].id.clone();
    w.restart_plugin().await;
    let second = w.kubelet.allocate(vec![format!("{g2}#1")]).await.unwrap();
    assert_eq!(
        second.envs["HSA_CU_MASK"], "0:38-75",
        "continues where the old plugin stopped"
    );
    assert_eq!(
        pod_annotation(&w.api, "two", "hami.io/bind-phase").as_deref(),
        Some("success")
    );
    let cus = pod_annotation(&w.api, "two", "hami.io/amd-cu-allocated").unwrap();
    assert_eq!(serde_json::from_str::<Value>(&cus).unwrap()[&g2], "0-75");
    assert!(released(&w.api).await, "the lock is released");
}

async fn memory_only(w: &World) {
    let (api, kubelet, g4) = (&w.api, &w.kubelet, &w.gpus[4]);
    schedule(api, "memory", &[(g4, 8192, 304)], 106);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let answer = kubelet
        .allocate(vec![format!("{}#0", g4.id)])
        .await
        .unwrap();
    assert!(!answer.envs.contains_key("HSA_CU_MASK"));
    assert_eq!(answer.envs["HIP_DEVICE_MEMORY_LIMIT_0"], "8192m");
    assert_eq!(answer.envs["LD_AUDIT"], "/usr/local/vgpu/libamvgpu.so");
}

async fn api_unreachable(w: &World) {
    let (api, kubelet, g5) = (&w.api, &w.kubelet, &w.gpus[5]);
    schedule(api, "offline", &[(g5, 1024, 38)], 107);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = pod_annotation(api, "offline", "hami.io/amd-devices-to-allocate");
    api.set_unreachable(true);
    let err = kubelet
        .allocate(vec![format!("{}#0", g5.id)])
        .await
        .unwrap_err();
    api.set_unreachable(false);
    assert!(err.message().contains("patching the pod"), "{err:?}");
    assert_eq!(
        pod_annotation(api, "offline", "hami.io/amd-devices-to-allocate"),
        before,
        "nothing half-written"
    );
    assert_eq!(
        pod_annotation(api, "offline", "hami.io/amd-cu-allocated"),
        None
    );
}

async fn two_gpus_in_one_container(w: &World) {
    let (api, kubelet, g6, g7) = (&w.api, &w.kubelet, &w.gpus[6], &w.gpus[7]);
    schedule(api, "pair", &[(g6, 4096, 38), (g7, 4096, 38)], 108);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let ids = vec![format!("{}#0", g6.id), format!("{}#0", g7.id)];
    let answer = kubelet.allocate(ids).await.unwrap();
    assert_eq!(
        answer.envs["ROCR_VISIBLE_DEVICES"],
        format!("{},{}", g6.rocr_uuid, g7.rocr_uuid)
    );
    assert_eq!(answer.envs["HSA_CU_MASK"], "0:0-37;1:0-37");
    assert_eq!(answer.envs["HIP_DEVICE_MEMORY_LIMIT_0"], "4096m");
    assert_eq!(answer.envs["HIP_DEVICE_MEMORY_LIMIT_1"], "4096m");
    assert_eq!(
        answer.devices.len(),
        5,
        "kfd plus a card and a render node per GPU"
    );
    let cus = pod_annotation(api, "pair", "hami.io/amd-cu-allocated").unwrap();
    let cus: Value = serde_json::from_str(&cus).unwrap();
    assert_eq!(
        (cus[&g6.id].as_str(), cus[&g7.id].as_str()),
        (Some("0-37"), Some("0-37"))
    );
}

/// 50 pods bound at once (no node lock: found by the fallback rule, oldest
/// bind-time first, which the plugin follows only with
/// `--annotations-protected`, as the chart runs it), 50 Allocates in flight
/// together: every pod gets its CUs, and no two pods share a CU.
#[test]
fn fifty_pods_at_once_never_share_a_cu() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(Duration::from_secs(120), fifty_pods());
}

async fn fifty_pods() {
    let w = world_with(&Setup {
        fixture: "mi300x-8-spx",
        devices: 80,
        gpud_args: &[],
        plugin_args: &["--annotations-protected".to_owned(), "true".to_owned()],
        prepare: &|_| {},
    })
    .await;
    let hami = HamiEmulator {
        node: NODE.to_owned(),
    };
    for i in 0..50_u64 {
        let g = &w.gpus[usize::try_from(i % 8).unwrap()];
        hami.bind_unlocked(
            &w.api,
            &format!("many-{i}"),
            &[vec![grant(g, 1024, 38)]],
            1000 + i,
        );
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let calls = (0..50).map(|i| {
        w.kubelet
            .allocate(vec![format!("{}#{}", w.gpus[i % 8].id, i / 8)])
    });
    let answers = futures_util::future::join_all(calls).await;
    assert!(
        answers.iter().all(Result::is_ok),
        "{:?}",
        answers.iter().find(|a| a.is_err())
    );
    let mut used: std::collections::HashMap<String, Vec<u64>> = std::collections::HashMap::new();
    for i in 0..50 {
        let name = format!("many-{i}");
        assert_eq!(
            pod_annotation(&w.api, &name, "hami.io/bind-phase").as_deref(),
            Some("success"),
            "{name}"
        );
        let cus: Value = serde_json::from_str(
            &pod_annotation(&w.api, &name, "hami.io/amd-cu-allocated").unwrap(),
        )
        .unwrap();
        for (gpu, list) in cus.as_object().unwrap() {
            let (a, b) = list.as_str().unwrap().split_once('-').unwrap();
            used.entry(gpu.clone())
                .or_default()
                .extend(a.parse::<u64>().unwrap()..=b.parse().unwrap());
        }
    }
    for (gpu, cus) in &used {
        let distinct: std::collections::HashSet<&u64> = cus.iter().collect();
        assert_eq!(distinct.len(), cus.len(), "GPU {gpu}: overlapping CUs");
    }
    assert_eq!(used.values().map(Vec::len).sum::<usize>(), 50 * 38);
}

/// A dGPU and an iGPU without a ROCr UUID in one container: ROCr stops at
/// the first token it cannot parse, so both are selected by container-local
/// index (their rank in KFD order), in annotation order; the register
/// annotation says which devices are selected that way.
#[test]
fn an_igpu_second_in_a_container_is_selected_by_index_with_the_dgpu() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(Duration::from_secs(120), async {
        let w = world_on("rx9070xt-igpu", 3).await;
        let dgpu = w.gpus.iter().find(|g| !g.rocr_uuid.is_empty()).unwrap();
        let igpu = w.gpus.iter().find(|g| g.rocr_uuid.is_empty()).unwrap();
        let shown: Vec<(String, Value)> = w
            .registered()
            .into_iter()
            .map(|d| {
                let id = d["id"].as_str().unwrap().to_owned();
                (id, d["custominfo"]["rocrVisibleDevice"].clone())
            })
            .collect();
        assert!(
            shown.contains(&(igpu.id.clone(), json!("index"))),
            "{shown:?}"
        );
        assert!(
            shown.contains(&(dgpu.id.clone(), json!(dgpu.rocr_uuid))),
            "{shown:?}"
        );
        schedule(
            &w.api,
            "igpu-second",
            &[(dgpu, 4096, 32), (igpu, 512, 2)],
            300,
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        let ids = vec![format!("{}#0", dgpu.id), format!("{}#0", igpu.id)];
        let answer = w.kubelet.allocate(ids).await.unwrap();
        // The dGPU is KFD node 1, the iGPU node 2.
        assert_eq!(answer.envs["ROCR_VISIBLE_DEVICES"], "0,1");
        assert_eq!(
            answer.envs["HSA_CU_MASK"], "0:0-31",
            "the dGPU's slice only"
        );
    });
}

/// An RX 9070 XT (gfx1201: CUs in WGP pairs) next to an iGPU without a ROCr
/// UUID (`unique_id` 0).
#[test]
fn wgp_rounding_and_a_gpu_without_rocr_uuid() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(Duration::from_secs(120), radeon());
}

async fn radeon() {
    let w = world_on("rx9070xt-igpu", 3).await;
    let dgpu = w.gpus.iter().find(|g| !g.rocr_uuid.is_empty()).unwrap();
    let igpu = w.gpus.iter().find(|g| g.rocr_uuid.is_empty()).unwrap();
    // 13 CUs on gfx12: whole WGPs only, rounded down to 12.
    schedule(&w.api, "odd", &[(dgpu, 4096, 13)], 200);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let answer = w
        .kubelet
        .allocate(vec![format!("{}#0", dgpu.id)])
        .await
        .unwrap();
    assert_eq!(answer.envs["HSA_CU_MASK"], "0:0-11");
    // One CU is less than a WGP: the pod gets the smallest share, one
    // whole WGP, recorded as such.
    schedule(&w.api, "tiny", &[(dgpu, 1024, 1)], 201);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let answer = w
        .kubelet
        .allocate(vec![format!("{}#1", dgpu.id)])
        .await
        .unwrap();
    assert_eq!(answer.envs["HSA_CU_MASK"], "0:12-13");
    assert_eq!(
        pod_annotation(&w.api, "tiny", "hami.io/amd-cu-allocated").as_deref(),
        Some(format!(r#"{{"{}":"12-13"}}"#, dgpu.id).as_str())
    );
    // The iGPU has no ROCr UUID: it is selected by its container-local index.
    schedule(&w.api, "apu", &[(igpu, 512, 2)], 202);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let answer = w
        .kubelet
        .allocate(vec![format!("{}#0", igpu.id)])
        .await
        .unwrap();
    assert_eq!(answer.envs["ROCR_VISIBLE_DEVICES"], "0");
    assert!(
        !answer.envs.contains_key("HSA_CU_MASK"),
        "2 of 2 CUs is the whole GPU"
    );
}
