//! A real control plane for tests: etcd (embedded in a main of ours),
//! kube-apiserver and kube-scheduler from `k8s.io/kubernetes` at the version
//! `tests/cluster/go.mod` pins, built once by `tests/cluster/build.sh` into
//! a cache outside the clone.
//!
//! [`RealCluster::start`] runs them on free loopback ports in a scratch
//! directory: etcd; kube-apiserver with RBAC and Node authorization, the
//! PodSecurity admission plugin (ValidatingAdmissionPolicy is on by default),
//! its own self-signed serving certificate, a service-account key pair made
//! with `openssl`, static bearer tokens and an audit log of every request;
//! kube-scheduler with a configuration file; on request kube-controller-manager
//! with its DaemonSet and node lifecycle controllers (`controllers.rs`).
//! Every process is killed when the cluster is dropped.

pub mod chart;
mod controllers;
mod files;
pub mod hami;
pub mod kubelet;
pub mod probe;
pub mod setup;

use std::{
    fs::File,
    io,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::OnceLock,
    time::{Duration, Instant},
};

use tempfile::TempDir;

use crate::stack::{Process, free_port};

/// The bearer token of the cluster administrator (group `system:masters`).
pub const ADMIN_TOKEN: &str = "admin-token-for-tests";
/// How long a component may take to get ready.
const READY_TIMEOUT: Duration = Duration::from_secs(90);

/// The directory of the built binaries (built on first use; later calls and
/// runs find them in the cache).
///
/// # Errors
/// When `tests/cluster/build.sh` fails (its output is in the message).
pub fn binaries() -> io::Result<PathBuf> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("cluster/build.sh");
            let out = Command::new("bash")
                .arg(&script)
                .stderr(Stdio::inherit())
                .output()
                .map_err(|e| format!("running {}: {e}", script.display()))?;
            let stdout = String::from_utf8_lossy(&out.stdout);
            match (out.status.success(), stdout.lines().last()) {
                (true, Some(dir)) => Ok(PathBuf::from(dir.trim())),
                _ => Err(format!(
                    "{} failed ({}): {stdout}",
                    script.display(),
                    out.status
                )),
            }
        })
        .clone()
        .map_err(io::Error::other)
}

/// A running control plane; see the module documentation.
pub struct RealCluster {
    /// The API server's secure port on 127.0.0.1.
    pub api_port: u16,
    /// Components in stop order: the scheduler first, etcd last.
    processes: Vec<(String, Process)>,
    bin: PathBuf,
    etcd_url: String,
    /// Logs, certificates, keys, kubeconfigs, etcd's data; removed last.
    pub dir: TempDir,
}

impl RealCluster {
    /// Starts etcd, kube-apiserver and kube-scheduler, and returns once the
    /// API server is ready.
    ///
    /// # Errors
    /// When a binary cannot be built or started, or is not ready in time.
    pub fn start() -> io::Result<Self> {
        Self::start_for_nodes(&[kubelet::KUBELET_NODE])
    }

    /// [`Self::start`] with a kubelet token for each of `nodes`
    /// ([`kubelet::node_token`]).
    ///
    /// # Errors
    /// As [`Self::start`].
    pub fn start_for_nodes(nodes: &[&str]) -> io::Result<Self> {
        let bin = binaries()?;
        let dir = crate::fixture::scratch_dir()?;
        files::write_all(dir.path(), nodes)?;
        let etcd_url = format!("http://127.0.0.1:{}", free_port()?);
        let mut cluster = Self {
            api_port: free_port()?,
            processes: Vec::new(),
            bin,
            etcd_url,
            dir,
        };
        cluster.start_etcd()?;
        cluster.start_apiserver()?;
        for namespace in ["default", "kube-system"] {
            cluster.publish_namespace_defaults(namespace)?;
        }
        let kubeconfig = cluster.kubeconfig("admin", ADMIN_TOKEN)?;
        files::write_scheduler_config(cluster.dir.path(), &kubeconfig)?;
        let scheduler = cluster.spawn("kube-scheduler", &cluster.scheduler_args())?;
        cluster
            .processes
            .insert(0, ("kube-scheduler".into(), scheduler));
        Ok(cluster)
    }

