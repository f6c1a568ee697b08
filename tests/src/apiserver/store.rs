//! The object store: objects as JSON, one global resourceVersion counter, a bounded event
//! history for watches, and the write rules (preconditions, status/spec split, no-op writes).

use std::collections::{BTreeMap, VecDeque};

use serde_json::{Value, json};

use super::{Kind, merge::merge_patch, select::Selector};

/// How many write events a watch can be behind before it gets `410 Expired`.
pub(crate) const HISTORY_LIMIT: usize = 1000;

/// A failed request, rendered as a `Status` object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Failure {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
}

impl Failure {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
        }
    }

    pub fn not_found(kind: Kind, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", kind.resource()),
        )
    }

    pub fn conflict(kind: Kind, name: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; \
                 please apply your changes to the latest version and try again",
                kind.resource()
            ),
        )
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }
}

/// Where a write lands: the main resource or its `status` subresource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sub {
    Main,
    Status,
    /// Test hooks: everything the client may change, status and spec alike.
    Whole,
}

/// `(kind, namespace, name)`; the namespace is empty for cluster-scoped kinds. The ordering
/// is the API server's list order (its storage keys sort by namespace, then name).
pub(crate) type Key = (Kind, String, String);

/// One write, as a watch replays it.
#[derive(Debug, Clone)]
pub(crate) struct Change {
    pub rv: u64,
    pub kind: Kind,
    pub namespace: String,
    /// `ADDED`, `MODIFIED` or `DELETED`.
    pub kind_of_change: &'static str,
    pub object: Value,
    /// The object before a modification, to turn it into ADDED/DELETED for selector watches.
    pub previous: Option<Value>,
}

#[derive(Debug, Default)]
pub(crate) struct Store {
    pub rv: u64,
    uid_counter: u64,
    pub objects: BTreeMap<Key, Value>,
    pub history: VecDeque<Change>,
    /// Watches from a resourceVersion below this one have lost events: 410.
    pub compacted_through: u64,
}

pub(crate) fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata")?.get(field)?.as_str()
}

fn set_meta(obj: &mut Value, field: &str, value: Value) {
    if let Some(map) = obj.as_object_mut() {
        let meta = map.entry("metadata").or_insert_with(|| json!({}));
        if !meta.is_object() {
            *meta = json!({});
        }
        if let Some(meta) = meta.as_object_mut() {
            meta.insert(field.to_owned(), value);
        }
    }
}

fn remove_meta(obj: &mut Value, field: &str) {
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove(field);
    }
}

/// `metadata.resourceVersion` of a request body, when it carries one (a precondition).
fn precondition(body: &Value) -> Option<&str> {
    meta_str(body, "resourceVersion").filter(|rv| !rv.is_empty())
}

