//! The health state machine of one device: hysteresis plus flap damping,
//! fed with one probe result per tick. Pure: no I/O, no clock of its own (the
//! caller passes the tick, the pulse number), so tests drive simulated time.
//! The design is explained in the [module documentation](super).

/// Penalty one flap event costs (a transition, or an interrupted run).
const POINT: f64 = 1.0;
/// The penalty at or below which a passing device may recover: the point its
/// own outage cost, and nothing else.
const RECOVERY_THRESHOLD: f64 = POINT;
/// Upper bound of the penalty, so that a device that flapped for hours
/// recovers after a bounded quiet time (`log2(16)` = 4 half-lives).
const MAX_PENALTY: f64 = 16.0 * POINT;
/// The penalty a device starts with: its faults are not believed to be
/// one-offs before it has passed its probes for a while.
const PROBATION: f64 = 2.0 * POINT;

/// Tuning, counted in probes (pulses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    /// Consecutive failed probes that make a healthy device unhealthy (N).
    pub unhealthy_after: u32,
    /// Consecutive passed probes that make an unhealthy device healthy (M),
    /// unless flap damping holds it.
    pub healthy_after: u32,
    /// Pulses in which the flap penalty halves.
    pub half_life: u32,
}

impl Default for Params {
    fn default() -> Self {
        Self {
            unhealthy_after: 3,
            healthy_after: 2,
            half_life: 15,
        }
    }
}

/// The state of one device.
#[derive(Debug, Clone, PartialEq)]
pub struct Damper {
    params: Params,
    healthy: bool,
    /// Consecutive failed probes (0 after a pass).
    fails: u32,
    /// Consecutive passed probes (0 after a failure).
    passes: u32,
    /// Flap penalty as of `tick`.
    penalty: f64,
    tick: u64,
}

impl Damper {
    /// A healthy device first seen at `tick`, on probation.
    pub fn new(params: Params, tick: u64) -> Self {
        Self {
            params: Params {
                unhealthy_after: params.unhealthy_after.max(1),
                healthy_after: params.healthy_after.max(1),
                half_life: params.half_life.max(1),
            },
            healthy: true,
            fails: 0,
            passes: 0,
            penalty: PROBATION,
            tick,
        }
    }

    /// Whether the device is in service.
    pub fn healthy(&self) -> bool {
        self.healthy
    }

    /// Whether the device passes its probes but is kept out of service by
    /// flap damping.
    pub fn held(&self) -> bool {
        !self.healthy && self.passes >= self.params.healthy_after
    }

    /// The flap penalty as of the last observation.
    #[cfg(test)]
    pub fn penalty(&self) -> f64 {
        self.penalty
    }

    /// Feeds the probe result of `tick` (ticks must not go backwards; a
    /// repeated tick decays nothing). Returns the new health when it changed.
    pub fn observe(&mut self, tick: u64, passed: bool) -> Option<bool> {
        self.decay_to(tick);
        if passed { self.pass() } else { self.fail() }
    }

    fn pass(&mut self) -> Option<bool> {
        if self.healthy && self.fails > 0 {
            // A failure run that ended before N: the probe wobbles.
            self.add(POINT);
        }
        self.fails = 0;
        self.passes = self.passes.saturating_add(1);
        let may_recover = self.passes >= self.params.healthy_after
            && self.penalty <= RECOVERY_THRESHOLD + f64::EPSILON;
        (!self.healthy && may_recover).then(|| self.flip(true))
    }

    fn fail(&mut self) -> Option<bool> {
        if !self.healthy && self.passes > 0 {
            // A run of passes that did not bring the device back: wobbling.
            self.add(POINT);
        }
        self.passes = 0;
        self.fails = self.fails.saturating_add(1);
        (self.healthy && self.fails >= self.params.unhealthy_after).then(|| self.flip(false))
    }

    fn flip(&mut self, healthy: bool) -> bool {
        self.healthy = healthy;
        self.add(POINT);
        healthy
    }

    fn add(&mut self, points: f64) {
        self.penalty = (self.penalty + points).min(MAX_PENALTY);
    }

