use std::sync::{
    Condvar,
    atomic::{AtomicUsize, Ordering},
};

use super::*;
use crate::loader_check::Loader;

/// The image's own entrypoint.
static NONE: RunSpec = RunSpec {
    command: Vec::new(),
    args: Vec::new(),
    working_dir: String::new(),
    path: String::new(),
    path_unknown: false,
};

/// An inspection that waits for its gate and counts what it did.
#[derive(Default)]
struct Fake {
    calls: AtomicUsize,
    analyses: AtomicUsize,
    seen: Mutex<Vec<String>>,
    gate: Arc<(Mutex<bool>, Condvar)>,
}

impl Fake {
    fn open() -> Self {
        let fake = Self::default();
        *fake.gate.0.lock().unwrap() = true;
        fake
    }
}

impl Inspect for Fake {
    fn inspect(
        &self,
        image: &str,
        run: &RunSpec,
        _deadline: Instant,
        cached: &dyn Fn(&str) -> Option<Known>,
    ) -> Result<Finding, CheckError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.seen.lock().unwrap().push(image.to_owned());
        let (open, turned) = &*self.gate;
        drop(turned.wait_while(open.lock().unwrap(), |o| !*o).unwrap());
        if image.contains("absent") {
            return Err(CheckError::NotPresent(format!("{image} is not there")));
        }
        let digest = format!("sha256:{image}");
        let key = run.cache_key(&digest);
        let failed = |why: String| CheckError::Failed {
            image: image.to_owned(),
            cache_key: Some(key.clone()),
            why,
        };
        match cached(&key) {
            Some(Ok(found)) => return Ok(found),
            Some(Err(why)) => return Err(failed(why)),
            None => {}
        }
        self.analyses.fetch_add(1, Ordering::SeqCst);
        let long = |c: &str| c.repeat(1 << 20);
        if image.contains("bomb") {
            let why = if image.contains("verbose") {
                long("w")
            } else {
                "the image exceeds the loader check's max_layer_bytes".to_owned()
            };
            return Err(failed(why));
        }
        if image.contains("verbose") {
            return Ok(Finding {
                digest,
                loader: Loader::Unknown { why: long("u") },
                evidence: long("e"),
            });
        }
        if let Some(program) = run.command.first() {
            return Ok(Finding {
                digest,
                loader: Loader::Static,
                evidence: format!("the pod's command {program} is static"),
            });
        }
        Ok(Finding {
            digest,
            loader: Loader::Musl,
            evidence: format!("{image} is musl"),
        })
    }
}

fn quick() -> CheckerConfig {
    CheckerConfig {
        answer_within: Duration::from_millis(300),
        ..CheckerConfig::default()
    }
}

async fn within<T>(test: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), test)
        .await
        .expect("timed out")
}

#[tokio::test]
async fn callers_of_one_image_share_one_inspection_and_its_cache() {
    within(async {
        let checker = Checker::new(Fake::default(), CheckerConfig::default());
        let (a, b) = (checker.clone(), checker.clone());
        let first = tokio::spawn(async move { a.check("alpine", &NONE).await });
        let second = tokio::spawn(async move { b.check("docker.io/library/alpine", &NONE).await });
        while checker.running.lock().unwrap().is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        let (open, turned) = &*checker.inspect.gate;
        *open.lock().unwrap() = true;
        turned.notify_all();
        let (first, second) = (first.await.unwrap(), second.await.unwrap());
        assert_eq!(first, second);
        assert_eq!(first.unwrap().loader, Loader::Musl);
        assert_eq!(checker.inspect.calls.load(Ordering::SeqCst), 1);
        assert_eq!(
            checker.inspect.seen.lock().unwrap()[0],
            "docker.io/library/alpine:latest",
            "the reference is normalised"
        );
        checker.check("alpine:latest", &NONE).await.unwrap();
        assert_eq!(checker.inspect.calls.load(Ordering::SeqCst), 2);
        assert_eq!(checker.inspect.analyses.load(Ordering::SeqCst), 1, "cached");
    })
    .await;
}

#[tokio::test]
async fn a_slow_inspection_answers_still_running_and_fills_the_cache() {
    within(async {
        let checker = Checker::new(Fake::default(), quick());
        let err = checker.check("rocm/pytorch", &NONE).await.unwrap_err();
        assert!(
            matches!(&err, CheckError::StillRunning { image, .. }
            if image == "docker.io/rocm/pytorch:latest"),
            "{err}"
        );
        let again = checker.check("rocm/pytorch", &NONE).await.unwrap_err();
        assert!(matches!(again, CheckError::StillRunning { .. }));
        assert_eq!(checker.inspect.calls.load(Ordering::SeqCst), 1, "joined");
        let (open, turned) = &*checker.inspect.gate;
        *open.lock().unwrap() = true;
        turned.notify_all();
        while !checker.running.lock().unwrap().is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let found = checker.check("rocm/pytorch", &NONE).await.unwrap();
        assert_eq!(found.loader, Loader::Musl);
        assert_eq!(checker.inspect.analyses.load(Ordering::SeqCst), 1);
    })
    .await;
}

