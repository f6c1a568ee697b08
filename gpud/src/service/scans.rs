//! The service task's reads of the host: one at a time, each on a thread of
//! its own within its [`ScanPlan::deadline`], queued while another runs. A
//! read that misses its deadline is abandoned but remembered: until it
//! returns no other is started, and every queued one fails at once.

use std::{collections::VecDeque, sync::Arc, time::Duration};

use tokio::{
    sync::oneshot::{self, error::TryRecvError},
    time::Instant,
};
use tracing::Span;

use super::{
    ScanPlan, Scanned,
    api::{ScanError, Snapshot},
};
use crate::{deadline, deadline::Overdue, topology::TopologyError};

const WHAT: &str = "the read of the host tree";

/// Where a rescan's outcome goes: a caller, or the log (the ticker's).
pub type Reply = oneshot::Sender<Result<Arc<Snapshot>, ScanError>>;

type Pending = oneshot::Receiver<Result<Scanned, TopologyError>>;

/// A rescan waiting for its turn.
#[derive(Debug)]
pub struct Queued {
    /// Probe AMD SMI again.
    pub reprobe: bool,
    /// `None` for the periodic rescan.
    pub reply: Option<Reply>,
    pub span: Span,
}

/// The read in flight.
#[derive(Debug)]
struct Running {
    read: Pending,
    /// The file the read is at.
    progress: deadline::Progress,
    until: Instant,
    limit: Duration,
    job: Queued,
}

/// The queue, the read in flight and the one stuck past its deadline.
#[derive(Debug, Default)]
pub struct Scans {
    queue: VecDeque<Queued>,
    running: Option<Running>,
    stuck: Option<Pending>,
}

impl Scans {
    /// Queues a rescan. A periodic one is dropped while another periodic
    /// one waits.
    pub fn push(&mut self, job: Queued) {
        if job.reply.is_none() && self.queue.iter().any(|q| q.reply.is_none()) {
            return;
        }
        self.queue.push_back(job);
    }

    /// Whether a read is in flight.
    pub fn busy(&self) -> bool {
        self.running.is_some()
    }

    /// The next queued rescan when it may start now; a queued one that may
    /// not (the stuck read has not returned) is answered with the error.
    pub fn next(&mut self) -> Option<Queued> {
        while !self.busy() {
            let job = self.queue.pop_front()?;
            match self.still_stuck() {
                Ok(()) => return Some(job),
                Err(err) => answer(job, Err(err)),
            }
        }
        None
    }

    fn still_stuck(&mut self) -> Result<(), ScanError> {
        let Some(mut stuck) = self.stuck.take() else {
            return Ok(());
        };
        if matches!(stuck.try_recv(), Err(TryRecvError::Empty)) {
            self.stuck = Some(stuck);
            return Err(Overdue::StillBlocked { what: WHAT }.into());
        }
        tracing::info!("the read that missed its deadline has returned");
        Ok(())
    }

    /// Starts `plan` for `job` on a thread of its own.
    pub fn start(&mut self, plan: ScanPlan, job: Queued) {
        self.start_read(plan.deadline(), job, move || plan.run());
    }

    /// Starts `read` for `job` on a thread of its own, within `limit`.
    fn start_read(
        &mut self,
        limit: Duration,
        job: Queued,
        read: impl FnOnce() -> Result<Scanned, TopologyError> + Send + 'static,
    ) {
        match deadline::spawn_watched(WHAT, read) {
            Ok((read, progress)) => {
                let until = Instant::now() + limit;
                self.running = Some(Running {
                    read,
                    progress,
                    until,
                    limit,
                    job,
                });
            }
            Err(err) => answer(job, Err(err.into())),
        }
    }

    /// Waits until the read in flight returns or misses its deadline (for
    /// ever when none is in flight); cancel-safe. The job is handed back
    /// with the outcome.
    pub async fn finished(&mut self) -> (Queued, Result<Scanned, ScanError>) {
        let Some(running) = self.running.as_mut() else {
            return std::future::pending().await;
        };
        let done = tokio::time::timeout_at(running.until, &mut running.read).await;
        let Some(running) = self.running.take() else {
            return std::future::pending().await;
        };
        let outcome = match done {
            Ok(Ok(read)) => read.map_err(ScanError::from),
            Ok(Err(_)) => Err(Overdue::Died { what: WHAT }.into()),
            Err(_) => {
                let (limit, at) = (running.limit, running.progress.at());
                self.stuck = Some(running.read);
                Err(Overdue::Late {
                    what: WHAT,
                    limit,
                    at,
                }
                .into())
            }
        };
        (running.job, outcome)
    }
}

/// Hands a rescan's outcome to its caller, or logs it (the periodic one).
pub fn answer(job: Queued, result: Result<Arc<Snapshot>, ScanError>) {
    match job.reply {
        Some(reply) => drop(reply.send(result)),
        None => {
            if let Err(err) = result {
                job.span
                    .in_scope(|| tracing::warn!("periodic rescan failed: {err}"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Answer = oneshot::Receiver<Result<Arc<Snapshot>, ScanError>>;

    fn job(reply: bool) -> (Queued, Option<Answer>) {
        let (tx, rx) = oneshot::channel();
        let reply = reply.then_some(tx);
        let rx = reply.is_some().then_some(rx);
        let queued = Queued {
            reprobe: false,
            reply,
            span: Span::none(),
        };
        (queued, rx)
    }

    #[test]
    fn a_periodic_rescan_waits_once_and_callers_keep_their_order() {
        let mut scans = Scans::default();
        let (first, _a) = job(true);
        let (tick, _) = job(false);
        let (again, _) = job(false);
        let (second, _b) = job(true);
        scans.push(first);
        scans.push(tick);
        scans.push(again);
        scans.push(second);
        let order: Vec<bool> = std::iter::from_fn(|| scans.next())
            .map(|q| q.reply.is_some())
            .collect();
        assert_eq!(order, [true, false, true]);
    }

    #[test]
    fn while_a_read_is_stuck_every_queued_one_fails_at_once() {
        let (_blocked, pending) = oneshot::channel();
        let mut scans = Scans {
            stuck: Some(pending),
            ..Scans::default()
        };
        let (first, a) = job(true);
        let (second, b) = job(true);
        scans.push(first);
        scans.push(second);
        assert!(scans.next().is_none());
        for mut rx in [a, b].into_iter().flatten() {
            let err = rx.try_recv().expect("answered at once").unwrap_err();
            assert!(err.to_string().contains("still blocked"), "{err}");
        }
        assert!(scans.stuck.is_some(), "the stuck read is still remembered");
    }

    /// A rescan blocked on a KFD file fails at its deadline naming that
    /// file (issue 38, item 7).
    #[tokio::test]
    async fn a_late_rescan_names_the_file_it_is_blocked_on() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = crate::inventory::tests::blocked_tree(dir.path());
        let paths = crate::HostPaths::under(dir.path());
        let mut scans = Scans::default();
        let (job, _answer) = job(true);
        scans.start_read(Duration::from_millis(200), job, move || {
            crate::topology::read_topology(&paths)?;
            Err(TopologyError::Unstable {
                path: paths.kfd_topology(),
                attempts: 0,
            })
        });
        let finished = tokio::time::timeout(Duration::from_secs(5), scans.finished()).await;
        let (_, outcome) = finished.expect("the deadline was not kept");
        crate::inventory::tests::release(&fifo);
        let err = outcome.expect_err("the read is late").to_string();
        assert!(err.contains("did not finish within 200ms"), "{err}");
        assert!(err.contains(&fifo.display().to_string()), "{err}");
    }
}
