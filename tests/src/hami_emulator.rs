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
        let Some(mut node) = api.get(Kind::Node, "", &self.node) else {
            panic!("node {} is not on the fake API server", self.node);
        };
        node["metadata"]["annotations"]["hami.io/mutex.lock"] =
            json!(format!("2026-11-29T08:00:00Z,default,{name}"));
        api.put_node(node);
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
        let entry = encode(containers);
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
            "spec": {"nodeName": self.node, "containers": [{"name": "c", "image": "rocm"}]},
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