#[tokio::test]
async fn inspections_at_once_are_bounded() {
    within(async {
        let checker = Checker::new(Fake::default(), quick());
        for image in ["x/a", "y/b"] {
            let err = checker.check(image, &NONE).await.unwrap_err();
            assert!(matches!(err, CheckError::StillRunning { .. }), "{err}");
        }
        let err = checker.check("z/c", &NONE).await.unwrap_err();
        assert_eq!(
            err,
            CheckError::TooMany {
                running: 2,
                limit: 2,
                tenant: None
            }
        );
        let (open, turned) = &*checker.inspect.gate;
        *open.lock().unwrap() = true;
        turned.notify_all();
    })
    .await;
}

#[tokio::test]
async fn absent_images_are_not_cached_and_bad_references_start_nothing() {
    within(async {
        let checker = Checker::new(Fake::open(), quick());
        for _ in 0..2 {
            let err = checker.check("absent:1", &NONE).await.unwrap_err();
            assert!(matches!(err, CheckError::NotPresent(_)), "{err}");
        }
        assert_eq!(checker.inspect.calls.load(Ordering::SeqCst), 2);
        let err = checker.check("a b", &NONE).await.unwrap_err();
        assert!(matches!(err, CheckError::Reference(_)), "{err}");
        assert_eq!(checker.inspect.calls.load(Ordering::SeqCst), 2);
    })
    .await;
}

/// Issue 38, F3: a failing image (a zero bomb cost 39 s of CPU each time)
/// is inspected once; later starts get the cached failure, by digest.
#[tokio::test]
async fn a_failing_image_is_inspected_once() {
    within(async {
        let checker = Checker::new(Fake::open(), quick());
        let first = checker.check("evil/bomb", &NONE).await.unwrap_err();
        let CheckError::Failed {
            cache_key: digest,
            why,
            ..
        } = &first
        else {
            panic!("{first}")
        };
        assert_eq!(digest.as_deref(), Some("sha256:docker.io/evil/bomb:latest"));
        assert!(why.contains("max_layer_bytes"), "{why}");
        let again = checker.check("evil/bomb", &NONE).await.unwrap_err();
        assert_eq!(again, first);
        assert_eq!(checker.inspect.analyses.load(Ordering::SeqCst), 1);

        // Past its time to live, a failure is inspected again.
        let config = CheckerConfig {
            failure_ttl: Duration::ZERO,
            ..quick()
        };
        let checker = Checker::new(Fake::open(), config);
        for _ in 0..2 {
            checker.check("evil/bomb", &NONE).await.unwrap_err();
        }
        assert_eq!(checker.inspect.analyses.load(Ordering::SeqCst), 2);
    })
    .await;
}

/// Issue 38, F3: the text an image makes is capped where it is kept and
/// answered (3.9 MB of evidence was seen for one image).
#[tokio::test]
async fn evidence_and_reasons_are_capped() {
    within(async {
        let checker = Checker::new(Fake::open(), quick());
        let found = checker.check("verbose", &NONE).await.unwrap();
        assert!(
            found.evidence.len() <= cache::MAX_EVIDENCE,
            "{}",
            found.evidence.len()
        );
        assert!(
            found.evidence.ends_with(" [... 1048576 bytes cut]"),
            "{}",
            found.evidence
        );
        assert!(found.evidence.starts_with("eee"));
        let Loader::Unknown { why } = &found.loader else {
            panic!("{:?}", found.loader)
        };
        assert!(why.len() <= cache::MAX_EVIDENCE && why.ends_with("bytes cut]"));
        assert_eq!(
            checker.check("verbose", &NONE).await.unwrap(),
            found,
            "cached capped"
        );
        let err = checker.check("verbose-bomb", &NONE).await.unwrap_err();
        let CheckError::Failed { why, .. } = &err else {
            panic!("{err}")
        };
        assert!(why.len() <= cache::MAX_EVIDENCE && why.ends_with("bytes cut]"));
    })
    .await;
}

#[test]
fn a_cut_keeps_whole_characters() {
    let mut text = "\u{e9}".repeat(cache::MAX_EVIDENCE);
    cache::cap_text(&mut text);
    assert!(text.len() <= cache::MAX_EVIDENCE);
    assert!(text.ends_with(" [... 2048 bytes cut]"), "{text}");
    let mut short = "fine".to_owned();
    cache::cap_text(&mut short);
    assert_eq!(short, "fine");
}

fn release(checker: &Checker<Fake>) {
    let (open, turned) = &*checker.inspect.gate;
    *open.lock().unwrap() = true;
    turned.notify_all();
}

/// Opens the gate when dropped, so that a failed assertion does not leave
/// the runtime waiting for the inspections behind it.
struct Opens(Arc<Checker<Fake>>);

impl Drop for Opens {
    fn drop(&mut self) {
        release(&self.0);
    }
}