impl Store {
    fn next_rv(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    fn record(&mut self, change: Change) {
        self.history.push_back(change);
        while self.history.len() > HISTORY_LIMIT {
            if let Some(old) = self.history.pop_front() {
                self.compacted_through = old.rv;
            }
        }
    }

    /// Drops the whole watch history: a watch from any earlier resourceVersion gets 410.
    pub fn compact(&mut self) {
        self.history.clear();
        self.compacted_through = self.rv;
    }

    pub fn get(&self, kind: Kind, ns: &str, name: &str) -> Option<&Value> {
        self.objects.get(&(kind, ns.to_owned(), name.to_owned()))
    }

    /// Objects of `kind` in `ns` (all namespaces when `None`) matching `selector`.
    pub fn list(&self, kind: Kind, ns: Option<&str>, selector: &Selector) -> Vec<Value> {
        self.objects
            .iter()
            .filter(|((k, n, _), obj)| {
                *k == kind && ns.is_none_or(|ns| ns == n) && selector.matches(obj)
            })
            .map(|(_, obj)| obj.clone())
            .collect()
    }

    fn stamp_new(&mut self, kind: Kind, obj: &mut Value) {
        self.uid_counter += 1;
        if !obj.is_object() {
            *obj = json!({});
        }
        if let Some(map) = obj.as_object_mut() {
            map.insert("kind".into(), kind.kind().into());
            map.insert("apiVersion".into(), kind.api_version().into());
        }
        let uid = format!("00000000-0000-4000-8000-{:012x}", self.uid_counter);
        set_meta(obj, "uid", uid.into());
        set_meta(obj, "creationTimestamp", now_rfc3339().into());
    }

    /// Creates an object; `409 AlreadyExists` when the name is taken.
    pub fn create(&mut self, kind: Kind, ns: &str, mut obj: Value) -> Result<Value, Failure> {
        if !obj.is_object() {
            return Err(Failure::bad_request("the body is not a JSON object"));
        }
        let name = match meta_str(&obj, "name").filter(|n| !n.is_empty()) {
            Some(name) => name.to_owned(),
            None => match meta_str(&obj, "generateName") {
                Some(prefix) => format!("{prefix}{:05x}", self.uid_counter + 1),
                None => {
                    return Err(Failure::new(
                        422,
                        "Invalid",
                        "metadata.name: Required value",
                    ));
                }
            },
        };
        match meta_str(&obj, "namespace") {
            Some(body_ns) if kind.namespaced() && !body_ns.is_empty() && body_ns != ns => {
                return Err(Failure::bad_request(
                    "the namespace of the provided object does not match the namespace sent on \
                     the request",
                ));
            }
            _ => {}
        }
        let key = (kind, ns.to_owned(), name.clone());
        if self.objects.contains_key(&key) {
            return Err(Failure::new(
                409,
                "AlreadyExists",
                format!("{} \"{name}\" already exists", kind.resource()),
            ));
        }
        set_meta(&mut obj, "name", name.into());
        if kind.namespaced() {
            set_meta(&mut obj, "namespace", ns.into());
        }
        if kind == Kind::Pod && obj.pointer("/status/phase").is_none() {
            merge_patch(&mut obj, &json!({"status": {"phase": "Pending"}}));
        }
        Ok(self.insert_new(key, obj))
    }

    fn insert_new(&mut self, key: Key, mut obj: Value) -> Value {
        self.stamp_new(key.0, &mut obj);
        let rv = self.next_rv();
        set_meta(&mut obj, "resourceVersion", rv.to_string().into());
        self.record(Change {
            rv,
            kind: key.0,
            namespace: key.1.clone(),
            kind_of_change: "ADDED",
            object: obj.clone(),
            previous: None,
        });
        self.objects.insert(key, obj.clone());
        obj
    }

    /// Stores `new` as the next version of an existing object, keeping what the client may not
    /// change. A write that changes nothing is not a write: no new resourceVersion, no event.
    fn write(&mut self, key: Key, sub: Sub, mut new: Value) -> Result<Value, Failure> {
        let Some(old) = self.objects.get(&key).cloned() else {
            return Err(Failure::not_found(key.0, &key.2));
        };
        if !new.is_object() {
            return Err(Failure::bad_request("the body is not a JSON object"));
        }
        for field in ["name", "namespace", "uid", "creationTimestamp"] {
            match old.get("metadata").and_then(|m| m.get(field)) {
                Some(value) => set_meta(&mut new, field, value.clone()),
                None => remove_meta(&mut new, field),
            }
        }
        if let Some(map) = new.as_object_mut() {
            map.insert("kind".into(), key.0.kind().into());
            map.insert("apiVersion".into(), key.0.api_version().into());
            // Pods and nodes: the main resource ignores status, the status subresource
            // ignores spec.
            let kept = match sub {
                Sub::Main if key.0.has_status() => Some("status"),
                Sub::Status => Some("spec"),
                Sub::Main | Sub::Whole => None,
            };
            if let Some(field) = kept {
                match old.get(field) {
                    Some(value) => map.insert(field.into(), value.clone()),
                    None => map.remove(field),
                };
            }
        }
        set_meta(
            &mut new,
            "resourceVersion",
            old["metadata"]["resourceVersion"].clone(),
        );
        if new == old {
            return Ok(old);
        }
        let rv = self.next_rv();
        set_meta(&mut new, "resourceVersion", rv.to_string().into());
        self.record(Change {
            rv,
            kind: key.0,
            namespace: key.1.clone(),
            kind_of_change: "MODIFIED",
            object: new.clone(),
            previous: Some(old),
        });
        self.objects.insert(key, new.clone());
        Ok(new)
    }

    fn check_preconditions(&self, key: &Key, body: &Value) -> Result<Value, Failure> {
        let Some(stored) = self.objects.get(key) else {
            return Err(Failure::not_found(key.0, &key.2));
        };
        if let Some(rv) = precondition(body)
            && Some(rv) != meta_str(stored, "resourceVersion")
        {
            return Err(Failure::conflict(key.0, &key.2));
        }
        if let Some(uid) = meta_str(body, "uid")
            && Some(uid) != meta_str(stored, "uid")
        {
            return Err(Failure::conflict(key.0, &key.2));
        }
        Ok(stored.clone())
    }

    /// A JSON merge patch (RFC 7386), guarded by `metadata.resourceVersion` in the patch.
    pub fn patch(&mut self, key: Key, sub: Sub, patch: &Value) -> Result<Value, Failure> {
        if !patch.is_object() {
            return Err(Failure::bad_request("the patch is not a JSON object"));
        }
        let mut merged = self.check_preconditions(&key, patch)?;
        merge_patch(&mut merged, patch);
        self.write(key, sub, merged)
    }

    /// A replace (PUT), guarded by `metadata.resourceVersion` in the body when present.
    pub fn replace(&mut self, key: Key, sub: Sub, body: Value) -> Result<Value, Failure> {
        self.check_preconditions(&key, &body)?;
        self.write(key, sub, body)
    }

    /// Deletes an object at once (no graceful deletion); answers the deleted object.
    pub fn delete(&mut self, key: &Key) -> Result<Value, Failure> {
        let Some(mut obj) = self.objects.remove(key) else {
            return Err(Failure::not_found(key.0, &key.2));
        };
        let rv = self.next_rv();
        set_meta(&mut obj, "resourceVersion", rv.to_string().into());
        self.record(Change {
            rv,
            kind: key.0,
            namespace: key.1.clone(),
            kind_of_change: "DELETED",
            object: obj.clone(),
            previous: None,
        });
        Ok(obj)
    }

    /// The `pods/binding` subresource: sets `spec.nodeName` once, copies the binding's
    /// annotations onto the pod.
    pub fn bind(&mut self, ns: &str, name: &str, binding: &Value) -> Result<(), Failure> {
        let key = (Kind::Pod, ns.to_owned(), name.to_owned());
        let Some(pod) = self.objects.get(&key) else {
            return Err(Failure::not_found(Kind::Pod, name));
        };
        let Some(node) = binding.pointer("/target/name").and_then(Value::as_str) else {
            return Err(Failure::new(422, "Invalid", "target.name: Required value"));
        };
        if let Some(current) = pod.pointer("/spec/nodeName").and_then(Value::as_str)
            && !current.is_empty()
        {
            return Err(Failure::new(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on pods/binding \"{name}\": pod {name} is already assigned to node \"{current}\""
                ),
            ));
        }
        let mut patch = json!({"spec": {"nodeName": node}});
        if let Some(annotations) = binding.pointer("/metadata/annotations") {
            patch["metadata"] = json!({"annotations": annotations});
        }
        let mut bound = pod.clone();
        merge_patch(&mut bound, &patch);
        self.write(key, Sub::Main, bound).map(drop)
    }

