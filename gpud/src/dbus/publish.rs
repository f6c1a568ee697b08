//! Applying the service task's changes ([`Published`]) to the bus: objects
//! added or updated, `PropertiesChanged`, `InventoryChanged`.

use std::{borrow::Cow, collections::HashMap, sync::Arc};

use tokio::sync::{mpsc, watch};

use ipc::{GPU_INTERFACE, NODE_INTERFACE, PARTITION_INTERFACE, gpu_path, partition_path};
use zbus::{
    Connection,
    fdo::Properties,
    names::InterfaceName,
    object_server::{Interface, InterfaceRef},
    zvariant::{OwnedObjectPath, Value},
};

use super::{
    node::NodeObject,
    objects::{GpuObject, PartitionObject},
    views::{GpuView, PartitionView, changed, gpu_view, partition_view},
};
use crate::service::{ObjectKey, Published, Shown, Snapshot, Update};

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

/// Applies every change the service task sends, in order (so views built
/// from an older state never land after newer ones), and tells the task
/// each is out; `shown` is what the node object answers from, replaced once
/// a change's objects are in place. Ends when the task does.
pub async fn apply_all(
    conn: Connection,
    shown: watch::Sender<Arc<Snapshot>>,
    mut updates: mpsc::Receiver<Published>,
) {
    while let Some(published) = updates.recv().await {
        let Published {
            update,
            shown: objects,
            state,
            meta_changed,
            applied,
        } = published;
        let views = views(&state, &objects);
        let done = publish(&conn, &update, views, meta_changed, &state, &shown).await;
        drop(applied.send(done.map_err(|e| e.to_string())));
    }
}

/// Publishes `update`: new objects are added (the ObjectManager announces
/// them), changed and missing ones emit `PropertiesChanged`; then the node
/// is handed `state` (through `shown`), and emits `InventoryChanged`.
///
/// # Errors
/// When the bus refuses an object or a signal.
async fn publish(
    conn: &Connection,
    update: &Update,
    views: Vec<(ObjectKey, View)>,
    meta_changed: bool,
    state: &Arc<Snapshot>,
    shown: &watch::Sender<Arc<Snapshot>>,
) -> zbus::Result<()> {
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
    shown.send_replace(state.clone());
    if update.is_empty() && !meta_changed {
        return Ok(());
    }
    announce_node(conn, update, state).await
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

async fn announce_node(conn: &Connection, update: &Update, state: &Snapshot) -> zbus::Result<()> {
    let iface = conn
        .object_server()
        .interface::<_, NodeObject>(ipc::ROOT_PATH)
        .await?;
    let generation = state.generation();
    let props = node_properties(state);
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

/// The node's changeable properties but the health counters (which
/// announce no change).
fn node_properties(state: &Snapshot) -> HashMap<&'static str, Value<'static>> {
    let meta = &state.meta;
    let gpus: Vec<OwnedObjectPath> = state
        .registry
        .gpus()
        .map(|(g, _)| gpu_path(&g.bdf.to_string()))
        .collect();
    [
        ("Generation", Value::from(state.generation())),
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
    .collect()
}

/// The views of the objects of a change, in the order the service gave.
fn views(state: &Snapshot, objects: &[(ObjectKey, Shown)]) -> Vec<(ObjectKey, View)> {
    let registry = &state.registry;
    objects
        .iter()
        .filter_map(|(key, shown)| {
            let view = match *key {
                ObjectKey::Gpu(bdf) => {
                    let (gpu, _) = registry.gpu(bdf)?;
                    View::Gpu(Box::new(gpu_view(gpu, shown, registry)))
                }
                ObjectKey::Partition(bdf, index) => {
                    let (part, _) = registry.partition(bdf, index)?;
                    View::Partition(partition_view(part, shown, &bdf.to_string()))
                }
            };
            Some((*key, view))
        })
        .collect()
}
