//! The first promise under a lagging watch (issue 16): no CU is ever granted
//! twice, and no container start fails, however far the plugin's watch
//! lags behind the API server.
//!
//! Three simulated nodes share one fake API server whose watch events go out
//! late (its lag knob, changed every round): an MI300X in cu mode (gfx9,
//! single CUs), an RX 9070 XT with an iGPU (gfx12, WGP pairs) and an MI300X
//! in CPX partition mode. Each node admits random pods back to back, the
//! three nodes at the same time: HAMi's Filter and Bind (emulated) place
//! each pod, then kubelet's calls follow (GetPreferredAllocation, Allocate
//! per container, the pod cgroup, PreStartContainer), and random live pods
//! finish (deleted, or Succeeded) to make room. Between rounds every plugin
//! is restarted. After every Allocate the container's hold (its CU mask, or
//! the whole device) is checked against every live container's; every
//! Allocate and every PreStartContainer must succeed. One admission in ten
//! is a race HAMi v2.10.0 makes (`grants_under_lag/race.rs`): a pod bound
//! without the node lock while another pod holds it, or under a lock whose
//! owner is gone.
//!
//! `GRANTS_DECISIONS` sets how many Allocates to run (default 10,000, about
//! 3,300 per node); `GRANTS_SEED` replays a run (the seed is printed; by
//! default it comes from the clock, so each run explores new schedules).

// An integration-test file is itself the test module, and a failed unwrap is a
// failed test here.
#![allow(clippy::tests_outside_test_module, clippy::unwrap_used)]

mod common;
#[path = "grants_under_lag/pods.rs"]
mod pods;
#[path = "grants_under_lag/race.rs"]
mod race;

use std::{
    collections::{HashMap, HashSet},
    path::PathBuf,
    time::{Duration, Instant},
};

use pods::Shape;
use race::Scheduled;
use serde_json::json;
use tests::{
    apiserver::{Kind, WatchDelay},
    fixture::cgroup::{CgroupDriver, QosClass, add_pod},
    grants::{Held, overlap_with, parse_id_list},
    hami_emulator::{
        Grant, Placement,
        request::{ContainerRequest, GpuPolicy},
    },
    kubelet::ContainerAllocateResponse,
    node_sim::{Session, node::SimNode, options::Mode},
    rng::Rng,
};

const LOCK: &str = "hami.io/mutex.lock";
const ROUNDS: usize = 6;
/// The lag knob per round: (fixed, random) milliseconds.
const DELAYS_MS: [(u64, u64); ROUNDS] = [(0, 0), (0, 40), (20, 60), (0, 250), (150, 200), (5, 15)];
const LIMIT: Duration = Duration::from_secs(1200);

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[test]
fn no_cu_is_granted_twice_and_every_start_succeeds_under_watch_lag() {
    if !common::have_dbus() {
        return;
    }
    let decisions = env_u64("GRANTS_DECISIONS").unwrap_or(10_000);
    let seed = env_u64("GRANTS_SEED").unwrap_or_else(|| {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        now.map_or(1, |d| d.as_secs())
    });
    eprintln!("grants under lag: {decisions} Allocates, GRANTS_SEED={seed}");
    common::run_async(LIMIT, run(decisions, seed));
}

async fn run(decisions: u64, seed: u64) {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_node-sim"));
    let session = Session::start(exe, true).unwrap();
    let nodes = [
        ("mi300x-8-spx", Mode::Cu),
        ("rx9070xt-igpu", Mode::Cu),
        ("mi300x-8-cpx", Mode::Partition),
    ];
    let mut drivers = Vec::new();
    for (i, (fixture, mode)) in nodes.into_iter().enumerate() {
        let node = SimNode::start(&session, fixture, mode, "none")
            .await
            .unwrap();
        drivers.push(Driver::new(&session, node, seed.wrapping_add(i as u64)));
    }
    let per_round = decisions.div_ceil((ROUNDS * drivers.len()) as u64);
    let start = Instant::now();
    for (round, (fixed, random)) in DELAYS_MS.into_iter().enumerate() {
        let delay = WatchDelay {
            fixed: Duration::from_millis(fixed),
            random: Duration::from_millis(random),
        };
        session
            .api
            .set_watch_delay(delay, seed.wrapping_add(round as u64));
        let rounds = drivers.iter_mut().map(|d| d.round(round, per_round));
        futures_util::future::join_all(rounds).await;
        for d in &mut drivers {
            d.node.restart_plugin(&session).await.unwrap();
            d.stats.restarts += 1;
        }
    }
    let mut total = Stats::default();
    for d in &drivers {
        eprintln!("{}: {:?}", d.node.name, d.stats);
        total.add(&d.stats);
    }
    eprintln!("total {total:?} in {:.1} s", start.elapsed().as_secs_f64());
    assert!(
        total.allocates >= decisions,
        "ran {} Allocates",
        total.allocates
    );
    assert!(
        total.pre_starts >= total.allocates,
        "every container was started"
    );
    // The plugin reads a pod from the API server only when its cache lags.
    let requests = session.api.requests();
    let reads = requests.of("get", "pods") + requests.of("list", "pods");
    eprintln!("pod reads the lag made the plugins do: {reads}");
    assert!(reads > 0, "the lag knob never made the cache lag");
}

