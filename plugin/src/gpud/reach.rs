//! Why the plugin cannot reach amd-gpud, said once, with the fix.
//!
//! Without amd-gpud the plugin lists no device: it stays unready (`/readyz`
//! needs a connected inventory) unless amd-gpud is absent from the node
//! ([`Unreachable::absent`]: a CPU node), where it is ready with no device;
//! either alone tells an operator little.
//! The inventory's follower (`gpud/client.rs`) classifies every failed
//! session or read into an [`Unreachable`], and [`report`] turns a cause that lasts past a
//! grace period (amd-gpud may simply start after the plugin) into one error
//! in the pod's log and one Warning Event on the Node, each naming the
//! command that fixes it; a cause that changes is said again, and a
//! reconnection is said once as a Normal Event.

use std::{fmt, future::Future, time::Duration};

use tokio::{sync::watch, time::Instant};
use tracing::{error, info};

use super::bus::SessionError;
use crate::kube::{Caches, Events, Regarding};

/// The Event reasons.
pub(crate) const UNREACHABLE: &str = "AMDGPUDaemonUnreachable";
pub(crate) const REACHABLE: &str = "AMDGPUDaemonReachable";

/// The bus driver's error names that say who is (not) there.
const ACCESS_DENIED: &str = "org.freedesktop.DBus.Error.AccessDenied";
const SERVICE_UNKNOWN: &str = "org.freedesktop.DBus.Error.ServiceUnknown";
const NAME_HAS_NO_OWNER: &str = "org.freedesktop.DBus.Error.NameHasNoOwner";

/// How the last attempt to reach amd-gpud went.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) enum Reach {
    /// Not tried yet.
    #[default]
    Unknown,
    Connected,
    Unreachable(Unreachable),
}

/// Why amd-gpud cannot be reached, each cause with its own fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Unreachable {
    /// The bus itself cannot be reached (socket not mounted, dbus down).
    NoBus { error: String },
    /// Nobody owns `io.hami.AmdGpu1`: amd-gpud is not installed or not running.
    NotOnBus,
    /// The bus or amd-gpud refused this process's UID.
    Denied { uid: u32, error: String },
    /// The bus accepted the connection, then closed it while authenticating:
    /// dbus-daemon does that to a UID that names no user on the node.
    UnknownUid { uid: u32, error: String },
    /// amd-gpud holds its name but does not answer.
    Hung { waited: Duration },
    /// Anything else; the message says what.
    Failed { error: String },
}

impl Unreachable {
    /// Classifies a failed session or read, for a process running as `uid`.
    pub(crate) fn classify(err: &SessionError, uid: u32) -> Self {
        let error = err.to_string();
        match err {
            SessionError::Connect(e) if handshake_refused(e) => Self::UnknownUid { uid, error },
            SessionError::Connect(_) => Self::NoBus { error },
            SessionError::Timeout(waited) => Self::Hung { waited: *waited },
            SessionError::Api(ipc::ApiError::AccessDenied(_)) => Self::Denied { uid, error },
            SessionError::Bus(e) | SessionError::Api(ipc::ApiError::ZBus(e)) => {
                match error_name(e).as_deref() {
                    Some(ACCESS_DENIED) => Self::Denied { uid, error },
                    Some(SERVICE_UNKNOWN | NAME_HAS_NO_OWNER) => Self::NotOnBus,
                    _ => Self::Failed { error },
                }
            }
            SessionError::Api(_) | SessionError::BusLost => Self::Failed { error },
        }
    }

    /// Whether the cause says amd-gpud is not installed on this node (a node
    /// without AMD GPUs) rather than installed and failing: nobody owns its
    /// bus name, or the bus does not know the package's user
    /// ([`ipc::PLUGIN_UID`], which only the amd-gpud package creates). The
    /// plugin is then ready with no device, as HAMi's Go plugin is on a node
    /// without GPUs, so rollouts finish on CPU nodes (issue 37); every other
    /// cause (no bus, refused, hung, failing, a UID of the operator's own that
    /// names no user) keeps it unready.
    pub(crate) fn absent(&self) -> bool {
        match self {
            Self::NotOnBus => true,
            Self::UnknownUid { uid, .. } => *uid == ipc::PLUGIN_UID,
            Self::NoBus { .. } | Self::Denied { .. } | Self::Hung { .. } | Self::Failed { .. } => {
                false
            }
        }
    }

    /// The cause without its details: a new kind is reported again.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Self::NoBus { .. } => "no-bus",
            Self::NotOnBus => "not-running",
            Self::Denied { .. } => "denied",
            Self::UnknownUid { .. } => "unknown-uid",
            Self::Hung { .. } => "hung",
            Self::Failed { .. } => "failed",
        }
    }
}

/// Whether connecting failed after the socket accepted us: not a missing
/// or unreachable bus, but a bus that closed the connection in the
/// authentication.
fn handshake_refused(err: &zbus::Error) -> bool {
    use std::io::ErrorKind::{AddrNotAvailable, ConnectionRefused, NotFound, PermissionDenied};
    match err {
        zbus::Error::InputOutput(io) => !matches!(
            io.kind(),
            NotFound | ConnectionRefused | PermissionDenied | AddrNotAvailable
        ),
        zbus::Error::Handshake(_) => true,
        _ => false,
    }
}

/// The D-Bus error name of a method error, however zbus wrapped it.
fn error_name(err: &zbus::Error) -> Option<String> {
    match err {
        zbus::Error::MethodError(name, _, _) => Some(name.to_string()),
        zbus::Error::FDO(fdo) => Some(zbus::DBusError::name(fdo.as_ref()).to_string()),
        _ => None,
    }
}

