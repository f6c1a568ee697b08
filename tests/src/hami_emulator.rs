//! What HAMi's scheduler writes when it places a pod on AMD GPUs
//! (hami-protocol §3.1–3.3, §3.7), applied to the fake API server: Filter's
//! annotations (`vgpu-node`, `vgpu-time`, to-allocate and allocated, equal
//! when written), then Bind's node lock `<time>,<ns>,<name>`, `bind-phase:
//! allocating` and `bind-time`, and the binding itself (`spec.nodeName`).

use serde_json::json;

use crate::apiserver::{FakeApiServer, Kind};

/// One device HAMi granted: the registered id and type, MiB, and CUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub id: String,
    pub device_type: String,
    pub mem_mib: u32,
    pub cus: u32,
}

/// The device-list value of §3.2 for `containers` (AMD containers only).
pub fn encode(containers: &[Vec<Grant>]) -> String {
    containers
        .iter()
        .map(|devices| {
            devices
                .iter()
                .map(|g| format!("{},{},{},{}:", g.id, g.device_type, g.mem_mib, g.cus))
                .collect::<String>()
                + ";"
        })
        .collect()
}

/// The scheduler of one node.
#[derive(Debug, Clone)]
pub struct HamiEmulator {
    pub node: String,
}

impl HamiEmulator {
    /// Filter + Bind of pod `default/<name>` with `containers`' grants at
    /// Unix time `now`: the pod is created bound, Pending, and the node lock
    /// names it.
    ///
    /// # Panics
    /// When the node does not exist on the fake API server (a test bug).
    pub fn bind(&self, api: &FakeApiServer, name: &str, containers: &[Vec<Grant>], now: u64) {
        self.bind_unlocked(api, name, containers, now);
        self.lock(api, name);
    }

    /// Filter + Bind without taking the node lock (as HAMi does for pods
    /// whose AMD request is in init containers only): the plugin must find
    /// the pod by the fallback rule.
    pub fn bind_unlocked(
        &self,
        api: &FakeApiServer,
        name: &str,
        containers: &[Vec<Grant>],
        now: u64,
    ) {
        let spec = json!([{"name": "c", "image": "rocm"}]);
        self.put_bound(api, name, containers, now, json!({"containers": spec}));
    }

    /// Filter + Bind of a pod with AMD init containers (`init`, run in
    /// order) and app containers (`app`), each requesting `amd.com/gpu` for
    /// its devices; HAMi's entries list them init first. The node lock is
    /// taken only when an app container requests AMD, as HAMi does.
    ///
    /// # Panics
    /// As [`Self::bind`].
    pub fn bind_staged(
        &self,
        api: &FakeApiServer,
        name: &str,
        init: &[Vec<Grant>],
        app: &[Vec<Grant>],
        now: u64,
    ) {
        let containers = |prefix: &str, grants: &[Vec<Grant>]| -> Vec<serde_json::Value> {
            grants
                .iter()
                .enumerate()
                .map(|(i, g)| {
                    json!({"name": format!("{prefix}-{i}"), "image": "rocm",
                           "resources": {"limits": {"amd.com/gpu": g.len().to_string()}}})
                })
                .collect()
        };
        let spec = json!({
            "initContainers": containers("init", init),
            "containers": containers("app", app),
        });
        let all: Vec<Vec<Grant>> = init.iter().chain(app).cloned().collect();
        self.put_bound(api, name, &all, now, spec);
        if !app.is_empty() {
            self.lock(api, name);
        }
    }

    fn lock(&self, api: &FakeApiServer, name: &str) {
        let Some(mut node) = api.get(Kind::Node, "", &self.node) else {
            panic!("node {} is not on the fake API server", self.node);
        };
        node["metadata"]["annotations"]["hami.io/mutex.lock"] =
            json!(format!("2026-11-29T08:00:00Z,default,{name}"));
        api.put_node(node);
    }

    fn put_bound(
        &self,
        api: &FakeApiServer,
        name: &str,
        containers: &[Vec<Grant>],
        now: u64,
        mut spec: serde_json::Value,
    ) {
        let entry = encode(containers);
        spec["nodeName"] = json!(self.node);
        api.put_pod(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "annotations": {
                "hami.io/vgpu-node": self.node,
                "hami.io/vgpu-time": now.to_string(),
                "hami.io/amd-devices-to-allocate": entry,
                "hami.io/amd-devices-allocated": entry,
                "hami.io/bind-phase": "allocating",
                "hami.io/bind-time": now.to_string(),
            }},
            "spec": spec,
            "status": {"phase": "Pending"}
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_the_spec_examples() {
        let g = |id: &str, mem, cus| Grant {
            id: id.into(),
            device_type: "T".into(),
            mem_mib: mem,
            cus,
        };
        assert_eq!(
            encode(&[vec![g("A", 16384, 76), g("B", 16384, 76)]]),
            "A,T,16384,76:B,T,16384,76:;"
        );
        assert_eq!(
            encode(&[vec![g("A", 8192, 38)], vec![g("A", 8192, 38)]]),
            "A,T,8192,38:;A,T,8192,38:;"
        );
    }
}
