//! The plugin facing peers that hang (issue 19): amd-gpud stopped with
//! SIGSTOP (its name stays on the bus, nothing answers), the API server down
//! at start while `--compute-partition` asks for a switch, and the API server
//! blackholed (it accepts connections and never answers) during Allocate.
//! Each runs with the plugin in a 128 MiB memory cgroup (the chart's limit)
//! when cgroup v1's memory controller is there, and prints the plugin's peak
//! RSS against its figure at rest. Needs root (private bus).

// An integration-test file is itself the test module, and a failed unwrap is a
// failed test here.
#![allow(clippy::tests_outside_test_module, clippy::unwrap_used)]

mod common;

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use common::world::{Setup, World, world_with};

/// The chart's memory limit for the plugin.
const LIMIT: u64 = 128 << 20;

/// A cgroup-v1 memory cgroup holding one process, limited to [`LIMIT`];
/// removed on drop (the process, if alive, goes back to the root group).
struct MemCgroup(Option<PathBuf>);

impl MemCgroup {
    fn enter(pid: u32, name: &str) -> Self {
        let root = PathBuf::from("/sys/fs/cgroup/memory");
        if !root.join("cgroup.procs").exists() {
            eprintln!("no cgroup-v1 memory controller: the plugin runs without a limit");
            return Self(None);
        }
        let dir = root.join(format!("{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("memory.limit_in_bytes"), LIMIT.to_string()).unwrap();
        std::fs::write(dir.join("cgroup.procs"), pid.to_string()).unwrap();
        Self(Some(dir))
    }

    /// How often the limit was hit and whether the OOM killer ran.
    fn pressure(&self) -> Option<(u64, bool)> {
        let dir = self.0.as_ref()?;
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
        let failcnt = read("memory.failcnt").trim().parse().unwrap_or(0);
        let killed = read("memory.oom_control")
            .lines()
            .any(|l| l.starts_with("oom_kill ") && !l.ends_with(" 0"));
        Some((failcnt, killed))
    }
}

impl Drop for MemCgroup {
    fn drop(&mut self) {
        if let Some(dir) = self.0.take() {
            for pid in std::fs::read_to_string(dir.join("cgroup.procs"))
                .unwrap_or_default()
                .lines()
            {
                let _ = std::fs::write("/sys/fs/cgroup/memory/cgroup.procs", pid);
            }
            let _ = std::fs::remove_dir(&dir);
        }
    }
}

/// `field` (`VmRSS:`, `VmHWM:`) of `pid`'s status, KiB.
fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Sends `signal` (`STOP`, `CONT`) to `pid`.
fn signal(pid: u32, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -{signal} {pid}");
}

/// Continues a stopped process on drop, so that a failed assertion does not
/// leave amd-gpud stopped for the world's teardown.
struct Stopped(u32);

impl Drop for Stopped {
    fn drop(&mut self) {
        signal(self.0, "CONT");
    }
}

/// Polls `f` every 200 ms until it holds; false after `limit`.
async fn eventually(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while !f() {
        if start.elapsed() > limit {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    true
}

/// The PID of amd-gpud, as the bus knows the owner of its name.
async fn gpud_pid(w: &World) -> u32 {
    let conn = zbus::connection::Builder::address(w.bus.address.as_str())
        .unwrap()
        .build()
        .await
        .unwrap();
    let dbus = zbus::fdo::DBusProxy::new(&conn).await.unwrap();
    let name = zbus::names::BusName::try_from(ipc::BUS_NAME).unwrap();
    dbus.get_connection_unix_process_id(name).await.unwrap()
}

/// Prints the plugin's peak RSS against `idle_kib` and asserts it lived
/// through `attack` inside its cgroup.
fn memory_report(w: &World, cgroup: &MemCgroup, attack: &str, idle_kib: u64) {
    let pid = w.plugin.0.id();
    let peak = status_kib(pid, "VmHWM:");
    let pressure = cgroup.pressure();
    eprintln!(
        "{attack}: plugin VmHWM {:.1} MiB (at rest before it: {:.1} MiB; limit {} MiB); \
         cgroup failcnt and OOM kill: {pressure:?}",
        peak as f64 / 1024.0,
        idle_kib as f64 / 1024.0,
        LIMIT >> 20,
    );
    assert!(peak * 1024 < LIMIT, "over the chart's limit");
    assert!(
        !pressure.is_some_and(|(_, killed)| killed),
        "OOM-killed in its cgroup"
    );
    assert_eq!(w.http("/healthz").0, 200, "the plugin still answers");
}

#[test]
fn a_stopped_amd_gpud_makes_the_plugin_unready_and_it_recovers() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(Duration::from_secs(180), stopped_gpud());
}

async fn stopped_gpud() {
    let plugin_args = ["--health-pulse".to_owned(), "1".to_owned()];
    let w = world_with(&Setup {
        fixture: "mi300x-8-spx",
        devices: 80,
        gpud_args: &[],
        plugin_args: &plugin_args,
        prepare: &|_| {},
    })
    .await;
    let cgroup = MemCgroup::enter(w.plugin.0.id(), "hung-gpud");
    assert!(
        eventually(Duration::from_secs(20), || w.http("/readyz").0 == 200).await,
        "never ready: {:?}",
        w.http("/readyz")
    );
    let idle = status_kib(w.plugin.0.id(), "VmHWM:");
    let before = w.kubelet.devices();
    let pid = gpud_pid(&w).await;

    signal(pid, "STOP");
    let stopped_at = Instant::now();
    let stopped = Stopped(pid);
    // Without a timeout on its reads the plugin waits for amd-gpud forever,
    // and /readyz stays 200 (the review saw it after 30 s).
    let unready = eventually(Duration::from_secs(30), || w.http("/readyz").0 == 503).await;
    let (status, body) = w.http("/readyz");
    eprintln!(
        "amd-gpud stopped: /readyz 503 after {:?} (pulse 1 s)",
        stopped_at.elapsed()
    );
    assert!(
        unready,
        "still ready with amd-gpud stopped: {status} {body}"
    );
    assert!(body.contains("amd-gpud"), "{body}");
    // It keeps serving from the last inventory: kubelet's devices unchanged.
    assert_eq!(w.kubelet.devices(), before);
    assert_eq!(w.registered().len(), 8);
    memory_report(&w, &cgroup, "amd-gpud stopped", idle);

    drop(stopped);
    let continued = Instant::now();
    let ready = eventually(Duration::from_secs(30), || w.http("/readyz").0 == 200).await;
    eprintln!(
        "amd-gpud continued: /readyz 200 after {:?}",
        continued.elapsed()
    );
    assert!(ready, "not ready again: {:?}", w.http("/readyz"));
    assert_eq!(w.kubelet.devices(), before);
}

#[test]
fn a_blackholed_api_server_bounds_allocate_and_frees_the_next_one() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(Duration::from_secs(240), blackholed_api());
}

/// How long after its call an Allocate must have answered: the plugin's
/// deadline (20 s) and as much again for a loaded machine. Before the fix
/// one Allocate took the pod patch's timeout, the failure patch's, and the
/// release's five attempts (about two minutes), and the next waited for all
/// of it.
const ANSWERED_WITHIN: Duration = Duration::from_secs(40);

async fn blackholed_api() {
    use common::world::{lock, schedule, world};
    let w = world().await;
    let cgroup = MemCgroup::enter(w.plugin.0.id(), "hung-api");
    let idle = status_kib(w.plugin.0.id(), "VmHWM:");
    let g0 = &w.gpus[0];
    schedule(&w.api, "stuck", &[(g0, 1024, 38)], 200);
    tokio::time::sleep(Duration::from_millis(300)).await; // the watch delivers it
    w.api.set_blackhole(true);

    // Kubelet's Allocate for the pod, and a second one a second later (as
    // kubelet would after the first gave up), both while nothing answers.
    let ids = vec![format!("{}#0", g0.id)];
    let call = |delay: u64| {
        let ids = ids.clone();
        let kubelet = &w.kubelet;
        async move {
            tokio::time::sleep(Duration::from_secs(delay)).await;
            let start = Instant::now();
            let answer = tokio::time::timeout(ANSWERED_WITHIN, kubelet.allocate(ids)).await;
            (answer, start.elapsed())
        }
    };
    let ((first, t1), (second, t2)) = tokio::join!(call(0), call(1));
    eprintln!("blackholed API server: Allocates answered after {t1:?} and {t2:?}");
    for answer in [first, second] {
        let err = answer
            .expect("an Allocate did not answer while the API server is a blackhole")
            .unwrap_err();
        eprintln!("  {}", err.message());
        assert!(err.message().contains("default/stuck"), "{err:?}");
    }
    memory_report(&w, &cgroup, "API server blackholed", idle);

    // Once the API server answers again, the plugin's background writes end
    // (the lock is released) and the next pod is allocated.
    w.api.set_blackhole(false);
    assert!(
        eventually(Duration::from_secs(90), || lock(&w.api).is_none()).await,
        "the node lock was never released: {:?}",
        lock(&w.api)
    );
    let g1 = &w.gpus[1];
    schedule(&w.api, "after", &[(g1, 1024, 38)], 201);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let answer = w.kubelet.allocate(vec![format!("{}#0", g1.id)]).await;
    assert!(answer.is_ok(), "{answer:?}");
}

#[test]
fn no_partition_switch_while_the_api_server_is_down_at_start() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(Duration::from_secs(240), switch_blind());
}

/// How long the switch is watched with the API server down: past the 30 s
/// the plugin used to wait for its pods cache before switching regardless.
const BLIND: Duration = Duration::from_secs(40);

async fn switch_blind() {
    use common::world::{NODE, world};
    use tests::{
        apiserver::Kind,
        fixture::{self, BuildOptions, PartitionMode, driver::FakeDriver},
        kubelet::pod_resources::FakePodResources,
    };
    let mut w = world().await;
    let opts = BuildOptions {
        drm: true,
        amdsmi_abi: None,
    };
    let driver = FakeDriver::start(w.root(), fixture::named("mi300x-8-spx").unwrap(), opts);
    // GPU 0 is held by a running pod (its HAMi annotation), GPU 1 by a
    // container kubelet's pod-resources API names.
    let (g0, g1) = (&w.gpus[0], &w.gpus[1]);
    let allocated = format!("{},{},1024,38:;", g0.id, g0.device_type);
    w.api.put_pod(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "holder", "namespace": "default",
                     "annotations": {"hami.io/amd-devices-allocated": allocated}},
        "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "rocm"}]},
        "status": {"phase": "Running"}
    }));
    let pod_resources = FakePodResources::start().unwrap();
    let held = vec![format!("{}#0", g1.id)];
    pod_resources.assign("default", "other", "c", "amd.com/gpu", &held);

    // The plugin starts with the API server down, asked to switch to CPX.
    w.api.set_unreachable(true);
    let socket = pod_resources.socket().display().to_string();
    let args = [
        "--compute-partition",
        "CPX",
        "--pod-resources-socket",
        &socket,
    ];
    w.extra.extend(args.iter().map(ToString::to_string));
    w.restart_plugin().await;
    let cgroup = MemCgroup::enter(w.plugin.0.id(), "blind-switch");
    let idle = status_kib(w.plugin.0.id(), "VmHWM:");
    let modes = || -> Vec<PartitionMode> {
        driver
            .spec()
            .gpus
            .iter()
            .map(|g| g.compute_mode())
            .collect()
    };
    let spx = modes()[0];
    let switched = eventually(BLIND, || modes().iter().any(|m| *m != spx)).await;
    assert!(
        !switched,
        "switched without a view of allocations: {:?}",
        modes()
    );
    memory_report(&w, &cgroup, "API server down at start", idle);

    // Back: the idle GPUs are switched, the held ones are not.
    w.api.set_unreachable(false);
    let done = eventually(Duration::from_secs(90), || {
        modes()[2..].iter().all(|m| *m != spx)
    })
    .await;
    assert!(done, "idle GPUs not switched: {:?}", modes());
    assert_eq!(&modes()[..2], &[spx, spx], "a held GPU was switched");
    let resumed = eventually(Duration::from_secs(20), || {
        w.api.list(Kind::EventV1).iter().any(|e| {
            e["reason"] == "PartitionSwitchResumed"
                && e["note"]
                    .as_str()
                    .is_some_and(|n| n.contains("not listed them"))
        })
    })
    .await;
    assert!(resumed, "no Event saying why: {:?}", w.api.events());
}
