//! The HTTP side: accept loop, routing, verbs, and the streaming watch.

use std::{
    collections::{HashMap, VecDeque},
    convert::Infallible,
    io,
    sync::Arc,
    time::Duration,
};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody, combinators::UnsyncBoxBody};
use hyper::{
    Method, Request, Response, StatusCode,
    body::{Frame, Incoming},
    header::CONTENT_TYPE,
    server::conn::http1,
    service::service_fn,
};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::{net::TcpListener, sync::oneshot, time::Instant};

use super::{
    Kind, Shared,
    select::Selector,
    store::{Failure, Key, Sub},
};

pub(crate) type Body = UnsyncBoxBody<Bytes, io::Error>;

/// How long a watch without `timeoutSeconds` lasts (the real server picks 30 to 60 minutes).
const DEFAULT_WATCH_SECONDS: u64 = 1800;

fn aborted() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        "fake API server set unreachable",
    )
}

/// Accepts connections until `stop` fires. While unreachable, connections are closed at once.
pub(crate) async fn serve(
    listener: TcpListener,
    shared: Arc<Shared>,
    mut stop: oneshot::Receiver<()>,
) {
    loop {
        tokio::select! {
            _ = &mut stop => return,
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                if shared.is_unreachable() {
                    drop(stream);
                    continue;
                }
                let shared = Arc::clone(&shared);
                tokio::spawn(async move {
                    let service = service_fn(move |req| handle(Arc::clone(&shared), req));
                    // A failed connection (the client went away, or we aborted it) is no news.
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        }
    }
}

async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Result<Response<Body>, io::Error> {
    if shared.is_unreachable() {
        // An error from the service makes hyper drop the connection without an answer.
        return Err(aborted());
    }
    if shared.is_blackholed() {
        shared.blackhole_lifted().await;
        return Err(aborted());
    }
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let query = parse_query(req.uri().query().unwrap_or(""));
    let content_type = req
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let body = req
        .into_body()
        .collect()
        .await
        .map_err(io::Error::other)?
        .to_bytes();
    let request = Req {
        method,
        query,
        content_type,
        body,
    };
    Ok(route(&shared, &path, &request).unwrap_or_else(|failure| status_response(&failure)))
}

struct Req {
    method: Method,
    query: HashMap<String, String>,
    content_type: String,
    body: Bytes,
}

impl Req {
    fn param(&self, key: &str) -> Option<&str> {
        self.query.get(key).map(String::as_str)
    }

    fn json(&self) -> Result<Value, Failure> {
        serde_json::from_slice(&self.body)
            .map_err(|e| Failure::bad_request(format!("the request body is not JSON: {e}")))
    }
}

/// A parsed resource path.
struct Route {
    kind: Kind,
    namespace: Option<String>,
    name: Option<String>,
    sub: Option<String>,
}

impl Route {
    fn key(&self) -> Option<Key> {
        Some((
            self.kind,
            self.namespace.clone().unwrap_or_default(),
            self.name.clone()?,
        ))
    }

    fn resource(&self) -> String {
        match &self.sub {
            Some(sub) => format!("{}/{sub}", self.kind.resource()),
            None => self.kind.resource().to_owned(),
        }
    }
}

fn parse_path(path: &str) -> Option<Route> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (core, rest) = match parts.as_slice() {
        ["api", "v1", rest @ ..] => (true, rest),
        ["apis", "events.k8s.io", "v1", rest @ ..] => (false, rest),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some((*ns).to_owned()), rest),
        _ => (None, rest),
    };
    let (resource, name, sub) = match rest {
        [resource] => (*resource, None, None),
        [resource, name] => (*resource, Some((*name).to_owned()), None),
        [resource, name, sub] => (*resource, Some((*name).to_owned()), Some((*sub).to_owned())),
        _ => return None,
    };
    let kind = match (core, resource) {
        (true, "nodes") => Kind::Node,
        (true, "pods") => Kind::Pod,
        (true, "events") => Kind::Event,
        (false, "events") => Kind::EventV1,
        _ => return None,
    };
    // A namespaced object needs its namespace; a cluster-scoped one has none.
    if (kind.namespaced() && name.is_some() && namespace.is_none())
        || (!kind.namespaced() && namespace.is_some())
    {
        return None;
    }
    Some(Route {
        kind,
        namespace,
        name,
        sub,
    })
}

