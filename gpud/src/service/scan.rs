//! A rescan in three steps, so that the service task never waits for the
//! hardware: [`Service::plan_scan`] copies what the read needs (no I/O),
//! [`ScanPlan::run`] reads sysfs and probes AMD SMI (on a thread of its
//! own, with a deadline: see [`super::scans`] and [`crate::deadline`]), and
//! [`Service::fold_scan`] folds the result in (no I/O). The task keeps
//! taking requests while a read is blocked, and a transport answers from
//! the last published [`super::Snapshot`] meanwhile.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use tracing::{info, warn};

use super::{Service, Update};
use crate::{
    amdsmi::{AmdSmiConfig, LibrarySource, report::AmdSmiReport},
    deadline,
    dmem::{self, Dmem},
    hostpaths::HostPaths,
    inventory::{self, AmdSmiSummary, Inventory},
    published_ids::PublishedIds,
    topology::TopologyError,
};

/// At most one AMD SMI probe (a child process loading the vendor library)
/// per this interval is started on behalf of `Rescan` calls; a call within
/// it reads sysfs only.
pub const RESCAN_PROBE_EVERY: Duration = Duration::from_secs(10);

/// What a read of the host needs, copied from the service.
#[derive(Debug)]
pub struct ScanPlan {
    paths: HostPaths,
    amdsmi_config: AmdSmiConfig,
    dmem: Arc<Dmem>,
    ids: Arc<PublishedIds>,
    /// Probe AMD SMI before reading sysfs.
    probe: bool,
    /// Whether the caller asked for the probe (no second one when the KFD
    /// generation moved).
    reprobe: bool,
    /// Nothing was read yet (the generation cannot have moved).
    first: bool,
    report: Option<AmdSmiReport>,
    kfd_generation: Option<u64>,
}

/// What [`ScanPlan::run`] read.
#[derive(Debug)]
pub struct Scanned {
    inventory: Inventory,
    /// The AMD SMI probe's result, when one ran.
    probed: Option<(Option<AmdSmiReport>, AmdSmiSummary)>,
    dmem: dmem::Status,
}

impl Service {
    /// The plan of a rescan (no I/O). `reprobe` forces a new AMD SMI probe.
    pub fn plan_scan(&self, reprobe: bool) -> ScanPlan {
        let first = self.meta.amdsmi.state.is_empty();
        ScanPlan {
            paths: self.config.paths.clone(),
            amdsmi_config: self.config.amdsmi.clone(),
            dmem: self.dmem.clone(),
            ids: self.ids.clone(),
            probe: reprobe || first || self.amdsmi_fatal(),
            reprobe,
            first,
            report: self.amdsmi.clone(),
            kfd_generation: self.meta.kfd_generation,
        }
    }

    /// Whether a `Rescan` call at `now` may probe AMD SMI again (at most
    /// once per [`RESCAN_PROBE_EVERY`]); records the probe when it may.
    pub fn rescan_may_probe(&mut self, now: Instant) -> bool {
        may_probe(&mut self.requested_probe, now)
    }

    /// Folds what a scan read into the registry (no I/O).
    pub fn fold_scan(&mut self, scanned: Scanned) -> Update {
        self.meta.dmem = scanned.dmem;
        if let Some((report, summary)) = scanned.probed {
            self.amdsmi = report;
            self.meta.amdsmi = summary;
        }
        self.fold(scanned.inventory)
    }
}

impl ScanPlan {
    /// How long [`ScanPlan::run`] may take before it is abandoned.
    pub fn deadline(&self) -> Duration {
        // A moved generation brings a probe (a second one after a first).
        let probes = match self.amdsmi_config.library {
            LibrarySource::Disabled => 0,
            _ if self.probe => 2,
            _ => 1,
        };
        deadline::SYSFS_READ + self.amdsmi_config.timeout * probes
    }

    /// Reads the host (blocking I/O, possibly for ever: run it with a
    /// deadline).
    ///
    /// # Errors
    /// When the KFD topology cannot be read at all.
    pub fn run(self) -> Result<Scanned, TopologyError> {
        self.dmem.refresh();
        let dmem = self.dmem.status();
        let mut probed = None;
        if self.probe {
            probed = Some(inventory::probe_amdsmi(&self.amdsmi_config));
        }
        let report = |probed: &Option<(Option<AmdSmiReport>, _)>| match probed {
            Some((report, _)) => report.clone(),
            None => self.report.clone(),
        };
        let mut inventory = inventory::discover(&self.paths, report(&probed).as_ref())?;
        let moved = !self.first && inventory.generation_id != self.kfd_generation;
        if moved && !self.reprobe {
            info!(
                before = ?self.kfd_generation,
                after = ?inventory.generation_id,
                "KFD topology generation moved; probing AMD SMI again"
            );
            probed = Some(inventory::probe_amdsmi(&self.amdsmi_config));
            inventory = inventory::discover(&self.paths, report(&probed).as_ref())?;
        }
        // Off the service task too: a GPU seen for the first time writes its ID.
        self.ids.stamp(&mut inventory);
        if self.first
            && let Some((_, summary)) = &probed
            && let Some(line) = inventory::without_amdsmi(summary, &inventory, &self.paths)
        {
            warn!("{line}");
        }
        Ok(Scanned {
            inventory,
            probed,
            dmem,
        })
    }
}

/// Whether a probe may start at `now` after the one at `last`; records it.
fn may_probe(last: &mut Option<Instant>, now: Instant) -> bool {
    let recent = last.is_some_and(|at| now.saturating_duration_since(at) < RESCAN_PROBE_EVERY);
    if !recent {
        *last = Some(now);
    }
    !recent
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rescan_calls_probe_amd_smi_at_most_once_per_interval() {
        let start = Instant::now();
        let mut last = None;
        assert!(may_probe(&mut last, start));
        // A flood of calls within the interval reads sysfs only.
        for ms in [0, 1, 5_000, 9_999] {
            assert!(!may_probe(&mut last, start + Duration::from_millis(ms)));
        }
        assert!(may_probe(&mut last, start + RESCAN_PROBE_EVERY));
        assert!(!may_probe(
            &mut last,
            start + RESCAN_PROBE_EVERY + Duration::from_secs(1)
        ));
    }
}
