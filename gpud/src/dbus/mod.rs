//! The D-Bus adapter: `io.hami.AmdGpu1` on the system bus (or any address),
//! the only code that knows of zbus.
//!
//! Thin by design: the service task ([`crate::service::spawn`]) owns the
//! state and its loops; methods authenticate, validate and send it a request
//! ([`Handle`]); [`publish`] applies the changes it sends to the object
//! server; properties answer from the last applied [`Snapshot`]. The daemon
//! exits with an error when it loses the bus or its name (or the service
//! task ends), so systemd restarts it.

mod auth;
mod bounded;
mod loader;
mod node;
mod objects;
mod publish;
mod switch;
mod views;
mod vram;

use std::{sync::Arc, time::Duration};

use futures_util::StreamExt;
use ipc::{BUS_NAME, ROOT_PATH};
use tokio::{sync::watch, task::JoinHandle};
use tracing::{error, info};
use zbus::{
    Connection, MatchRule, MessageStream,
    connection::Builder,
    fdo::{ObjectManager, RequestNameFlags, RequestNameReply},
    message::Type as MessageType,
};

use self::node::NodeObject;
use crate::{
    dmem::Dmem,
    health::Stats,
    service::{self, Handle, Origin, ScanError, Service, ServiceConfig, Snapshot},
};

/// Where to connect.
#[derive(Debug, Clone)]
pub enum BusTarget {
    /// The system bus (`DBUS_SYSTEM_BUS_ADDRESS` or its default socket).
    System,
    /// A bus address such as `unix:path=/run/test/bus`.
    Address(String),
}