fn route(shared: &Arc<Shared>, path: &str, req: &Req) -> Result<Response<Body>, Failure> {
    if path == "/version" && req.method == Method::GET {
        let version = json!({"major": "1", "minor": "34", "gitVersion": "v1.34.0-fake"});
        return Ok(json_response(StatusCode::OK, &version));
    }
    if req.method == Method::GET
        && let Some(document) = super::discovery::document(path)
    {
        return Ok(json_response(StatusCode::OK, &document));
    }
    let route = parse_path(path).ok_or_else(|| {
        Failure::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    })?;
    let sub = match route.sub.as_deref() {
        None => Sub::Main,
        Some("status") if route.kind.has_status() => Sub::Status,
        Some("binding") if route.kind == Kind::Pod && req.method == Method::POST => Sub::Main,
        Some(_) => {
            return Err(Failure::new(
                404,
                "NotFound",
                "the server could not find the requested resource",
            ));
        }
    };
    let watching = matches!(req.param("watch"), Some("true" | "1"));
    let verb = match (&req.method, route.name.is_some()) {
        (&Method::GET, false) if watching => "watch",
        (&Method::GET, false) => "list",
        (&Method::GET, true) => "get",
        (&Method::POST, _) => "post",
        (&Method::PUT, true) => "put",
        (&Method::PATCH, true) => "patch",
        (&Method::DELETE, true) => "delete",
        _ => {
            return Err(Failure::new(
                405,
                "MethodNotAllowed",
                "the server does not allow this method on the requested resource",
            ));
        }
    };
    shared.count(verb, &route.resource());
    let key = route.key();
    match (verb, key) {
        ("watch", _) => watch(shared, &route, req),
        ("list", _) => list(shared, &route, req),
        ("get", Some(key)) => shared
            .with_store(|s| s.get(key.0, &key.1, &key.2).cloned())
            .map(|obj| json_response(StatusCode::OK, &obj))
            .ok_or_else(|| Failure::not_found(key.0, &key.2)),
        ("post", None) => create(shared, &route, req),
        ("post", Some(key)) => {
            let binding = req.json()?;
            shared.with_store(|s| s.bind(&key.1, &key.2, &binding))?;
            Ok(json_response(
                StatusCode::CREATED,
                &json!({
                    "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201,
                }),
            ))
        }
        ("put", Some(key)) => {
            let body = req.json()?;
            let obj = shared.with_store(|s| s.replace(key, sub, body))?;
            Ok(json_response(StatusCode::OK, &obj))
        }
        ("patch", Some(key)) => patch(shared, key, sub, req),
        ("delete", Some(key)) => {
            let obj = shared.with_store(|s| s.delete(&key))?;
            Ok(json_response(StatusCode::OK, &obj))
        }
        _ => Err(Failure::new(405, "MethodNotAllowed", "unsupported request")),
    }
}

fn create(shared: &Shared, route: &Route, req: &Req) -> Result<Response<Body>, Failure> {
    let namespace = match (&route.namespace, route.kind.namespaced()) {
        (Some(ns), true) => ns.clone(),
        (None, false) => String::new(),
        _ => {
            return Err(Failure::bad_request(
                "a namespaced object is created in its namespace",
            ));
        }
    };
    let body = req.json()?;
    let obj = shared.with_store(|s| s.create(route.kind, &namespace, body))?;
    Ok(json_response(StatusCode::CREATED, &obj))
}

fn patch(shared: &Shared, key: Key, sub: Sub, req: &Req) -> Result<Response<Body>, Failure> {
    let media = req.content_type.split(';').next().unwrap_or("").trim();
    match media {
        // A strategic merge patch is a merge patch here: lists are replaced, not merged by
        // key, and `$patch` directives are not interpreted.
        "application/merge-patch+json" | "application/strategic-merge-patch+json" => {}
        other => {
            return Err(Failure::new(
                415,
                "UnsupportedMediaType",
                format!(
                    "the body of the request was in an unknown format - accepted media types include: application/merge-patch+json, application/strategic-merge-patch+json (got {other:?})"
                ),
            ));
        }
    }
    let body = req.json()?;
    let obj = shared.with_store(|s| s.patch(key, sub, &body))?;
    Ok(json_response(StatusCode::OK, &obj))
}