impl fmt::Display for Unreachable {
    /// What is wrong and the command that fixes it, for the log and the Event.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoBus { error } => write!(
                f,
                "cannot reach the node's system bus ({error}): the plugin pod needs the host's \
                 /run/dbus mounted (the chart does this) and dbus running on the node; \
                 check with `systemctl status dbus` on the node"
            ),
            Self::NotOnBus => write!(
                f,
                "amd-gpud is not running on this node (nobody owns {} on the system bus): \
                 install the amd-gpud package on the node (`apt install ./amd-gpud_*.deb`, or \
                 the chart's nodeInstaller) and start it with `systemctl enable --now amd-gpud`; \
                 check with `systemctl status amd-gpud` and `journalctl -u amd-gpud`",
                ipc::BUS_NAME
            ),
            Self::Denied { uid, error } => write!(
                f,
                "the bus refuses this plugin's calls to amd-gpud as UID {uid} ({error}): \
                 the policy /usr/share/dbus-1/system.d/{}.conf lets only the amdgpu-plugin \
                 user (UID 60700) call it, so the chart's runAsUser must be that UID; if the \
                 user was created after dbus read the policy, run `systemctl reload dbus` on \
                 the node; check with `getent passwd amdgpu-plugin`",
                ipc::BUS_NAME
            ),
            Self::UnknownUid { uid, error } => write!(
                f,
                "the system bus closed the connection while authenticating this plugin as \
                 UID {uid} ({error}): dbus-daemon drops a UID that names no user on the node, \
                 and the plugin must run as the amdgpu-plugin user (UID 60700) that the \
                 amd-gpud package creates: set the chart's runAsUser to that UID, and check \
                 with `getent passwd amdgpu-plugin` on the node"
            ),
            Self::Hung { waited } => write!(
                f,
                "amd-gpud holds its bus name but did not answer within {waited:?}: it is hung \
                 or stopped; restart it with `systemctl restart amd-gpud` and look at \
                 `journalctl -u amd-gpud`"
            ),
            Self::Failed { error } => write!(
                f,
                "amd-gpud cannot be read ({error}); look at `journalctl -u amd-gpud` on the node"
            ),
        }
    }
}

/// Where [`report`] sends its Events; `None` without the Kubernetes API
/// (the log line is still written).
#[derive(Clone)]
pub(crate) struct NodeEvents {
    pub(crate) events: Events,
    pub(crate) caches: Caches,
}

impl NodeEvents {
    fn regarding(&self) -> Regarding {
        Regarding::node_of(&self.caches)
    }
}

/// What [`report`] says next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Said {
    Unreachable(Unreachable),
    Reachable,
}

/// The memory behind "once": when the current outage began and which
/// causes were said during it.
#[derive(Debug, Default)]
pub(crate) struct Teller {
    since: Option<Instant>,
    said: Vec<&'static str>,
}

impl Teller {
    /// What to say on seeing `now` at `at`, if anything.
    pub(crate) fn step(&mut self, now: &Reach, at: Instant, grace: Duration) -> Option<Said> {
        match now {
            Reach::Unreachable(cause) => {
                let first = *self.since.get_or_insert(at);
                let due = at.saturating_duration_since(first) >= grace;
                (due && !self.said.contains(&cause.kind())).then(|| {
                    self.said.push(cause.kind());
                    Said::Unreachable(cause.clone())
                })
            }
            Reach::Connected => {
                self.since = None;
                let was_said = !self.said.is_empty();
                self.said.clear();
                was_said.then_some(Said::Reachable)
            }
            Reach::Unknown => None,
        }
    }

    /// When an outage that has not been said yet becomes due.
    fn due(&self, grace: Duration) -> Option<Instant> {
        self.since
            .filter(|_| self.said.is_empty())
            .map(|since| since + grace)
    }
}

/// Follows `reach` until `shutdown`: a cause that lasts `grace` is said once
/// (log and Warning Event), each other cause of the same outage once too,
/// the recovery once.
pub(crate) async fn report(
    mut reach: watch::Receiver<Reach>,
    sink: Option<NodeEvents>,
    grace: Duration,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let mut teller = Teller::default();
    loop {
        let now = reach.borrow_and_update().clone();
        match teller.step(&now, Instant::now(), grace) {
            Some(Said::Unreachable(cause)) => say_unreachable(&cause, sink.as_ref()),
            Some(Said::Reachable) => say_reachable(sink.as_ref()),
            None => {}
        }
        let due = teller.due(grace);
        tokio::select! {
            () = &mut shutdown => return,
            changed = reach.changed() => if changed.is_err() { return },
            () = sleep_until_some(due) => {}
        }
    }
}

async fn sleep_until_some(due: Option<Instant>) {
    match due {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn say_unreachable(cause: &Unreachable, sink: Option<&NodeEvents>) {
    error!(cause = cause.kind(), "{cause}");
    if let Some(sink) = sink {
        let note = format!("amd-device-plugin stays unready: {cause}");
        sink.events
            .warning(&sink.regarding(), UNREACHABLE, "Connect", note);
    }
}

fn say_reachable(sink: Option<&NodeEvents>) {
    info!("amd-gpud answers again");
    if let Some(sink) = sink {
        let note = "amd-device-plugin reaches amd-gpud again".to_owned();
        sink.events
            .normal(&sink.regarding(), REACHABLE, "Connect", note);
    }
}

#[cfg(test)]
mod tests;
