//! The health pulse of the service task: a round of probes every pulse, off
//! the executor. The probes get half a pulse; when they do not return in
//! time (a device whose open hangs), every device of the round fails with
//! [`ProbeError::Hung`], and so does every later round until the stuck one
//! returns (no second round is started meanwhile).

use std::time::Duration;

use tokio::{
    task::{JoinError, JoinHandle},
    time::{Instant, Interval, MissedTickBehavior},
};

use super::ObjectKey;
use crate::health::{self, ProbeError, Target};

/// The results of one round, per partition.
pub type Results = Vec<(ObjectKey, Result<(), ProbeError>)>;

/// A round in flight.
#[derive(Debug)]
struct Round {
    probes: JoinHandle<Results>,
    keys: Vec<ObjectKey>,
    until: Instant,
}

/// What the pulse asks of the service task next.
#[derive(Debug)]
pub enum Event {
    /// Time for a round: hand [`Pulse::start`] the targets.
    Tick,
    /// A round's results, to fold in.
    Done(Results),
    /// The probe task died.
    Died(JoinError),
}

/// The ticker, the round in flight and the one stuck past its budget.
#[derive(Debug)]
pub struct Pulse {
    every: Duration,
    ticker: Interval,
    round: Option<Round>,
    stuck: Option<JoinHandle<Results>>,
}

impl Pulse {
    /// A pulse whose first round is due now.
    pub fn new(every: Duration) -> Self {
        let mut ticker = tokio::time::interval(every);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        Self {
            every,
            ticker,
            round: None,
            stuck: None,
        }
    }

    fn budget(&self) -> Duration {
        self.every / 2
    }

    /// The next event; cancel-safe.
    pub async fn next(&mut self) -> Event {
        let budget = self.budget();
        let Some(round) = self.round.as_mut() else {
            self.ticker.tick().await;
            return Event::Tick;
        };
        let done = tokio::time::timeout_at(round.until, &mut round.probes).await;
        let Some(round) = self.round.take() else {
            return std::future::pending().await;
        };
        match done {
            Ok(Ok(results)) => Event::Done(results),
            Ok(Err(err)) => Event::Died(err),
            Err(_) => {
                self.stuck = Some(round.probes);
                Event::Done(hung(&round.keys, budget))
            }
        }
    }

    /// Starts a round over `targets`, or answers at once with every target
    /// hung while an earlier round is still stuck.
    pub fn start(&mut self, targets: Vec<Target<ObjectKey>>) -> Option<Results> {
        let keys: Vec<ObjectKey> = targets.iter().map(|t| t.key).collect();
        if self.stuck.as_ref().is_some_and(|s| !s.is_finished()) {
            return Some(hung(&keys, self.budget()));
        }
        self.stuck = None;
        let probes = tokio::task::spawn_blocking(move || health::probe::run(&targets));
        self.round = Some(Round {
            probes,
            keys,
            until: Instant::now() + self.budget(),
        });
        None
    }
}

fn hung(keys: &[ObjectKey], budget: Duration) -> Results {
    keys.iter()
        .map(|k| (*k, Err(ProbeError::Hung(budget))))
        .collect()
}
