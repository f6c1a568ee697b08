//! `amd-device-plugin`: the Kubernetes face of the stack.
//!
//! It follows amd-gpud's inventory over D-Bus (crate `ipc`), offers each GPU
//! to kubelet as `count` devices (crate `proto`), and re-registers by itself
//! whenever kubelet restarts. GPU health reaches kubelet (ListAndWatch), HAMi
//! (the register annotation) and operators (Node Events, metrics)
//! together, all rebuilt from the same amd-gpud snapshot. Everything
//! privileged is amd-gpud's job.

#![deny(unsafe_code)]

pub(crate) mod allocate;
pub(crate) mod choice;
pub(crate) mod config;
pub(crate) mod cu;
pub(crate) mod gpud;
pub(crate) mod hami;
pub(crate) mod inventory;
pub(crate) mod kube;
pub(crate) mod kubelet;
pub(crate) mod loader;
pub(crate) mod metrics;
pub(crate) mod mode;
pub(crate) mod preferred;
pub(crate) mod register;
pub(crate) mod sandbox;
pub mod testing;
#[cfg(test)]
mod testutil;
pub(crate) mod vram;

use std::{process::ExitCode, sync::Arc, time::Duration};

use anyhow::Context;
pub(crate) use config::Cli;
use tokio::sync::watch;
use tracing::info;

use crate::{
    config::ListenAddress,
    gpud::Bus,
    inventory::{DeviceTable, partition},
    metrics::Metrics,
    mode::switch,
};

/// Entry point of the binary: parses `args` (help and version are not
/// errors), runs, and maps errors to an exit code.
pub fn main(args: impl IntoIterator<Item = std::ffi::OsString>) -> ExitCode {
    let cli = match <Cli as clap::Parser>::try_parse_from(args) {
        Ok(cli) => cli,
        Err(err) => {
            let _ = err.print();
            return if err.use_stderr() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    match run(cli) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("amd-device-plugin: {}", ipc::report::one_line(err.as_ref()));
            ExitCode::FAILURE
        }
    }
}

/// Runs the plugin until SIGTERM or SIGINT.
///
/// # Errors
/// When the runtime or the plugin socket cannot be set up.
pub(crate) fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    init_tracing(&cli.log);
    // The configuration is read and the sandbox applied on this one thread,
    // before the runtime starts any other: landlock binds the calling thread
    // and those it starts later.
    let kube_config = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the configuration runtime")?
        .block_on(kube::config(&cli.kube))?;
    let plan = sandbox_plan(&cli, kube_config.as_ref());
    sandbox::apply(&plan, cli.sandbox).context("applying the landlock sandbox")?;
    // One thread serves kubelet and amd-gpud and writes to the API server,
    // so a call's steps never wait for another thread to wake; the watches
    // decode on a second one.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let decoder = decoder_thread().context("starting the watch thread")?;
    let served = runtime.block_on(serve(cli, kube_config, decoder));
    // Bounded, so that the error below is printed even when a task's drop
    // or a blocking call would hold the runtime's shutdown for ever.
    runtime.shutdown_timeout(Duration::from_secs(5));
    served?;
    Ok(ExitCode::SUCCESS)
}

/// A runtime on a thread of its own for the Kubernetes watches; it lives as
/// long as the process.
fn decoder_thread() -> std::io::Result<tokio::runtime::Handle> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let handle = runtime.handle().clone();
    std::thread::Builder::new()
        .name("kube-watch".to_owned())
        .spawn(move || runtime.block_on(std::future::pending::<()>()))?;
    Ok(handle)
}

