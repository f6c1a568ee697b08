//! The random pods of the lag test, for each kind of node.

use serde_json::{Value, json};
use tests::rng::Rng;

/// What kind of node a pod is made for.
pub struct NodeKind<'a> {
    /// Whole compute partitions (no CU shares).
    pub partition: bool,
    /// An RDNA node: one discrete GPU, 16 GiB.
    pub rdna: bool,
    /// Devices too small to slice, kept from requests for a share.
    pub unsliceable: &'a [String],
}

/// The `resources.limits` of one AMD container.
fn amd_limits(rng: &mut Rng, kind: &NodeKind<'_>) -> Value {
    let gpus = if kind.rdna || !rng.chance(25) { 1 } else { 2 };
    if kind.partition {
        return json!({"amd.com/gpu": gpus.to_string()});
    }
    let cores: &[u32] = if kind.rdna {
        &[10, 20, 25, 40, 50, 100]
    } else {
        &[5, 10, 20, 25, 33, 50, 100]
    };
    let mem_max = if kind.rdna { 16 } else { 64 };
    let mem = 256 * (1 + rng.below(mem_max));
    let core = *rng.pick(cores).unwrap_or(&100);
    json!({"amd.com/gpu": gpus.to_string(), "amd.com/gpucores": core.to_string(),
           "amd.com/gpumem": mem.to_string()})
}

fn container(name: &str, limits: Option<Value>) -> Value {
    match limits {
        Some(l) => json!({"name": name, "image": "rocm", "resources": {"limits": l}}),
        None => json!({"name": name, "image": "busybox"}),
    }
}

/// The containers of a random pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// An AMD init container only (HAMi takes no lock for it: the plugin
    /// finds the pod by the fallback rule).
    InitOnly,
    /// An AMD init container before an AMD app container.
    InitAndApp,
    /// Two AMD app containers.
    TwoApps,
    /// One AMD app container.
    OneApp,
}

impl Shape {
    /// The mix of the lag test: 5 % init only, 15 % init and app, 15 % two
    /// apps, the rest one app.
    pub fn random(rng: &mut Rng) -> Self {
        match rng.below(100) {
            0..5 => Self::InitOnly,
            5..20 => Self::InitAndApp,
            20..35 => Self::TwoApps,
            _ => Self::OneApp,
        }
    }

    /// A shape with an AMD app container (HAMi locks the node for it).
    pub fn random_app(rng: &mut Rng) -> Self {
        match rng.below(3) {
            0 => Self::InitAndApp,
            1 => Self::TwoApps,
            _ => Self::OneApp,
        }
    }
}

/// A random pod `default/<name>` of `shape`; binpack or spread.
pub fn pod_of(rng: &mut Rng, name: &str, kind: &NodeKind<'_>, shape: Shape) -> Value {
    let (init, app): (Vec<Value>, Vec<Value>) = match shape {
        Shape::InitOnly => (
            vec![container("init", Some(amd_limits(rng, kind)))],
            vec![container("main", None)],
        ),
        Shape::InitAndApp => (
            vec![container("init", Some(amd_limits(rng, kind)))],
            vec![container("main", Some(amd_limits(rng, kind)))],
        ),
        Shape::TwoApps => (
            Vec::new(),
            vec![
                container("a", Some(amd_limits(rng, kind))),
                container("b", Some(amd_limits(rng, kind))),
            ],
        ),
        Shape::OneApp => (
            Vec::new(),
            vec![container("main", Some(amd_limits(rng, kind)))],
        ),
    };
    let policy = if rng.chance(50) { "binpack" } else { "spread" };
    let mut annotations = json!({"hami.io/gpu-scheduler-policy": policy});
    if !kind.unsliceable.is_empty() {
        annotations["amd.com/nouse-gpu-uuid"] = json!(kind.unsliceable.join(","));
    }
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": "default", "annotations": annotations},
           "spec": {"initContainers": init, "containers": app}})
}
