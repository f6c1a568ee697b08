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
//!
//! What one image can cost the others is bounded (issue 38, F3): a failed
//! inspection is cached by digest like a finding (for
//! [`CheckerConfig::failure_ttl`]), the text kept and answered is capped
//! ([`cache::MAX_EVIDENCE`]), and one tenant holds at most
//! [`CheckerConfig::per_tenant`] of the [`CheckerConfig::at_once`] slots.

mod cache;

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use tokio::sync::watch;
use tracing::{Instrument, info, info_span, warn};

use super::{
    Finding,
    reference::{self, ReferenceError},
    run::RunSpec,
};

use cache::Cache;

/// How the check runs.
#[derive(Debug, Clone)]
pub struct CheckerConfig {
    /// How long a caller waits for an inspection.
    pub answer_within: Duration,
    /// How long one inspection may go on in the background.
    pub budget: Duration,
    /// Inspections running at once; more are refused as busy.
    pub at_once: usize,
    /// Inspections one tenant may run at once; more are refused as busy
    /// while other tenants still get the slots left.
    pub per_tenant: usize,
    /// How long a failed inspection is answered from the cache before the
    /// image is inspected again.
    pub failure_ttl: Duration,
}

impl Default for CheckerConfig {
    fn default() -> Self {
        Self {
            answer_within: Duration::from_secs(20),
            budget: Duration::from_secs(600),
            at_once: 2,
            // Half the slots: one tenant cannot take them all.
            per_tenant: 1,
            // The inspection budget: an image that failed costs at most
            // one inspection in that time, a transient failure is retried.
            failure_ttl: Duration::from_secs(600),
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
    #[error("{running} image inspections are running already{} (at most {limit}); try again later", .tenant.as_ref().map(|t| format!(" for {t}")).unwrap_or_default())]
    TooMany {
        running: usize,
        limit: usize,
        /// The tenant whose share is full; `None`: the node's.
        tenant: Option<String>,
    },
    #[error("inspecting {image}: {why}")]
    Failed {
        image: String,
        /// When the image's content is what failed, the cache key the
        /// failure is kept under: the image's digest, with the pod's
        /// [`RunSpec`] when it has one ([`RunSpec::cache_key`]).
        cache_key: Option<String>,
        why: String,
    },
}

/// What the cache knows of a key: its finding, or why it failed.
pub type Known = Result<Finding, String>;

/// One whole inspection of a normalised reference started as `run` says, on
/// a blocking thread: `cached` gives what is already known of a cache key
/// ([`RunSpec::cache_key`] of the target's digest).
pub trait Inspect: Send + Sync + 'static {
    /// # Errors
    /// [`CheckError`] naming the image; a failure of the image's content
    /// names its cache key ([`CheckError::Failed`]), to be cached.
    fn inspect(
        &self,
        image: &str,
        run: &RunSpec,
        deadline: Instant,
        cached: &dyn Fn(&str) -> Option<Known>,
    ) -> Result<Finding, CheckError>;
}

type Outcome = Result<Finding, CheckError>;

/// An inspection running: its answer to come, and whose slot it holds.
struct Running {
    answer: watch::Receiver<Option<Outcome>>,
    tenant: String,
}

/// The tenant an image is charged to when the caller names none: its
/// registry and first path component (`docker.io/rocm`), the account that
/// pushed it. The plugin does not pass the pod's namespace yet.
#[must_use]
pub fn tenant_of(image: &str) -> String {
    let name = image.split('@').next().unwrap_or(image);
    let mut parts = name.splitn(3, '/');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(domain), Some(owner), Some(_)) => format!("{domain}/{owner}"),
        (Some(domain), Some(_), None) => domain.to_owned(),
        _ => name.to_owned(),
    }
}

/// The check, shared by every caller.
pub struct Checker<I: Inspect> {
    inspect: Arc<I>,
    config: CheckerConfig,
    cache: Mutex<Cache>,
    /// Inspections running, by normalised reference.
    running: Mutex<HashMap<String, Running>>,
}

impl<I: Inspect> Checker<I> {
    pub fn new(inspect: I, config: CheckerConfig) -> Arc<Self> {
        let cache = Cache::new(config.failure_ttl);
        Arc::new(Self {
            inspect: Arc::new(inspect),
            config,
            cache: Mutex::new(cache),
            running: Mutex::default(),
        })
    }

    /// The loader of image `reference` (as a pod spec names it), charged
    /// to the tenant [`tenant_of`] the image.
    ///
    /// # Errors
    /// [`CheckError`]; `StillRunning` when the answer is not there in time.
    pub async fn check(
        self: &Arc<Self>,
        reference: &str,
        run: &RunSpec,
    ) -> Result<Finding, CheckError> {
        let image = reference::normalize(reference)?;
        self.check_as(&tenant_of(&image), &image, run).await
    }

