//! The loader check as amd-gpud serves it: one inspection per image at a
//! time however many containers ask, a cache by image digest, a bounded
//! number of inspections running, and an answer within
//! [`CheckerConfig::answer_within`] whatever the image's size.
//!
//! An inspection reads every layer of the image, which for a large image
//! takes longer than kubelet waits for PreStartContainer (30 s). So the
//! caller waits only so long and gets [`CheckError::StillRunning`]; the
//! inspection goes on (until [`CheckerConfig::budget`]) and fills the
//! cache, and kubelet's next attempt to start the container gets the
//! answer at once.

use std::{
    collections::{HashMap, VecDeque},
    path::PathBuf,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use tokio::sync::watch;
use tracing::{Instrument, info, info_span, warn};

use super::{
    Finding, ImageSource, SourceError,
    analyze::{self, InspectError, Limits, Platform},
    containerd::ContainerdSource,
    reference::{self, ReferenceError},
};

/// Findings kept (one per image digest).
const CACHED: usize = 512;

/// How the check runs.
#[derive(Debug, Clone)]
pub struct CheckerConfig {
    /// How long a caller waits for an inspection.
    pub answer_within: Duration,
    /// How long one inspection may go on in the background.
    pub budget: Duration,
    /// Inspections running at once; more are refused as busy.
    pub at_once: usize,
}

impl Default for CheckerConfig {
    fn default() -> Self {
        Self {
            answer_within: Duration::from_secs(20),
            budget: Duration::from_secs(600),
            at_once: 2,
        }
    }
}

/// Why an image could not be judged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckError {
    #[error(transparent)]
    Reference(#[from] ReferenceError),
    #[error("{0}")]
    NotPresent(String),
    #[error("{0}")]
    NoRuntime(String),
    #[error(
        "the inspection of {image} is still running after {waited:?}; it goes on, and a later call gets its answer"
    )]
    StillRunning { image: String, waited: Duration },
    #[error("{running} image inspections are running already; try again later")]
    TooMany { running: usize },
    #[error("inspecting {image}: {why}")]
    Failed { image: String, why: String },
}

impl CheckError {
    fn of_inspection(image: &str, err: &InspectError) -> Self {
        match err {
            InspectError::Source(SourceError::NotPresent { .. }) => {
                Self::NotPresent(err.to_string())
            }
            InspectError::Source(SourceError::NoRuntime { .. }) => Self::NoRuntime(err.to_string()),
            _ => Self::Failed {
                image: image.to_owned(),
                why: err.to_string(),
            },
        }
    }
}

/// One whole inspection of a normalised reference, on a blocking thread:
/// `cached` gives the finding already known for a target digest.
pub trait Inspect: Send + Sync + 'static {
    /// # Errors
    /// [`CheckError`] naming the image.
    fn inspect(
        &self,
        image: &str,
        deadline: Instant,
        cached: &dyn Fn(&str) -> Option<Finding>,
    ) -> Result<Finding, CheckError>;
}

/// Inspections through containerd's API.
#[derive(Debug, Clone)]
pub struct ContainerdInspect {
    pub socket: PathBuf,
    pub namespace: String,
    pub handle: tokio::runtime::Handle,
    /// Each call to containerd (and each chunk of a layer).
    pub call_timeout: Duration,
}

impl Inspect for ContainerdInspect {
    fn inspect(
        &self,
        image: &str,
        deadline: Instant,
        cached: &dyn Fn(&str) -> Option<Finding>,
    ) -> Result<Finding, CheckError> {
        let fail = |err: InspectError| CheckError::of_inspection(image, &err);
        let handle = self.handle.clone();
        let mut source =
            ContainerdSource::connect(&self.socket, &self.namespace, handle, self.call_timeout)
                .map_err(|e| fail(e.into()))?;
        let target = source.target(image).map_err(|e| fail(e.into()))?;
        if let Some(found) = cached(&target.digest) {
            return Ok(found);
        }
        let limits = Limits {
            deadline,
            ..Limits::default()
        };
        analyze::inspect_target(&mut source, &target, &Platform::host(), &limits).map_err(fail)
    }
}

