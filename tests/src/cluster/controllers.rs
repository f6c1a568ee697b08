//! kube-controller-manager with two controllers: the DaemonSet controller,
//! which makes a DaemonSet's pod for each node, replaces them on a template
//! change as the update strategy says and writes the DaemonSet's status
//! (scheduled, ready, available, updated) that `helm --wait` and `kubectl
//! rollout status` read; and the node lifecycle controller, which lifts the
//! `node.kubernetes.io/not-ready:NoSchedule` taint the API server puts on a
//! new Node once its kubelet reports Ready (a DaemonSet's pods do not
//! tolerate it, so the scheduler would place none). Every other controller
//! stays off: the tests publish what they need of the others themselves
//! (the namespaces' defaults, [`RealCluster::start_for_nodes`]).

use std::io;

use super::{ADMIN_TOKEN, RealCluster};

/// What kube-controller-manager logs once the DaemonSet controller runs.
const DAEMONSET_STARTED: &str = "Starting daemon sets controller";

impl RealCluster {
    /// Starts kube-controller-manager as the administrator, running only the
    /// DaemonSet and node lifecycle controllers, and returns once the
    /// DaemonSet controller has started.
    /// It is stopped first when the cluster is dropped.
    ///
    /// # Errors
    /// When it cannot start or its controller does not start in time (the
    /// message ends with its log).
    pub fn start_controllers(&mut self) -> io::Result<()> {
        let kubeconfig = self.kubeconfig("controller-manager", ADMIN_TOKEN)?;
        let args = [
            format!("--kubeconfig={}", kubeconfig.display()),
            "--controllers=daemonset-controller,node-lifecycle-controller".to_owned(),
            // One instance: no lease to take first.
            "--leader-elect=false".to_owned(),
            // No serving endpoint: it would write a self-signed certificate
            // outside the scratch directory.
            "--secure-port=0".to_owned(),
            "--use-service-account-credentials=false".to_owned(),
            "-v=2".to_owned(),
        ];
        let name = "kube-controller-manager";
        let process = self.spawn(name, &args)?;
        self.processes.insert(0, (name.into(), process));
        self.wait_for_log(name, DAEMONSET_STARTED)
    }
}
