//! Kubernetes API access: a client with timeouts, watch-fed caches of this
//! node and of the pods bound to it, and Events.
//!
//! Reads on the hot path come from the caches; the API server sees watches
//! and the few writes the protocol needs.

mod events;
mod progress;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    str::FromStr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

pub(crate) use events::{Events, Regarding};
use futures_util::StreamExt;
use k8s_openapi::{
    api::core::v1::{Container, Node, Pod},
    apimachinery::pkg::api::resource::Quantity,
};
use kube::{
    Api, Client, Config,
    config::{KubeConfigOptions, Kubeconfig},
    runtime::{WatchStreamExt, reflector, reflector::Store, watcher},
};
pub(crate) use progress::{CacheMark, WatchProgress};
use tracing::warn;

/// Timeout of every non-watch call (and of connecting).
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the Kubernetes side could not start.
#[derive(Debug, thiserror::Error)]
pub(crate) enum KubeError {
    #[error("no Kubernetes configuration (in-cluster or KUBECONFIG): {0}")]
    Infer(#[source] kube::config::InferConfigError),
    #[error("cannot read the kubeconfig {path}: {source}")]
    Kubeconfig {
        path: String,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("cannot build the Kubernetes client: {0}")]
    Client(#[source] kube::Error),
    #[error("--node-name (NODE_NAME) is required with --kube {0}")]
    NoNodeName(String),
}

/// The client configuration `access` asks for; `None` for `--kube none`.
///
/// # Errors
/// When the configuration cannot be found or read.
pub(crate) async fn config(access: &KubeAccess) -> Result<Option<Config>, KubeError> {
    let mut config = match access {
        KubeAccess::None => return Ok(None),
        KubeAccess::Auto => Config::infer().await.map_err(KubeError::Infer)?,
        KubeAccess::Kubeconfig(path) => from_file(path).await?,
    };
    config.connect_timeout = Some(CALL_TIMEOUT);
    config.write_timeout = Some(CALL_TIMEOUT);
    Ok(Some(config))
}

/// A client for `config` (inside the async runtime).
///
/// # Errors
/// When the client cannot be built.
pub(crate) fn client(config: Config) -> Result<Client, KubeError> {
    Client::try_from(config).map_err(KubeError::Client)
}

/// The API server's TCP port in `config` (the scheme's default when the URL
/// names none).
pub(crate) fn api_port(config: &Config) -> u16 {
    let url = &config.cluster_url;
    url.port_u16()
        .unwrap_or(if url.scheme_str() == Some("http") {
            80
        } else {
            443
        })
}

async fn from_file(path: &Path) -> Result<Config, KubeError> {
    let wrap = |source| KubeError::Kubeconfig {
        path: path.display().to_string(),
        source,
    };
    let kubeconfig = Kubeconfig::read_from(path).map_err(wrap)?;
    Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(wrap)
}

/// Watch-fed caches of this node and of the pods on it.
#[derive(Clone)]
pub(crate) struct Caches {
    pub(crate) node_name: String,
    pub(crate) nodes: Store<Node>,
    pub(crate) pods: Store<Pod>,
    /// How far the pods watch has brought [`Self::pods`].
    pub(crate) pods_progress: Arc<WatchProgress>,
    /// Whether each watch (node, pods) got an answer last time, not an error.
    watching: Arc<[AtomicBool; 2]>,
}

impl Caches {
    /// Starts the watches (each restarts with back-off on errors) on
    /// `decoder`: every change of a pod on this node comes as a whole object
    /// to decode, work that must not queue in front of a kubelet call.
    pub(crate) fn start(
        client: &Client,
        node_name: &str,
        decoder: &tokio::runtime::Handle,
    ) -> Self {
        let node_fields = format!("metadata.name={node_name}");
        let pod_fields = format!("spec.nodeName={node_name}");
        let watching = Arc::new([AtomicBool::new(false), AtomicBool::new(false)]);
        let pods_progress = Arc::new(WatchProgress::default());
        let nodes = watch(decoder, Api::<Node>::all(client.clone()), &node_fields, {
            let w = watching.clone();
            move |event: Option<&watcher::Event<Node>>| {
                w[0].store(event.is_some(), Ordering::Relaxed)
            }
        });
        let pods = watch(decoder, Api::<Pod>::all(client.clone()), &pod_fields, {
            let (w, progress) = (watching.clone(), pods_progress.clone());
            move |event: Option<&watcher::Event<Pod>>| {
                w[1].store(event.is_some(), Ordering::Relaxed);
                if let Some(event) = event {
                    progress.saw(event);
                }
            }
        });
        Self {
            node_name: node_name.to_owned(),
            nodes,
            pods,
            pods_progress,
            watching,
        }
    }

    #[cfg(test)]
    /// Caches over stores filled by someone else (tests, tools); they count
    /// as connected.
    pub(crate) fn from_stores(node_name: &str, nodes: Store<Node>, pods: Store<Pod>) -> Self {
        Self {
            node_name: node_name.to_owned(),
            nodes,
            pods,
            pods_progress: Arc::new(WatchProgress::default()),
            watching: Arc::new([AtomicBool::new(true), AtomicBool::new(true)]),
        }
    }

    /// The cached pods, and the mark taken just before they were read (what
    /// their absence means, see [`CacheMark::covers`]).
    pub(crate) fn pods_with_mark(&self) -> (CacheMark, Vec<Arc<Pod>>) {
        let mark = self.pods_progress.mark();
        (mark, self.pods.state())
    }

    /// Whether the node watch's last answer from the API server was not an
    /// error (else the cached node may be stale).
    pub(crate) fn node_watch_answering(&self) -> bool {
        self.watching[0].load(Ordering::Relaxed)
    }

    /// Whether both watches work: their last answer from the API server was
    /// not an error.
    pub(crate) fn connected(&self) -> bool {
        self.watching.iter().all(|w| w.load(Ordering::Relaxed))
    }

    /// This node as last seen by the watch.
    pub(crate) fn node(&self) -> Option<std::sync::Arc<Node>> {
        self.nodes
            .state()
            .into_iter()
            .find(|n| n.metadata.name.as_deref() == Some(&self.node_name))
    }
}

/// A reflector of `api` restricted to `fields`; `answered` gets each event
/// after the store applied it (`None`: the watch failed).
fn watch<K>(
    decoder: &tokio::runtime::Handle,
    api: Api<K>,
    fields: &str,
    answered: impl Fn(Option<&watcher::Event<K>>) + Send + 'static,
) -> Store<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let config = watcher::Config::default().fields(fields);
    let what = format!("{} ({fields})", K::plural(&()));
    let stream = reflector(writer, watcher(api, config)).default_backoff();
    decoder.spawn(async move {
        futures_util::pin_mut!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(event) => answered(Some(&event)),
                Err(err) => {
                    answered(None);
                    warn!("watch of {what}: {err}");
                }
            }
        }
    });
    reader
}

/// How the plugin reaches the Kubernetes API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KubeAccess {
    None,
    Auto,
    Kubeconfig(PathBuf),
}

impl FromStr for KubeAccess {
    type Err = crate::choice::InvalidChoice;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value {
            "" => Err(Self::Err::new(
                "--kube",
                "none, auto or a kubeconfig path",
                value,
            )),
            "none" => Ok(Self::None),
            "auto" => Ok(Self::Auto),
            path => Ok(Self::Kubeconfig(PathBuf::from(path))),
        }
    }
}

/// How many devices of `resource` `container` asks for (its limit, or its
/// request when only that is given); `None` when none or unparsable.
pub(crate) fn container_asks(container: &Container, resource: &str) -> Option<u64> {
    let r = container.resources.as_ref()?;
    let of = |m: &Option<BTreeMap<String, Quantity>>| {
        m.as_ref()
            .and_then(|m| m.get(resource))
            .map(|q| q.0.trim().parse::<u64>())
    };
    of(&r.limits).or_else(|| of(&r.requests))?.ok()
}
