//! Faults under the real kubelet (issue 18): kubelet v1.36.3 with
//! `recording-cri`, the real API server, amd-gpud with a fake dmem cgroup
//! tree (`--dmem-any-fs`, kubelet's cgroupfs layout) and the plugin with
//! `--dmem-backend on`, so that kubelet calls PreStartContainer before each
//! AMD container starts and the plugin has amd-gpud write the pod's
//! `dmem.max`.
//!
//! 1. The plugin is killed (SIGKILL) and restarted in the middle of a storm
//!    of 50 admissions placed as HAMi places them: every wanted pod ends
//!    with exactly one Running pod whose container was created once, no two
//!    of them share a CU, each keeps its grant and its VRAM cap; a pod
//!    whose init container is held across the restart gets its cap from
//!    the restarted plugin, which knows the pod only from kubelet's
//!    pod-resources API.
//! 2. amd-gpud, then the bus broker, restarted while pods run: no pod is
//!    disrupted, no cap changes, and the node admits a new pod with its cap
//!    after each.
//!
//! Needs root. Figures: `docs/benchmarks.md`.

// An integration-test file is itself the test module, and a failed unwrap is a
// failed test here.
#![allow(clippy::tests_outside_test_module, clippy::unwrap_used)]

mod common;
#[path = "real_kubelet_faults/restarts.rs"]
mod restarts;

