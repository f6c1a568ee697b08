//! `node-sim --cluster real`: the same nodes and pods on a real control
//! plane (etcd, kube-apiserver, kube-scheduler, built from the modules
//! `tests/cluster/go.mod` pins) with a real kubelet per node
//! ([`node::RealNode`]). HAMi's scheduler is emulated, as in the fake
//! cluster (its module cannot be had here): its Filter and Bind write to
//! the real API server, and from there the real kubelet admits and starts
//! every pod ([`admit`]). Needs root: kubelet runs as root.

pub mod admit;
mod follow;
pub mod hami;
pub mod node;
pub mod runtime;

use kube::Client;

use self::node::RealNode;
use super::{
    Host, SimError, by_mode,
    options::Options,
    pods,
    report::{NodeReport, PodReport, Report},
};
use crate::{
    cluster::{
        ADMIN_TOKEN, RealCluster,
        hami::{Extender, HamiEndpoints},
        setup,
    },
    hami_emulator::{
        extender::{self, ExtenderServer},
        request::GpuPolicy,
    },
};

/// The real cluster and what every node shares. Fields drop in order: the
/// control plane before the scratch directory.
pub struct RealSession {
    pub cluster: RealCluster,
    /// Where a real HAMi scheduler serves when it places the pods
    /// (`--hami-scheduler`); else the emulator places them.
    pub hami: Option<HamiEndpoints>,
    /// The emulator serving HAMi's extender API to the `hami-scheduler`
    /// kube-scheduler, for pods created with kubectl (without
    /// `--hami-scheduler`).
    pub extender: Option<ExtenderServer>,
    /// The administrator's client.
    pub client: Client,
    pub host: Host,
}

/// A finished run on the real cluster whose processes are still up;
/// dropping it stops them (the nodes before the control plane).
pub struct RealSimulation {
    pub report: Report,
    pub nodes: Vec<RealNode>,
    pub session: RealSession,
}

impl RealSimulation {
    pub(crate) fn how_to_look(&self) -> String {
        let kubeconfig = self.session.cluster.dir.path().join("kubeconfig-admin");
        let mut text = format!(
            "\nEverything keeps running; Ctrl-C stops it. The API server is {} \
             (administrator's kubeconfig):\n  export KUBECONFIG={}\n  kubectl get nodes\n",
            self.session.cluster.url(),
            kubeconfig.display()
        );
        for node in &self.nodes {
            text.push_str(&format!("  kubectl get node {} -o yaml\n", node.name));
        }
        text.push_str("  kubectl get pods -A -o wide\n");
        text.push_str(
            "Pods created now with `schedulerName: hami-scheduler` are placed by HAMi's \
             scheduler and admitted by the node's kubelet; node-sim reports each step.\n",
        );
        for node in &self.nodes {
            let [plugin, gpud, kubelet] = node.logs();
            text.push_str(&format!(
                "{}: bus {}, logs {}, {} and {}\n",
                node.name,
                node.host.bus.address,
                plugin.display(),
                gpud.display(),
                kubelet.display()
            ));
        }
        text
    }
}

/// As [`super::run`], on the real cluster.
///
/// # Errors
/// As [`super::run`]; not being root; the control plane not starting
/// (the first run builds it: minutes).
pub async fn run(options: &Options, exe: std::path::PathBuf) -> Result<RealSimulation, SimError> {
    let pods = pods::load(&options.pods)?;
    let mut host = Host::new(exe, options.quiet)?;
    host.cdi = options.cdi;
    if host.uid != 0 {
        return Err(SimError::NeedsRoot { uid: host.uid });
    }
    let groups = by_mode(&pods, options.mode);
    let names: Vec<String> = groups
        .iter()
        .map(|(mode, _)| {
            let node = options.node.as_deref().unwrap_or(mode.default_node());
            format!("{}-{}", super::options::fixture_name(node), mode.as_str())
        })
        .collect();
    let policy = GpuPolicy::from(options.gpu_policy);
    let hami = (options.hami_scheduler.as_deref(), policy);
    let session = start_cluster(host, &names, hami).await?;
    let mut nodes = Vec::new();
    let mut reports: Vec<PodReport> = Vec::new();
    for (mode, group) in groups {
        let name = options.node.as_deref().unwrap_or(mode.default_node());
        let node = RealNode::start(&session, name, mode, &options.amdsmi).await?;
        if options.all_at_once {
            reports.extend(admit::admit_all(&session, &node, &group, policy).await);
        } else {
            for pod in group {
                reports.push(admit::admit(&session, &node, pod, policy).await);
            }
        }
        nodes.push(node);
    }
    super::letter_pods(&mut reports);
    let mut node_reports = Vec::new();
    for node in &nodes {
        node_reports.push(node_report(&session, node, &reports).await);
    }
    let report = super::finish_report(
        format!("{:?}", session.host.bus_policy),
        policy,
        node_reports,
        reports,
        &session.host.progress,
    );
    Ok(RealSimulation {
        report,
        nodes,
        session,
    })
}

