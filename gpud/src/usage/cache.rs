//! The last reading, kept for [`TTL`] so that several scrapers (and their
//! retries) cost one read of the host.

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use super::Reading;

/// How long a reading is served again.
pub(crate) const TTL: Duration = Duration::from_secs(2);

/// The last reading and when it was taken.
#[derive(Debug, Default)]
pub(crate) struct Cache(Mutex<Option<(Instant, Arc<Reading>)>>);

impl Cache {
    /// The reading, if it was taken less than [`TTL`] before `now`.
    pub(crate) fn fresh(&self, now: Instant) -> Option<Arc<Reading>> {
        let slot = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        slot.as_ref()
            .filter(|(at, _)| now.saturating_duration_since(*at) < TTL)
            .map(|(_, r)| r.clone())
    }

    pub(crate) fn store(&self, at: Instant, reading: Arc<Reading>) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some((at, reading));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reading_is_fresh_for_the_ttl_only() {
        let cache = Cache::default();
        let t0 = Instant::now();
        assert!(cache.fresh(t0).is_none());
        cache.store(t0, Arc::new(Reading::default()));
        assert!(cache.fresh(t0 + TTL / 2).is_some());
        assert!(cache.fresh(t0 + TTL).is_none());
    }
}
