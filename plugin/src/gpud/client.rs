//! Following amd-gpud's inventory over D-Bus.
//!
//! A background task keeps a [`Snapshot`] of every GPU up to date: it reads
//! the whole inventory at start, again on each `InventoryChanged` signal, and
//! whenever amd-gpud (re)appears on the bus. When the bus or amd-gpud goes
//! away the last snapshot is kept (marked disconnected) and the task
//! reconnects by itself. A read that amd-gpud does not answer within
//! [`READ_TIMEOUT`] (a hung or stopped daemon keeps its name on the bus and
//! answers nothing) counts as a disconnection too: the snapshot is kept,
//! marked disconnected (so `/readyz` fails), and the next pulse reads again.

use std::{collections::BTreeMap, time::Duration};

use futures_util::StreamExt;
use ipc::{
    BUS_NAME, DmemBackend, Health,
    proxy::NodeProxy,
    types::{GpuInfo, PartitionInfo},
};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use zbus::{Connection, fdo::DBusProxy};

use super::{
    bus::{Bus, SessionError, connect},
    reach::{Reach, Unreachable},
};
use crate::inventory::{Device, Snapshot, exclude::ExcludeGpus};

/// How long one whole read of the inventory may take. amd-gpud serves it
/// from memory (milliseconds for 64 partitions); a read that takes longer
/// means amd-gpud is hung, and without a bound the session would wait for
/// it forever, the snapshot still marked connected.
pub(crate) const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// What [`spawn`] follows: the latest inventory, and how the last attempt
/// to reach amd-gpud went (for [`crate::gpud::reach::report`]).
#[derive(Debug, Clone)]
pub(crate) struct Followed {
    pub(crate) snapshots: watch::Receiver<Snapshot>,
    pub(crate) reach: watch::Receiver<Reach>,
}

/// The sending side of [`Followed`].
struct Feeds {
    snapshots: watch::Sender<Snapshot>,
    reach: watch::Sender<Reach>,
    uid: u32,
    /// `--exclude-gpus`, and what it did at the last read: the GPUs left
    /// out, and the entries that named none.
    exclude: ExcludeGpus,
    excluded: std::sync::Mutex<(Vec<String>, Vec<String>)>,
}

impl Feeds {
    /// Marks the snapshot stale and records why; the first failure of a
    /// kind is a warning, its repeats (every retry and pulse) only debug.
    fn unreachable(&self, what: &str, err: &SessionError) {
        self.snapshots
            .send_if_modified(|s| std::mem::replace(&mut s.connected, false));
        self.set_reach(
            Reach::Unreachable(Unreachable::classify(err, self.uid)),
            what,
            err,
        );
    }

    /// `gpus` and `partitions` without the GPUs `--exclude-gpus` names,
    /// saying which when that changes; an entry that newly names no GPU is
    /// a warning.
    fn excluding(&self, gpus: Vec<GpuInfo>, partitions: Partitions) -> (Vec<GpuInfo>, Partitions) {
        if self.exclude.is_empty() {
            return (gpus, partitions);
        }
        let kept = self.exclude.apply(gpus, partitions);
        let mut last = self
            .excluded
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if last.0 != kept.excluded {
            info!(gpus = ?kept.excluded, "GPUs left out (--exclude-gpus)");
        }
        for entry in kept.unmatched.iter().filter(|e| !last.1.contains(e)) {
            warn!(
                "--exclude-gpus (AMDGPU_DP_EXCLUDE_GPUS) names {entry}, which is no GPU of this \
                 node; nothing is excluded for it"
            );
        }
        *last = (kept.excluded, kept.unmatched);
        (kept.gpus, kept.partitions)
    }

    fn set_reach(&self, reach: Reach, what: &str, err: &SessionError) {
        let kind_changed = self.reach.send_if_modified(|old| {
            let changed = kind(old) != kind(&reach);
            *old = reach;
            changed
        });
        if kind_changed {
            warn!("{what}: {err}");
        } else {
            debug!("{what}: {err}");
        }
    }
}

fn kind(reach: &Reach) -> Option<&'static str> {
    match reach {
        Reach::Unreachable(cause) => Some(cause.kind()),
        Reach::Connected | Reach::Unknown => None,
    }
}

/// Starts following amd-gpud; the receivers always hold the latest snapshot
/// and reach. Besides the signals, the whole inventory (health included) is
/// read again every `pulse`, so that a missed signal costs at most one pulse;
/// a zero pulse reads on signals only. The GPUs `exclude` names are left
/// out of every snapshot.
pub(crate) fn spawn(bus: Bus, pulse: Duration, exclude: ExcludeGpus) -> Followed {
    let (snapshots, snapshots_rx) = watch::channel(Snapshot::default());
    let (reach, reach_rx) = watch::channel(Reach::default());
    let uid = rustix::process::getuid().as_raw();
    tokio::spawn(follow(
        bus,
        Feeds {
            snapshots,
            reach,
            uid,
            exclude,
            excluded: std::sync::Mutex::default(),
        },
        pulse,
    ));
    Followed {
        snapshots: snapshots_rx,
        reach: reach_rx,
    }
}

