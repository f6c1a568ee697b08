//! Turning a registry [`Update`] into objects and signals on the bus.

use std::{borrow::Cow, collections::HashMap};

use tokio::sync::oneshot::error::TryRecvError;

use ipc::{GPU_INTERFACE, NODE_INTERFACE, PARTITION_INTERFACE, gpu_path, partition_path};
use zbus::{
    Connection,
    fdo::Properties,
    names::InterfaceName,
    object_server::{Interface, InterfaceRef},
    zvariant::{OwnedObjectPath, Value},
};

use super::{
    node::{NodeObject, Shared},
    objects::{GpuObject, PartitionObject},
    views::{GpuView, PartitionView, changed, gpu_view, partition_view},
};
use crate::{
    deadline::{self, Overdue},
    service::{ObjectKey, Scanned, Update},
    topology::TopologyError,
};

/// Why a rescan could not be published.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("reading the inventory: {0}")]
    Inventory(#[from] TopologyError),
    #[error("the rescan task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    #[error("{0}")]
    Overdue(#[from] Overdue),
    #[error("publishing on the bus: {0}")]
    Bus(#[from] zbus::Error),
}

/// A view of one object, ready to publish.
enum View {
    Gpu(Box<GpuView>),
    Partition(PartitionView),
}

fn path(key: ObjectKey) -> OwnedObjectPath {
    match key {
        ObjectKey::Gpu(bdf) => gpu_path(&bdf.to_string()),
        ObjectKey::Partition(bdf, index) => partition_path(&bdf.to_string(), index),
    }
}

/// The read of the host that missed its deadline and is still blocked, if
/// any. Also one read at a time: the rescan loop, `Rescan` calls and a
/// partition switch each rescan, and the folds must not interleave.
static SCANNING: tokio::sync::Mutex<Option<Pending>> = tokio::sync::Mutex::const_new(None);

type Pending = tokio::sync::oneshot::Receiver<Result<Scanned, TopologyError>>;

/// Reads the inventory again (on a thread of its own, without the service
/// lock, within [`crate::service::ScanPlan::deadline`]) and publishes the
/// change. Returns the inventory generation after it.
///
/// # Errors
/// When the topology cannot be read, the read misses its deadline (or an
/// earlier one is still blocked), or the bus refuses the update.
pub async fn rescan(
    conn: &Connection,
    shared: &Shared,
    reprobe: bool,
) -> Result<u64, PublishError> {
    const WHAT: &str = "the read of the host tree";
    let mut pending = SCANNING.lock().await;
    if let Some(mut stuck) = pending.take() {
        if matches!(stuck.try_recv(), Err(TryRecvError::Empty)) {
            *pending = Some(stuck);
            return Err(Overdue::StillBlocked { what: WHAT }.into());
        }
        tracing::info!("the read that missed its deadline has returned");
    }
    let plan = lock(shared).plan_scan(reprobe);
    let limit = plan.deadline();
    let mut read = deadline::spawn(WHAT, move || plan.run())?;
    let scanned = match tokio::time::timeout(limit, &mut read).await {
        Ok(Ok(scanned)) => scanned?,
        Ok(Err(_)) => return Err(Overdue::Died { what: WHAT }.into()),
        Err(_) => {
            *pending = Some(read);
            return Err(Overdue::Late { what: WHAT, limit }.into());
        }
    };
    let (update, meta_changed) = {
        let mut service = lock(shared);
        let before = service.meta().clone();
        let update = service.fold_scan(scanned);
        (update, before != *service.meta())
    };
    publish(conn, shared, &update, meta_changed).await?;
    drop(pending);
    write_cdi(shared);
    Ok(generation(shared))
}

fn lock(shared: &Shared) -> std::sync::MutexGuard<'_, crate::service::Service> {
    shared
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Refreshes the CDI spec (when enabled) from the published inventory;
/// a failure is logged, not fatal: the plugin can still hand out device nodes.
fn write_cdi(shared: &Shared) {
    let (paths, spec) = {
        let service = lock(shared);
        if !service.config().cdi {
            return;
        }
        let paths = service.config().paths.clone();
        let spec = crate::cdi::spec(&paths, service.registry().gpus());
        (paths, spec)
    };
    match crate::cdi::write(&paths, &spec) {
        Ok(true) => tracing::info!(dir = %paths.cdi.display(), "CDI spec written"),
        Ok(false) => {}
        Err(err) => tracing::warn!("{err}"),
    }
}

fn generation(shared: &Shared) -> u64 {
    let service = shared
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    service.registry().generation()
}

/// One publication at a time: the rescan loop, `Rescan` calls and the health
/// pulse each publish, and views built from an older state must not land
/// after newer ones.
static PUBLISHING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Publishes `update`: new objects are added (the ObjectManager announces
/// them), changed and missing ones emit `PropertiesChanged`, and the node
/// emits `InventoryChanged`.
///
/// # Errors
/// When the bus refuses an object or a signal.
pub async fn publish(
    conn: &Connection,
    shared: &Shared,
    update: &Update,
    meta_changed: bool,
) -> zbus::Result<()> {
    let _one = PUBLISHING.lock().await;
    let views = views(shared, update);
    let server = conn.object_server();
    for (key, view) in views {
        let path = path(key);
        let is_new = update.added.contains(&key);
        match view {
            View::Gpu(view) if is_new => {
                server.at(&path, GpuObject { view: *view }).await?;
            }
            View::Partition(view) if is_new => {
                server.at(&path, PartitionObject { view }).await?;
            }
            View::Gpu(view) => {
                let iface = server.interface::<_, GpuObject>(&path).await?;
                let old = std::mem::replace(&mut iface.get_mut().await.view, (*view).clone());
                announce(
                    &iface,
                    GPU_INTERFACE,
                    changed(old.to_properties(), view.to_properties()),
                )
                .await?;
            }
            View::Partition(view) => {
                let iface = server.interface::<_, PartitionObject>(&path).await?;
                let old = std::mem::replace(&mut iface.get_mut().await.view, view.clone());
                let diff = changed(old.to_properties(), view.to_properties());
                announce(&iface, PARTITION_INTERFACE, diff).await?;
            }
        }
    }
    if update.is_empty() && !meta_changed {
        return Ok(());
    }
    announce_node(conn, shared, update).await
}

async fn announce<I: Interface>(
    iface: &InterfaceRef<I>,
    interface: &'static str,
    diff: HashMap<&'static str, Value<'static>>,
) -> zbus::Result<()> {
    if diff.is_empty() {
        return Ok(());
    }
    let name = InterfaceName::from_static_str_unchecked(interface);
    Properties::properties_changed(iface.signal_emitter(), name, diff, Cow::Borrowed(&[])).await
}

async fn announce_node(conn: &Connection, shared: &Shared, update: &Update) -> zbus::Result<()> {
    let iface = conn
        .object_server()
        .interface::<_, NodeObject>(ipc::ROOT_PATH)
        .await?;
    let (generation, props) = {
        let service = shared
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let meta = service.meta();
        let gpus: Vec<OwnedObjectPath> = service
            .registry()
            .gpus()
            .map(|(g, _)| gpu_path(&g.bdf.to_string()))
            .collect();
        let props: HashMap<&'static str, Value<'static>> = [
            ("Generation", Value::from(service.registry().generation())),
            (
                "KfdGeneration",
                Value::from(meta.kfd_generation.unwrap_or(0)),
            ),
            ("Gpus", Value::from(gpus)),
            (
                "AmdSmi",
                Value::from(format!("{}: {}", meta.amdsmi.state, meta.amdsmi.detail)),
            ),
            ("Warnings", Value::from(meta.warnings.clone())),
        ]
        .into_iter()
        .chain(super::vram::properties(&meta.dmem))
        .collect();
        (service.registry().generation(), props)
    };
    announce(&iface, NODE_INTERFACE, props).await?;
    let paths = |keys: &[ObjectKey]| keys.iter().map(|k| path(*k)).collect::<Vec<_>>();
    let (added, missing, changed) = (
        paths(&update.added),
        paths(&update.missing),
        paths(&update.changed),
    );
    NodeObject::inventory_changed(
        iface.signal_emitter(),
        generation,
        as_refs(&added),
        as_refs(&missing),
        as_refs(&changed),
    )
    .await
}

fn as_refs(paths: &[OwnedObjectPath]) -> Vec<zbus::zvariant::ObjectPath<'_>> {
    paths.iter().map(|p| p.as_ref()).collect()
}

fn views(shared: &Shared, update: &Update) -> Vec<(ObjectKey, View)> {
    let service = shared
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let registry = service.registry();
    // GPUs before their partitions, so a partition's `Gpu` path exists first.
    let mut keys: Vec<ObjectKey> = update
        .added
        .iter()
        .chain(&update.missing)
        .chain(&update.changed)
        .copied()
        .collect();
    keys.sort();
    keys.into_iter()
        .filter_map(|key| {
            let view = match key {
                ObjectKey::Gpu(bdf) => {
                    let (gpu, presence) = registry.gpu(bdf)?;
                    let shown = service.health_of(key, presence);
                    View::Gpu(Box::new(gpu_view(gpu, &shown, registry)))
                }
                ObjectKey::Partition(bdf, index) => {
                    let (part, presence) = registry.partition(bdf, index)?;
                    let shown = service.health_of(key, presence);
                    View::Partition(partition_view(part, &shown, &bdf.to_string()))
                }
            };
            Some((key, view))
        })
        .collect()
}