use std::{
    collections::{HashMap, VecDeque},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::Pod;
use kube::{Api, api::DeleteParams};
use serde_json::{Value, json};
use tests::{
    cluster::{
        RealCluster,
        kubelet::{KUBELET_NODE, KubeletVersion, container_env},
    },
    fixture::{
        self,
        cgroup::{CGROUP_MOUNT, CgroupDriver, QosClass, add_pod, pod_cgroup, write_dmem_cgroups},
    },
    grants::{Held, overlaps, parse_id_list},
};

use common::{
    cluster::{LIMIT, bind, eventually, hami_places_spec},
    real_node::{NodeSetup, PluginUser, Scene, created_for, registered, scene_prepared},
};

const WANTED: usize = 50;
/// The wanted pod whose init container is held across the plugin restart.
const HELD: usize = 20;
/// The plugin is killed right after this many placements.
const KILL_AFTER: usize = 25;
/// 38 CUs (an eighth of an MI300X) and 4 GiB per pod.
const GRANT: (u32, u32) = (38, 4096);
const CAP_BYTES: u64 = 4096 << 20;
/// HAMi's `HAMI_NODELOCK_EXPIRE` here (a Go duration on its scheduler,
/// default 5 min; Project-HAMi/HAMi:pkg/util/nodelock/nodelock.go): a lock
/// older than this, or whose pod is gone, is taken over.
const LOCK_EXPIRE: Duration = Duration::from_secs(20);
/// Kubelet's log line when a device plugin registers.
const REGISTERED: &str = "Got registration request from device plugin";
/// The runtime's knob (tests/cluster/cmd/recording-cri/main.go).
const EXIT_ON: &str = "RECORDING_CRI_EXIT_ON";

/// amd-gpud with the fixture's dmem cgroup tree, the plugin requiring
/// PreStartContainer; `plugin_args` added.
async fn capped_scene(plugin_args: &[String]) -> Scene {
    let mut args = vec!["--dmem-backend".to_owned(), "on".to_owned()];
    args.extend_from_slice(plugin_args);
    let setup = NodeSetup {
        fixture: "mi300x-8-spx",
        user: PluginUser::Root,
        gpud_args: ["--dmem-any-fs", "--dmem-backend", "on"]
            .map(String::from)
            .into(),
        plugin_args: args,
    };
    let prepare = |root: &Path| {
        let spec = fixture::named("mi300x-8-spx").unwrap();
        // kubelet here uses the cgroupfs driver (its runtime says so), and
        // amd-gpud finds it from the tree: `kubepods` exists.
        write_dmem_cgroups(&spec, root, CgroupDriver::Cgroupfs).unwrap();
    };
    scene_prepared(KubeletVersion::Pinned, &setup, "80", &prepare).await
}

/// The pod cgroup of `uid`: BestEffort, as a pod asking for nothing but
/// `amd.com/gpu` is.
fn cgroup_of(root: &Path, uid: &str) -> PathBuf {
    root.join(CGROUP_MOUNT).join(pod_cgroup(
        CgroupDriver::Cgroupfs,
        QosClass::BestEffort,
        uid,
    ))
}

/// What `dmem.max` holds once the pod's cap on `gpu` is set.
fn cap_line(gpu: &Value) -> String {
    let bdf = gpu["custominfo"]["pciBDF"].as_str().unwrap();
    format!("drm/{bdf}/vram {CAP_BYTES}\n")
}

/// A pod asking for one AMD container `c`; with `hold`, a CPU-only init
/// container `hold` before it, which runs until the file `hold` exists.
fn pod_spec(hold: Option<&Path>) -> Value {
    let app = json!({"name": "c", "image": "rocm",
                     "resources": {"limits": {"amd.com/gpu": "1"}}});
    match hold {
        None => json!({"containers": [app]}),
        Some(file) => json!({
            "initContainers": [{"name": "hold", "image": "rocm",
                                "env": [{"name": EXIT_ON, "value": file.display().to_string()}]}],
            "containers": [app]}),
    }
}

/// HAMi's placement of `name` on `gpu`, the pod cgroup kubelet would make,
/// and the binding; the pod's UID.
fn place(cluster: &RealCluster, root: &Path, name: &str, gpu: &Value, spec: &Value) -> String {
    let uid = hami_places_spec(cluster, name, KUBELET_NODE, gpu, GRANT, spec);
    add_pod(root, CgroupDriver::Cgroupfs, QosClass::BestEffort, &uid).unwrap();
    bind(cluster, name, KUBELET_NODE);
    uid
}

/// The phase of `default/<name>` (`None`: no such pod).
async fn phase(pods: &Api<Pod>, name: &str) -> Option<String> {
    let pod = pods.get_opt(name).await.unwrap()?;
    Some(pod.status.and_then(|s| s.phase).unwrap_or_default())
}

/// HAMi's view of the node lock, as its scheduler decides whether to bind
/// the next pod: free when absent, when its pod is gone, or when older than
/// [`LOCK_EXPIRE`] (when HAMi took it is what this test remembers).
struct Hami {
    taken: HashMap<String, Instant>,
    expired: usize,
}

impl Hami {
    async fn lock_free(&mut self, scene: &Scene) -> bool {
        let node = scene.nodes.get(KUBELET_NODE).await.unwrap();
        let annotations = node.metadata.annotations.unwrap_or_default();
        let Some(lock) = annotations.get("hami.io/mutex.lock") else {
            return true;
        };
        let owner = lock.rsplit(',').next().unwrap_or_default();
        if scene.pods.get_opt(owner).await.unwrap().is_none() {
            return true;
        }
        let old = self
            .taken
            .get(owner)
            .is_none_or(|at| at.elapsed() > LOCK_EXPIRE);
        self.expired += usize::from(old);
        old
    }
}

/// One wanted pod: its current attempt (as a ReplicaSet names a
/// replacement anew).
struct Wanted {
    attempt: usize,
    uid: String,
}

fn attempt_name(wanted: usize, attempt: usize) -> String {
    format!("w{wanted:02}-{attempt}")
}

/// The storm's bookkeeping and figures.
struct Storm {
    wanted: Vec<Wanted>,
    queue: VecDeque<usize>,
    placed: usize,
    replaced: Vec<String>,
    hold: PathBuf,
    plugin_log: PathBuf,
    /// When the plugin was restarted and kubelet's registrations before.
    restart: Option<(Instant, usize)>,
    registered_after: Option<Duration>,
    /// When HAMi placed its first pod after the restart (the lock of the
    /// pod being admitted at the kill had to be freed first).
    placed_after: Option<Duration>,
    allocated_after: Option<Duration>,
}

#[test]
fn the_plugin_killed_in_a_storm_of_admissions_loses_and_duplicates_nothing() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(LIMIT, storm());
}

