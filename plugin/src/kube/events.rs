//! Kubernetes Events (events.k8s.io/v1) from the plugin, sent off the hot
//! path: publishing runs in its own task with the call timeout, and a failure
//! is logged, never returned to the caller that asked for the Event.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::{
    Client,
    runtime::events::{Event, EventType, Recorder, Reporter},
};
use tracing::{Instrument, info_span, warn};

use super::CALL_TIMEOUT;

/// The name Events are reported under.
pub(crate) const CONTROLLER: &str = "amd-device-plugin";

/// What an Event is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Regarding {
    Pod {
        namespace: String,
        name: String,
        uid: String,
    },
    Node {
        name: String,
        uid: String,
    },
}

impl Regarding {
    /// This plugin's node, with its UID when the cache holds the node.
    pub(crate) fn node_of(caches: &super::Caches) -> Self {
        Self::Node {
            name: caches.node_name.clone(),
            uid: caches
                .node()
                .and_then(|n| n.metadata.uid.clone())
                .unwrap_or_default(),
        }
    }

    fn reference(&self) -> ObjectReference {
        match self {
            Self::Pod {
                namespace,
                name,
                uid,
            } => ObjectReference {
                api_version: Some("v1".to_owned()),
                kind: Some("Pod".to_owned()),
                namespace: Some(namespace.clone()),
                name: Some(name.clone()),
                uid: Some(uid.clone()).filter(|u| !u.is_empty()),
                ..ObjectReference::default()
            },
            Self::Node { name, uid } => ObjectReference {
                api_version: Some("v1".to_owned()),
                kind: Some("Node".to_owned()),
                name: Some(name.clone()),
                uid: Some(uid.clone()).filter(|u| !u.is_empty()),
                ..ObjectReference::default()
            },
        }
    }
}

/// Publishes Events for this node's plugin instance.
#[derive(Clone)]
pub(crate) struct Events {
    recorder: Recorder,
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Events").finish_non_exhaustive()
    }
}

impl Events {
    /// Events reported by `amd-device-plugin` on `node_name`.
    pub(crate) fn new(client: Client, node_name: &str) -> Self {
        let reporter = Reporter {
            controller: CONTROLLER.to_owned(),
            instance: Some(format!("{CONTROLLER}-{node_name}")),
        };
        Self {
            recorder: Recorder::new(client, reporter),
        }
    }

    /// Sends a Warning Event in the background.
    pub(crate) fn warning(&self, regarding: &Regarding, reason: &str, action: &str, note: String) {
        self.send(EventType::Warning, regarding, reason, action, note);
    }

    /// Sends a Normal Event in the background.
    pub(crate) fn normal(&self, regarding: &Regarding, reason: &str, action: &str, note: String) {
        self.send(EventType::Normal, regarding, reason, action, note);
    }

    fn send(
        &self,
        type_: EventType,
        regarding: &Regarding,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let recorder = self.recorder.clone();
        let reference = regarding.reference();
        let event = Event {
            type_,
            reason: reason.to_owned(),
            // The API server refuses notes over 1 kB.
            note: Some(truncate(note, 1000)),
            action: action.to_owned(),
            secondary: None,
        };
        let span = info_span!("event", reason, object = ?reference.name);
        tokio::spawn(
            async move {
                match tokio::time::timeout(CALL_TIMEOUT, recorder.publish(&event, &reference)).await
                {
                    Ok(Ok(())) => {}
                    Ok(Err(err)) => warn!("could not publish the Event: {err}"),
                    Err(_) => warn!("publishing the Event timed out after {CALL_TIMEOUT:?}"),
                }
            }
            .instrument(span),
        );
    }
}

fn truncate(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut cut = max.saturating_sub(3);
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push_str("...");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_notes_are_cut_on_a_character_boundary() {
        let note = "é".repeat(800);
        let cut = truncate(note, 1000);
        assert!(cut.len() <= 1000 && cut.ends_with("..."));
        assert_eq!(truncate("short".to_owned(), 1000), "short");
    }

    #[test]
    fn references_name_the_object() {
        let pod = Regarding::Pod {
            namespace: "ns".into(),
            name: "p".into(),
            uid: String::new(),
        };
        let r = pod.reference();
        assert_eq!(
            (
                r.kind.as_deref(),
                r.namespace.as_deref(),
                r.name.as_deref(),
                r.uid
            ),
            (Some("Pod"), Some("ns"), Some("p"), None)
        );
    }
}