type Outcome = Result<Finding, CheckError>;

/// The findings by digest, oldest first out.
#[derive(Debug, Default)]
struct Cache {
    by_digest: HashMap<String, Finding>,
    order: VecDeque<String>,
}

impl Cache {
    fn put(&mut self, found: &Finding) {
        if self
            .by_digest
            .insert(found.digest.clone(), found.clone())
            .is_none()
        {
            self.order.push_back(found.digest.clone());
        }
        while self.order.len() > CACHED {
            if let Some(old) = self.order.pop_front() {
                self.by_digest.remove(&old);
            }
        }
    }
}

/// The check, shared by every caller.
pub struct Checker<I: Inspect> {
    inspect: Arc<I>,
    config: CheckerConfig,
    cache: Mutex<Cache>,
    /// Inspections running, by normalised reference.
    running: Mutex<HashMap<String, watch::Receiver<Option<Outcome>>>>,
}

impl<I: Inspect> Checker<I> {
    pub fn new(inspect: I, config: CheckerConfig) -> Arc<Self> {
        Arc::new(Self {
            inspect: Arc::new(inspect),
            config,
            cache: Mutex::default(),
            running: Mutex::default(),
        })
    }

    /// The loader of image `reference` (as a pod spec names it).
    ///
    /// # Errors
    /// [`CheckError`]; `StillRunning` when the answer is not there in time.
    pub async fn check(self: &Arc<Self>, reference: &str) -> Result<Finding, CheckError> {
        let image = reference::normalize(reference)?;
        let mut answer = self.join_or_start(&image)?;
        let waited = self.config.answer_within;
        match tokio::time::timeout(waited, answer.wait_for(Option::is_some)).await {
            Ok(Ok(outcome)) => outcome.clone().unwrap_or_else(|| {
                Err(CheckError::Failed {
                    image: image.clone(),
                    why: "no answer".into(),
                })
            }),
            Ok(Err(_)) => Err(CheckError::Failed {
                image,
                why: "the inspection ended without an answer (it panicked?)".into(),
            }),
            Err(_) => Err(CheckError::StillRunning { image, waited }),
        }
    }

    fn join_or_start(
        self: &Arc<Self>,
        image: &str,
    ) -> Result<watch::Receiver<Option<Outcome>>, CheckError> {
        let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(answer) = running.get(image) {
            return Ok(answer.clone());
        }
        if running.len() >= self.config.at_once {
            return Err(CheckError::TooMany {
                running: running.len(),
            });
        }
        let (send, answer) = watch::channel(None);
        running.insert(image.to_owned(), answer.clone());
        let this = Arc::clone(self);
        let image = image.to_owned();
        let span = info_span!("loader_check", image = %image);
        let task = async move {
            let work = Arc::clone(&this);
            let name = image.clone();
            let outcome = tokio::task::spawn_blocking(move || work.inspect_now(&name))
                .await
                .unwrap_or_else(|e| {
                    Err(CheckError::Failed {
                        image: image.clone(),
                        why: format!("the inspection thread failed: {e}"),
                    })
                });
            this.running
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&image);
            let _ = send.send(Some(outcome));
        };
        tokio::spawn(task.instrument(span));
        Ok(answer)
    }

    /// One inspection, on the blocking thread; a finding joins the cache.
    fn inspect_now(&self, image: &str) -> Outcome {
        let started = Instant::now();
        let cached = |digest: &str| {
            let cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
            cache.by_digest.get(digest).cloned()
        };
        let outcome = self
            .inspect
            .inspect(image, started + self.config.budget, &cached);
        match &outcome {
            Ok(found) => {
                self.cache
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .put(found);
                info!(
                    digest = %found.digest,
                    loader = ?found.loader,
                    took_ms = started.elapsed().as_millis(),
                    "image inspected: {}",
                    found.evidence
                );
            }
            Err(err) => warn!("image inspection failed: {err}"),
        }
        outcome
    }
}

#[cfg(test)]
mod tests;