#[derive(Debug, Default, Clone)]
struct Stats {
    allocates: u64,
    pre_starts: u64,
    pods: u64,
    unschedulable: u64,
    deleted: u64,
    succeeded: u64,
    restarts: u64,
    races: u64,
    stale_locks: u64,
}

impl Stats {
    fn add(&mut self, o: &Stats) {
        self.allocates += o.allocates;
        self.pre_starts += o.pre_starts;
        self.pods += o.pods;
        self.unschedulable += o.unschedulable;
        self.deleted += o.deleted;
        self.succeeded += o.succeeded;
        self.restarts += o.restarts;
        self.races += o.races;
        self.stale_locks += o.stale_locks;
    }
}

/// A pod that holds devices: its kubelet ids and its containers' holds.
struct LivePod {
    name: String,
    ids: Vec<String>,
    held: Vec<Held>,
    /// Ids of its init containers that later containers take first, as
    /// kubelet's device manager reuses them (`devicesToReuse`).
    reusable: Vec<String>,
}

/// One node's schedule.
struct Driver<'a> {
    session: &'a Session,
    node: SimNode,
    rng: Rng,
    seed: u64,
    live: Vec<LivePod>,
    /// Succeeded pods still on the API server, deleted later.
    terminal: Vec<String>,
    /// HAMi device id -> the render node Allocate gave for it.
    render_of: HashMap<String, String>,
    /// Devices too small to slice (the iGPU's 2 CUs are one WGP), kept
    /// from requests for a share.
    unsliceable: Vec<String>,
    serial: u64,
    stats: Stats,
}

impl<'a> Driver<'a> {
    fn new(session: &'a Session, node: SimNode, seed: u64) -> Self {
        let register = tests::node_sim::node::register(session, &node.name).unwrap();
        let unsliceable = register
            .as_array()
            .unwrap()
            .iter()
            .filter(|d| d["devcore"].as_u64().unwrap() < 8)
            .map(|d| d["id"].as_str().unwrap().to_owned())
            .collect();
        Self {
            unsliceable,
            session,
            node,
            rng: Rng::new(seed),
            seed,
            live: Vec::new(),
            terminal: Vec::new(),
            render_of: HashMap::new(),
            serial: 0,
            stats: Stats::default(),
        }
    }

    fn context(&self, round: usize) -> String {
        let [plugin_log, _] = self.node.logs();
        let devices = self.node.kubelet.devices();
        let healthy = devices.iter().filter(|d| d.health == "Healthy").count();
        format!(
            "node {} round {round} (seed {}): kubelet lists {} devices, {healthy} healthy, {} in use \
             by {} live pods; plugin log {}:\n{}\n{}",
            self.node.name,
            self.seed,
            devices.len(),
            self.node.used.len(),
            self.live.len(),
            plugin_log.display(),
            tests::node_sim::node::tail(&plugin_log, 30),
            std::fs::read_to_string(&plugin_log)
                .unwrap_or_default()
                .lines()
                .filter(|l| l.contains("ListAndWatch")
                    || l.contains("regist")
                    || l.contains("switch"))
                .collect::<Vec<_>>()
                .join("\n")
        )
    }

    async fn round(&mut self, round: usize, allocates: u64) {
        let target = self.stats.allocates + allocates;
        while self.stats.allocates < target {
            if !self.live.is_empty() && self.rng.chance(35) {
                self.finish_one();
                continue;
            }
            if self.rng.chance(10) {
                self.admit_racing(round).await;
            } else {
                self.admit_one(round).await;
            }
        }
    }

