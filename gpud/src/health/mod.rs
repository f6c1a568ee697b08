//! Device health: probes run every pulse, and a state machine per device that
//! turns probe results into `Healthy` or `Unhealthy` without flapping.
//! Transport-neutral: the service feeds it, the D-Bus adapter publishes it.
//!
//! # Probes
//!
//! Every `--health-pulse` seconds each present partition is probed
//! ([`probe`]): its DRM render and card nodes must still open (read-only,
//! non-blocking; `/dev/kfd` is only checked to exist, because opening it
//! creates a KFD process), its KFD topology node must still be there with the
//! same `gpu_id`, and the last AMD SMI probe must report no fatal state for it
//! (a driver, DRM or I/O error, [`amdsmi::fatal_states`]). A GPU passes when
//! all its present partitions pass. A GPU or partition that leaves the
//! inventory is reported `Missing` by the registry, whatever its probes said.
//!
//! # Hysteresis and flap damping
//!
//! Each GPU and partition has a [`Damper`], fed one probe result per pulse:
//!
//! * **Hysteresis.** A healthy device turns unhealthy after N consecutive
//!   failed probes (`--unhealthy-after`, default 3), an unhealthy one healthy
//!   after M consecutive passes (`--healthy-after`, default 2). Going out of
//!   service is never delayed further.
//! * **Flap penalty.** Every flap event costs the device one point: each
//!   transition, and each *interrupted run*, i.e. a failure between passes
//!   while healthy (a run that did not reach N) or a pass between failures
//!   while unhealthy. The penalty halves every `--health-half-life` pulses
//!   (default 15: 2.5 minutes at the default pulse) and is capped at 16.
//! * **Hold.** An unhealthy device that passes M probes in a row recovers only
//!   when its penalty is at most 1 point, the cost of its own outage. Until
//!   then it stays out of service (*held*, counted in the `HealthHeld`
//!   property) and recovers once the penalty has decayed, without a restart.
//! * **Probation.** A device starts with 2 points: its faults are believed to
//!   be one-offs only after it has passed its probes for a few half-lives.
//!
//! What that gives:
//!
//! * A device with a clean record that fails solidly (a removed node, a
//!   driver reset) goes out after N pulses and comes back M pulses after the
//!   fault clears: its penalty is the one point of its outage.
//! * Faults that repeat within a few half-lives are held longer: the penalty
//!   left by the previous ones adds up (about 1.5 half-lives after a
//!   back-to-back fault, up to 4 half-lives when the penalty is at its cap).
//! * A flaky probe wobbles: its interrupted runs cost a point every few
//!   pulses, so the penalty of a device that fails half its probes at random
//!   stays around 5 points. It goes out once and is held for as long as it
//!   keeps wobbling; it needs about 2.5 quiet half-lives to come back. The
//!   unit tests check at most one transition per device in any 30 pulses
//!   (5 minutes at the default pulse) for 256 such devices over 2 hours.
//! * The limit: the first flap of a device with a long clean record looks
//!   exactly like a short genuine fault (N failures, then M passes), so it
//!   gets the quick recovery once; the wobbles after it hold the device.
//!
//! Everything is counted in pulses (ticks), given by the caller: the state
//! machine reads no clock, so tests run hours of simulated time in
//! microseconds.

pub mod amdsmi;
mod damper;
pub mod probe;

use std::{
    collections::BTreeMap,
    sync::{
        Arc,
        atomic::{AtomicU32, AtomicU64, Ordering},
    },
    time::Duration,
};

pub use damper::{Damper, Params};
pub use probe::{Check, ProbeError, Target};

/// How health is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthConfig {
    /// Time between two rounds of probes; `None` turns health checks off.
    pub pulse: Option<Duration>,
    pub params: Params,
}

impl Default for HealthConfig {
    fn default() -> Self {
        Self {
            pulse: Some(Duration::from_secs(10)),
            params: Params::default(),
        }
    }
}

/// Counters of the health checks: atomics the service task counts in and
/// a transport reads as they are.
#[derive(Debug, Default)]
pub struct Stats {
    /// Rounds of probes run.
    pub pulses: AtomicU64,
    /// Device probes that failed (GPUs and partitions).
    pub failures: AtomicU64,
    /// Health transitions of GPUs and partitions, both ways.
    pub transitions: AtomicU64,
    /// Devices held unhealthy by flap damping although they pass.
    pub held: AtomicU32,
}