fn selector(req: &Req) -> Result<Selector, Failure> {
    Selector::parse(req.param("fieldSelector"), req.param("labelSelector"))
}

/// Items of a list carry no `kind`/`apiVersion`, as from the real server.
fn strip_type(mut obj: Value) -> Value {
    if let Some(map) = obj.as_object_mut() {
        map.remove("kind");
        map.remove("apiVersion");
    }
    obj
}

fn list(shared: &Shared, route: &Route, req: &Req) -> Result<Response<Body>, Failure> {
    let selector = selector(req)?;
    let (rv, items) = shared.with_store(|s| {
        (
            s.rv,
            s.list(route.kind, route.namespace.as_deref(), &selector),
        )
    });
    let list = json!({
        "kind": format!("{}List", route.kind.kind()),
        "apiVersion": route.kind.api_version(),
        "metadata": {"resourceVersion": rv.to_string()},
        "items": items.into_iter().map(strip_type).collect::<Vec<_>>(),
    });
    Ok(json_response(StatusCode::OK, &list))
}

/// One open watch: what it filters on, how far it got, and the lines waiting to go out.
struct Watch {
    shared: Arc<Shared>,
    kind: Kind,
    namespace: Option<String>,
    selector: Selector,
    last_rv: u64,
    deadline: Instant,
    bookmarks: bool,
    /// Lines waiting to go out, each with the instant it may.
    queue: VecDeque<(Instant, Bytes)>,
    done: bool,
    changed: tokio::sync::watch::Receiver<u64>,
}

/// One watch event line, `type` first as the real API server writes it
/// (its `WatchEvent` struct has `type` before `object`); clients that read
/// the type first need not buffer the object.
fn event_line(kind_of_change: &str, object: &Value) -> Bytes {
    let kind = Value::String(kind_of_change.to_owned());
    Bytes::from(format!("{{\"type\":{kind},\"object\":{object}}}\n"))
}

impl Watch {
    /// Queues `line` to go out after the lag knob's delay, and never before
    /// the line queued before it.
    fn push(&mut self, line: Bytes) {
        let due = Instant::now() + self.shared.next_watch_delay();
        let due = self.queue.back().map_or(due, |(last, _)| due.max(*last));
        self.queue.push_back((due, line));
    }

    /// Queues the events after `last_rv`, or a 410 `Expired` error when they are gone.
    fn poll_store(&mut self) {
        let shared = Arc::clone(&self.shared);
        let store = shared.lock_store();
        let Some(changes) = store.changes_since(self.last_rv, self.kind) else {
            let status = json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": format!("too old resource version: {} ({})", self.last_rv, store.compacted_through + 1),
                "reason": "Expired", "code": 410,
            });
            self.push(event_line("ERROR", &status));
            self.done = true;
            return;
        };
        for change in changes {
            if self
                .namespace
                .as_ref()
                .is_some_and(|ns| *ns != change.namespace)
            {
                continue;
            }
            let now = self.selector.matches(&change.object);
            let before = change.previous.as_ref().map(|p| self.selector.matches(p));
            // Like the watch cache: an object entering the selector is ADDED, one leaving
            // it is DELETED.
            let sent = match (change.kind_of_change, before, now) {
                ("MODIFIED", Some(false), true) => "ADDED",
                ("MODIFIED", Some(true), false) => "DELETED",
                (_, _, false) => continue,
                (kind_of_change, _, true) => kind_of_change,
            };
            self.push(event_line(sent, &change.object));
        }
        self.last_rv = store.rv;
    }

    async fn next(mut self) -> Option<(Result<Frame<Bytes>, io::Error>, Self)> {
        loop {
            if self.shared.is_blackholed() {
                self.shared.blackhole_lifted().await;
                self.done = true;
                return Some((Err(aborted()), self));
            }
            if let Some((due, _)) = self.queue.front() {
                tokio::time::sleep_until(*due).await;
            }
            if let Some((_, line)) = self.queue.pop_front() {
                return Some((Ok(Frame::data(line)), self));
            }
            if self.done {
                return None;
            }
            if self.shared.is_unreachable() {
                self.done = true;
                return Some((Err(aborted()), self));
            }
            self.changed.borrow_and_update();
            self.poll_store();
            if !self.queue.is_empty() || self.done {
                continue;
            }
            tokio::select! {
                changed = self.changed.changed() => self.done = changed.is_err(),
                () = tokio::time::sleep_until(self.deadline) => {
                    if self.bookmarks {
                        let bookmark = json!({
                            "kind": self.kind.kind(), "apiVersion": self.kind.api_version(),
                            "metadata": {"resourceVersion": self.last_rv.to_string()},
                        });
                        self.push(event_line("BOOKMARK", &bookmark));
                    }
                    self.done = true;
                }
            }
        }
    }
}