    /// The loader of image `reference`, its inspection charged to `tenant`
    /// (e.g. the pod's namespace): a tenant holding
    /// [`CheckerConfig::per_tenant`] inspections is answered `TooMany`.
    ///
    /// # Errors
    /// [`CheckError`]; `StillRunning` when the answer is not there in time.
    pub async fn check_as(
        self: &Arc<Self>,
        tenant: &str,
        reference: &str,
        run: &RunSpec,
    ) -> Result<Finding, CheckError> {
        let image = reference::normalize(reference)?;
        let mut answer = self.join_or_start(tenant, &image, run)?;
        let waited = self.config.answer_within;
        let failed = |why: &str| CheckError::Failed {
            image: image.clone(),
            cache_key: None,
            why: why.to_owned(),
        };
        match tokio::time::timeout(waited, answer.wait_for(Option::is_some)).await {
            Ok(Ok(outcome)) => outcome.clone().unwrap_or_else(|| Err(failed("no answer"))),
            Ok(Err(_)) => Err(failed(
                "the inspection ended without an answer (it panicked?)",
            )),
            Err(_) => Err(CheckError::StillRunning { image, waited }),
        }
    }

    /// The slot `tenant` may take, or why not.
    fn slot_for(&self, running: &HashMap<String, Running>, tenant: &str) -> Result<(), CheckError> {
        if running.len() >= self.config.at_once {
            return Err(CheckError::TooMany {
                running: running.len(),
                limit: self.config.at_once,
                tenant: None,
            });
        }
        let held = running.values().filter(|r| r.tenant == tenant).count();
        if held >= self.config.per_tenant {
            return Err(CheckError::TooMany {
                running: held,
                limit: self.config.per_tenant,
                tenant: Some(tenant.to_owned()),
            });
        }
        Ok(())
    }

    fn join_or_start(
        self: &Arc<Self>,
        tenant: &str,
        image: &str,
        run: &RunSpec,
    ) -> Result<watch::Receiver<Option<Outcome>>, CheckError> {
        // One inspection per image and way of starting it.
        let running_key = run.cache_key(image);
        let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(r) = running.get(&running_key) {
            return Ok(r.answer.clone());
        }
        self.slot_for(&running, tenant)?;
        let (send, answer) = watch::channel(None);
        let entry = Running {
            answer: answer.clone(),
            tenant: tenant.to_owned(),
        };
        running.insert(running_key.clone(), entry);
        let this = Arc::clone(self);
        let image = image.to_owned();
        let run = run.clone();
        let span = info_span!(
            "loader_check",
            image = %image,
            tenant = %tenant,
            from_pod = !run.is_image_default(),
        );
        let task = async move {
            let work = Arc::clone(&this);
            let name = image.clone();
            let outcome = tokio::task::spawn_blocking(move || work.inspect_now(&name, &run))
                .await
                .unwrap_or_else(|e| {
                    Err(CheckError::Failed {
                        image: image.clone(),
                        cache_key: None,
                        why: format!("the inspection thread failed: {e}"),
                    })
                });
            this.running
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&running_key);
            let _ = send.send(Some(outcome));
        };
        tokio::spawn(task.instrument(span));
        Ok(answer)
    }

    /// One inspection, on the blocking thread; a finding, or a failure of
    /// the image's content, joins the cache, its text capped.
    fn inspect_now(&self, image: &str, run: &RunSpec) -> Outcome {
        let started = Instant::now();
        let cached = |key: &str| {
            let cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
            cache.get(key)
        };
        let outcome = self
            .inspect
            .inspect(image, run, started + self.config.budget, &cached);
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        match outcome {
            Ok(found) => {
                let found = cache::capped(found);
                cache.put(&run.cache_key(&found.digest), &found);
                info!(
                    digest = %found.digest,
                    loader = ?found.loader,
                    took_ms = started.elapsed().as_millis(),
                    "image inspected: {}",
                    found.evidence
                );
                Ok(found)
            }
            Err(CheckError::Failed {
                image,
                cache_key,
                mut why,
            }) => {
                cache::cap_text(&mut why);
                if let Some(key) = &cache_key {
                    cache.put_failure(key, &why);
                }
                let err = CheckError::Failed {
                    image,
                    cache_key,
                    why,
                };
                warn!("image inspection failed: {err}");
                Err(err)
            }
            Err(err) => {
                warn!("image inspection failed: {err}");
                Err(err)
            }
        }
    }
}

#[cfg(test)]
mod tests;