    /// A random live pod ends: deleted, or Succeeded (deleted later).
    fn finish_one(&mut self) {
        let Some(i) = self
            .rng
            .pick(&(0..self.live.len()).collect::<Vec<_>>())
            .copied()
        else {
            return;
        };
        let pod = self.live.swap_remove(i);
        for id in &pod.ids {
            self.node.used.remove(id);
        }
        let api = &self.session.api;
        if self.rng.chance(50) {
            api.remove(Kind::Pod, "default", &pod.name);
            self.stats.deleted += 1;
        } else if let Some(mut stored) = api.get(Kind::Pod, "default", &pod.name) {
            stored["status"] = json!({"phase": "Succeeded"});
            api.put_pod(stored);
            self.terminal.push(pod.name);
            self.stats.succeeded += 1;
        }
        while self.terminal.len() > 8 {
            let name = self.terminal.remove(0);
            api.remove(Kind::Pod, "default", &name);
        }
    }

    async fn admit_one(&mut self, round: usize) {
        let Some((name, placement)) = self.place(None, Scheduled::Bound) else {
            return;
        };
        self.admit_placed(&name, &placement, round).await;
        self.wait_unlocked(&name, round).await;
    }

    /// HAMi's Filter and Bind (up to the lock for [`Scheduled::Locked`]) of
    /// a new random pod, of `shape` when given; `None` when HAMi cannot
    /// place it (a live pod then finishes to make room).
    fn place(&mut self, shape: Option<Shape>, how: Scheduled) -> Option<(String, Placement)> {
        self.serial += 1;
        let name = format!("{}-{}", self.node.name, self.serial);
        let kind = pods::NodeKind {
            partition: self.node.mode == Mode::Partition,
            rdna: self.node.fixture.starts_with("rx"),
            unsliceable: &self.unsliceable,
        };
        let shape = shape.unwrap_or_else(|| Shape::random(&mut self.rng));
        let manifest = pods::pod_of(&mut self.rng, &name, &kind, shape);
        let (api, hami, now) = (&self.session.api, &self.node.hami, unix_now());
        let placed = match how {
            Scheduled::Bound => hami.schedule(api, &manifest, now, GpuPolicy::Spread),
            Scheduled::Locked => {
                hami.schedule_before_binding(api, &manifest, now, GpuPolicy::Spread)
            }
        };
        match placed {
            Ok(placement) => Some((name, placement)),
            Err(_) => {
                self.stats.unschedulable += 1;
                self.finish_one();
                None
            }
        }
    }

    /// Kubelet admits the bound pod `name`: Allocate per container, then
    /// the start; the pod joins the live ones.
    async fn admit_placed(&mut self, name: &str, placement: &Placement, round: usize) {
        self.stats.pods += 1;
        let mut pod = LivePod {
            name: name.to_owned(),
            ids: Vec::new(),
            held: Vec::new(),
            reusable: Vec::new(),
        };
        let mut allocated = Vec::new();
        for (request, grants) in placement.requests.iter().zip(&placement.grants) {
            allocated.push(self.allocate(&mut pod, request, grants, round).await);
        }
        self.start(name, &allocated, round).await;
        self.live.push(pod);
    }

    /// Kubelet's Allocate for one container of `pod`, which must succeed and
    /// give CUs no live container holds; the ids it used.
    async fn allocate(
        &mut self,
        pod: &mut LivePod,
        request: &ContainerRequest,
        grants: &[Grant],
        round: usize,
    ) -> Vec<String> {
        let reused = grants.len().min(pod.reusable.len());
        let mut ids: Vec<String> = pod.reusable.drain(..reused).collect();
        ids.extend(self.choose_ids(grants.len() - reused).await);
        if request.init {
            pod.reusable.extend(ids.iter().cloned());
        }
        let answer = self.node.kubelet.allocate(ids.clone()).await;
        let answer = answer.unwrap_or_else(|status| {
            let (name, container) = (&pod.name, &request.container);
            let why = status.message();
            panic!(
                "Allocate of {name}/{container} failed: {why}\n{}",
                self.context(round)
            )
        });
        self.stats.allocates += 1;
        self.node.used.extend(ids.iter().cloned());
        let holder = (pod.name.as_str(), request.container.as_str(), request.init);
        let held = self.holds(holder, grants, &answer, round);
        for h in &held {
            let others = self.live.iter().flat_map(|p| &p.held).chain(&pod.held);
            let others: Vec<Held> = others.cloned().collect();
            if let Some(overlap) = overlap_with(h, &others) {
                panic!("CU granted twice: {overlap}\n{}", self.context(round));
            }
        }
        pod.held.extend(held);
        pod.ids.extend(ids.iter().cloned());
        ids
    }

