use std::{sync::Mutex, time::Duration};

use ipc::types::GpuInfo;
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

use super::*;

fn gpu(bdf: &str, uuid: &str) -> GpuInfo {
    crate::testutil::mi300x(bdf, uuid)
}

fn snapshot() -> Snapshot {
    let gpus = [gpu("0000:05:00.0", "GPU-A"), gpu("0000:15:00.0", "GPU-B")];
    Snapshot::from_gpud(&gpus, BTreeMap::new(), ipc::DmemBackend::On)
}

fn pod(allocated: &str) -> Pod {
    serde_json::from_value(json!({"metadata": {
        "name": "p", "namespace": "ns", "uid": "0b4c6c1e-5d0e-4d3c-9a43-4b0c2f4e0a01",
        "annotations": {ALLOCATED_KEY: allocated}}}))
    .unwrap()
}

/// HAMi up to v2.9 wrote `<node>-AMDGPU-<n>`: slot 10 (10 a GPU) is
/// GPU-B's, and its VRAM is capped in GPU-B's region.
#[test]
fn a_hami_v2_9_grant_is_capped_on_the_gpu_of_its_slot() {
    let old = pod("node-1-AMDGPU-10,AMDGPU,2048,0:;");
    let limits = pod_limits(&old, (&snapshot(), 0), "amd.com/gpu", None).unwrap();
    assert_eq!(
        limits,
        BTreeMap::from([("0000:15:00.0".to_owned(), 2048 * MIB)])
    );
    let limits = pod_limits(&old, (&snapshot(), 5), "amd.com/gpu", None);
    assert!(limits.is_err(), "slot 10 of 2 GPUs of 5: none");
}

#[test]
fn the_limit_is_the_pods_sum_per_gpu() {
    let two = pod("GPU-A,T,4096,76:;GPU-A,T,2048,38:GPU-B,T,1024,10:;");
    let limits = pod_limits(&two, (&snapshot(), 0), "amd.com/gpu", None).unwrap();
    assert_eq!(
        limits,
        BTreeMap::from([
            ("0000:05:00.0".to_owned(), 6144 * MIB),
            ("0000:15:00.0".to_owned(), 1024 * MIB),
        ])
    );
    let err = pod_limits(&pod("GPU-Z,T,1,1:;"), (&snapshot(), 0), "amd.com/gpu", None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("GPU-Z"), "{err}");
    let none: Pod = serde_json::from_value(json!({"metadata": {"name": "p"}})).unwrap();
    assert!(
        pod_limits(&none, (&snapshot(), 0), "amd.com/gpu", None)
            .unwrap_err()
            .to_string()
            .contains(ALLOCATED_KEY)
    );
}

/// amd-gpud as the plugin sees it: backend state, and what it was asked.
#[derive(Debug)]
struct FakeSink {
    on: bool,
    refuse: Option<String>,
    calls: Mutex<Vec<(String, BTreeMap<String, u64>)>>,
}

impl CapSink for FakeSink {
    fn backend_on(&self) -> bool {
        self.on
    }

    fn set(
        &self,
        uid: String,
        limits: BTreeMap<String, u64>,
    ) -> Pin<Box<dyn Future<Output = Result<(), SessionError>> + Send>> {
        self.calls.lock().unwrap().push((uid, limits));
        let answer = self
            .refuse
            .clone()
            .map_or(Ok(()), |why| Err(zbus::Error::Failure(why).into()));
        Box::pin(async move { answer })
    }
}

fn caps(mode: DmemMode, sink: FakeSink, pods: Vec<Pod>) -> (VramCaps, Arc<FakeSink>) {
    let sink = Arc::new(sink);
    let (_tx, snapshots) = watch::channel(snapshot());
    let caps = VramCaps {
        mode,
        sink: sink.clone(),
        owners: Arc::new(Owners::new(None, "amd.com/gpu")),
        pods: Arc::new(crate::testutil::KnownPods {
            pods: pods.into_iter().map(Arc::new).collect(),
        }),
        snapshots,
        events: None,
        split_count: 0,
    };
    (caps, sink)
}

fn sink(on: bool, refuse: Option<&str>) -> FakeSink {
    FakeSink {
        on,
        refuse: refuse.map(str::to_owned),
        calls: Mutex::new(Vec::new()),
    }
}

fn remember(caps: &VramCaps, ids: &[String]) {
    let owner = owners::PodRef {
        namespace: "ns".into(),
        name: "p".into(),
        uid: "0b4c6c1e-5d0e-4d3c-9a43-4b0c2f4e0a01".into(),
    };
    caps.owners.remember(ids, owner, |_| true);
}

