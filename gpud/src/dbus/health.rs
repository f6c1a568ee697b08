//! The health pulse on the bus: the probes run off the executor without the
//! service lock, the results are folded into the service, and transitions are
//! published like any other change (`PropertiesChanged` of `Health` and
//! `HealthReason`, then `InventoryChanged`).

use std::time::Duration;

use tokio::{task::JoinHandle, time::MissedTickBehavior};
use tracing::{Instrument, debug_span, warn};
use zbus::Connection;

use super::{
    node::Shared,
    publish::{self, PublishError},
};
use crate::{
    health::{self, ProbeError},
    service::{ObjectKey, Service},
};

type Results = Vec<(ObjectKey, Result<(), ProbeError>)>;

fn lock(shared: &Shared) -> std::sync::MutexGuard<'_, Service> {
    shared
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Runs a round of probes every `pulse`, forever.
pub async fn pulses(conn: &Connection, shared: &Shared, pulse: Duration) {
    let mut ticker = tokio::time::interval(pulse);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut pending = None;
    loop {
        ticker.tick().await;
        let round = pulse_once(conn, shared, pulse, &mut pending);
        if let Err(err) = round.instrument(debug_span!("health_pulse")).await {
            warn!("health pulse failed: {err}");
        }
    }
}

/// One round. The probes get half a pulse; when they do not return in time
/// (a device whose open hangs), every device of the round fails with
/// [`ProbeError::Hung`], and so does every later round until the stuck one
/// returns (no second round is started meanwhile).
async fn pulse_once(
    conn: &Connection,
    shared: &Shared,
    pulse: Duration,
    pending: &mut Option<JoinHandle<Results>>,
) -> Result<(), PublishError> {
    let service = shared.clone();
    let targets = tokio::task::spawn_blocking(move || lock(&service).health_targets()).await?;
    let keys: Vec<ObjectKey> = targets.iter().map(|t| t.key).collect();
    let budget = pulse / 2;
    let results = match pending.take() {
        Some(stuck) if !stuck.is_finished() => {
            *pending = Some(stuck);
            hung(&keys, budget)
        }
        _ => {
            let mut probes = tokio::task::spawn_blocking(move || health::probe::run(&targets));
            match tokio::time::timeout(budget, &mut probes).await {
                Ok(done) => done?,
                Err(_) => {
                    *pending = Some(probes);
                    hung(&keys, budget)
                }
            }
        }
    };
    let service = shared.clone();
    let update = tokio::task::spawn_blocking(move || lock(&service).record_health(results)).await?;
    if !update.is_empty() {
        publish::publish(conn, shared, &update, false).await?;
    }
    Ok(())
}

fn hung(keys: &[ObjectKey], budget: Duration) -> Results {
    keys.iter()
        .map(|k| (*k, Err(ProbeError::Hung(budget))))
        .collect()
}