fn watch(shared: &Arc<Shared>, route: &Route, req: &Req) -> Result<Response<Body>, Failure> {
    let selector = selector(req)?;
    let seconds = match req.param("timeoutSeconds") {
        Some(s) => s
            .parse()
            .map_err(|_| Failure::bad_request(format!("invalid timeoutSeconds {s:?}")))?,
        None => DEFAULT_WATCH_SECONDS,
    };
    let mut watch = Watch {
        shared: Arc::clone(shared),
        kind: route.kind,
        namespace: route.namespace.clone(),
        selector,
        last_rv: 0,
        deadline: Instant::now() + Duration::from_secs(seconds),
        bookmarks: matches!(req.param("allowWatchBookmarks"), Some("true" | "1")),
        queue: VecDeque::new(),
        done: false,
        changed: shared.subscribe(),
    };
    match req.param("resourceVersion").unwrap_or("") {
        // "Start at most recent" / "any": the current state as ADDED events, then changes.
        "" | "0" => {
            let store = shared.lock_store();
            for obj in store.list(route.kind, route.namespace.as_deref(), &watch.selector) {
                watch.push(event_line("ADDED", &obj));
            }
            watch.last_rv = store.rv;
        }
        rv => {
            watch.last_rv = rv
                .parse()
                .map_err(|_| Failure::bad_request(format!("invalid resourceVersion {rv:?}")))?;
        }
    }
    let stream = futures_util::stream::unfold(watch, Watch::next);
    let body = StreamBody::new(stream).boxed_unsync();
    let mut response = Response::new(body);
    response.headers_mut().insert(
        CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    Ok(response)
}

fn json_response(code: StatusCode, value: &Value) -> Response<Body> {
    let body = Full::new(Bytes::from(value.to_string()))
        .map_err(|never: Infallible| match never {})
        .boxed_unsync();
    let mut response = Response::new(body);
    *response.status_mut() = code;
    response.headers_mut().insert(
        CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    response
}

fn status_response(failure: &Failure) -> Response<Body> {
    let status = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": failure.message, "reason": failure.reason, "code": failure.code,
    });
    let code = StatusCode::from_u16(failure.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    json_response(code, &status)
}

/// Splits and percent-decodes a query string (`+` is a space).
fn parse_query(query: &str) -> HashMap<String, String> {
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::{Value, event_line, json, parse_path, percent_decode};

    #[test]
    fn decodes_queries_and_paths() {
        assert_eq!(
            percent_decode("spec.nodeName%3Dn1%2Cx+y"),
            "spec.nodeName=n1,x y"
        );
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("a%2"), "a%2");
        assert!(parse_path("/api/v1/namespaces/ns/pods/p/status").is_some());
        assert!(parse_path("/api/v1/pods").is_some());
        assert!(
            parse_path("/api/v1/pods/p").is_none(),
            "a pod needs a namespace"
        );
        assert!(parse_path("/api/v1/namespaces/ns/nodes").is_none());
        assert!(parse_path("/apis/apps/v1/deployments").is_none());
    }

    #[test]
    fn event_lines_name_the_type_before_the_object() {
        let line = event_line("MODIFIED", &json!({"metadata": {"name": "p\"1"}}));
        let text = std::str::from_utf8(&line).unwrap();
        assert!(
            text.starts_with(r#"{"type":"MODIFIED","object":{"#),
            "{text}"
        );
        assert!(text.ends_with("}\n"));
        let parsed: Value = serde_json::from_str(text).unwrap();
        assert_eq!(parsed["object"]["metadata"]["name"], "p\"1");
    }
}