#[tokio::test(flavor = "current_thread")]
async fn the_pod_total_goes_to_amd_gpud_at_pre_start() {
    let ids = vec!["GPU-A#0".to_owned()];
    let (caps, sink) = caps(
        DmemMode::Auto,
        sink(true, None),
        vec![pod("GPU-A,T,4096,76:;GPU-A,T,2048,38:;")],
    );
    assert!(caps.pre_start_required());
    remember(&caps, &ids);
    tokio::time::timeout(Duration::from_secs(5), caps.pre_start(&ids, false))
        .await
        .unwrap()
        .unwrap();
    let calls = sink.calls.lock().unwrap().clone();
    assert_eq!(
        calls,
        [(
            "0b4c6c1e-5d0e-4d3c-9a43-4b0c2f4e0a01".to_owned(),
            BTreeMap::from([("0000:05:00.0".to_owned(), 6144 * MIB)])
        )]
    );
}

#[tokio::test(flavor = "current_thread")]
async fn only_on_makes_a_failed_cap_fail_the_container() {
    let ids = vec!["GPU-A#0".to_owned()];
    let refused = Some("dmem.max of the pod refused 1 GiB: Device or resource busy");
    let (auto, _) = caps(
        DmemMode::Auto,
        sink(true, refused),
        vec![pod("GPU-A,T,1024,76:;")],
    );
    remember(&auto, &ids);
    let done = tokio::time::timeout(Duration::from_secs(5), auto.pre_start(&ids, false)).await;
    assert!(
        matches!(done.unwrap(), Ok(())),
        "auto: logged, the container starts"
    );
    let hookless = tokio::time::timeout(Duration::from_secs(5), auto.pre_start(&ids, true))
        .await
        .unwrap()
        .unwrap_err()
        .to_string();
    assert!(
        hookless.contains("resource busy") && hookless.contains("no memory hook"),
        "auto, but the loader check left the hook out: the cap must hold: {hookless}"
    );

    let (on, _) = caps(
        DmemMode::On,
        sink(true, refused),
        vec![pod("GPU-A,T,1024,76:;")],
    );
    remember(&on, &ids);
    let err = tokio::time::timeout(Duration::from_secs(5), on.pre_start(&ids, false))
        .await
        .unwrap()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("resource busy") && err.contains("ns/p"),
        "{err}"
    );

    // No record and no pod-resources API: the ids are named.
    let (lost, sink) = caps(DmemMode::On, sink(true, None), vec![]);
    let err = tokio::time::timeout(Duration::from_secs(5), lost.pre_start(&ids, false))
        .await
        .unwrap()
        .unwrap_err()
        .to_string();
    assert!(err.contains("GPU-A#0"), "{err}");
    assert!(sink.calls.lock().unwrap().is_empty());
}

#[tokio::test(flavor = "current_thread")]
async fn nothing_is_asked_when_the_backend_is_off() {
    let ids = vec!["GPU-A#0".to_owned()];
    for (mode, on) in [(DmemMode::Off, true), (DmemMode::Auto, false)] {
        let (caps, sink) = caps(mode, sink(on, None), vec![pod("GPU-A,T,1024,76:;")]);
        remember(&caps, &ids);
        assert!(!caps.pre_start_required());
        let done = tokio::time::timeout(Duration::from_secs(5), caps.pre_start(&ids, false)).await;
        assert!(matches!(done.unwrap(), Ok(())), "{mode:?}");
        assert!(sink.calls.lock().unwrap().is_empty(), "{mode:?}");
    }
}

/// Issue 35, point 3: an init container and an app container on one GPU.
/// The cap at each PreStartContainer is what runs from then on (12 GiB
/// while the init container runs, 4 GiB from the app on), not the sum of
/// both grants; when the container is not known, HAMi's count.
#[tokio::test(flavor = "current_thread")]
async fn the_cap_follows_the_phase_of_the_starting_container() {
    let asks = json!({"limits": {"amd.com/gpu": "1"}});
    let mut staged = pod("GPU-A,T,12288,76:;GPU-A,T,4096,38:;");
    staged.spec = serde_json::from_value(json!({
        "initContainers": [{"name": "init", "image": "x", "resources": asks}],
        "containers": [{"name": "app", "image": "x", "resources": asks}],
    }))
    .unwrap();
    let (caps, sink) = caps(DmemMode::On, sink(true, None), vec![staged]);
    let (init, app, lost) = (
        vec!["GPU-A#0".to_owned()],
        vec!["GPU-A#1".to_owned()],
        vec!["GPU-A#2".to_owned()],
    );
    remember(&caps, &init);
    caps.owners.remember_container(&init, "init");
    remember(&caps, &app);
    caps.owners.remember_container(&app, "app");
    remember(&caps, &lost);
    for ids in [&init, &app, &lost] {
        tokio::time::timeout(Duration::from_secs(5), caps.pre_start(ids, false))
            .await
            .unwrap()
            .unwrap();
    }
    let region = "0000:05:00.0".to_owned();
    let caps: Vec<u64> = sink
        .calls
        .lock()
        .unwrap()
        .iter()
        .map(|(_, limits)| limits[&region])
        .collect();
    assert_eq!(caps, [12288 * MIB, 4096 * MIB, 12288 * MIB]);
}
