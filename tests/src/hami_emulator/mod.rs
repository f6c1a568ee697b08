//! What HAMi's scheduler writes when it places a pod on AMD GPUs
//! (docs/hami-protocol.md §3.1–3.3, §3.7), applied to the fake API server: Filter's
//! annotations (`vgpu-node`, `vgpu-time`, to-allocate and allocated, equal
//! when written), then Bind's node lock `<time>,<ns>,<name>`, `bind-phase:
//! allocating` and `bind-time`, and the binding itself (`spec.nodeName`).
//!
//! The grants are either given by the test ([`HamiEmulator::bind`] and
//! friends) or chosen as HAMi's Filter would from the node's register
//! annotation and the pods already placed ([`HamiEmulator::schedule`], see
//! [`filter`]).

pub mod extender;
pub mod filter;
pub mod order;
pub mod request;
pub mod usage;

use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use self::{
    filter::{FilterError, REGISTER_KEY, decode_register, fit},
    request::{ContainerRequest, GpuPolicy, RequestError, Selection},
    usage::node_usage,
};
use crate::apiserver::{FakeApiServer, Kind, rfc3339};

/// The scheduler name HAMi's webhook gives the pods it manages.
pub const SCHEDULER_NAME: &str = "hami-scheduler";

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

/// Where HAMi's Filter put a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The AMD containers' requests, init containers first.
    pub requests: Vec<ContainerRequest>,
    /// Their grants, in the same order.
    pub grants: Vec<Vec<Grant>>,
    /// Requests HAMi dropped (logged out of range): with none kept, HAMi
    /// binds the pod without devices ([`request::Requests::dropped`]).
    pub dropped: Vec<RequestError>,
}

impl HamiEmulator {
    /// HAMi's Filter for the pod `manifest` on this node (`policy` unless
    /// the pod names one), without writing anything.
    ///
    /// # Errors
    /// Why HAMi would not place the pod here.
    pub fn filter(
        &self,
        api: &FakeApiServer,
        manifest: &Value,
        policy: GpuPolicy,
    ) -> Result<Placement, FilterError> {
        let node = api.get(Kind::Node, "", &self.node);
        let register = node
            .as_ref()
            .and_then(|n| n["metadata"]["annotations"][REGISTER_KEY].as_str());
        self.place(register, &api.list(Kind::Pod), manifest, policy)
    }

    /// HAMi's Filter for the pod `manifest` on this node, from the node's
    /// register annotation and every pod of the cluster (as JSON), whoever
    /// serves them.
    ///
    /// # Errors
    /// As [`Self::filter`].
    pub fn place(
        &self,
        register: Option<&str>,
        pods: &[Value],
        manifest: &Value,
        policy: GpuPolicy,
    ) -> Result<Placement, FilterError> {
        let pod: Pod =
            serde_json::from_value(manifest.clone()).map_err(|e| FilterError::BadPod {
                message: e.to_string(),
            })?;
        let register = register.ok_or_else(|| FilterError::NotRegistered {
            node: self.node.clone(),
        })?;
        let devices = decode_register(register).map_err(|e| FilterError::BadRegister {
            node: self.node.clone(),
            message: e.to_string(),
        })?;
        let request::Requests { kept, dropped } = request::requests_of(&pod)?;
        if kept.is_empty() && request::routed_to_hami(&pod) {
            // HAMi's Filter passes every node for a pod without requests,
            // and its Bind binds it with no device annotation.
            return Ok(Placement {
                requests: kept,
                grants: Vec::new(),
                dropped,
            });
        }
        let usage = node_usage(&devices, &self.node, pods);
        let selection = Selection::of(&pod, policy);
        let grants = fit(&self.node, &usage, &kept, &selection)?;
        Ok(Placement {
            requests: kept,
            grants,
            dropped,
        })
    }

    /// Filter, then Bind: the pod is stored bound to this node at Unix time
    /// `now`, Pending, with HAMi's annotations, and the node lock names it
    /// when an app container asks for AMD GPUs.
    ///
    /// # Errors
    /// As [`Self::filter`]; nothing is written then.
    ///
    /// # Panics
    /// When the node does not exist on the fake API server.
    pub fn schedule(
        &self,
        api: &FakeApiServer,
        manifest: &Value,
        now: u64,
        policy: GpuPolicy,
    ) -> Result<Placement, FilterError> {
        self.schedule_up_to(api, manifest, (now, policy), true)
    }

