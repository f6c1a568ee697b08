//! What the check remembers of images, by digest (and the pod's way of
//! starting the container, `RunSpec::cache_key`): findings, and why an
//! inspection failed (issue 38, F3: a failure was not kept, so a hostile
//! image was inspected again in full at every container start), each entry
//! with its text bounded.

use std::{
    collections::{HashMap, VecDeque},
    time::{Duration, Instant},
};

use crate::loader_check::{Finding, Loader};

/// Findings kept (one per image digest).
pub(super) const CACHED: usize = 512;
/// Failures kept: fewer than findings, so that a flood of failing images
/// evicts only failures, never a finding.
pub(super) const FAILURES_CACHED: usize = 256;
/// Bytes of evidence, of an unknown loader's reason or of a failure's
/// reason kept and answered: the evidence of a real image is one line of
/// a few hundred bytes; an image could make it megabytes (3.9 MB seen).
pub(crate) const MAX_EVIDENCE: usize = 1024;

/// `text` cut to [`MAX_EVIDENCE`] bytes at most, marked where it was cut.
pub(crate) fn cap_text(text: &mut String) {
    if text.len() <= MAX_EVIDENCE {
        return;
    }
    let marker = format!(" [... {} bytes cut]", text.len());
    let mut end = MAX_EVIDENCE.saturating_sub(marker.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push_str(&marker);
}

/// `found` with its texts capped.
pub(super) fn capped(mut found: Finding) -> Finding {
    cap_text(&mut found.evidence);
    if let Loader::Unknown { why } = &mut found.loader {
        cap_text(why);
    }
    found
}

/// Values by key, the oldest out first beyond `max`.
#[derive(Debug)]
struct Fifo<V> {
    by_key: HashMap<String, V>,
    order: VecDeque<String>,
    max: usize,
}

impl<V> Fifo<V> {
    fn new(max: usize) -> Self {
        Self {
            by_key: HashMap::new(),
            order: VecDeque::new(),
            max,
        }
    }

    fn put(&mut self, key: &str, value: V) {
        if self.by_key.insert(key.to_owned(), value).is_none() {
            self.order.push_back(key.to_owned());
        }
        while self.order.len() > self.max {
            if let Some(old) = self.order.pop_front() {
                self.by_key.remove(&old);
            }
        }
    }
}

/// Findings and failures by image digest.
#[derive(Debug)]
pub(super) struct Cache {
    found: Fifo<Finding>,
    /// Why, and when it was stored.
    failed: Fifo<(String, Instant)>,
    /// How long a failure is answered from the cache.
    failure_ttl: Duration,
}

impl Cache {
    pub(super) fn new(failure_ttl: Duration) -> Self {
        Self {
            found: Fifo::new(CACHED),
            failed: Fifo::new(FAILURES_CACHED),
            failure_ttl,
        }
    }

    pub(super) fn put(&mut self, key: &str, found: &Finding) {
        self.found.put(key, found.clone());
    }

    /// Keeps why `digest` failed, unless that is known already (an answer
    /// from the cache does not renew its time to live).
    pub(super) fn put_failure(&mut self, digest: &str, why: &str) {
        if self.get(digest).is_none() {
            self.failed.put(digest, (why.to_owned(), Instant::now()));
        }
    }

    /// What is known of `digest`: its finding, or why it failed (within
    /// the failure's time to live).
    pub(super) fn get(&self, digest: &str) -> Option<Result<Finding, String>> {
        if let Some(found) = self.found.by_key.get(digest) {
            return Some(Ok(found.clone()));
        }
        let (why, at) = self.failed.by_key.get(digest)?;
        (at.elapsed() < self.failure_ttl).then(|| Err(why.clone()))
    }

    #[cfg(test)]
    pub(super) fn findings(&self) -> usize {
        self.found.by_key.len()
    }

    #[cfg(test)]
    pub(super) fn failures(&self) -> usize {
        self.failed.by_key.len()
    }
}