impl Stats {
    pub fn pulses(&self) -> u64 {
        self.pulses.load(Ordering::Relaxed)
    }
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }
    pub fn transitions(&self) -> u64 {
        self.transitions.load(Ordering::Relaxed)
    }
    pub fn held(&self) -> u32 {
        self.held.load(Ordering::Relaxed)
    }
}

#[derive(Debug, Clone)]
struct Tracked {
    damper: Damper,
    /// Why the device went out of service (empty while healthy).
    reason: String,
}

/// The health of every probed device, keyed by `K`.
#[derive(Debug)]
pub struct Monitor<K> {
    params: Params,
    devices: BTreeMap<K, Tracked>,
    tick: u64,
    stats: Arc<Stats>,
}

impl<K: Ord + Copy> Monitor<K> {
    pub fn new(params: Params) -> Self {
        Self {
            params,
            devices: BTreeMap::new(),
            tick: 0,
            stats: Arc::default(),
        }
    }

    /// The counters, shared.
    pub fn stats(&self) -> &Arc<Stats> {
        &self.stats
    }

    /// Feeds one round of probe results (one per device probed this pulse;
    /// devices not listed are left as they are). Returns the devices whose
    /// health changed, in key order.
    pub fn pulse(&mut self, results: impl IntoIterator<Item = (K, Result<(), String>)>) -> Vec<K> {
        let tick = self.tick;
        self.tick += 1;
        let mut changed = Vec::new();
        let (mut failures, mut transitions) = (0_u64, 0_u64);
        for (key, result) in results {
            let params = self.params;
            let tracked = self.devices.entry(key).or_insert_with(|| Tracked {
                damper: Damper::new(params, tick),
                reason: String::new(),
            });
            failures += u64::from(result.is_err());
            let flipped = tracked.damper.observe(tick, result.is_ok());
            match (flipped, result) {
                (Some(false), Err(why)) => tracked.reason = why,
                (Some(true), _) => tracked.reason.clear(),
                _ => {}
            }
            if flipped.is_some() {
                transitions += 1;
                changed.push(key);
            }
        }
        let held = self.devices.values().filter(|t| t.damper.held()).count();
        let stats = &self.stats;
        stats.pulses.fetch_add(1, Ordering::Relaxed);
        stats.failures.fetch_add(failures, Ordering::Relaxed);
        stats.transitions.fetch_add(transitions, Ordering::Relaxed);
        stats
            .held
            .store(u32::try_from(held).unwrap_or(u32::MAX), Ordering::Relaxed);
        changed.sort();
        changed
    }

    /// Whether `key` is in service (a device never probed is).
    pub fn healthy(&self, key: K) -> bool {
        self.devices.get(&key).is_none_or(|t| t.damper.healthy())
    }

    /// Why `key` went out of service; empty while it is healthy.
    pub fn reason(&self, key: K) -> &str {
        self.devices.get(&key).map_or("", |t| t.reason.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_monitor_reports_transitions_reasons_and_counters() {
        let params = Params {
            unhealthy_after: 2,
            healthy_after: 1,
            half_life: 1,
        };
        let mut m = Monitor::new(params);
        let ok = |k: u32| (k, Ok(()));
        let bad = |k: u32| (k, Err(format!("device {k} is gone")));
        for _ in 0..10 {
            assert!(m.pulse([ok(1), ok(2)]).is_empty());
        }
        assert!(m.pulse([bad(1), ok(2)]).is_empty());
        assert_eq!(m.pulse([bad(1), ok(2)]), [1]);
        assert!(!m.healthy(1) && m.healthy(2) && m.healthy(3));
        assert_eq!(m.reason(1), "device 1 is gone");
        assert_eq!(m.pulse([ok(1), ok(2)]), [1]);
        assert_eq!(m.reason(1), "");
        let stats = m.stats();
        assert_eq!(
            (stats.pulses(), stats.failures(), stats.transitions()),
            (13, 2, 2)
        );
    }
}
