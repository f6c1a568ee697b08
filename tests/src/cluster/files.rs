//! The files the control plane starts from: bearer tokens, the
//! service-account key pair, the audit policy, the scheduler's
//! configuration, kubeconfigs.

use std::{fs, io, path::Path, process::Command};

use super::{ADMIN_TOKEN, kubelet::node_token};

pub const TOKENS: &str = "tokens.csv";
pub const SA_KEY: &str = "service-account.key";
pub const AUDIT_POLICY: &str = "audit-policy.yaml";
pub const AUDIT_LOG: &str = "audit.log";
pub const SCHEDULER_CONFIG: &str = "kube-scheduler.yaml";

/// Every request at `Metadata` level (who, what, the answer's code), once it
/// has been answered.
const AUDIT: &str = "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\n\
                     rules:\n- level: Metadata\n";

/// Writes the tokens (the administrator's, and a kubelet's for each of
/// `nodes`), the audit policy and the service-account key into `dir`.
///
/// # Errors
/// When a file cannot be written or `openssl` fails.
pub fn write_all(dir: &Path, nodes: &[&str]) -> io::Result<()> {
    // token,user,uid,"group1,group2"; a kubelet's identity is its node's.
    let mut tokens = format!("{ADMIN_TOKEN},admin,admin-uid,\"system:masters\"\n");
    for node in nodes {
        tokens.push_str(&format!(
            "{},system:node:{node},kubelet-{node},\"system:nodes\"\n",
            node_token(node)
        ));
    }
    fs::write(dir.join(TOKENS), tokens)?;
    fs::write(dir.join(AUDIT_POLICY), AUDIT)?;
    let key = dir.join(SA_KEY);
    let out = Command::new("openssl")
        .args([
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
            "-out",
        ])
        .arg(&key)
        .output()
        .map_err(|e| io::Error::other(format!("running openssl: {e}")))?;
    if !out.status.success() {
        let why = String::from_utf8_lossy(&out.stderr);
        return Err(io::Error::other(format!("openssl genpkey failed: {why}")));
    }
    Ok(())
}

/// The scheduler's configuration: the default profile, no leader election,
/// the cluster reached through `kubeconfig`.
///
/// # Errors
/// When the file cannot be written.
pub fn write_scheduler_config(dir: &Path, kubeconfig: &Path) -> io::Result<()> {
    let text = format!(
        "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n\
         clientConnection:\n  kubeconfig: {}\nleaderElection:\n  leaderElect: false\n\
         profiles:\n- schedulerName: default-scheduler\n",
        kubeconfig.display()
    );
    fs::write(dir.join(SCHEDULER_CONFIG), text)
}

/// A kubeconfig for `url` trusting the certificates in `ca`, as `user` with
/// the bearer `token`.
///
/// # Errors
/// When the file cannot be written.
pub fn write_kubeconfig(
    path: &Path,
    url: &str,
    ca: &Path,
    user: &str,
    token: &str,
) -> io::Result<()> {
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: real\n  cluster:\n    server: {url}\n    \
         certificate-authority: {}\ncontexts:\n- name: real\n  context:\n    cluster: real\n    \
         user: {user}\n    namespace: default\ncurrent-context: real\nusers:\n- name: {user}\n  \
         user:\n    token: {token}\n",
        ca.display()
    );
    fs::write(path, text)
}