async fn follow(bus: Bus, feeds: Feeds, pulse: Duration) {
    let mut backoff = Duration::from_millis(200);
    loop {
        match session(&bus, &feeds, pulse).await {
            Ok(()) => backoff = Duration::from_millis(200),
            Err(err) => {
                let what = format!(
                    "amd-gpud session ended (keeping the last inventory, retrying in {backoff:?})"
                );
                feeds.unreachable(&what, &err);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
        if feeds.snapshots.is_closed() {
            return;
        }
    }
}

/// One connection's life: ends `Ok` when amd-gpud's owner changes (read
/// everything again with fresh proxies), `Err` when the bus goes away.
async fn session(bus: &Bus, feeds: &Feeds, pulse: Duration) -> Result<(), SessionError> {
    let conn = connect(bus).await?;
    let dbus = DBusProxy::new(&conn).await?;
    let mut owners = dbus
        .receive_name_owner_changed_with_args(&[(0, BUS_NAME)])
        .await?;
    let node = super::bus::node_proxy(&conn).await?;
    let mut changes = node.receive_inventory_changed().await?;
    let name = zbus::names::BusName::try_from(BUS_NAME).map_err(zbus::Error::from)?;
    let owned = dbus
        .name_has_owner(name)
        .await
        .map_err(|e| SessionError::Bus(zbus::Error::FDO(Box::new(e))))?;
    if !owned {
        let err = SessionError::Bus(zbus::Error::FDO(Box::new(
            zbus::fdo::Error::ServiceUnknown(format!("nobody owns {BUS_NAME}")),
        )));
        feeds.unreachable("amd-gpud is not on the bus (waiting for it)", &err);
    } else {
        refresh(&conn, &node, feeds).await;
    }
    let mut resync = Resync::every(pulse).await;
    loop {
        tokio::select! {
            () = resync.tick() => refresh(&conn, &node, feeds).await,
            () = conn.closed() => return Err(SessionError::BusLost),
            owner = owners.next() => {
                let appeared = owner
                    .and_then(|o| o.args().ok().map(|a| a.new_owner().is_some()))
                    .unwrap_or(false);
                info!(appeared, "amd-gpud changed owner on the bus");
                if appeared {
                    return Ok(());
                }
                let err = SessionError::Bus(zbus::Error::FDO(Box::new(
                    zbus::fdo::Error::ServiceUnknown(format!("{BUS_NAME} left the bus")),
                )));
                feeds.unreachable("amd-gpud left the bus", &err);
            }
            change = changes.next() => {
                if change.is_none() {
                    return Err(SessionError::BusLost);
                }
                debug!("InventoryChanged");
                refresh(&conn, &node, feeds).await;
            }
        }
    }
}

/// The pulse of full re-reads; a zero pulse never ticks (signals only).
struct Resync(Option<tokio::time::Interval>);

impl Resync {
    async fn every(pulse: Duration) -> Self {
        if pulse.is_zero() {
            return Self(None);
        }
        let mut interval = tokio::time::interval(pulse.max(Duration::from_secs(1)));
        // A read that timed out must not be followed by a burst of catch-up reads.
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        interval.tick().await;
        Self(Some(interval))
    }

    async fn tick(&mut self) {
        match &mut self.0 {
            Some(interval) => {
                interval.tick().await;
            }
            None => std::future::pending().await,
        }
    }
}

/// Reads every GPU; on failure (or no answer within [`READ_TIMEOUT`]) keeps
/// the old snapshot and marks it stale.
async fn refresh(conn: &Connection, node: &NodeProxy<'_>, feeds: &Feeds) {
    match read_within(conn, node, READ_TIMEOUT, feeds).await {
        Ok(mut fresh) => {
            if feeds.reach.send_replace(Reach::Connected) != Reach::Connected {
                info!("read the inventory from amd-gpud");
            }
            feeds.snapshots.send_if_modified(|s| {
                keep_vanished(s, &mut fresh);
                let changed = *s != fresh;
                *s = fresh;
                changed
            });
        }
        Err(err) => {
            feeds.unreachable(
                "cannot read the inventory from amd-gpud (keeping the last one)",
                &err,
            );
        }
    }
}

/// The whole inventory (without the excluded GPUs) and the VRAM cap
/// backend, read within `limit`.
async fn read_within(
    conn: &Connection,
    node: &NodeProxy<'_>,
    limit: Duration,
    feeds: &Feeds,
) -> Result<Snapshot, SessionError> {
    let read = async {
        let (gpus, partitions) = read_all(conn, node).await?;
        let (gpus, partitions) = feeds.excluding(gpus, partitions);
        let dmem = node.dmem_backend().await.map_or_else(
            |err| DmemBackend::Off {
                reason: format!("amd-gpud does not report its VRAM cap backend ({err})"),
            },
            |backend| DmemBackend::from_wire(&backend),
        );
        Ok(Snapshot::from_gpud(&gpus, partitions, dmem))
    };
    tokio::time::timeout(limit, read)
        .await
        .map_err(|_| SessionError::Timeout(limit))?
}

/// Why a GPU kept by [`keep_vanished`] is missing.
pub(crate) const VANISHED_REASON: &str = "amd-gpud no longer lists it (it restarted after the GPU went away); kept as missing until the plugin restarts";

/// Carries the GPUs of `previous` that `fresh` no longer lists into `fresh`,
/// missing with their partitions. amd-gpud keeps a GPU that goes away as
/// missing for as long as it runs; a restarted amd-gpud never saw it, and
/// without this the GPU's devices would silently leave kubelet's list and
/// HAMi's annotation instead of staying there unhealthy.
fn keep_vanished(previous: &Snapshot, fresh: &mut Snapshot) {
    // A GPU whose PCI address now holds another one is gone for good.
    let gone =
        |g: &&Device| fresh.device(&g.id).is_none() && !fresh.partitions.contains_key(&g.bdf);
    let vanished: Vec<Device> = previous.devices().iter().filter(gone).cloned().collect();
    let mut kept = Vec::with_capacity(vanished.len());
    for mut gpu in vanished {
        if gpu.health != Health::Missing {
            warn!(gpu = %gpu.id, bdf = %gpu.bdf, "{VANISHED_REASON}");
            gpu.health = Health::Missing;
            gpu.health_reason = VANISHED_REASON.to_owned();
        }
        let parts = previous
            .partitions
            .get(&gpu.bdf)
            .cloned()
            .unwrap_or_default();
        let parts = parts.into_iter().map(|mut p| {
            p.health = Health::Missing.as_str().to_owned();
            p.health_reason = VANISHED_REASON.to_owned();
            p
        });
        fresh.partitions.insert(gpu.bdf.clone(), parts.collect());
        kept.push(gpu);
    }
    fresh.add(kept);
}

/// Each GPU's partitions, by the GPU's PCI address.
type Partitions = BTreeMap<String, Vec<PartitionInfo>>;
type Inventory = (Vec<GpuInfo>, Partitions);

async fn read_all(conn: &Connection, node: &NodeProxy<'_>) -> Result<Inventory, SessionError> {
    let mut gpus = Vec::new();
    let mut partitions = BTreeMap::new();
    for path in node.gpus().await? {
        let gpu = ipc::proxy::read_gpu(conn, &path.as_ref()).await?;
        let mut parts = Vec::with_capacity(gpu.partitions.len());
        for part in &gpu.partitions {
            parts.push(ipc::proxy::read_partition(conn, &part.as_ref()).await?);
        }
        partitions.insert(gpu.bdf.clone(), parts);
        gpus.push(gpu);
    }
    Ok((gpus, partitions))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::mi300x;

    fn snapshot(gpus: Vec<GpuInfo>) -> Snapshot {
        let partitions = gpus.iter().map(|g| (g.bdf.clone(), Vec::new())).collect();
        Snapshot::from_gpud(&gpus, partitions, DmemBackend::default())
    }

    #[test]
    fn a_gpu_a_restarted_amd_gpud_no_longer_lists_stays_missing() {
        let before = snapshot(vec![
            mi300x("0000:05:00.0", "GPU-a"),
            mi300x("0000:15:00.0", "GPU-b"),
        ]);
        let mut fresh = snapshot(vec![mi300x("0000:15:00.0", "GPU-b")]);
        keep_vanished(&before, &mut fresh);
        let bdfs: Vec<&str> = fresh.devices().iter().map(|g| g.bdf.as_str()).collect();
        assert_eq!(bdfs, ["0000:05:00.0", "0000:15:00.0"], "kept, in PCI order");
        assert_eq!(fresh.devices()[0].health, Health::Missing);
        assert_eq!(fresh.devices()[0].health_reason, VANISHED_REASON);
        assert!(fresh.partitions.contains_key("0000:05:00.0"));
        assert_eq!(fresh.devices()[1].health, Health::Healthy);
        // Still missing on the next read; back when amd-gpud lists it again.
        let mut next = snapshot(vec![mi300x("0000:15:00.0", "GPU-b")]);
        keep_vanished(&fresh, &mut next);
        assert_eq!(next, fresh);
        let mut back = snapshot(vec![
            mi300x("0000:05:00.0", "GPU-a"),
            mi300x("0000:15:00.0", "GPU-b"),
        ]);
        keep_vanished(&next, &mut back);
        assert!(back.devices().iter().all(|g| g.health == Health::Healthy));
    }

    #[test]
    fn a_gpu_replaced_at_its_pci_address_is_not_kept() {
        let before = snapshot(vec![mi300x("0000:05:00.0", "GPU-a")]);
        let mut fresh = snapshot(vec![mi300x("0000:05:00.0", "GPU-c")]);
        keep_vanished(&before, &mut fresh);
        assert_eq!(fresh.devices().len(), 1);
        assert_eq!(fresh.devices()[0].rocr_uuid, "GPU-c");
    }
}