/// The control plane with a kubelet token per node, the chart applied, and
/// HAMi's scheduler from `hami` when given.
async fn start_cluster(
    host: Host,
    nodes: &[String],
    (hami, policy): (Option<&std::path::Path>, GpuPolicy),
) -> Result<RealSession, SimError> {
    host.progress.step(
        "cluster",
        "starting etcd, kube-apiserver, kube-scheduler (the first run builds them: minutes)",
    );
    let names: Vec<String> = nodes.to_vec();
    let cluster = tokio::task::spawn_blocking(move || {
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        RealCluster::start_for_nodes(&refs)
    })
    .await
    .map_err(|e| SimError::start("the control plane")(std::io::Error::other(e)))?
    .map_err(SimError::start("the control plane"))?;
    setup::apply_chart(&cluster).map_err(SimError::start("applying the chart"))?;
    let mut cluster = cluster;
    let config = cluster
        .client_config("admin", ADMIN_TOKEN)
        .await
        .map_err(SimError::start("the administrator's client"))?;
    let client = Client::try_from(config)
        .map_err(|e| SimError::start("the administrator's client")(std::io::Error::other(e)))?;
    let (hami, extender) = start_hami(&mut cluster, &client, &host, (hami, policy)).await?;
    host.progress
        .step("cluster", &format!("API server at {}", cluster.url()));
    Ok(RealSession {
        cluster,
        hami,
        extender,
        client,
        host,
    })
}

/// HAMi's scheduler as its chart deploys it: a kube-scheduler named
/// `hami-scheduler` whose extender is the HAMi scheduler binary `hami`, or
/// else the emulator (serving kubectl's pods; node-sim places its own).
async fn start_hami(
    cluster: &mut RealCluster,
    client: &Client,
    host: &Host,
    (hami, policy): (Option<&std::path::Path>, GpuPolicy),
) -> Result<(Option<HamiEndpoints>, Option<ExtenderServer>), SimError> {
    Ok(match hami {
        Some(path) => {
            let what = format!(
                "starting HAMi's scheduler {} behind kube-scheduler hami-scheduler",
                path.display()
            );
            host.progress.step("cluster", &what);
            let extender = Extender::Binary(path.to_owned());
            let endpoints = cluster
                .start_hami(&extender)
                .map_err(SimError::start("HAMi's scheduler"))?;
            (Some(endpoints), None)
        }
        None => {
            let server = extender::serve(client.clone(), policy)
                .await
                .map_err(SimError::start("the emulator's extender"))?;
            let what = format!(
                "kube-scheduler hami-scheduler calls the emulator as HAMi's extender at {}",
                server.url
            );
            host.progress.step("cluster", &what);
            cluster
                .start_hami(&Extender::Url(server.url.clone()))
                .map_err(SimError::start("kube-scheduler hami-scheduler"))?;
            (None, Some(server))
        }
    })
}

async fn node_report(session: &RealSession, node: &RealNode, pods: &[PodReport]) -> NodeReport {
    let register = node.register(session).await.unwrap_or_default();
    let devices = super::admit::devices(Some(&register));
    NodeReport {
        name: node.name.clone(),
        fixture: node.host.fixture.clone(),
        mode: node.mode,
        amdsmi: node.host.amdsmi.clone(),
        kubelet_devices: node.capacity,
        monitor: None,
        taints: node.taints(session).await,
        occupancy: super::picture::occupancy(&devices, pods, &node.name),
        register,
    }
}