/// Issue 38, F3: a tenant holding its share of the slots is answered busy
/// while another tenant still gets one; the node's bound holds over all.
#[tokio::test]
async fn a_tenant_holding_its_share_is_busy_while_another_gets_a_slot() {
    within(async {
        let checker = Checker::new(Fake::default(), quick());
        let _opens = Opens(Arc::clone(&checker));
        let err = checker.check_as("ns-a", "a/one", &NONE).await.unwrap_err();
        assert!(matches!(err, CheckError::StillRunning { .. }), "{err}");
        let err = checker.check_as("ns-a", "a/two", &NONE).await.unwrap_err();
        assert_eq!(
            err,
            CheckError::TooMany {
                running: 1,
                limit: 1,
                tenant: Some("ns-a".to_owned())
            }
        );
        assert!(err.to_string().contains("for ns-a"), "{err}");
        let err = checker.check_as("ns-b", "b/one", &NONE).await.unwrap_err();
        assert!(matches!(err, CheckError::StillRunning { .. }), "{err}");
        // Joining an inspection running already takes no slot.
        let err = checker.check_as("ns-a", "b/one", &NONE).await.unwrap_err();
        assert!(matches!(err, CheckError::StillRunning { .. }), "{err}");
        let err = checker.check_as("ns-c", "c/one", &NONE).await.unwrap_err();
        assert!(
            matches!(
                err,
                CheckError::TooMany {
                    running: 2,
                    limit: 2,
                    tenant: None
                }
            ),
            "{err}"
        );
        assert_eq!(checker.inspect.calls.load(Ordering::SeqCst), 2);
    })
    .await;
}

/// Without a tenant named, an image is charged to its registry account.
#[tokio::test]
async fn one_account_cannot_hold_every_slot() {
    within(async {
        let checker = Checker::new(Fake::default(), quick());
        let _opens = Opens(Arc::clone(&checker));
        let err = checker.check("evil/slow1", &NONE).await.unwrap_err();
        assert!(matches!(err, CheckError::StillRunning { .. }), "{err}");
        let err = checker.check("evil/slow2", &NONE).await.unwrap_err();
        assert!(
            matches!(&err, CheckError::TooMany { tenant: Some(t), .. } if t == "docker.io/evil"),
            "{err}"
        );
        let err = checker.check("rocm/pytorch", &NONE).await.unwrap_err();
        assert!(matches!(err, CheckError::StillRunning { .. }), "{err}");
    })
    .await;
}

#[test]
fn tenants_of_images() {
    assert_eq!(tenant_of("docker.io/rocm/pytorch:latest"), "docker.io/rocm");
    assert_eq!(tenant_of("ghcr.io/a/b/c:1"), "ghcr.io/a");
    assert_eq!(tenant_of("localhost/app:latest"), "localhost");
    assert_eq!(tenant_of("docker.io/x/y@sha256:0123"), "docker.io/x");
}

#[test]
fn the_cache_keeps_the_newest_findings_and_failures_apart() {
    let mut cache = Cache::new(Duration::from_secs(600));
    for i in 0..=cache::CACHED {
        cache.put(
            &format!("sha256:{i}"),
            &Finding {
                digest: format!("sha256:{i}"),
                loader: Loader::Static,
                evidence: String::new(),
            },
        );
    }
    assert_eq!(cache.findings(), cache::CACHED);
    assert!(cache.get("sha256:0").is_none());
    assert!(cache.get(&format!("sha256:{}", cache::CACHED)).is_some());
    for i in 0..=cache::FAILURES_CACHED {
        cache.put_failure(&format!("sha256:bad{i}"), "why");
    }
    assert_eq!(cache.failures(), cache::FAILURES_CACHED);
    assert_eq!(cache.findings(), cache::CACHED, "failures evict no finding");
    assert_eq!(
        cache.get(&format!("sha256:bad{}", cache::FAILURES_CACHED)),
        Some(Err("why".to_owned()))
    );
}

/// Issue 38, F8: a pod's command is judged, not the image's entrypoint,
/// and its answer is kept apart from the image's own: one spec's answer
/// never serves another's.
#[tokio::test]
async fn a_pods_command_is_judged_and_cached_apart_from_the_image() {
    within(async {
        let checker = Checker::new(Fake::open(), quick());
        let own = checker.check("alpine", &NONE).await.unwrap();
        assert_eq!(own.loader, Loader::Musl);
        let static_run = RunSpec {
            command: vec!["/static".to_owned()],
            ..RunSpec::default()
        };
        let other = checker.check("alpine", &static_run).await.unwrap();
        assert_eq!(other.loader, Loader::Static, "{other:?}");
        assert!(
            other.evidence.contains("the pod's command /static"),
            "{other:?}"
        );
        assert_eq!(checker.inspect.analyses.load(Ordering::SeqCst), 2);
        // Each answer again from the cache, neither for the other.
        assert_eq!(checker.check("alpine", &NONE).await.unwrap(), own);
        assert_eq!(checker.check("alpine", &static_run).await.unwrap(), other);
        assert_eq!(checker.inspect.analyses.load(Ordering::SeqCst), 2);
    })
    .await;
}
