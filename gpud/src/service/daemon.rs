//! The service task: it alone owns the [`Service`], and runs its loops (the
//! periodic rescan, the health pulse, partition switches waiting for the
//! driver) and the CDI write. A transport reaches it through a [`Handle`]
//! and applies the [`Published`] changes it sends, in order; the task waits
//! for each to be applied before it answers the request behind it.
//!
//! Nothing blocking runs on the task: reads of the host go to threads of
//! their own ([`super::scans`]), probes and writes to the blocking pool, so
//! the task keeps taking requests while AMD SMI is probed, and a transport
//! answers from the last [`Snapshot`] without asking it at all.

use std::{sync::Arc, time::Duration};

use tokio::{
    sync::{mpsc, oneshot},
    task::{JoinHandle, JoinSet},
    time::{Instant, Interval, MissedTickBehavior},
};
use tracing::{Instrument, Span, debug_span, info, info_span, warn};

use super::{
    ObjectKey, Presence, Scanned, Service, Shown, Update,
    api::{Handle, Origin, Published, Request, ScanError, Snapshot, SwitchError},
    pulse::{Event, Pulse},
    scans::{Queued, Scans, answer},
    switch,
};
use crate::pci::PciAddress;

/// Requests queued before a caller waits to send one.
const REQUESTS: usize = 64;

/// A started service task.
#[derive(Debug)]
pub struct Spawned {
    pub handle: Handle,
    /// The changes to apply, in order.
    pub updates: mpsc::Receiver<Published>,
    /// Ends when every [`Handle`] is gone (or the task panicked).
    pub task: JoinHandle<()>,
}

/// Starts the task that owns `service`. Nothing is read until the first
/// [`Origin::First`] rescan; the periodic rescan (every `rescan`) and the
/// health pulse start once a read has succeeded.
pub fn spawn(service: Service, rescan: Option<Duration>) -> Spawned {
    let (requests_tx, requests) = mpsc::channel(REQUESTS);
    let (updates, updates_rx) = mpsc::channel(1);
    let daemon = Daemon {
        service,
        weak: requests_tx.downgrade(),
        requests,
        updates,
        scans: Scans::default(),
        rescan_every: rescan,
        armed: false,
        ticker: None,
        pulse: None,
        switches: JoinSet::new(),
    };
    Spawned {
        handle: Handle {
            requests: requests_tx,
        },
        updates: updates_rx,
        task: tokio::spawn(daemon.run()),
    }
}

struct Daemon {
    service: Service,
    requests: mpsc::Receiver<Request>,
    /// Handed to partition switches, which rescan like any caller.
    weak: mpsc::WeakSender<Request>,
    updates: mpsc::Sender<Published>,
    scans: Scans,
    rescan_every: Option<Duration>,
    /// Whether the loops were started (after the first good read).
    armed: bool,
    ticker: Option<Interval>,
    pulse: Option<Pulse>,
    /// Switches waiting for the driver; aborted when the task ends.
    switches: JoinSet<()>,
}

impl Daemon {
    async fn run(mut self) {
        loop {
            tokio::select! {
                request = self.requests.recv() => match request {
                    Some(request) => self.handle(request),
                    None => return,
                },
                () = tick(self.ticker.as_mut()) => self.queue(Queued {
                    reprobe: false,
                    reply: None,
                    span: info_span!("periodic_rescan"),
                }),
                (job, read) = self.scans.finished() => self.scanned(job, read).await,
                event = next_pulse(self.pulse.as_mut()) => {
                    self.pulse_event(event).instrument(debug_span!("health_pulse")).await;
                }
                Some(_) = self.switches.join_next(), if !self.switches.is_empty() => {}
            }
        }
    }

    fn handle(&mut self, request: Request) {
        match request {
            Request::Rescan {
                origin,
                span,
                reply,
            } => {
                let reprobe = match origin {
                    Origin::First => true,
                    Origin::Internal => false,
                    Origin::Caller => {
                        let reprobe = self.service.rescan_may_probe(std::time::Instant::now());
                        span.in_scope(|| info!(reprobe, "rescan requested"));
                        reprobe
                    }
                };
                let reply = Some(reply);
                self.queue(Queued {
                    reprobe,
                    reply,
                    span,
                });
            }
            Request::SetComputePartition {
                gpu,
                mode,
                allocations_exist,
                span,
                reply,
            } => self.switch(gpu, mode, allocations_exist, span, reply),
        }
    }

    fn queue(&mut self, job: Queued) {
        self.scans.push(job);
        self.start_next();
    }

    fn start_next(&mut self) {
        while let Some(job) = self.scans.next() {
            let plan = self.service.plan_scan(job.reprobe);
            self.scans.start(plan, job);
        }
    }

    async fn scanned(&mut self, job: Queued, read: Result<Scanned, ScanError>) {
        let result = match read {
            Ok(scanned) => self.fold(scanned).instrument(job.span.clone()).await,
            Err(err) => Err(err),
        };
        if result.is_ok() {
            self.arm();
        }
        answer(job, result);
        self.start_next();
    }

