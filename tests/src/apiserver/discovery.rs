//! The discovery documents kubectl reads before anything else (`/api`,
//! `/apis`, `/api/v1`, `/apis/events.k8s.io/v1`), in their legacy JSON form:
//! what the fake serves and nothing more.

use serde_json::{Value, json};

/// The discovery document at `path`, if it is one.
pub(crate) fn document(path: &str) -> Option<Value> {
    Some(match path.trim_end_matches('/') {
        "/api" => json!({"kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": []}),
        "/apis" => json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [{
            "name": "events.k8s.io",
            "versions": [{"groupVersion": "events.k8s.io/v1", "version": "v1"}],
            "preferredVersion": {"groupVersion": "events.k8s.io/v1", "version": "v1"}}]}),
        "/api/v1" => resources(
            "v1",
            &[
                resource("nodes", "Node", false, &["no"]),
                resource("nodes/status", "Node", false, &[]),
                resource("pods", "Pod", true, &["po"]),
                resource("pods/status", "Pod", true, &[]),
                resource("pods/binding", "Binding", true, &[]),
                resource("events", "Event", true, &["ev"]),
            ],
        ),
        "/apis/events.k8s.io/v1" => resources(
            "events.k8s.io/v1",
            &[resource("events", "Event", true, &["ev"])],
        ),
        _ => return None,
    })
}

fn resources(group_version: &str, list: &[Value]) -> Value {
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version,
           "resources": list})
}

fn resource(name: &str, kind: &str, namespaced: bool, short: &[&str]) -> Value {
    let sub = name.contains('/');
    let verbs: &[&str] = if sub {
        &["get", "patch", "update", "create"]
    } else {
        &[
            "create", "delete", "get", "list", "patch", "update", "watch",
        ]
    };
    let singular = if sub { "" } else { kind };
    json!({"name": name, "singularName": singular.to_lowercase(), "namespaced": namespaced,
           "kind": kind, "verbs": verbs, "shortNames": short})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents() {
        assert_eq!(document("/api").unwrap()["versions"][0], "v1");
        let v1 = document("/api/v1/").unwrap();
        let names: Vec<&str> = v1["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        assert!(names.contains(&"nodes") && names.contains(&"pods"));
        assert!(document("/api/v1/pods").is_none());
    }
}
