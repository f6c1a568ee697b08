//! The node simulator behind `node-sim`: the whole node side on a fake node,
//! with HAMi's scheduler emulated, driven by example pod manifests.
//!
//! For each operating mode the pods need ([`options::Mode`]) one node is
//! started ([`node::SimNode`]): a builder fixture with the fake AMD SMI
//! library, a private D-Bus, amd-gpud, the plugin and a fake kubelet, all
//! registered on one fake API server. Each pod is then placed by HAMi's
//! Filter ([`crate::hami_emulator::filter`]) and bound, and admitted as
//! kubelet would ([`admit`]); the [`report::Report`] says what HAMi saw and
//! what every container got, with a picture of CU occupancy ([`picture`]).
//! Everything started stops when the [`Simulation`] is dropped.

pub mod admit;
pub mod all_at_once;
pub mod error;
pub mod monitor;
pub mod node;
pub mod options;
pub mod overlap;
pub mod picture;
pub mod pods;
pub mod real;
pub mod render;
pub mod report;
pub mod vram;

use std::{
    path::{Path, PathBuf},
    time::Instant,
};

use tempfile::TempDir;

pub use self::{error::SimError, options::Options};
use self::{
    node::SimNode,
    options::{Mode, ModeArg},
    pods::ExamplePod,
    report::{NodeReport, PodReport, Report},
};
use crate::{
    apiserver::{FakeApiServer, Kind},
    bus::{self, Policy},
    hami_emulator::request::GpuPolicy,
};

/// Progress lines on stderr, with the time since start.
#[derive(Debug)]
pub struct Progress {
    start: Instant,
    quiet: bool,
}

impl Progress {
    pub fn new(quiet: bool) -> Self {
        Self {
            start: Instant::now(),
            quiet,
        }
    }

    /// One line about `node`.
    pub fn step(&self, node: &str, message: &str) {
        if !self.quiet {
            let secs = self.start.elapsed().as_secs_f64();
            eprintln!("[{secs:>5.1} s] {node:<24} {message}");
        }
    }

    fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

/// What every node shares, whatever the cluster: progress, the scratch
/// directory, and how to start the processes.
pub struct Host {
    pub progress: Progress,
    /// The binary that runs amd-gpud (`EXE gpud ...`) and the plugin (`EXE plugin ...`).
    pub exe: PathBuf,
    /// `Shipped` as root; `Unprivileged` otherwise, so that amd-gpud may own its name.
    pub bus_policy: Policy,
    /// The UID everything runs as (amd-gpud's `--plugin-uid`).
    pub uid: u32,
    /// The plugin's `--cdi`.
    pub cdi: bool,
    /// Fake host roots, logs, kubeconfigs; removed last.
    pub dir: TempDir,
}

impl Host {
    /// A fresh scratch directory and our UID.
    ///
    /// # Errors
    /// When the directory cannot be made or the UID read.
    pub fn new(exe: PathBuf, quiet: bool) -> Result<Self, SimError> {
        let dir = scratch().map_err(SimError::start("a scratch directory"))?;
        let uid = bus::effective_uid().map_err(SimError::start("reading our UID"))?;
        let bus_policy = if uid == 0 {
            Policy::Shipped
        } else {
            Policy::Unprivileged
        };
        Ok(Self {
            progress: Progress::new(quiet),
            exe,
            bus_policy,
            uid,
            cdi: false,
            dir,
        })
    }
}

/// The fake cluster's session: its API server and what every node shares.
pub struct Session {
    pub api: FakeApiServer,
    /// The kubeconfig of [`Self::api`].
    pub kubeconfig: PathBuf,
    /// Dropped last (it holds the scratch directory).
    pub host: Host,
}

impl Session {
    /// Starts the fake API server in a fresh scratch directory.
    ///
    /// # Errors
    /// When the directory or the server cannot be made.
    pub fn start(exe: PathBuf, quiet: bool) -> Result<Self, SimError> {
        let host = Host::new(exe, quiet)?;
        let api = FakeApiServer::start().map_err(SimError::start("the fake API server"))?;
        let kubeconfig = api.kubeconfig(host.dir.path());
        host.progress
            .step("api-server", &format!("fake API server at {}", api.url()));
        Ok(Self {
            api,
            kubeconfig,
            host,
        })
    }
}

/// A finished run of either cluster; dropping it stops everything.
pub enum Run {
    Fake(Simulation),
    Real(real::RealSimulation),
}

impl Run {
    /// Runs the cluster `--cluster` names.
    ///
    /// # Errors
    /// As [`run`] and [`real::run`].
    pub async fn start(options: &Options, exe: PathBuf) -> Result<Self, SimError> {
        Ok(match options.cluster {
            options::ClusterArg::Fake => Self::Fake(run(options, exe).await?),
            options::ClusterArg::Real => Self::Real(real::run(options, exe).await?),
        })
    }