    /// [`Self::schedule`] up to the node lock: the pod carries Filter's and
    /// Bind's annotations and the lock names it (when an app container asks
    /// for AMD GPUs), but the Binding is not made ([`Self::complete_binding`]
    /// makes it). HAMi binds pods asking in init containers only in between,
    /// without the lock.
    ///
    /// # Errors
    /// As [`Self::filter`]; nothing is written then.
    pub fn schedule_before_binding(
        &self,
        api: &FakeApiServer,
        manifest: &Value,
        now: u64,
        policy: GpuPolicy,
    ) -> Result<Placement, FilterError> {
        self.schedule_up_to(api, manifest, (now, policy), false)
    }

    fn schedule_up_to(
        &self,
        api: &FakeApiServer,
        manifest: &Value,
        (now, policy): (u64, GpuPolicy),
        bound: bool,
    ) -> Result<Placement, FilterError> {
        let placement = self.filter(api, manifest, policy)?;
        let mut pod = manifest.clone();
        if pod["metadata"]["namespace"].as_str().is_none() {
            pod["metadata"]["namespace"] = json!("default");
        }
        pod["spec"]["schedulerName"] = json!(SCHEDULER_NAME);
        let namespace = pod["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_owned();
        let name = pod["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        // HAMi's Bind: the lock (for AMD app containers), the pod's
        // annotations, then the Binding.
        if placement.requests.iter().any(|r| !r.init) {
            self.lock_for(api, &format!("{},{namespace},{name}", rfc3339(now)));
        }
        self.store(api, pod, &placement.grants, now, bound);
        Ok(placement)
    }

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
        self.bind_image_unlocked(api, name, containers, now, "rocm");
    }

    /// [`Self::bind`] of a pod whose one container runs `image`.
    pub fn bind_image(
        &self,
        api: &FakeApiServer,
        name: &str,
        containers: &[Vec<Grant>],
        now: u64,
        image: &str,
    ) {
        self.bind_image_unlocked(api, name, containers, now, image);
        self.lock(api, name);
    }

    /// As [`Self::bind_image`], for one container written out (`image`,
    /// `command`, `args`, `env`, ...) granted `grants`; its `name` and
    /// `resources` are set here.
    ///
    /// # Panics
    /// As [`Self::bind`].
    pub fn bind_container(
        &self,
        api: &FakeApiServer,
        name: &str,
        grants: &[Grant],
        now: u64,
        mut container: serde_json::Value,
    ) {
        container["name"] = json!("c");
        container["resources"] = json!({"limits": {"amd.com/gpu": grants.len().to_string()}});
        let containers = [grants.to_vec()];
        self.put_bound(
            api,
            name,
            &containers,
            now,
            json!({"containers": [container]}),
        );
        self.lock(api, name);
    }

    fn bind_image_unlocked(
        &self,
        api: &FakeApiServer,
        name: &str,
        containers: &[Vec<Grant>],
        now: u64,
        image: &str,
    ) {
        let devices: usize = containers.iter().map(Vec::len).sum();
        let limits = json!({"amd.com/gpu": devices.to_string()});
        let spec = json!([{"name": "c", "image": image, "resources": {"limits": limits}}]);
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

    /// HAMi's Bind of `default/<name>` (one app container granted
    /// `containers`) up to the node lock: the pod carries Filter's and
    /// Bind's annotations and the lock names it, but the Binding has not
    /// been made yet ([`Self::complete_binding`] makes it). HAMi binds other
    /// pods without the lock in between (those asking in init containers
    /// only).
    pub fn lock_before_binding(
        &self,
        api: &FakeApiServer,
        name: &str,
        containers: &[Vec<Grant>],
        now: u64,
    ) {
        self.lock(api, name);
        let devices: usize = containers.iter().map(Vec::len).sum();
        let limits = json!({"amd.com/gpu": devices.to_string()});
        let spec = json!({"containers": [{"name": "c", "image": "rocm",
                                          "resources": {"limits": limits}}]});
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": spec,
        });
        self.store(api, pod, containers, now, false);
    }

    /// The Binding of `default/<name>`, which [`Self::lock_before_binding`]
    /// or [`Self::schedule_before_binding`] left unbound.
    pub fn complete_binding(&self, api: &FakeApiServer, name: &str) {
        let mut pod = api
            .get(Kind::Pod, "default", name)
            .unwrap_or_else(|| panic!("pod {name} is not on the fake API server"));
        pod["spec"]["nodeName"] = json!(self.node);
        api.put_pod(pod);
    }

    /// A lock naming `default/<owner>` that outlived its pod.
    pub fn stale_lock(&self, api: &FakeApiServer, owner: &str) {
        self.lock(api, owner);
    }

    fn lock(&self, api: &FakeApiServer, name: &str) {
        self.lock_for(api, &format!("2026-11-29T08:00:00Z,default,{name}"));
    }