    /// Folds a read in, publishes the change and refreshes the CDI spec.
    async fn fold(&mut self, scanned: Scanned) -> Result<Arc<Snapshot>, ScanError> {
        let before = self.service.meta().clone();
        let update = self.service.fold_scan(scanned);
        let meta_changed = before != *self.service.meta();
        let state = self.publish(update, meta_changed).await?;
        self.write_cdi().await;
        Ok(state)
    }

    /// Sends `update` to the transport and waits until it is applied.
    async fn publish(
        &mut self,
        update: Update,
        meta_changed: bool,
    ) -> Result<Arc<Snapshot>, ScanError> {
        let state = Arc::new(Snapshot {
            registry: self.service.shared_registry(),
            meta: self.service.meta().clone(),
        });
        let (applied, done) = oneshot::channel();
        let published = Published {
            shown: self.shown(&update),
            update,
            state: state.clone(),
            meta_changed,
            applied,
        };
        let gone = || ScanError::Publish("nothing applies the changes".to_owned());
        self.updates.send(published).await.map_err(|_| gone())?;
        done.await
            .map_err(|_| gone())?
            .map_err(ScanError::Publish)?;
        Ok(state)
    }

    /// What each object of `update` shows, GPUs before their partitions.
    fn shown(&self, update: &Update) -> Vec<(ObjectKey, Shown)> {
        let registry = self.service.registry();
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
                let presence = match key {
                    ObjectKey::Gpu(bdf) => registry.gpu(bdf)?.1,
                    ObjectKey::Partition(bdf, index) => registry.partition(bdf, index)?.1,
                };
                Some((key, self.service.health_of(key, presence)))
            })
            .collect()
    }

    /// Refreshes the CDI spec (when enabled) from the published inventory;
    /// a failure is logged, not fatal: the plugin can still hand out device
    /// nodes.
    async fn write_cdi(&self) {
        let config = self.service.config();
        if !config.cdi {
            return;
        }
        let paths = config.paths.clone();
        let present = self.service.registry().gpus();
        let spec = crate::cdi::spec(
            &paths,
            present.filter_map(|(g, p)| (p == Presence::Present).then_some(g)),
        );
        let written = tokio::task::spawn_blocking(move || {
            let written = crate::cdi::write(&paths, &spec);
            (paths, written)
        });
        match written.await {
            Ok((paths, Ok(true))) => info!(dir = %paths.cdi.display(), "CDI spec written"),
            Ok((_, Ok(false))) => {}
            Ok((_, Err(err))) => warn!("{err}"),
            Err(err) => warn!("the CDI write failed: {err}"),
        }
    }

    /// Starts the periodic rescan and the health pulse, once.
    fn arm(&mut self) {
        if std::mem::replace(&mut self.armed, true) {
            return;
        }
        self.ticker = self.rescan_every.map(|every| {
            let mut ticker = tokio::time::interval_at(Instant::now() + every, every);
            ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
            ticker
        });
        self.pulse = self.service.config().health.pulse.map(Pulse::new);
    }

    async fn pulse_event(&mut self, event: Event) {
        let results = match event {
            Event::Tick => {
                let targets = self.service.health_targets();
                let Some(pulse) = self.pulse.as_mut() else {
                    return;
                };
                match pulse.start(targets) {
                    Some(hung) => hung,
                    None => return,
                }
            }
            Event::Done(results) => results,
            Event::Died(err) => {
                warn!("health pulse failed: the probe task failed: {err}");
                return;
            }
        };
        let update = self.service.record_health(results);
        if update.is_empty() {
            return;
        }
        if let Err(err) = self.publish(update, false).await {
            warn!("health pulse failed: {err}");
        }
    }

    /// Starts a switch of `gpu` when the registry has it present.
    fn switch(
        &mut self,
        gpu: PciAddress,
        mode: &'static str,
        allocations_exist: bool,
        span: Span,
        reply: oneshot::Sender<Result<u64, SwitchError>>,
    ) {
        let found = self
            .service
            .registry()
            .gpu(gpu)
            .filter(|(_, presence)| *presence == Presence::Present)
            .map(|(g, _)| g.clone());
        let Some(found) = found else {
            drop(reply.send(Err(SwitchError::NotFound(gpu))));
            return;
        };
        let config = self.service.config();
        let job = switch::Job {
            paths: config.paths.clone(),
            amdsmi: config.amdsmi.clone(),
            gpu: found,
            mode,
            allocations_exist,
            service: self.weak.clone(),
            span,
        };
        self.switches
            .spawn(async move { drop(reply.send(job.run().await)) });
    }
}

async fn tick(ticker: Option<&mut Interval>) {
    match ticker {
        Some(t) => drop(t.tick().await),
        None => std::future::pending().await,
    }
}

async fn next_pulse(pulse: Option<&mut Pulse>) -> Event {
    match pulse {
        Some(pulse) => pulse.next().await,
        None => std::future::pending().await,
    }
}