    fn decay_to(&mut self, tick: u64) {
        let elapsed = tick.saturating_sub(self.tick);
        self.tick = self.tick.max(tick);
        if elapsed == 0 {
            return;
        }
        // Exact for any realistic gap; a gap beyond 2^32 pulses decays fully.
        let elapsed = f64::from(u32::try_from(elapsed).unwrap_or(u32::MAX));
        self.penalty *= (-elapsed / f64::from(self.params.half_life)).exp2();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// xorshift64*: a seeded, dependency-free source of probe results.
    struct XorShift(u64);

    impl XorShift {
        fn coin(&mut self) -> bool {
            let mut x = self.0;
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            self.0 = x;
            x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 63 == 1
        }
    }

    /// Runs `results` from tick `start`; returns the ticks of the transitions.
    fn run(d: &mut Damper, start: u64, results: &[bool]) -> Vec<u64> {
        (start..)
            .zip(results)
            .filter_map(|(tick, ok)| d.observe(tick, *ok).map(|_| tick))
            .collect()
    }

    fn params(n: u32, m: u32) -> Params {
        Params {
            unhealthy_after: n,
            healthy_after: m,
            ..Params::default()
        }
    }

    /// A device that passed its probes for a long time (probation over).
    fn trusted(p: Params) -> (Damper, u64) {
        let mut d = Damper::new(p, 0);
        let start = 20 * u64::from(p.half_life);
        assert!(run(&mut d, 0, &vec![true; usize::try_from(start).unwrap()]).is_empty());
        assert!(d.penalty() < 0.01);
        (d, start)
    }

    #[test]
    fn unhealthy_after_n_failures_and_healthy_after_m_passes() {
        for (n, m) in [(1, 1), (3, 2), (5, 4)] {
            let (mut d, t) = trusted(params(n, m));
            let fails = vec![false; usize::try_from(n).unwrap()];
            let down = run(&mut d, t, &fails);
            assert_eq!(down, [t + u64::from(n) - 1], "N={n}");
            assert!(!d.healthy());
            let t = t + u64::from(n) + 10;
            assert!(
                run(&mut d, t - 10, &[false; 10]).is_empty(),
                "a solid outage"
            );
            let up = run(&mut d, t, &vec![true; usize::try_from(m).unwrap()]);
            assert_eq!(up, [t + u64::from(m) - 1], "M={m}: back after M passes");
            assert!(d.healthy());
        }
    }

    #[test]
    fn fewer_than_n_failures_or_m_passes_change_nothing() {
        let (mut d, t) = trusted(params(3, 2));
        assert!(run(&mut d, t, &[false, false, true, false, false, true]).is_empty());
        assert!(d.healthy());
        let mut d = Damper::new(params(3, 3), 0);
        run(&mut d, 0, &[false; 3]);
        assert!(!d.healthy());
        assert!(run(&mut d, 3, &[true, true, false, true, true]).is_empty());
        assert!(!d.healthy());
    }

    /// Clean faults (a solid run of failures, then solid passes) one after
    /// the other; returns the passes each needed to come back.
    fn back_to_back(d: &mut Damper, mut t: u64, faults: usize, gap: u64) -> Vec<u64> {
        let mut holds = Vec::new();
        for _ in 0..faults {
            assert_eq!(run(d, t, &[false; 5]).len(), 1, "out after N failures");
            t += 5;
            let mut passes = 0;
            while !d.healthy() {
                d.observe(t, true);
                t += 1;
                passes += 1;
            }
            holds.push(passes);
            assert!(run(d, t, &vec![true; usize::try_from(gap).unwrap()]).is_empty());
            t += gap;
        }
        holds
    }

    #[test]
    fn repeated_faults_are_held_and_a_long_clean_record_earns_trust_back() {
        let p = params(3, 2);
        let (mut d, t) = trusted(p);
        let holds = back_to_back(&mut d, t, 4, 0);
        assert_eq!(holds[0], 2, "the first clean fault recovers after M passes");
        assert!(holds[1..].iter().all(|h| *h > 10), "{holds:?}");
        assert!(
            holds.iter().all(|h| *h <= 4 * u64::from(p.half_life) + 2),
            "{holds:?}"
        );
        // Faults an hour apart (360 pulses) are each believed to be one-offs.
        let (mut d, t) = trusted(p);
        assert_eq!(back_to_back(&mut d, t, 3, 360), [2, 2, 2]);
    }

    #[test]
    fn a_device_that_fails_right_at_start_is_held_on_probation() {
        let p = params(3, 2);
        let mut d = Damper::new(p, 0);
        assert_eq!(run(&mut d, 0, &[false; 3]), [2]);
        let back = run(&mut d, 3, &[true; 40]);
        let held = back[0] - 3 + 1;
        assert!(held > u64::from(p.healthy_after), "held {held}");
        assert!(held <= 2 * u64::from(p.half_life), "held {held}");
    }

    #[test]
    fn unhealthy_is_never_delayed() {
        // However high the penalty, N failures take the device out.
        let mut d = Damper::new(params(3, 2), 0);
        let mut flaky = XorShift(0x9e37_79b9_7f4a_7c15);
        let noise: Vec<bool> = (0..100).map(|_| flaky.coin()).collect();
        run(&mut d, 0, &noise);
        if d.healthy() {
            assert_eq!(run(&mut d, 100, &[false; 3]).len(), 1);
        }
        let mut d = Damper::new(params(3, 2), 0);
        let mut t = 0;
        for _ in 0..5 {
            assert_eq!(run(&mut d, t, &[false; 3]).len(), 1, "out after N failures");
            t += 3;
            while !d.healthy() {
                d.observe(t, true);
                t += 1;
            }
        }
    }

    /// Transitions in any window of `window` ticks.
    fn worst_window(transitions: &[u64], window: u64) -> usize {
        transitions
            .iter()
            .map(|start| {
                transitions
                    .iter()
                    .filter(|t| **t >= *start && **t < start + window)
                    .count()
            })
            .max()
            .unwrap_or(0)
    }

    #[test]
    fn a_fifty_percent_probe_flips_at_most_once_per_five_minutes() {
        // The default pulse is 10 s: five minutes are 30 pulses. 256 devices,
        // each probed at random for 5 minutes and for 2 hours.
        let p = Params::default();
        let mut rng = XorShift(0x5eed_1234_abcd_ef01);
        let mut went_out = 0;
        for device in 0..256 {
            let short: Vec<bool> = (0..30).map(|_| rng.coin()).collect();
            let mut d = Damper::new(p, 0);
            let transitions = run(&mut d, 0, &short);
            assert!(transitions.len() <= 1, "device {device}: {transitions:?}");
            went_out += transitions.len();
            let long: Vec<bool> = (0..720).map(|_| rng.coin()).collect();
            let mut d = Damper::new(p, 0);
            let transitions = run(&mut d, 0, &long);
            let worst = worst_window(&transitions, 30);
            assert!(worst <= 1, "device {device}: {transitions:?}");
        }
        assert!(went_out > 100, "a flaky device is taken out: {went_out}");
    }

    #[test]
    fn a_trusted_device_that_turns_flaky_gets_one_quick_recovery_only() {
        // Its first flap looks like a genuine short fault (the documented
        // limit); from then on the wobbles hold it.
        let p = Params::default();
        let mut rng = XorShift(0x0dd_ba11);
        for device in 0..256 {
            let (mut d, t) = trusted(p);
            let noise: Vec<bool> = (0..720).map(|_| rng.coin()).collect();
            let transitions = run(&mut d, t, &noise);
            let later = transitions.get(2..).unwrap_or_default();
            assert!(
                worst_window(later, 30) <= 1,
                "device {device}: {transitions:?}"
            );
            assert!(worst_window(&transitions, 30) <= 3, "{transitions:?}");
        }
    }

    #[test]
    fn a_flaky_device_recovers_once_its_probe_is_steady() {
        let p = Params::default();
        let mut rng = XorShift(42);
        let mut d = Damper::new(p, 0);
        let noise: Vec<bool> = (0..120).map(|_| rng.coin()).collect();
        run(&mut d, 0, &noise);
        assert!(!d.healthy());
        let back = run(&mut d, 120, &[true; 100]);
        assert_eq!(back.len(), 1, "recovers without a restart");
        assert!(back[0] - 120 <= 4 * u64::from(p.half_life) + 1, "{back:?}");
    }

    #[test]
    fn held_is_reported_and_gaps_decay() {
        let mut d = Damper::new(params(1, 1), 0);
        d.observe(0, false);
        d.observe(1, true);
        assert!(d.held(), "passing but on probation");
        let before = d.penalty();
        d.observe(2, true);
        assert!(d.penalty() < before && !d.healthy());
        d.observe(2 + 2 * 15, true);
        assert!(d.healthy(), "two half-lives later the penalty allows it");
    }
}