/// Why the service stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot connect to the bus at {target}: {source}")]
    Connect {
        target: String,
        #[source]
        source: Box<zbus::Error>,
    },
    #[error("cannot install the signal handlers: {0}")]
    Signals(#[source] std::io::Error),
    #[error("another process owns {BUS_NAME} on the bus")]
    NameTaken,
    #[error("lost the connection to the bus")]
    BusLost,
    #[error("lost the name {BUS_NAME}")]
    NameLost,
    #[error("the first inventory read failed: {0}")]
    FirstRead(#[source] ScanError),
    #[error("the service task stopped")]
    ServiceStopped,
    #[error("bus error: {0}")]
    Bus(#[source] Box<zbus::Error>),
    #[error("--dmem-backend on: {0}")]
    Dmem(crate::dmem::DmemError),
}

impl From<zbus::Error> for ServeError {
    fn from(err: zbus::Error) -> Self {
        Self::Bus(Box::new(err))
    }
}

/// Runs the service until SIGTERM/SIGINT (`Ok`) or until the bus or the
/// name is lost (`Err`).
///
/// # Errors
/// See [`ServeError`].
pub async fn serve(
    service: Service,
    bus: BusTarget,
    rescan: Option<Duration>,
) -> Result<(), ServeError> {
    service.dmem().check_required().map_err(ServeError::Dmem)?;
    let config = service.config().clone();
    let (dmem, health) = (service.dmem().clone(), service.health_stats());
    let (shown, state) = watch::channel(Arc::new(Snapshot::default()));
    let spawned = service::spawn(service, rescan);
    let first = spawned.handle.clone();
    let node = node_object(&config, spawned.handle, state, dmem, health);
    let conn = connect(&bus, node, loader_object(&config)).await?;
    tokio::spawn(publish::apply_all(conn.clone(), shown, spawned.updates));
    first
        .rescan(Origin::First)
        .await
        .map_err(ServeError::FirstRead)?;
    drop(first);
    let reply = conn
        .request_name_with_flags(BUS_NAME, RequestNameFlags::DoNotQueue.into())
        .await
        .map_err(|e| match e {
            zbus::Error::NameTaken => ServeError::NameTaken,
            other => other.into(),
        })?;
    if reply != RequestNameReply::PrimaryOwner {
        return Err(ServeError::NameTaken);
    }
    info!(name = BUS_NAME, "serving the GPU inventory");
    let name_lost = name_lost_stream(&conn).await?;
    run(&conn, spawned.task, name_lost).await
}

/// The node object over the service task behind `service`.
fn node_object(
    config: &ServiceConfig,
    service: Handle,
    state: watch::Receiver<Arc<Snapshot>>,
    dmem: Arc<Dmem>,
    health: Arc<Stats>,
) -> NodeObject {
    let pulse = config.health.pulse.unwrap_or_default();
    NodeObject {
        service,
        state,
        dmem,
        allowed_uids: Arc::from(config.allowed_uids.as_slice()),
        health,
        usage: Arc::new(crate::usage::reader::UsageReader::new(
            config.paths.clone(),
            config.dmem.clone(),
            config.amdsmi.clone(),
        )),
        health_pulse: u32::try_from(pulse.as_secs()).unwrap_or(u32::MAX),
        paths: config.paths.clone(),
    }
}

async fn connect(
    bus: &BusTarget,
    node: NodeObject,
    loader: loader::LoaderObject,
) -> Result<Connection, ServeError> {
    let target = match bus {
        BusTarget::System => "the system bus".to_owned(),
        BusTarget::Address(address) => address.clone(),
    };
    let built = async {
        let (stream, guid) = bus_stream(bus).await?;
        let conn = Builder::socket(bounded::bounded_socket(stream, bounded::MAX_INCOMING))
            .serve_at(ROOT_PATH, ObjectManager)?
            .serve_at(ROOT_PATH, node)?
            .serve_at(ROOT_PATH, loader)?
            .build()
            .await?;
        check_guid(&conn, guid.as_deref())?;
        Ok(conn)
    };
    built.await.map_err(|source| ServeError::Connect {
        target,
        source: Box::new(source),
    })
}

/// A connected stream to the bus `bus` names (zbus's own parsing of the
/// address and of `DBUS_SYSTEM_BUS_ADDRESS`), and the server GUID the
/// address names, if any: amd-gpud connects itself, so that the
/// connection's read side is [`bounded`]. A unix socket path or an abstract
/// name; any other transport is refused, naming it. The connect blocks (a
/// bus whose listen backlog is full at boot makes a non-blocking one fail
/// with EAGAIN), so it runs on the blocking pool, as zbus's own does.
async fn bus_stream(bus: &BusTarget) -> zbus::Result<(tokio::net::UnixStream, Option<String>)> {
    use std::os::{linux::net::SocketAddrExt, unix::net};
    use zbus::address::{Address, Transport, transport::UnixSocket};
    let address = match bus {
        BusTarget::System => Address::system()?,
        BusTarget::Address(text) => text.parse::<Address>()?,
    };
    let guid = address.guid().map(|g| g.as_str().to_owned());
    let socket = match address.transport() {
        Transport::Unix(unix) => match unix.path() {
            UnixSocket::File(path) => Some(net::SocketAddr::from_pathname(path)?),
            UnixSocket::Abstract(name) => Some(net::SocketAddr::from_abstract_name(
                name.as_encoded_bytes(),
            )?),
            _ => None,
        },
        _ => None,
    };
    let Some(socket) = socket else {
        return Err(zbus::Error::Address(format!(
            "amd-gpud reaches its bus through a unix socket (unix:path= or unix:abstract=), not {address}"
        )));
    };
    let stream = tokio::task::spawn_blocking(move || net::UnixStream::connect_addr(&socket))
        .await
        .map_err(std::io::Error::other)??;
    stream.set_nonblocking(true)?;
    Ok((tokio::net::UnixStream::from_std(stream)?, guid))
}

/// Refuses a bus whose server GUID is not the one its address names (what
/// zbus checks when it connects by address itself).
fn check_guid(conn: &Connection, expected: Option<&str>) -> zbus::Result<()> {
    match expected {
        Some(guid) if conn.server_guid().as_str() != guid => Err(zbus::Error::Address(format!(
            "the bus answered with GUID {}, not the {guid} its address names",
            conn.server_guid().as_str()
        ))),
        _ => Ok(()),
    }
}

/// The loader object of `config`: each image is read from containerd and
/// parsed by processes of the helper binary (`crate::loader_check::fetch`).
fn loader_object(config: &ServiceConfig) -> loader::LoaderObject {
    use crate::loader_check::{
        checker, fetch::spawn::ForkedInspect, sandbox::Sandbox, stage::HookStage,
    };
    let sandbox = Sandbox {
        uid: config.loader.inspector_uid,
        gid: config.loader.inspector_uid,
        memory: config.loader.inspector_memory,
        ..Sandbox::new(Vec::new())
    };
    let inspect = ForkedInspect {
        helper: config.loader.helper.clone(),
        containerd_socket: config.loader.containerd_socket.clone(),
        containerd_namespace: config.loader.containerd_namespace.clone(),
        call_timeout: Duration::from_secs(10),
        sandbox,
    };
    let checks = checker::CheckerConfig {
        budget: config.loader.budget,
        ..checker::CheckerConfig::default()
    };
    loader::LoaderObject {
        checker: checker::Checker::new(inspect, checks),
        stage: Arc::new(HookStage::new(
            &config.paths,
            Some(config.loader.memory_hook.clone()),
        )),
        allowed_uids: Arc::from(config.allowed_uids.as_slice()),
    }
}

async fn name_lost_stream(conn: &Connection) -> Result<MessageStream, ServeError> {
    let rule = MatchRule::builder()
        .msg_type(MessageType::Signal)
        .sender("org.freedesktop.DBus")?
        .interface("org.freedesktop.DBus")?
        .member("NameLost")?
        .arg(0, BUS_NAME)?
        .build();
    Ok(MessageStream::for_match_rule(rule, conn, None).await?)
}

async fn run(
    conn: &Connection,
    mut service: JoinHandle<()>,
    mut name_lost: MessageStream,
) -> Result<(), ServeError> {
    let mut terminate = signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut interrupt = signal(tokio::signal::unix::SignalKind::interrupt())?;
    tokio::select! {
        () = conn.closed() => {
            error!("lost the connection to the bus; exiting so that systemd restarts amd-gpud");
            Err(ServeError::BusLost)
        }
        lost = name_lost.next() => {
            error!(?lost, "lost the bus name; exiting");
            Err(if lost.is_some_and(|m| m.is_ok()) { ServeError::NameLost } else { ServeError::BusLost })
        }
        _ = terminate.recv() => { info!("SIGTERM: stopping"); Ok(()) }
        _ = interrupt.recv() => { info!("SIGINT: stopping"); Ok(()) }
        ended = &mut service => {
            error!(?ended, "the service task stopped; exiting");
            Err(ServeError::ServiceStopped)
        }
    }
}

fn signal(
    kind: tokio::signal::unix::SignalKind,
) -> Result<tokio::signal::unix::Signal, ServeError> {
    tokio::signal::unix::signal(kind).map_err(ServeError::Signals)
}