    /// Test hook: creates the object or replaces it whole (status included), no precondition.
    pub fn put(&mut self, kind: Kind, mut obj: Value) -> Result<Value, Failure> {
        let name = meta_str(&obj, "name")
            .filter(|n| !n.is_empty())
            .ok_or_else(|| Failure::new(422, "Invalid", "metadata.name: Required value"))?
            .to_owned();
        let ns = if kind.namespaced() {
            meta_str(&obj, "namespace")
                .filter(|n| !n.is_empty())
                .unwrap_or("default")
                .to_owned()
        } else {
            String::new()
        };
        if kind.namespaced() {
            set_meta(&mut obj, "namespace", ns.clone().into());
        }
        let key = (kind, ns, name);
        if self.objects.contains_key(&key) {
            remove_meta(&mut obj, "resourceVersion");
            self.write(key, Sub::Whole, obj)
        } else {
            Ok(self.insert_new(key, obj))
        }
    }

    /// Events after `rv` for one kind, or `None` when they were compacted away.
    pub fn changes_since(&self, rv: u64, kind: Kind) -> Option<Vec<Change>> {
        if rv < self.compacted_through {
            return None;
        }
        Some(
            self.history
                .iter()
                .filter(|c| c.rv > rv && c.kind == kind)
                .cloned()
                .collect(),
        )
    }
}

/// The current time as the API server writes it: `2006-01-02T15:04:05Z`.
pub(crate) fn now_rfc3339() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    rfc3339(secs)
}

/// Unix time `secs` as Go's `time.RFC3339` in UTC (`2026-11-29T08:00:00Z`).
pub fn rfc3339(secs: u64) -> String {
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}
