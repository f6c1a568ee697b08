//! `--report-node-capacity`: the Go plugin's `-report_node_capacity` (chart
//! `dp.reportNodeCapacity`, Project-HAMi/amd-device-plugin:helm/amd-gpu/README.md):
//! the healthy devices' memory (`amd.com/gpumem`, MiB) and compute units
//! (`amd.com/gpucores`) published as the node's capacity and allocatable,
//! so that `kubectl describe node`, quotas and schedulers other than HAMi's
//! see them. Off by default, as there.
//!
//! The sums are over the register entries (`devmem`, `devcore` of each entry
//! with `health`), as HAMi's own `--report-node-capacity` sums them
//! (Project-HAMi/HAMi#2874), and written with a merge patch of the node's
//! `status` subresource when they differ from what the node shows: kubelet
//! zeroes extended resources it does not serve when it registers the node
//! again, and the registrar's re-check puts them back.

use k8s_openapi::{api::core::v1::Node, apimachinery::pkg::api::resource::Quantity};
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use serde_json::{Value, json};
use tracing::{info, warn};

use crate::{hami::DeviceInfo, kube::CALL_TIMEOUT};

/// The node resource with the healthy devices' memory, in MiB.
pub(crate) const MEMORY_RESOURCE: &str = "amd.com/gpumem";
/// The node resource with the healthy devices' compute units.
pub(crate) const CORES_RESOURCE: &str = "amd.com/gpucores";

/// The capacity the node should show: (resource, quantity) pairs.
pub(crate) fn wanted(devices: &[DeviceInfo]) -> [(&'static str, String); 2] {
    let healthy = devices.iter().filter(|d| d.health);
    let (memory, cores) = healthy.fold((0_i64, 0_i64), |(m, c), d| {
        (m + i64::from(d.devmem), c + i64::from(d.devcore))
    });
    [
        (MEMORY_RESOURCE, memory.to_string()),
        (CORES_RESOURCE, cores.to_string()),
    ]
}

/// Whether the node's capacity or allocatable differs from `wanted` (or
/// the node is not known).
pub(crate) fn needs_write(wanted: &[(&'static str, String); 2], node: Option<&Node>) -> bool {
    let Some(status) = node.and_then(|n| n.status.as_ref()) else {
        return true;
    };
    let shows = |list: Option<&std::collections::BTreeMap<String, Quantity>>| {
        wanted
            .iter()
            .all(|(name, value)| list.and_then(|l| l.get(*name)).map(|q| &q.0) == Some(value))
    };
    !(shows(status.capacity.as_ref()) && shows(status.allocatable.as_ref()))
}

/// The merge patch of the node's status that publishes `wanted`.
pub(crate) fn patch(wanted: &[(&'static str, String); 2]) -> Value {
    let list: serde_json::Map<String, Value> = wanted
        .iter()
        .map(|(name, value)| ((*name).to_owned(), Value::String(value.clone())))
        .collect();
    json!({ "status": { "capacity": list.clone(), "allocatable": list } })
}

/// Patches the node's status with `wanted`; failures are logged (the next
/// re-check tries again).
pub(crate) async fn publish(nodes: &Api<Node>, node: &str, wanted: &[(&'static str, String); 2]) {
    let (body, params) = (patch(wanted), PatchParams::default());
    let body = Patch::Merge(&body);
    let call = nodes.patch_status(node, &params, &body);
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(Ok(_)) => info!(node, ?wanted, "published the node's GPU capacity"),
        Ok(Err(err)) => warn!(node, "patching the node's GPU capacity failed: {err}"),
        Err(_) => warn!(
            node,
            "patching the node's GPU capacity timed out after {CALL_TIMEOUT:?}"
        ),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::NodeStatus;

    use super::*;

    fn device(id: &str, devmem: i32, devcore: i32, health: bool) -> DeviceInfo {
        DeviceInfo {
            id: id.into(),
            devmem,
            devcore,
            health,
            ..DeviceInfo::default()
        }
    }

    /// The Go plugin's chart: "the healthy GPUs' memory (`amd.com/gpumem`,
    /// MiB) and compute units (`amd.com/gpucores`)"; here from register
    /// entries as HAMi reads them (an MI300X registers 196608 MiB, 304 CUs).
    #[test]
    fn sums_the_healthy_entries_memory_and_cores() {
        let register: Vec<DeviceInfo> = serde_json::from_str(
            r#"[{"id":"a","count":10,"devmem":196608,"devcore":304,"type":"AMD Instinct MI300X","numa":0,"health":true},
                {"id":"b","count":10,"devmem":196608,"devcore":304,"type":"AMD Instinct MI300X","numa":1,"health":true},
                {"id":"c","count":10,"devmem":196608,"devcore":304,"type":"AMD Instinct MI300X","numa":1}]"#,
        )
        .unwrap();
        let wanted = wanted(&register);
        assert_eq!(
            wanted,
            [
                ("amd.com/gpumem", "393216".to_owned()),
                ("amd.com/gpucores", "608".to_owned())
            ],
            "the third entry is unhealthy (no `health`)"
        );
        assert_eq!(
            patch(&wanted),
            json!({"status": {
                "capacity": {"amd.com/gpumem": "393216", "amd.com/gpucores": "608"},
                "allocatable": {"amd.com/gpumem": "393216", "amd.com/gpucores": "608"}}})
        );
        let none = self::wanted(&[device("x", 100, 10, false)]);
        assert_eq!(none[0].1, "0", "no healthy device: 0, not left stale");
    }

    #[test]
    fn writes_only_when_capacity_or_allocatable_differs() {
        let wanted = wanted(&[device("a", 1024, 38, true)]);
        let node = |capacity: &[(&str, &str)], allocatable: &[(&str, &str)]| {
            let list = |l: &[(&str, &str)]| {
                l.iter()
                    .map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned())))
                    .collect()
            };
            Node {
                status: Some(NodeStatus {
                    capacity: Some(list(capacity)),
                    allocatable: Some(list(allocatable)),
                    ..NodeStatus::default()
                }),
                ..Node::default()
            }
        };
        let both = [("amd.com/gpumem", "1024"), ("amd.com/gpucores", "38")];
        assert!(!needs_write(&wanted, Some(&node(&both, &both))));
        assert!(needs_write(&wanted, Some(&node(&both, &both[..1]))));
        let zeroed = [("amd.com/gpumem", "0"), ("amd.com/gpucores", "0")];
        assert!(
            needs_write(&wanted, Some(&node(&zeroed, &zeroed))),
            "kubelet zeroed them"
        );
        assert!(needs_write(&wanted, Some(&Node::default())));
        assert!(needs_write(&wanted, None));
    }
}