async fn storm() {
    let mut scene = capped_scene(&[]).await;
    let devices = registered(&scene.nodes, KUBELET_NODE).await;
    let root = scene.node.root.path().to_owned();
    let mut storm = Storm {
        wanted: (0..WANTED)
            .map(|_| Wanted {
                attempt: 0,
                uid: String::new(),
            })
            .collect(),
        queue: (0..WANTED).collect(),
        placed: 0,
        replaced: Vec::new(),
        hold: root.join("release-held-init"),
        plugin_log: root.join("restarted-plugin.log"),
        restart: None,
        registered_after: None,
        placed_after: None,
        allocated_after: None,
    };
    scene.node.log_plugin_to(&storm.plugin_log);
    let mut hami = Hami {
        taken: HashMap::new(),
        expired: 0,
    };
    let start = Instant::now();
    while !storm.done(&scene).await {
        assert!(
            start.elapsed() < Duration::from_secs(600),
            "the storm did not settle: {}",
            scene.kubelet.log_tail("kubelet")
        );
        storm.replace_failed(&scene).await;
        storm.watch_restart(&scene);
        if let Some(&i) = storm.queue.front()
            && hami.lock_free(&scene).await
        {
            storm.queue.pop_front();
            let name = storm.place(&scene, &root, &devices, i);
            hami.taken.insert(name, Instant::now());
            if storm.placed == KILL_AFTER {
                storm.kill_plugin(&mut scene).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    storm.report(hami.expired);
    check_storm(&scene, &storm, &devices);
}

impl Storm {
    fn place(&mut self, scene: &Scene, root: &Path, devices: &[Value], i: usize) -> String {
        let name = attempt_name(i, self.wanted[i].attempt);
        let hold = (i == HELD).then_some(self.hold.as_path());
        let gpu = &devices[i % devices.len()];
        self.wanted[i].uid = place(&scene.cluster, root, &name, gpu, &pod_spec(hold));
        self.placed += 1;
        if let Some((at, _)) = self.restart {
            self.placed_after.get_or_insert(at.elapsed());
        }
        name
    }

    /// SIGKILL and a new plugin, once the held pod is admitted (its
    /// Allocate answered by the plugin about to die) and its init container
    /// runs.
    async fn kill_plugin(&mut self, scene: &mut Scene) {
        let held = attempt_name(HELD, 0);
        let created = || async {
            let created = scene.kubelet.requests("CreateContainer");
            (!created_for(&created, &held).is_empty()).then_some(())
        };
        eventually(LIMIT, "the held pod's init container created", created).await;
        let pod = scene.pods.get(&held).await.unwrap();
        let annotations = pod.metadata.annotations.unwrap_or_default();
        assert_eq!(
            annotations["hami.io/bind-phase"], "success",
            "{annotations:?}"
        );
        let before = scene.kubelet.log_count(REGISTERED);
        self.restart = Some((Instant::now(), before));
        scene.node.restart_plugin();
    }

    /// Once the restarted plugin registered with kubelet, releases the held
    /// init container; notes when the new plugin answered its first
    /// Allocate.
    fn watch_restart(&mut self, scene: &Scene) {
        let Some((at, before)) = self.restart else {
            return;
        };
        if self.registered_after.is_none() && scene.kubelet.log_count(REGISTERED) > before {
            self.registered_after = Some(at.elapsed());
            std::fs::write(&self.hold, "").unwrap();
        }
        let log = plain_log(&self.plugin_log);
        if self.allocated_after.is_none() && log.lines().any(|l| l.contains(" allocated pod=")) {
            self.allocated_after = Some(at.elapsed());
        }
    }

    /// As the ReplicaSet controller: a pod kubelet failed (the admission
    /// errors of a plugin that is down) is deleted and replaced by a pod of
    /// a new name, which HAMi places again.
    async fn replace_failed(&mut self, scene: &Scene) {
        for i in 0..WANTED {
            if self.queue.contains(&i) || self.wanted[i].uid.is_empty() {
                continue;
            }
            let name = attempt_name(i, self.wanted[i].attempt);
            let pod = scene.pods.get(&name).await.unwrap();
            let status = pod.status.unwrap_or_default();
            if status.phase.as_deref() != Some("Failed") {
                continue;
            }
            let reason = status.reason.as_deref();
            assert_eq!(
                reason,
                Some("UnexpectedAdmissionError"),
                "{name}: {status:?}"
            );
            assert_ne!(i, HELD, "the held pod was admitted before the kill");
            let params = DeleteParams::default().grace_period(0);
            scene.pods.delete(&name, &params).await.unwrap();
            self.replaced.push(name);
            self.wanted[i].attempt += 1;
            self.queue.push_back(i);
        }
    }

    async fn done(&self, scene: &Scene) -> bool {
        if !self.queue.is_empty() || self.placed < WANTED {
            return false;
        }
        for (i, wanted) in self.wanted.iter().enumerate() {
            let name = attempt_name(i, wanted.attempt);
            if phase(&scene.pods, &name).await.as_deref() != Some("Running") {
                return false;
            }
        }
        true
    }

    fn report(&self, expired: usize) {
        let secs = |d: Option<Duration>| d.map_or(f64::NAN, |d| d.as_secs_f64());
        println!(
            "{WANTED} pods, plugin killed after {KILL_AFTER} placements: {} placements, {} pods \
             failed by kubelet and replaced ({:?}), {expired} node locks taken over after \
             HAMi's expiry ({LOCK_EXPIRE:?}); from the restart: the plugin registered with \
             kubelet after {:.2} s, HAMi placed the next pod after {:.2} s, the plugin \
             answered its first Allocate after {:.2} s",
            self.placed,
            self.replaced.len(),
            self.replaced,
            secs(self.registered_after),
            secs(self.placed_after),
            secs(self.allocated_after),
        );
    }
}

/// A plugin log without its colours (tracing's ANSI escapes).
fn plain_log(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut plain = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ parameters, then a final letter.
            chars.by_ref().find(char::is_ascii_alphabetic);
        } else {
            plain.push(c);
        }
    }
    plain
}

/// The value of `key` in a recorded container's environment.
fn env_of(request: &Value, key: &str) -> Option<String> {
    container_env(request)
        .into_iter()
        .find_map(|(k, v)| (k == key).then_some(v))
}

/// The CreateContainer requests of container `c` of pod `name`.
fn app_created<'a>(created: &'a [Value], name: &str) -> Vec<&'a Value> {
    created_for(created, name)
        .into_iter()
        .filter(|r| r["config"]["metadata"]["name"] == "c")
        .collect()
}

