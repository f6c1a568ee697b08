//! Following what pods and GPUs use: a background task asks amd-gpud's
//! `GetUsage` (and `GetComputeUsage`, the CUs containers occupy; empty from
//! an amd-gpud without it) every [`EVERY`] and keeps the last answer for `/metrics`, so a
//! scrape never waits on amd-gpud and several scrapers cost one call. A call
//! that fails or takes longer than [`CALL_TIMEOUT`] clears the answer: the
//! usage series vanish rather than show stale values.

use std::{sync::Arc, time::Duration};

use ipc::usage::Usage;
use tokio::sync::watch;
use tracing::{debug, warn};

use super::bus::{Bus, SessionError, connect, node_proxy};

/// Between two calls. amd-gpud reads the host at most once per 2 s anyway.
pub(crate) const EVERY: Duration = Duration::from_secs(5);
/// Longest wait for one answer (amd-gpud bounds its read at 3 s).
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Most entries kept from each list of an answer.
pub(crate) const MAX_ENTRIES: usize = 16384;

/// The last answer; `None` before the first and after a failed call.
pub(crate) type UsageFeed = watch::Receiver<Option<Arc<Usage>>>;

/// Starts the task; it ends when every receiver is dropped.
pub(crate) fn spawn(bus: Bus, every: Duration) -> UsageFeed {
    let (tx, rx) = watch::channel(None);
    tokio::spawn(async move {
        let mut conn = None;
        let mut failing = false;
        loop {
            match call(&bus, &mut conn).await {
                Ok(usage) => {
                    failing = false;
                    tx.send_replace(Some(Arc::new(usage)));
                }
                Err(err) => {
                    conn = None;
                    if !std::mem::replace(&mut failing, true) {
                        warn!("amd-gpud GetUsage: {err} (the usage series are left out)");
                    } else {
                        debug!("amd-gpud GetUsage: {err}");
                    }
                    tx.send_replace(None);
                }
            }
            if tx.is_closed() {
                return;
            }
            tokio::time::sleep(every).await;
        }
    });
    rx
}

async fn call(bus: &Bus, conn: &mut Option<zbus::Connection>) -> Result<Usage, SessionError> {
    let once = async {
        let c = match conn.take() {
            Some(c) => c,
            None => connect(bus).await?,
        };
        let node = node_proxy(&c).await?;
        let (mut containers, mut dmem, mut gpus) = node.get_usage().await?;
        // The same cached read; an older amd-gpud has no such method.
        let mut compute = node.get_compute_usage().await.unwrap_or_else(|err| {
            debug!("amd-gpud GetComputeUsage: {err} (no occupied CUs)");
            Vec::new()
        });
        *conn = Some(c);
        containers.truncate(MAX_ENTRIES);
        dmem.truncate(MAX_ENTRIES);
        gpus.truncate(MAX_ENTRIES);
        compute.truncate(MAX_ENTRIES);
        Ok(Usage {
            containers,
            dmem,
            gpus,
            compute,
        })
    };
    tokio::time::timeout(CALL_TIMEOUT, once)
        .await
        .map_err(|_| SessionError::Timeout(CALL_TIMEOUT))?
}