    /// What kube-controller-manager's ServiceAccount and root CA publisher
    /// controllers (never run here) put in each namespace: the
    /// `default` ServiceAccount and the `kube-root-ca.crt` ConfigMap that
    /// every pod's projected API token volume mounts (kubelet does not start
    /// a pod without it).
    fn publish_namespace_defaults(&self, namespace: &str) -> io::Result<()> {
        let ca = std::fs::read_to_string(self.dir.path().join("certs/apiserver.crt"))?;
        let objects = [
            (
                "serviceaccounts",
                serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount",
                                   "metadata": {"name": "default"}}),
            ),
            (
                "configmaps",
                serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
                                   "metadata": {"name": "kube-root-ca.crt"},
                                   "data": {"ca.crt": ca}}),
            ),
        ];
        for (resource, object) in objects {
            let path = format!("/api/v1/namespaces/{namespace}/{resource}");
            let body = object.to_string();
            let (code, answer) = self.request_as(ADMIN_TOKEN, "POST", &path, Some(&body))?;
            if code != 201 {
                return Err(io::Error::other(format!(
                    "creating {resource} in {namespace}: {code} {answer}"
                )));
            }
        }
        Ok(())
    }

    /// The directory of the built binaries.
    pub fn bin(&self) -> &Path {
        &self.bin
    }

    fn spawn(&self, name: &str, args: &[String]) -> io::Result<Process> {
        let log = File::create(self.dir.path().join(format!("{name}.log")))?;
        let child = Command::new(self.bin.join(name))
            .args(args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .map_err(|e| io::Error::other(format!("starting {name}: {e}")))?;
        Ok(Process(child))
    }

    fn start_etcd(&mut self) -> io::Result<()> {
        let peer = format!("http://127.0.0.1:{}", free_port()?);
        let data = self.dir.path().join("etcd");
        let args = [
            "--data-dir".to_owned(),
            data.display().to_string(),
            "--listen-client-url".to_owned(),
            self.etcd_url.clone(),
            "--listen-peer-url".to_owned(),
            peer,
        ];
        let etcd = self.spawn("etcd", &args)?;
        self.processes.push(("etcd".into(), etcd));
        self.wait_for_log("etcd", "etcd: ready")
    }

    fn apiserver_args(&self) -> Vec<String> {
        let d = |name: &str| self.dir.path().join(name).display().to_string();
        let flags: [(&str, String); 17] = [
            ("--etcd-servers", self.etcd_url.clone()),
            ("--bind-address", "127.0.0.1".into()),
            ("--advertise-address", "127.0.0.1".into()),
            ("--secure-port", self.api_port.to_string()),
            ("--cert-dir", d("certs")),
            ("--token-auth-file", d(files::TOKENS)),
            ("--service-account-key-file", d(files::SA_KEY)),
            ("--service-account-signing-key-file", d(files::SA_KEY)),
            (
                "--service-account-issuer",
                "https://kubernetes.default.svc".into(),
            ),
            ("--authorization-mode", "Node,RBAC".into()),
            (
                "--enable-admission-plugins",
                "PodSecurity,NodeRestriction".into(),
            ),
            ("--service-cluster-ip-range", "10.96.0.0/24".into()),
            // The `kubernetes` Service's endpoint would be 127.0.0.1, which
            // Endpoints refuse; nothing here reaches the API server that way.
            ("--endpoint-reconciler-type", "none".into()),
            ("--audit-policy-file", d(files::AUDIT_POLICY)),
            ("--audit-log-path", d(files::AUDIT_LOG)),
            ("--audit-log-format", "json".into()),
            ("--audit-log-mode", "blocking".into()),
        ];
        flags
            .into_iter()
            .flat_map(|(k, v)| [k.to_owned(), v])
            .collect()
    }

    fn start_apiserver(&mut self) -> io::Result<()> {
        let apiserver = self.spawn("kube-apiserver", &self.apiserver_args())?;
        self.processes
            .insert(0, ("kube-apiserver".into(), apiserver));
        self.wait_ready()
    }

    fn scheduler_args(&self) -> Vec<String> {
        let config = self.dir.path().join(files::SCHEDULER_CONFIG);
        vec![
            "--config".into(),
            config.display().to_string(),
            "--secure-port".into(),
            "0".into(),
            // Its default level logs nothing about a pod it cannot schedule.
            "-v=2".into(),
        ]
    }

    /// Stops the API server (etcd and the scheduler keep running); with
    /// [`Self::start_apiserver_again`], an outage.
    pub fn stop_apiserver(&mut self) {
        if let Some(i) = self
            .processes
            .iter()
            .position(|(n, _)| n == "kube-apiserver")
        {
            let (_, mut process) = self.processes.remove(i);
            process.kill();
        }
    }

    /// Starts the API server again on the same port and waits until ready.
    ///
    /// # Errors
    /// As [`Self::start`].
    pub fn start_apiserver_again(&mut self) -> io::Result<()> {
        self.start_apiserver()
    }

    /// Polls `/readyz` with the admin token until it answers `ok`.
    fn wait_ready(&mut self) -> io::Result<()> {
        let start = Instant::now();
        loop {
            if self
                .get_as(ADMIN_TOKEN, "/readyz")
                .is_ok_and(|(code, _)| code == 200)
            {
                return Ok(());
            }
            self.check_running()?;
            if start.elapsed() > READY_TIMEOUT {
                return Err(self.failure("kube-apiserver", "not ready"));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn wait_for_log(&mut self, name: &str, line: &str) -> io::Result<()> {
        let start = Instant::now();
        let log = self.dir.path().join(format!("{name}.log"));
        while !std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains(line)
        {
            self.check_running()?;
            if start.elapsed() > READY_TIMEOUT {
                return Err(self.failure(name, "not ready"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    /// An error naming the first component that has exited.
    fn check_running(&mut self) -> io::Result<()> {
        let exited = self
            .processes
            .iter_mut()
            .find_map(|(name, p)| p.0.try_wait().ok().flatten().map(|s| (name.clone(), s)));
        match exited {
            Some((name, status)) => Err(self.failure(&name, &format!("exited ({status})"))),
            None => Ok(()),
        }
    }

    fn failure(&self, name: &str, what: &str) -> io::Error {
        io::Error::other(format!("{name} {what}; {}", self.log_tail(name)))
    }

    /// The last lines of a component's log (`etcd`, `kube-apiserver`,
    /// `kube-scheduler`), for failure messages.
    pub fn log_tail(&self, name: &str) -> String {
        let log = self.dir.path().join(format!("{name}.log"));
        let tail = crate::node_sim::node::tail(&log, 20);
        format!("the end of {}:\n{tail}", log.display())
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.api_port)
    }

    /// Writes `<dir>/kubeconfig-<user>` for the bearer `token`, trusting the
    /// API server's self-signed certificate; returns its path.
    ///
    /// # Errors
    /// When the certificate cannot be read or the file written.
    pub fn kubeconfig(&self, user: &str, token: &str) -> io::Result<PathBuf> {
        let ca = self.dir.path().join("certs/apiserver.crt");
        let path = self.dir.path().join(format!("kubeconfig-{user}"));
        files::write_kubeconfig(&path, &self.url(), &ca, user, token)?;
        Ok(path)
    }

    /// As [`Self::kubeconfig`], written with a copy of the API server's
    /// certificate into `dir` (for a process of another UID, which cannot
    /// enter the cluster's own directory).
    ///
    /// # Errors
    /// When a file cannot be copied or written.
    pub fn kubeconfig_in(&self, dir: &Path, user: &str, token: &str) -> io::Result<PathBuf> {
        let ca = dir.join("apiserver.crt");
        std::fs::copy(self.dir.path().join("certs/apiserver.crt"), &ca)?;
        let path = dir.join(format!("kubeconfig-{user}"));
        files::write_kubeconfig(&path, &self.url(), &ca, user, token)?;
        Ok(path)
    }

    /// A kube-rs configuration for the bearer `token`.
    ///
    /// # Errors
    /// As [`Self::kubeconfig`], or when kube-rs refuses it.
    pub async fn client_config(&self, user: &str, token: &str) -> io::Result<kube::Config> {
        let path = self.kubeconfig(user, token)?;
        let kubeconfig = kube::config::Kubeconfig::read_from(&path).map_err(io::Error::other)?;
        let options = kube::config::KubeConfigOptions::default();
        kube::Config::from_custom_kubeconfig(kubeconfig, &options)
            .await
            .map_err(io::Error::other)
    }

    /// One GET of `path` as the holder of `token`, without checking the
    /// server's certificate (curl): the status code and the body.
    ///
    /// # Errors
    /// When curl cannot run or prints no status.
    pub fn get_as(&self, token: &str, path: &str) -> io::Result<(u16, String)> {
        self.request_as(token, "GET", path, None)
    }

    /// One request as the holder of `token` (curl, the server's certificate
    /// not checked), with a JSON `body`: the status code and the body.
    ///
    /// # Errors
    /// When curl cannot run or prints no status.
    pub fn request_as(
        &self,
        token: &str,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> io::Result<(u16, String)> {
        self.request_with(token, method, path, body, "application/json")
    }

    /// A JSON merge patch of `path` as the holder of `token`: the status
    /// code and the answer.
    ///
    /// # Errors
    /// As [`Self::request_as`].
    pub fn merge_patch_as(
        &self,
        token: &str,
        path: &str,
        patch: &str,
    ) -> io::Result<(u16, String)> {
        self.request_with(
            token,
            "PATCH",
            path,
            Some(patch),
            "application/merge-patch+json",
        )
    }

    /// [`Self::request_as`] with the body's content type.
    ///
    /// # Errors
    /// As [`Self::request_as`].
    pub fn request_with(
        &self,
        token: &str,
        method: &str,
        path: &str,
        body: Option<&str>,
        content_type: &str,
    ) -> io::Result<(u16, String)> {
        let mut curl = Command::new("curl");
        curl.args([
            "-sk",
            "--max-time",
            "10",
            "-w",
            "\n%{http_code}",
            "-X",
            method,
            "-H",
        ])
        .arg(format!("Authorization: Bearer {token}"));
        if let Some(body) = body {
            curl.arg("-H").arg(format!("Content-Type: {content_type}"));
            curl.args(["--data-binary", body]);
        }
        let out = curl.arg(format!("{}{path}", self.url())).output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
        let code = code
            .trim()
            .parse()
            .map_err(|_| io::Error::other(format!("curl: {text}")))?;
        Ok((code, body.to_owned()))
    }

    /// The audit log's events (one JSON object per request) so far.
    pub fn audit_events(&self) -> Vec<serde_json::Value> {
        self.audit_events_since(0)
    }

    /// Where the audit log ends now, for [`Self::audit_events_since`].
    pub fn audit_offset(&self) -> u64 {
        std::fs::metadata(self.dir.path().join(files::AUDIT_LOG)).map_or(0, |m| m.len())
    }

    /// The audit log's events written after `offset` (an
    /// [`Self::audit_offset`]).
    pub fn audit_events_since(&self, offset: u64) -> Vec<serde_json::Value> {
        let text = std::fs::read(self.dir.path().join(files::AUDIT_LOG)).unwrap_or_default();
        let start = usize::try_from(offset)
            .unwrap_or(usize::MAX)
            .min(text.len());
        String::from_utf8_lossy(&text[start..])
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
}

impl Drop for RealCluster {
    fn drop(&mut self) {
        for (_, process) in &mut self.processes {
            process.kill();
        }
    }
}
