//! The bytes and the time one inspection may spend reading its layers.

use std::{
    cell::Cell,
    io::{self, Read},
    time::Instant,
};

use super::guard::Refusal;
use crate::loader_check::inspection::{InspectError, Limits};

/// Uncompressed bytes and time left for one inspection, shared by the
/// readers of all its layers.
pub(crate) struct Budget {
    used: Cell<u64>,
    max: u64,
    deadline: Instant,
    tripped: Cell<Option<Trip>>,
}

#[derive(Debug, Clone, Copy)]
pub(super) enum Trip {
    Bytes,
    Time,
    /// A tar extension record refused for its size ([`super::guard`]).
    Record(Refusal),
}

impl Budget {
    pub(crate) fn new(limits: &Limits) -> Self {
        Self {
            used: Cell::new(0),
            max: limits.max_layer_bytes,
            deadline: limits.deadline,
            tripped: Cell::new(None),
        }
    }

    /// Records why the reads stop.
    pub(super) fn trip(&self, why: Trip) {
        self.tripped.set(Some(why));
    }

    pub(super) fn check_time(&self) -> Result<(), InspectError> {
        if Instant::now() >= self.deadline {
            return Err(InspectError::OutOfTime {
                stage: "reading layers",
            });
        }
        Ok(())
    }

    /// The error a failed read stands for: a limit this budget tripped, or
    /// else a read error of the layer `digest`.
    pub(super) fn failure(&self, digest: &str, err: &io::Error) -> InspectError {
        match self.tripped.get() {
            Some(Trip::Bytes) => InspectError::Limit {
                limit: "max_layer_bytes",
                value: self.max,
            },
            Some(Trip::Time) => InspectError::OutOfTime {
                stage: "reading layers",
            },
            Some(Trip::Record(r)) => InspectError::TarRecord {
                digest: digest.to_owned(),
                record: r.record,
                offset: r.offset,
                size: r.size,
                limit: r.limit,
                bound: r.bound,
            },
            None => InspectError::Layer {
                digest: digest.to_owned(),
                offset: Some(self.used.get()),
                why: err.to_string(),
            },
        }
    }
}

/// Counts the uncompressed bytes against the budget, and stops at the
/// deadline.
pub(super) struct Counted<'b, R> {
    pub(super) inner: R,
    pub(super) budget: &'b Budget,
}

impl<R: Read> Read for Counted<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if Instant::now() >= self.budget.deadline {
            self.budget.trip(Trip::Time);
            return Err(io::Error::other("out of time"));
        }
        let n = self.inner.read(buf)?;
        let used = self.budget.used.get().saturating_add(n as u64);
        self.budget.used.set(used);
        if used > self.budget.max {
            self.budget.trip(Trip::Bytes);
            return Err(io::Error::other("max_layer_bytes exceeded"));
        }
        Ok(n)
    }
}