    fn lock_for(&self, api: &FakeApiServer, value: &str) {
        let Some(mut node) = api.get(Kind::Node, "", &self.node) else {
            panic!("node {} is not on the fake API server", self.node);
        };
        node["metadata"]["annotations"]["hami.io/mutex.lock"] = json!(value);
        api.put_node(node);
    }

    fn put_bound(
        &self,
        api: &FakeApiServer,
        name: &str,
        containers: &[Vec<Grant>],
        now: u64,
        spec: Value,
    ) {
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": spec,
        });
        self.store(api, pod, containers, now, true);
    }

    /// The annotations HAMi's Filter and Bind write on a pod granted
    /// `containers` at Unix time `now`: Bind's alone when Filter granted
    /// nothing (every request dropped).
    pub fn bind_annotations(
        &self,
        containers: &[Vec<Grant>],
        now: u64,
    ) -> Vec<(&'static str, String)> {
        let bind = [
            ("hami.io/bind-phase", "allocating".to_owned()),
            ("hami.io/bind-time", now.to_string()),
        ];
        if containers.is_empty() {
            return bind.into();
        }
        let entry = encode(containers);
        let filter = [
            ("hami.io/vgpu-node", self.node.clone()),
            ("hami.io/vgpu-time", now.to_string()),
            ("hami.io/amd-devices-to-allocate", entry.clone()),
            (filter::ALLOCATED_KEY, entry),
        ];
        filter.into_iter().chain(bind).collect()
    }

    /// Stores `pod` with Filter's and Bind's annotations, Pending, and
    /// bound to the node when `bound` (else HAMi has not made its Binding).
    fn store(
        &self,
        api: &FakeApiServer,
        mut pod: Value,
        containers: &[Vec<Grant>],
        now: u64,
        bound: bool,
    ) {
        for (key, value) in self.bind_annotations(containers, now) {
            pod["metadata"]["annotations"][key] = json!(value);
        }
        if !containers.is_empty() {
            pod["metadata"]["labels"]["hami.io/vgpu-node"] = json!(self.node);
        }
        if bound {
            pod["spec"]["nodeName"] = json!(self.node);
        }
        pod["status"] = json!({"phase": "Pending"});
        api.put_pod(pod);
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

    #[test]
    fn lock_times_are_rfc3339() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_755_757_239), "2025-08-21T06:20:39Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
    }

    #[test]
    fn schedule_filters_binds_and_locks() {
        let api = FakeApiServer::start().unwrap();
        let register = r#"[{"id":"A","count":10,"devmem":1000,"devcore":100,"type":"AMD X","health":true},
                           {"id":"B","count":10,"devmem":1000,"devcore":100,"type":"AMD X","health":true}]"#;
        api.put_node(json!({"metadata": {"name": "n", "annotations": {REGISTER_KEY: register}}}));
        let hami = HamiEmulator { node: "n".into() };
        let pod = |name: &str, mem: &str| {
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                   "spec": {"containers": [{"name": "c", "resources": {"limits": {
                       "amd.com/gpu": 1, "amd.com/gpucores": 50, "amd.com/gpumem": mem}}}]}})
        };
        let placed = hami
            .schedule(&api, &pod("p1", "600"), 1_755_757_239, GpuPolicy::Spread)
            .unwrap();
        assert_eq!(encode(&placed.grants), "B,AMD X,600,50:;");
        let stored = api.get(Kind::Pod, "default", "p1").unwrap();
        assert_eq!(stored["spec"]["nodeName"], "n");
        assert_eq!(
            stored["metadata"]["annotations"]["hami.io/bind-phase"],
            "allocating"
        );
        assert_eq!(stored["metadata"]["labels"]["hami.io/vgpu-node"], "n");
        let node = api.get(Kind::Node, "", "n").unwrap();
        assert_eq!(
            node["metadata"]["annotations"]["hami.io/mutex.lock"],
            "2025-08-21T06:20:39Z,default,p1"
        );
        // B holds 600 MiB now: the next pod goes to A, then nothing fits 600 more.
        let second = hami
            .schedule(&api, &pod("p2", "600"), 2, GpuPolicy::Spread)
            .unwrap();
        assert_eq!(second.grants[0][0].id, "A");
        let err = hami
            .filter(&api, &pod("p3", "600"), GpuPolicy::Spread)
            .unwrap_err();
        assert!(
            err.to_string().contains("2/2 CardInsufficientMemory"),
            "{err}"
        );
        assert!(api.get(Kind::Pod, "default", "p3").is_none());
    }
}