    pub fn report(&self) -> &Report {
        match self {
            Self::Fake(sim) => &sim.report,
            Self::Real(sim) => &sim.report,
        }
    }

    /// Reports pods created after the run (`--keep-running` on the real
    /// cluster, where kube-scheduler and HAMi's extender place them); the
    /// fake cluster has no scheduler of its own, so this never ends.
    pub async fn follow_new_pods(&self) {
        match self {
            Self::Fake(_) => std::future::pending().await,
            Self::Real(sim) => sim.follow_new_pods().await,
        }
    }

    /// How to look at what keeps running (`--keep-running`).
    pub fn how_to_look(&self) -> String {
        match self {
            Self::Fake(sim) => sim.how_to_look(),
            Self::Real(sim) => sim.how_to_look(),
        }
    }
}

impl Simulation {
    fn how_to_look(&self) -> String {
        let mut text = format!(
            "\nEverything keeps running; Ctrl-C stops it. The fake API server is {}:\n  \
             export KUBECONFIG={}\n  kubectl get nodes\n",
            self.session.api.url(),
            self.session.kubeconfig.display()
        );
        for node in &self.nodes {
            text.push_str(&format!("  kubectl get node {} -o yaml\n", node.name));
        }
        text.push_str("  kubectl get pods -o yaml\n");
        for (node, monitor) in self
            .nodes
            .iter()
            .filter_map(|n| Some((n, n.monitor.as_ref()?)))
        {
            text.push_str(&format!("  curl -s {}  # {}\n", monitor.url(), node.name));
        }
        for node in &self.nodes {
            let [plugin, gpud] = node.logs();
            text.push_str(&format!(
                "{}: bus {}, logs {} and {}\n",
                node.name,
                node.bus_address(),
                plugin.display(),
                gpud.display()
            ));
        }
        text
    }
}

/// A finished run whose processes are still up; dropping it stops them.
pub struct Simulation {
    pub report: Report,
    pub nodes: Vec<SimNode>,
    pub session: Session,
}

/// Loads the pods, starts a node per mode they need, admits them in order
/// and builds the report. `exe` re-enters a binary that dispatches `gpud`,
/// `plugin` and `amdsmi-probe` (node-sim itself).
///
/// # Errors
/// Bad pod files or a node that cannot start; pods that do not fit or fail
/// Allocate are in the report, not errors.
pub async fn run(options: &Options, exe: PathBuf) -> Result<Simulation, SimError> {
    let pods = pods::load(&options.pods)?;
    let mut session = Session::start(exe, options.quiet)?;
    session.host.cdi = options.cdi;
    let policy = GpuPolicy::from(options.gpu_policy);
    let mut nodes = Vec::new();
    let mut reports: Vec<PodReport> = Vec::new();
    for (mode, group) in by_mode(&pods, options.mode) {
        let name = options.node.as_deref().unwrap_or(mode.default_node());
        let mut node = SimNode::start(&session, name, mode, &options.amdsmi).await?;
        if options.all_at_once {
            let admitted = all_at_once::admit_all(&session, &mut node, &group, policy).await;
            reports.extend(admitted);
        } else {
            for pod in group {
                reports.push(admit::admit(&session, &mut node, pod, policy).await);
            }
        }
        nodes.push(node);
    }
    letter_pods(&mut reports);
    let node_reports = nodes
        .iter()
        .map(|n| node_report(&session, n, &reports))
        .collect();
    let report = finish_report(
        format!("{:?}", session.host.bus_policy),
        policy,
        node_reports,
        reports,
        &session.host.progress,
    );
    Ok(Simulation {
        report,
        nodes,
        session,
    })
}

/// Gives each admitted pod its letter in the occupancy picture.
pub(crate) fn letter_pods(pods: &mut [PodReport]) {
    let letters = ('A'..='Z').chain('a'..='z');
    for (report, letter) in pods.iter_mut().filter(|r| r.admitted()).zip(letters) {
        report.letter = Some(letter);
    }
}

/// The report of a run: the CU overlaps found, the time taken.
pub(crate) fn finish_report(
    bus_policy: String,
    policy: GpuPolicy,
    nodes: Vec<NodeReport>,
    pods: Vec<PodReport>,
    progress: &Progress,
) -> Report {
    let overlaps = overlap::of_pods(&pods);
    Report {
        bus_policy,
        gpu_policy: format!("{policy:?}").to_lowercase(),
        nodes,
        pods,
        overlaps,
        elapsed_ms: progress.elapsed_ms(),
    }
}

/// The pods per mode, cu first: every pod in `--mode` when given, else in
/// the mode its annotation asks for (cu when none).
pub(crate) fn by_mode(pods: &[ExamplePod], mode: ModeArg) -> Vec<(Mode, Vec<&ExamplePod>)> {
    let of = |p: &ExamplePod| match mode {
        ModeArg::Cu => Mode::Cu,
        ModeArg::Partition => Mode::Partition,
        ModeArg::Auto => p.mode.unwrap_or(Mode::Cu),
    };
    [Mode::Cu, Mode::Partition]
        .into_iter()
        .map(|m| (m, pods.iter().filter(|p| of(p) == m).collect::<Vec<_>>()))
        .filter(|(_, group)| !group.is_empty())
        .collect()
}

fn node_report(session: &Session, node: &SimNode, pods: &[PodReport]) -> NodeReport {
    let register = node::register(session, &node.name).unwrap_or_default();
    let devices = admit::devices(Some(&register));
    NodeReport {
        name: node.name.clone(),
        fixture: node.fixture.clone(),
        mode: node.mode,
        amdsmi: node.amdsmi.clone(),
        kubelet_devices: node.kubelet.devices().len(),
        monitor: node.monitor.as_ref().map(monitor::Monitor::url),
        taints: session
            .api
            .get(Kind::Node, "", &node.name)
            .and_then(|n| n["spec"]["taints"].as_array().cloned())
            .unwrap_or_default()
            .iter()
            .map(ToString::to_string)
            .collect(),
        occupancy: picture::occupancy(&devices, pods, &node.name),
        register,
    }
}

/// A scratch directory on tmpfs when there is one (fake CPX roots are
/// thousands of files).
fn scratch() -> std::io::Result<TempDir> {
    let shm = Path::new("/dev/shm");
    let mut builder = tempfile::Builder::new();
    builder.prefix("node-sim-");
    match shm.is_dir().then(|| builder.tempdir_in(shm)) {
        Some(Ok(dir)) => Ok(dir),
        _ => builder.tempdir(),
    }
}

/// `path` relative to the current directory when it is below it.
pub fn shown_path(path: &Path) -> String {
    let path = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    std::env::current_dir()
        .ok()
        .and_then(|cwd| path.strip_prefix(cwd).ok().map(Path::to_path_buf))
        .unwrap_or(path)
        .display()
        .to_string()
}