/// What container `c` of `name` holds, from its one CreateContainer: its
/// GPU and CUs, checked against HAMi's grant.
fn held_by(created: &[Value], name: &str, gpu: &Value) -> Held {
    let requests = app_created(created, name);
    assert_eq!(requests.len(), 1, "{name}: created once, {requests:?}");
    let mask = env_of(requests[0], "HSA_CU_MASK").unwrap_or_default();
    let cus = parse_id_list(mask.strip_prefix("0:").unwrap_or(&mask)).unwrap();
    let count: u32 = cus.iter().map(|(a, b)| b - a + 1).sum();
    assert_eq!(count, GRANT.0, "{name}: HSA_CU_MASK {mask}");
    let device = env_of(requests[0], "ROCR_VISIBLE_DEVICES").unwrap_or_default();
    // ROCr selects the GPU by the ROCr UUID its register entry shows (its
    // id is AMD SMI's UUID).
    let rocr = gpu["custominfo"]["rocrVisibleDevice"].as_str().unwrap();
    assert_eq!(device, rocr, "{name}: on its GPU");
    let limit = env_of(requests[0], "HIP_DEVICE_MEMORY_LIMIT_0");
    assert_eq!(limit.as_deref(), Some("4096m"), "{name}");
    Held {
        pod: name.to_owned(),
        container: "c".to_owned(),
        init: false,
        device,
        cus: Some(cus),
    }
}

/// 0 lost, 0 duplicated, 0 overlapping; every cap set; the held pod's cap
/// set by the restarted plugin through pod-resources.
fn check_storm(scene: &Scene, storm: &Storm, devices: &[Value]) {
    let created = scene.kubelet.requests("CreateContainer");
    for name in &storm.replaced {
        assert!(
            created_for(&created, name).is_empty(),
            "{name} failed admission, yet a container was created"
        );
    }
    let root = scene.node.root.path();
    let mut held = Vec::with_capacity(WANTED);
    for (i, wanted) in storm.wanted.iter().enumerate() {
        let name = attempt_name(i, wanted.attempt);
        let gpu = &devices[i % devices.len()];
        held.push(held_by(&created, &name, gpu));
        let dmem = std::fs::read_to_string(cgroup_of(root, &wanted.uid).join("dmem.max"));
        assert_eq!(dmem.unwrap(), cap_line(gpu), "{name}: its VRAM cap");
    }
    let found = overlaps(&held);
    assert!(found.is_empty(), "overlapping CUs: {found:#?}");
    let held_name = attempt_name(HELD, 0);
    assert_eq!(storm.wanted[HELD].attempt, 0);
    let log = plain_log(&storm.plugin_log);
    let recovered = log
        .lines()
        .any(|l| l.contains("recovered from pod-resources") && l.contains(&held_name));
    assert!(
        recovered,
        "the restarted plugin found {held_name} through pod-resources:\n{log}"
    );
}

#[test]
fn amd_gpud_and_the_bus_restarted_while_pods_run_disrupt_nothing() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(LIMIT, restarts::restarts());
}