/// What the plugin may touch: the kubelet directory read-write, everything
/// else it names read-only, the API server's port.
fn sandbox_plan(cli: &Cli, kube_config: Option<&::kube::Config>) -> sandbox::Plan {
    let mut read: Vec<std::path::PathBuf> = sandbox::SYSTEM_READS
        .iter()
        .map(std::path::PathBuf::from)
        .collect();
    read.push(cli.hook_path.clone());
    read.extend(
        cli.pod_resources()
            .and_then(|p| p.parent().map(std::path::Path::to_path_buf)),
    );
    if let kube::KubeAccess::Kubeconfig(path) = &cli.kube {
        read.push(path.clone());
    }
    sandbox::Plan {
        read,
        write: vec![cli.kubelet_dir.clone(), "/dev/null".into()],
        connect: kube_config.map(kube::api_port).into_iter().collect(),
        bind: [cli.metrics_address, cli.probe_address]
            .into_iter()
            .filter_map(ListenAddress::port)
            .collect(),
    }
}

/// The plugin's main task: follow amd-gpud, keep the device table, serve kubelet.
///
/// # Errors
/// When the plugin or metrics socket cannot be bound or the signal handlers
/// installed.
pub(crate) async fn serve(
    cli: Cli,
    kube_config: Option<::kube::Config>,
    decoder: tokio::runtime::Handle,
) -> anyhow::Result<()> {
    let client = kube_config.map(kube::client).transpose()?;
    if client.is_some() && cli.node_name.is_empty() {
        return Err(kube::KubeError::NoNodeName(format!("{:?}", cli.kube)).into());
    }
    let metrics = Arc::new(Metrics::new());
    metrics.set_landlock(landlock_status());
    let bus = cli.bus_address.clone().map_or(Bus::System, Bus::Address);
    let followed = gpud::client::spawn(
        bus.clone(),
        Duration::from_secs(cli.health_pulse),
        cli.exclude_gpus.clone(),
    );
    let raw = followed.snapshots;
    let mode = switch::operating_mode(client.as_ref(), &cli.node_name, cli.operating_mode).await;
    let (mode_tx, mode_rx) = watch::channel(mode);
    let snapshots = partition::follow(raw.clone(), mode_rx);
    let devices = follow_devices(snapshots.clone(), cli.split_count);
    let (stop, stopped) = watch::channel(false);
    let reach = followed.reach.clone();
    let side = client.map(|client| start_kube(&cli, client, &bus, &snapshots, &stopped, &decoder));
    spawn_followers(
        &cli,
        &bus,
        raw,
        side.as_ref(),
        (mode_tx, followed.reach),
        &stopped,
    );
    if side.is_none() {
        info!("--kube none: no Kubernetes API; Allocate is refused with an explanation");
    }
    let exporter = metrics::NodeExporter {
        metrics: metrics.clone(),
        snapshots: snapshots.clone(),
        caches: side.as_ref().map(|s| s.caches.clone()),
        split_count: cli.split_count,
        usage: matches!(cli.metrics_address, ListenAddress::At(_))
            .then(|| gpud::usage::spawn(bus.clone(), gpud::usage::EVERY)),
        node_name: cli.node_name.clone(),
        reach,
    };
    let servers = start_http(&cli, exporter).await?;
    let config = kubelet::KubeletConfig {
        kubelet_socket: cli.kubelet_socket(),
        socket: cli.socket_path(),
        resource_name: cli.resource_name.clone(),
        policy: cli.allocator_policy,
        allocator: side.as_ref().map(|s| s.allocator.clone()),
        hint: side.as_ref().map(|s| s.hint.clone()),
        vram: side.as_ref().map(|s| s.vram.clone()),
        loader: side.as_ref().and_then(|s| s.loader.clone()),
        metrics,
        rebind: kubelet::Rebind::default(),
    };
    let served = kubelet::run(config, devices, shutdown_signal()?).await;
    stop.send_replace(true);
    for server in servers {
        server.abort();
    }
    served?;
    if let Some(side) = side
        && tokio::time::timeout(Duration::from_secs(15), side.registrar)
            .await
            .is_err()
    {
        tracing::warn!("the node annotation was not republished within 15 s of the stop");
    }
    Ok(())
}

