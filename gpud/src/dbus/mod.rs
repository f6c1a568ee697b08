//! The D-Bus adapter: `io.hami.AmdGpu1` on the system bus (or any address).
//!
//! Thin by design: objects render views of the [`Service`]'s registry;
//! methods authenticate, validate and call the service. The daemon exits with
//! an error when it loses the bus or its name, so systemd restarts it.

mod auth;
mod health;
mod loader;
mod node;
mod objects;
mod publish;
mod switch;
mod usage;
mod views;
mod vram;

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use futures_util::StreamExt;
use ipc::{BUS_NAME, ROOT_PATH};
pub use node::Shared;
pub use publish::PublishError;
use tracing::{error, info, warn};
use zbus::{
    Connection, MatchRule, MessageStream,
    connection::Builder,
    fdo::{ObjectManager, RequestNameFlags, RequestNameReply},
    message::Type as MessageType,
};

use self::node::NodeObject;
use crate::service::Service;

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
    FirstRead(#[source] PublishError),
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
    let shared: Shared = Arc::new(Mutex::new(service));
    let conn = connect(&bus, &shared).await?;
    publish::rescan(&conn, &shared, true)
        .await
        .map_err(ServeError::FirstRead)?;
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
    run(&conn, &shared, rescan, name_lost).await
}

async fn connect(bus: &BusTarget, shared: &Shared) -> Result<Connection, ServeError> {
    let (builder, target) = match bus {
        BusTarget::System => (Builder::system(), "the system bus".to_owned()),
        BusTarget::Address(address) => (Builder::address(address.as_str()), address.clone()),
    };
    let node = {
        let service = shared
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let pulse = service.config().health.pulse.unwrap_or_default();
        NodeObject {
            service: shared.clone(),
            dmem: service.dmem().clone(),
            allowed_uids: Arc::from(service.config().allowed_uids.as_slice()),
            health: service.health_stats(),
            usage: Arc::new(usage::UsageState::new(
                service.config().paths.clone(),
                service.config().dmem.clone(),
                service.config().amdsmi.clone(),
            )),
            health_pulse: u32::try_from(pulse.as_secs()).unwrap_or(u32::MAX),
        }
    };
    let loader = {
        let service = shared
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        loader_object(service.config())
    };
    let built = async {
        builder?
            .serve_at(ROOT_PATH, ObjectManager)?
            .serve_at(ROOT_PATH, node)?
            .serve_at(ROOT_PATH, loader)?
            .build()
            .await
    };
    built.await.map_err(|source| ServeError::Connect {
        target,
        source: Box::new(source),
    })
}

/// The loader object of `config`; containerd is reached through this
/// runtime.
fn loader_object(config: &crate::service::ServiceConfig) -> loader::LoaderObject {
    use crate::loader_check::{checker, stage::HookStage};
    let inspect = checker::ContainerdInspect {
        socket: config.loader.containerd_socket.clone(),
        namespace: config.loader.containerd_namespace.clone(),
        handle: tokio::runtime::Handle::current(),
        call_timeout: Duration::from_secs(10),
    };
    loader::LoaderObject {
        checker: checker::Checker::new(inspect, checker::CheckerConfig::default()),
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
    shared: &Shared,
    rescan: Option<Duration>,
    mut name_lost: MessageStream,
) -> Result<(), ServeError> {
    let mut ticker = rescan.map(tokio::time::interval);
    if let Some(t) = ticker.as_mut() {
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        t.tick().await; // the first tick is immediate; the first read is done
    }
    let mut terminate = signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut interrupt = signal(tokio::signal::unix::SignalKind::interrupt())?;
    let pulse = shared
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .config()
        .health
        .pulse;
    let health = async {
        match pulse {
            Some(pulse) => health::pulses(conn, shared, pulse).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(health);
    loop {
        tokio::select! {
            () = conn.closed() => {
                error!("lost the connection to the bus; exiting so that systemd restarts amd-gpud");
                return Err(ServeError::BusLost);
            }
            lost = name_lost.next() => {
                error!(?lost, "lost the bus name; exiting");
                return Err(if lost.is_some_and(|m| m.is_ok()) { ServeError::NameLost } else { ServeError::BusLost });
            }
            _ = terminate.recv() => { info!("SIGTERM: stopping"); return Ok(()); }
            _ = interrupt.recv() => { info!("SIGINT: stopping"); return Ok(()); }
            () = &mut health => {}
            () = tick(ticker.as_mut()) => {
                if let Err(err) = publish::rescan(conn, shared, false).await {
                    warn!("periodic rescan failed: {err}");
                }
            }
        }
    }
}

fn signal(
    kind: tokio::signal::unix::SignalKind,
) -> Result<tokio::signal::unix::Signal, ServeError> {
    tokio::signal::unix::signal(kind).map_err(ServeError::Signals)
}

async fn tick(ticker: Option<&mut tokio::time::Interval>) {
    match ticker {
        Some(t) => drop(t.tick().await),
        None => std::future::pending().await,
    }
}