    /// Kubelet's device ids for a container of `n` devices: the plugin's
    /// preference when it is usable, else free ids at random (kubelet's
    /// choice need not follow HAMi's; the plugin goes by HAMi's entry).
    async fn choose_ids(&mut self, n: usize) -> Vec<String> {
        let free: Vec<String> = self
            .node
            .kubelet
            .devices()
            .into_iter()
            .filter(|d| d.health == "Healthy" && !self.node.used.contains(&d.id))
            .map(|d| d.id)
            .collect();
        let size = i32::try_from(n).unwrap();
        let preferred = self
            .node
            .kubelet
            .preferred_allocation(free.clone(), Vec::new(), size)
            .await;
        if let Ok(ids) = preferred {
            let distinct: HashSet<&String> = ids.iter().collect();
            if ids.len() == n && distinct.len() == n && ids.iter().all(|id| free.contains(id)) {
                return ids;
            }
        }
        let mut pool = free;
        let mut ids = Vec::new();
        while ids.len() < n && !pool.is_empty() {
            let i = usize::try_from(self.rng.below(pool.len() as u64)).unwrap();
            ids.push(pool.swap_remove(i));
        }
        ids
    }

    /// What the container holds of each granted device, from its answer;
    /// each HAMi id must always come with the same render node.
    fn holds(
        &mut self,
        (pod, container, init): (&str, &str, bool),
        grants: &[Grant],
        answer: &ContainerAllocateResponse,
        round: usize,
    ) -> Vec<Held> {
        let renders: Vec<&str> = answer
            .devices
            .iter()
            .map(|d| d.host_path.as_str())
            .filter(|p| p.contains("renderD"))
            .collect();
        assert_eq!(
            renders.len(),
            grants.len(),
            "{pod}/{container}: {answer:?}\n{}",
            self.context(round)
        );
        let masks = answer
            .envs
            .get("HSA_CU_MASK")
            .map(|m| tests::node_sim::report::parse_cu_mask(m))
            .unwrap_or_default();
        let mut held = Vec::new();
        for (i, (grant, render)) in grants.iter().zip(renders).enumerate() {
            let known = self
                .render_of
                .entry(grant.id.clone())
                .or_insert_with(|| render.to_owned());
            assert_eq!(
                known, render,
                "{pod}/{container}: device {} moved",
                grant.id
            );
            let cus = masks.get(&i).map(|l| parse_id_list(l).unwrap());
            if let Some(ranges) = &cus {
                let count: u32 = ranges.iter().map(|(a, b)| b - a + 1).sum();
                assert!(
                    count > 0 && count <= grant.cus,
                    "{pod}/{container}: {count} CUs for a grant of {}",
                    grant.cus
                );
            }
            held.push(Held {
                pod: pod.to_owned(),
                container: container.to_owned(),
                init,
                device: grant.id.clone(),
                cus,
            });
        }
        held
    }

    /// Kubelet starting the pod: its cgroup, then PreStartContainer per
    /// container (which must succeed), then Running.
    async fn start(&mut self, name: &str, allocated: &[Vec<String>], round: usize) {
        let api = &self.session.api;
        let stored = api.get(Kind::Pod, "default", name).unwrap();
        let uid = stored["metadata"]["uid"].as_str().unwrap();
        add_pod(
            &self.node.root,
            CgroupDriver::Systemd,
            QosClass::BestEffort,
            uid,
        )
        .unwrap();
        for ids in allocated {
            if let Err(status) = self.node.kubelet.pre_start(ids.clone()).await {
                panic!(
                    "PreStartContainer of {name} failed: {}\n{}",
                    status.message(),
                    self.context(round)
                );
            }
            self.stats.pre_starts += 1;
        }
        let mut running = api.get(Kind::Pod, "default", name).unwrap();
        running["status"] = json!({"phase": "Running"});
        api.put_pod(running);
    }

    /// HAMi binds the next pod only once the plugin released the lock of
    /// this one (it takes none for init-only pods).
    async fn wait_unlocked(&self, name: &str, round: usize) {
        let start = Instant::now();
        loop {
            let node = self
                .session
                .api
                .get(Kind::Node, "", &self.node.name)
                .unwrap();
            let lock = node["metadata"]["annotations"][LOCK]
                .as_str()
                .unwrap_or_default();
            if !lock.ends_with(&format!(",default,{name}")) {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "{name} kept the node lock\n{}",
                self.context(round)
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