fn landlock_status() -> metrics::LandlockStatus {
    match sandbox::status() {
        sandbox::Enforcement::Off => metrics::LandlockStatus::NotApplied,
        sandbox::Enforcement::NotEnforced => metrics::LandlockStatus::NotEnforced,
        sandbox::Enforcement::Partial => metrics::LandlockStatus::PartiallyEnforced,
        sandbox::Enforcement::Full => metrics::LandlockStatus::FullyEnforced,
    }
}

/// The tasks that follow amd-gpud and the node beside the kubelet side: the
/// compute partition (flag and annotation), the operating-mode annotation, and the
/// reports of an unreachable amd-gpud.
fn spawn_followers(
    cli: &Cli,
    bus: &Bus,
    raw: watch::Receiver<inventory::Snapshot>,
    side: Option<&KubeSide>,
    (mode, reach): (
        watch::Sender<partition::OperatingMode>,
        watch::Receiver<gpud::reach::Reach>,
    ),
    stopped: &watch::Receiver<bool>,
) {
    let sources = switch::Sources {
        caches: side.map(|s| s.caches.clone()),
        pod_resources: cli.pod_resources(),
        resource_name: cli.resource_name.clone(),
        events: side.map(|s| s.events.clone()),
        split_count: cli.split_count,
    };
    tokio::spawn(mode::compute::follow(
        bus.clone(),
        raw,
        sources.clone(),
        cli.compute_partition.clone(),
        until(stopped.clone()),
    ));
    tokio::spawn(mode::follow::follow(
        sources,
        cli.operating_mode,
        mode,
        until(stopped.clone()),
    ));
    tokio::spawn(gpud::reach::report(
        reach,
        side.map(|s| gpud::reach::NodeEvents {
            events: s.events.clone(),
            caches: s.caches.clone(),
        }),
        Duration::from_secs(cli.gpud_unreachable_after),
        until(stopped.clone()),
    ));
}

/// What runs with the Kubernetes API.
struct KubeSide {
    caches: kube::Caches,
    events: kube::Events,
    allocator: Arc<allocate::Allocator>,
    hint: Arc<dyn preferred::AllocationHint>,
    vram: Arc<vram::VramCaps>,
    /// The loader check at PreStartContainer (`--loader-check`).
    loader: Option<Arc<loader::LoaderCheck>>,
    /// Publishes the register annotation until the stop.
    registrar: tokio::task::JoinHandle<()>,
}

/// Starts the caches, the registrar and the health Events; builds Allocate's
/// and PreStartContainer's handlers.
fn start_kube(
    cli: &Cli,
    client: ::kube::Client,
    bus: &Bus,
    snapshots: &watch::Receiver<inventory::Snapshot>,
    stopped: &watch::Receiver<bool>,
    decoder: &tokio::runtime::Handle,
) -> KubeSide {
    let owners = Arc::new(vram::Owners::new(cli.pod_resources(), &cli.resource_name));
    let caches = kube::Caches::start(&client, &cli.node_name, decoder);
    let config = allocate::AllocateConfig {
        dev_dir: cli.host_dev.clone(),
        hook_dir: cli.hook_path.clone(),
        resource_name: cli.resource_name.clone(),
        cdi: cli.cdi,
        pod_resources: cli.pod_resources(),
        annotations_protected: cli.annotations_protected,
        staged_hooks: cli.loader_check.then(|| cli.loader_hook_root.clone()),
        hip_log_level: cli.hip_log_level,
        split_count: cli.split_count,
    };
    let allocator = Arc::new(allocate::Allocator::new(
        client.clone(),
        caches.clone(),
        snapshots.clone(),
        config,
        owners.clone(),
    ));
    let events = kube::Events::new(client.clone(), &cli.node_name);
    let vram = Arc::new(vram::VramCaps {
        mode: cli.dmem_backend,
        sink: Arc::new(vram::gpud::GpudCaps {
            bus: bus.clone(),
            snapshots: snapshots.clone(),
        }),
        owners: owners.clone(),
        pods: allocator.clone(),
        snapshots: snapshots.clone(),
        events: Some(events.clone()),
        split_count: cli.split_count,
    });
    let loader = cli.loader_check.then(|| {
        Arc::new(loader::LoaderCheck {
            sink: Arc::new(loader::gpud::GpudLoader { bus: bus.clone() }),
            owners,
            pods: allocator.clone(),
            pod_resources: cli.pod_resources(),
            resource_name: cli.resource_name.clone(),
            events: Some(events.clone()),
        })
    });
    tokio::spawn(inventory::health::follow(
        snapshots.clone(),
        events.clone(),
        caches.clone(),
        until(stopped.clone()),
    ));
    let config = register::RegisterConfig {
        split_count: cli.split_count,
        recheck: Duration::from_secs(cli.register_interval.max(1)),
        report_node_capacity: cli.report_node_capacity,
    };
    let registrar = tokio::spawn(register::run_register(
        client,
        caches.clone(),
        snapshots.clone(),
        config,
        until(stopped.clone()),
    ));
    KubeSide {
        hint: Arc::new(allocate::HamiHint {
            allocator: allocator.clone(),
        }),
        caches,
        events,
        allocator,
        vram,
        loader,
        registrar,
    }
}

