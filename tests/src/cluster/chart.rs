//! The chart as the cluster gets it: `helm/amd-gpu` rendered by Helm's own
//! library (`tests/cluster/cmd/render-chart`), applied server-side, and the
//! tokens its ServiceAccount gets.

use std::{io, path::Path, process::Command};

use serde_json::{Value, json};

use super::{ADMIN_TOKEN, RealCluster, binaries};

/// The release the chart is rendered as, in `kube-system`.
pub const RELEASE: &str = "amd-gpu";
pub const NAMESPACE: &str = "kube-system";

/// The chart's objects in [`NAMESPACE`] for the default values overlaid
/// with `set_json` (`key.path`, JSON value) pairs, for Kubernetes v1.36.3.
///
/// # Errors
/// When the renderer cannot be built or run, or refuses the values.
pub fn render(set_json: &[(&str, &str)]) -> io::Result<Vec<Value>> {
    render_in(NAMESPACE, set_json)
}

/// [`render`] for a release in `namespace`.
///
/// # Errors
/// As [`render`].
pub fn render_in(namespace: &str, set_json: &[(&str, &str)]) -> io::Result<Vec<Value>> {
    let out = render_chart(namespace, set_json)?.output()?;
    if !out.status.success() {
        let why = String::from_utf8_lossy(&out.stderr);
        return Err(io::Error::other(format!(
            "rendering {}: {why}",
            chart_dir().display()
        )));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut objects = Vec::new();
    for document in serde_yaml::Deserializer::from_str(&text) {
        let value: Value = serde::Deserialize::deserialize(document).map_err(io::Error::other)?;
        if !value.is_null() {
            objects.push(value);
        }
    }
    Ok(objects)
}

/// `helm upgrade --install --wait --timeout <timeout>` of the chart as
/// [`RELEASE`] in [`NAMESPACE`] on `cluster`, as the administrator, with the
/// default values overlaid with `set_json`, through Helm's own library
/// (`render-chart -kubeconfig`): what it printed (`release amd-gpu revision
/// N deployed`), once Helm's wait said every object is ready.
///
/// # Errors
/// When the renderer cannot be built or run, or Helm fails or times out
/// (the message carries Helm's log).
pub fn upgrade_install(
    cluster: &RealCluster,
    set_json: &[(&str, &str)],
    timeout: std::time::Duration,
) -> io::Result<String> {
    let kubeconfig = cluster.kubeconfig("helm", ADMIN_TOKEN)?;
    let out = render_chart(NAMESPACE, set_json)?
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .arg(format!("--timeout={}s", timeout.as_secs()))
        .output()?;
    let printed = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "helm upgrade --install {RELEASE} ({}): {printed}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(printed)
}

/// `helm/amd-gpu`.
fn chart_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../helm/amd-gpu")
}

/// render-chart for the chart as [`RELEASE`] in `namespace`, its default
/// values overlaid with `set_json`.
fn render_chart(namespace: &str, set_json: &[(&str, &str)]) -> io::Result<Command> {
    let mut cmd = Command::new(binaries()?.join("render-chart"));
    cmd.arg("--chart")
        .arg(chart_dir())
        .args(["--name", RELEASE, "--namespace", namespace]);
    for (key, value) in set_json {
        cmd.arg("--set-json").arg(format!("{key}={value}"));
    }
    Ok(cmd)
}

/// The REST collection of `object` (its group, version, namespace and the
/// plural of its kind).
pub fn collection(object: &Value) -> io::Result<String> {
    let api_version = object["apiVersion"].as_str().unwrap_or_default();
    let kind = object["kind"].as_str().unwrap_or_default();
    if api_version.is_empty() || kind.is_empty() {
        return Err(io::Error::other(format!("no apiVersion or kind: {object}")));
    }
    let root = if api_version.contains('/') {
        "/apis"
    } else {
        "/api"
    };
    let lower = kind.to_lowercase();
    let plural = match lower.strip_suffix('y') {
        Some(stem) => format!("{stem}ies"),
        None => format!("{lower}s"),
    };
    Ok(match object["metadata"]["namespace"].as_str() {
        Some(ns) => format!("{root}/{api_version}/namespaces/{ns}/{plural}"),
        None => format!("{root}/{api_version}/{plural}"),
    })
}

impl RealCluster {
    /// Server-side applies `object` as the administrator: the status code
    /// and the answer.
    ///
    /// # Errors
    /// When the object names no collection or curl fails.
    pub fn apply(&self, object: &Value) -> io::Result<(u16, String)> {
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        let path = format!(
            "{}/{name}?fieldManager=tests&force=true",
            collection(object)?
        );
        let body = object.to_string();
        self.request_with(
            ADMIN_TOKEN,
            "PATCH",
            &path,
            Some(&body),
            "application/apply-patch+yaml",
        )
    }

    /// A token of ServiceAccount `namespace/account`, bound to no object
    /// (as a user's tool would hold one).
    ///
    /// # Errors
    /// When the TokenRequest fails.
    pub fn account_token(&self, namespace: &str, account: &str) -> io::Result<String> {
        let request = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                             "spec": {"expirationSeconds": 3600}});
        self.token_request(namespace, account, &request)
    }

    fn token_request(&self, namespace: &str, account: &str, request: &Value) -> io::Result<String> {
        let path = format!("/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token");
        let body = request.to_string();
        let (code, answer) = self.request_as(ADMIN_TOKEN, "POST", &path, Some(&body))?;
        let answer: Value = serde_json::from_str(&answer).unwrap_or_default();
        match answer["status"]["token"].as_str() {
            Some(token) if code == 201 => Ok(token.to_owned()),
            _ => Err(io::Error::other(format!(
                "TokenRequest for {account}: {code} {answer}"
            ))),
        }
    }

    /// A token of ServiceAccount `namespace/account` bound to the pod
    /// `namespace/pod` (so that it names the pod's node, as a DaemonSet
    /// pod's projected token does).
    ///
    /// # Errors
    /// When the pod or the TokenRequest fails.
    pub fn pod_token(&self, namespace: &str, account: &str, pod: &str) -> io::Result<String> {
        let path = format!("/api/v1/namespaces/{namespace}/pods/{pod}");
        let (code, found) = self.get_as(ADMIN_TOKEN, &path)?;
        let found: Value = serde_json::from_str(&found).unwrap_or_default();
        let uid = found["metadata"]["uid"].as_str().unwrap_or_default();
        if code != 200 || uid.is_empty() {
            return Err(io::Error::other(format!(
                "reading pod {namespace}/{pod}: {code}"
            )));
        }
        let request = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"expirationSeconds": 3600,
                     "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": uid}}});
        self.token_request(namespace, account, &request)
    }
}
