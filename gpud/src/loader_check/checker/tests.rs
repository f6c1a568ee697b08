use std::sync::{
    Condvar,
    atomic::{AtomicUsize, Ordering},
};

use super::*;
use crate::loader_check::Loader;

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
        _deadline: Instant,
        cached: &dyn Fn(&str) -> Option<Finding>,
    ) -> Result<Finding, CheckError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.seen.lock().unwrap().push(image.to_owned());
        let (open, turned) = &*self.gate;
        drop(turned.wait_while(open.lock().unwrap(), |o| !*o).unwrap());
        if image.contains("absent") {
            return Err(CheckError::NotPresent(format!("{image} is not there")));
        }
        let digest = format!("sha256:{}", image.len());
        if let Some(found) = cached(&digest) {
            return Ok(found);
        }
        self.analyses.fetch_add(1, Ordering::SeqCst);
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
        let first = tokio::spawn(async move { a.check("alpine").await });
        let second = tokio::spawn(async move { b.check("docker.io/library/alpine").await });
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
        checker.check("alpine:latest").await.unwrap();
        assert_eq!(checker.inspect.calls.load(Ordering::SeqCst), 2);
        assert_eq!(checker.inspect.analyses.load(Ordering::SeqCst), 1, "cached");
    })
    .await;
}

#[tokio::test]
async fn a_slow_inspection_answers_still_running_and_fills_the_cache() {
    within(async {
        let checker = Checker::new(Fake::default(), quick());
        let err = checker.check("rocm/pytorch").await.unwrap_err();
        assert!(
            matches!(&err, CheckError::StillRunning { image, .. }
            if image == "docker.io/rocm/pytorch:latest"),
            "{err}"
        );
        let again = checker.check("rocm/pytorch").await.unwrap_err();
        assert!(matches!(again, CheckError::StillRunning { .. }));
        assert_eq!(checker.inspect.calls.load(Ordering::SeqCst), 1, "joined");
        let (open, turned) = &*checker.inspect.gate;
        *open.lock().unwrap() = true;
        turned.notify_all();
        while !checker.running.lock().unwrap().is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let found = checker.check("rocm/pytorch").await.unwrap();
        assert_eq!(found.loader, Loader::Musl);
        assert_eq!(checker.inspect.analyses.load(Ordering::SeqCst), 1);
    })
    .await;
}

#[tokio::test]
async fn inspections_at_once_are_bounded() {
    within(async {
        let checker = Checker::new(Fake::default(), quick());
        for image in ["a", "b"] {
            let err = checker.check(image).await.unwrap_err();
            assert!(matches!(err, CheckError::StillRunning { .. }), "{err}");
        }
        let err = checker.check("c").await.unwrap_err();
        assert_eq!(err, CheckError::TooMany { running: 2 });
        let (open, turned) = &*checker.inspect.gate;
        *open.lock().unwrap() = true;
        turned.notify_all();
    })
    .await;
}

#[tokio::test]
async fn failures_are_not_cached_and_bad_references_start_nothing() {
    within(async {
        let checker = Checker::new(Fake::open(), quick());
        for _ in 0..2 {
            let err = checker.check("absent:1").await.unwrap_err();
            assert!(matches!(err, CheckError::NotPresent(_)), "{err}");
        }
        assert_eq!(checker.inspect.calls.load(Ordering::SeqCst), 2);
        let err = checker.check("a b").await.unwrap_err();
        assert!(matches!(err, CheckError::Reference(_)), "{err}");
        assert_eq!(checker.inspect.calls.load(Ordering::SeqCst), 2);
    })
    .await;
}

#[test]
fn the_cache_keeps_the_newest_findings() {
    let mut cache = Cache::default();
    for i in 0..=CACHED {
        cache.put(&Finding {
            digest: format!("sha256:{i}"),
            loader: Loader::Static,
            evidence: String::new(),
        });
    }
    assert_eq!(cache.by_digest.len(), CACHED);
    assert!(!cache.by_digest.contains_key("sha256:0"));
    assert!(cache.by_digest.contains_key(&format!("sha256:{CACHED}")));
}