/// Binds `--metrics-address` and `--probe-address` and serves them in the
/// background, each with its own connection slots.
async fn start_http(
    cli: &Cli,
    exporter: metrics::NodeExporter,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<()>>> {
    use metrics::server::{self, Limits, Routes};
    let exporter: Arc<dyn metrics::Exporter> = Arc::new(exporter);
    let mut servers = Vec::new();
    for (address, routes) in [
        (cli.metrics_address, Routes::Metrics),
        (cli.probe_address, Routes::Probes),
    ] {
        let ListenAddress::At(address) = address else {
            info!("{} none: not served", routes.flag());
            continue;
        };
        let listener = server::bind(address, routes).await?;
        servers.push(tokio::spawn(server::serve(
            listener,
            exporter.clone(),
            routes,
            Limits::default(),
        )));
    }
    Ok(servers)
}

/// Resolves on SIGTERM or SIGINT.
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    Ok(async move {
        tokio::select! {
            _ = terminate.recv() => info!("SIGTERM: stopping"),
            _ = tokio::signal::ctrl_c() => info!("SIGINT: stopping"),
        }
    })
}

/// Resolves when `stop` turns true (or its sender is gone).
async fn until(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Keeps a device table in step with the snapshots.
pub(crate) fn follow_devices(
    mut snapshots: watch::Receiver<inventory::Snapshot>,
    split_count: u32,
) -> watch::Receiver<DeviceTable> {
    let (tx, rx) = watch::channel(DeviceTable::build(
        &snapshots.borrow_and_update(),
        split_count,
    ));
    tokio::spawn(async move {
        while snapshots.changed().await.is_ok() {
            let table = DeviceTable::build(&snapshots.borrow_and_update(), split_count);
            tx.send_if_modified(|t| {
                let changed = *t != table;
                *t = table;
                changed
            });
        }
    });
    rx
}

fn init_tracing(filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    /// Landlock lets the plugin bind only the ports the plan names: a
    /// listener left out would fail the start under `--sandbox required`.
    #[test]
    fn the_sandbox_lets_each_listener_bind() {
        let cli = Cli::parse_from(["x"]);
        assert_eq!(sandbox_plan(&cli, None).bind, [9394, 9401]);
        let cli = Cli::parse_from(["x", "--metrics-address", "none"]);
        assert_eq!(sandbox_plan(&cli, None).bind, [9401]);
        let cli = Cli::parse_from(["x", "--probe-address", "none"]);
        assert_eq!(sandbox_plan(&cli, None).bind, [9394]);
    }
}
