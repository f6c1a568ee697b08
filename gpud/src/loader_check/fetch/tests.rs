//! amd-gpud's side of the fetcher exchange, against fetchers that are shell
//! scripts: what each answer, silence, death or garbage becomes.

use std::{
    ffi::OsString,
    time::{Duration, Instant},
};

use super::{FetchJob, Step, spawn::ForkedInspect};
use crate::loader_check::{
    Finding, Loader,
    checker::{CheckError, Inspect, Known},
    run::RunSpec,
    sandbox::{
        Sandbox,
        wire::{self, FailKind, MAX_LINE, Verdict},
    },
};

const DIGEST: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";

/// A fetcher that runs `script` in `sh` (its `$1` is the subcommand).
fn scripted(script: &str) -> ForkedInspect {
    ForkedInspect {
        helper: vec!["/bin/sh".into(), "-c".into(), script.into(), "sh".into()],
        containerd_socket: "/nonexistent/containerd.sock".into(),
        containerd_namespace: "k8s.io".into(),
        call_timeout: Duration::from_secs(1),
        sandbox: Sandbox {
            grace: Duration::ZERO,
            ..Sandbox::new(Vec::new())
        },
    }
}

fn line(step: &Step) -> String {
    serde_json::to_string(step).unwrap()
}

fn target_line() -> String {
    line(&Step::Target {
        target: super::WireDescriptor {
            media_type: "application/vnd.oci.image.manifest.v1+json".into(),
            digest: DIGEST.into(),
            size: 100,
        },
    })
}

fn found_line() -> String {
    line(&Step::Verdict {
        verdict: Verdict::Found {
            loader: Loader::Musl,
            evidence: "from the script".into(),
        },
    })
}

/// The fetcher's line of a failed verdict (lasting: the checker ignores it
/// before a target).
fn failed_line(kind: FailKind, why: &str) -> String {
    line(&Step::Verdict {
        verdict: Verdict::Failed {
            kind,
            why: why.into(),
            lasting: true,
        },
    })
}

/// A job for `image` started as `run`, reading containerd at `socket`.
fn job_for(run: RunSpec, socket: std::path::PathBuf) -> FetchJob {
    FetchJob {
        image: "docker.io/library/x:1".into(),
        run,
        budget_ms: 5_000,
        containerd_socket: socket,
        containerd_namespace: "k8s.io".into(),
        call_timeout_ms: 2_000,
        inspector_uid: 60702,
        inspector_gid: 60702,
        inspector_memory: 1 << 20,
        inspector_grace_ms: 0,
    }
}

/// Runs one inspection of `docker.io/library/x:1` within `budget`.
fn inspect(
    fetcher: &ForkedInspect,
    budget: Duration,
    cached: &dyn Fn(&str) -> Option<Known>,
) -> Result<Finding, CheckError> {
    fetcher.inspect(
        "docker.io/library/x:1",
        &RunSpec::default(),
        Instant::now() + budget,
        cached,
    )
}

fn nothing_cached(_: &str) -> Option<Known> {
    None
}

/// `sh` printing `lines` (single-quoted), after reading `reads` lines.
fn script(steps: &[(usize, &str)]) -> String {
    steps
        .iter()
        .map(|(reads, text)| {
            let reads = "read -r _ || exit 0; ".repeat(*reads);
            format!("{reads}printf '%s\\n' '{text}'; ")
        })
        .collect()
}

#[test]
fn a_verdict_is_the_finding_of_the_digest_the_fetcher_reported() {
    let fetcher = scripted(&script(&[(1, &target_line()), (1, &found_line())]));
    let found = inspect(&fetcher, Duration::from_secs(10), &nothing_cached).unwrap();
    assert_eq!(found.digest, DIGEST);
    assert_eq!(found.loader, Loader::Musl);
    assert_eq!(found.evidence, "from the script");
}

#[test]
fn the_job_is_one_line_the_fetcher_can_read() {
    // The fetcher answers with the job it was given, as evidence.
    let echo = r#"read -r job; printf '%s\n' "$TARGET"; read -r _;
        printf '{"step":"verdict","verdict":{"outcome":"found","loader":{"kind":"static"},"evidence":%s}}\n' \
        "$(printf '%s' "$job" | sed 's/\\/\\\\/g; s/"/\\"/g; s/^/"/; s/$/"/')""#;
    let fetcher = scripted(&format!("TARGET='{}'; {echo}", target_line()));
    let found = inspect(&fetcher, Duration::from_secs(10), &nothing_cached).unwrap();
    let job: FetchJob = serde_json::from_str(&found.evidence).unwrap();
    assert_eq!(job.image, "docker.io/library/x:1");
    assert_eq!(job.containerd_namespace, "k8s.io");
    assert_eq!(job.inspector_uid, crate::loader_check::sandbox::INSPECT_UID);
    assert!(job.budget_ms <= 10_000 && job.budget_ms > 9_000, "{job:?}");
}

#[test]
fn a_known_digest_is_answered_from_the_cache_and_the_fetcher_told_to_end() {
    // Given the go-ahead, this fetcher would say "from the script"; told to
    // end (its input closed), it leaves a mark and exits by itself.
    let marks = tempfile::tempdir().unwrap();
    let mark = marks.path().join("ended");
    let fetcher = scripted(&format!(
        "{}read -r go && printf '%s\\n' '{}'; echo >> '{}'; exit 0",
        script(&[(1, &target_line())]),
        found_line(),
        mark.display()
    ));
    let key = RunSpec::default().cache_key(DIGEST);
    let cached = |asked: &str| {
        (asked == key).then(|| {
            Ok(Finding {
                digest: DIGEST.into(),
                loader: Loader::Static,
                evidence: "cached".into(),
            })
        })
    };
    let found = inspect(&fetcher, Duration::from_secs(10), &cached).unwrap();
    assert_eq!(found.evidence, "cached");
    assert_eq!(
        std::fs::read_to_string(&mark).unwrap(),
        "\n",
        "not ended by itself"
    );
    let failed = |_: &str| Some(Err("a cached failure".to_owned()));
    match inspect(&fetcher, Duration::from_secs(10), &failed) {
        Err(CheckError::Failed { cache_key, why, .. }) => {
            assert_eq!(cache_key.as_deref(), Some(key.as_str()));
            assert_eq!(why, "a cached failure");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_content_failure_before_the_target_is_not_cached() {
    let verdict = failed_line(FailKind::Content, "containerd Images.Get failed");
    let fetcher = scripted(&script(&[(1, &verdict)]));
    match inspect(&fetcher, Duration::from_secs(10), &nothing_cached) {
        Err(CheckError::Failed { cache_key, why, .. }) => {
            assert_eq!(cache_key, None, "no digest was known");
            assert_eq!(why, "containerd Images.Get failed");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn an_image_not_looked_up_is_not_present_or_no_runtime_and_never_cached() {
    for (kind, expect_not_present) in [(FailKind::NotPresent, true), (FailKind::NoRuntime, false)] {
        let verdict = failed_line(kind, "told by the script");
        let fetcher = scripted(&script(&[(1, &verdict)]));
        match inspect(&fetcher, Duration::from_secs(10), &nothing_cached) {
            Err(CheckError::NotPresent(why)) if expect_not_present => {
                assert_eq!(why, "told by the script");
            }
            Err(CheckError::NoRuntime(why)) if !expect_not_present => {
                assert_eq!(why, "told by the script");
            }
            other => panic!("{kind:?}: {other:?}"),
        }
    }
}

#[test]
fn an_inspector_that_ran_and_failed_is_cached_one_that_never_started_is_not() {
    let key = RunSpec::default().cache_key(DIGEST);
    for (started, expected_key) in [(true, Some(key.as_str())), (false, None)] {
        let failed = line(&Step::inspector_failed("it died of SIGKILL", started));
        let fetcher = scripted(&script(&[(1, &target_line()), (1, &failed)]));
        match inspect(&fetcher, Duration::from_secs(10), &nothing_cached) {
            Err(CheckError::Failed { cache_key, why, .. }) => {
                assert_eq!(cache_key.as_deref(), expected_key);
                assert_eq!(why, "it died of SIGKILL");
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn a_fetcher_that_dies_silent_is_named_with_its_status_and_stderr_is_not_an_answer() {
    let fetcher = scripted("read -r _; echo 'containerd went away' >&2; exit 7");
    match inspect(&fetcher, Duration::from_secs(10), &nothing_cached) {
        Err(CheckError::Failed { cache_key, why, .. }) => {
            assert_eq!(cache_key, None, "nothing of the image was learnt");
            assert!(why.contains("ended without an answer"), "{why}");
            assert!(why.contains("status 7"), "{why}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_fetcher_that_hangs_after_its_target_is_killed_and_the_digest_cached() {
    // `exec`: a child of the shell would keep the pipe open after the
    // shell's kill (the real fetcher's inspector has pipes of its own).
    let fetcher = scripted(&format!("{}exec sleep 60", script(&[(1, &target_line())])));
    let started = Instant::now();
    let outcome = inspect(&fetcher, Duration::from_millis(200), &nothing_cached);
    // The budget, the inspector's grace (0 here) and the fetcher's 3 s.
    assert!(started.elapsed() < Duration::from_secs(20), "never killed");
    match outcome {
        Err(CheckError::Failed { cache_key, why, .. }) => {
            let key = RunSpec::default().cache_key(DIGEST);
            assert_eq!(cache_key.as_deref(), Some(key.as_str()));
            assert!(why.contains("was killed"), "{why}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_line_over_the_bound_or_garbage_breaks_the_exchange() {
    let long = "x".repeat(MAX_LINE + 10);
    for text in [long.as_str(), "not json", &found_line()] {
        let fetcher = scripted(&script(&[(1, text)]));
        match inspect(&fetcher, Duration::from_secs(10), &nothing_cached) {
            Err(CheckError::Failed { cache_key, why, .. }) => {
                assert_eq!(cache_key, None);
                assert!(why.starts_with("the image fetcher"), "{why}");
            }
            other => panic!("{}: {other:?}", text.get(..20).unwrap_or(text)),
        }
    }
}

#[test]
fn a_fetcher_that_cannot_start_says_which_program() {
    let fetcher = ForkedInspect {
        helper: vec![OsString::from("/nonexistent/amd-gpud-loader-check")],
        ..scripted("")
    };
    match inspect(&fetcher, Duration::from_secs(10), &nothing_cached) {
        Err(CheckError::Failed { cache_key, why, .. }) => {
            assert_eq!(cache_key, None);
            assert!(why.contains("/nonexistent/amd-gpud-loader-check"), "{why}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_fetcher_that_breaks_off_after_its_target_is_not_cached_unless_past_its_deadline() {
    // Its own failure, not the image's: the next check tries again.
    let fetcher = scripted(&format!(
        "{}read -r _; printf 'garbage\\n'; exec sleep 60",
        script(&[(1, &target_line())])
    ));
    let started = Instant::now();
    match inspect(&fetcher, Duration::from_secs(30), &nothing_cached) {
        Err(CheckError::Failed { cache_key, why, .. }) => {
            assert_eq!(cache_key, None);
            assert!(why.contains("broke the exchange"), "{why}");
            assert!(why.contains("amd-gpud then ended it"), "{why}");
        }
        other => panic!("{other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "waited for its deadline"
    );
}

/// A pod spec at the bound amd-gpud takes (`run::MAX_RUN_BYTES`), in the
/// characters JSON escapes the longest.
fn largest_run() -> RunSpec {
    let word = "\u{1}".repeat(1024);
    RunSpec {
        command: vec![word; crate::loader_check::run::MAX_RUN_BYTES / 1024 - 1],
        ..RunSpec::default()
    }
    .bounded()
    .unwrap()
}

#[test]
fn the_largest_pod_spec_reaches_the_fetcher_whole() {
    // The fetcher reads its job and says the image is not there.
    let not_present = failed_line(FailKind::NotPresent, "told by the script");
    let fetcher = scripted(&script(&[(1, &not_present)]));
    let outcome = fetcher.inspect(
        "docker.io/library/x:1",
        &largest_run(),
        Instant::now() + Duration::from_secs(10),
        &nothing_cached,
    );
    assert!(
        matches!(outcome, Err(CheckError::NotPresent(_))),
        "{outcome:?}"
    );
    // And the fetcher's own reader takes that job.
    let job = job_for(largest_run(), "/nonexistent/containerd.sock".into());
    let mut text = Vec::new();
    wire::write_line(&mut text, &job, wire::MAX_JOB).unwrap();
    assert!(text.len() > 6 * 30 * 1024, "{} bytes", text.len());
    let read: FetchJob = wire::read_line(&mut text.as_slice(), wire::MAX_JOB).unwrap();
    assert_eq!(read, job);
}

#[test]
fn the_fetcher_answers_no_runtime_for_a_socket_nobody_listens_on() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let job = job_for(RunSpec::default(), dir.path().join("containerd.sock"));
    let mut input = Vec::new();
    wire::write_line(&mut input, &job, wire::MAX_JOB).unwrap();
    let mut output = Vec::new();
    super::process::fetch(runtime.handle(), &mut input.as_slice(), &mut output).unwrap();
    let step: Step = wire::read_line(&mut output.as_slice(), super::MAX_STEP_LINE).unwrap();
    match step {
        Step::Verdict {
            verdict:
                Verdict::Failed {
                    kind: FailKind::NoRuntime,
                    why,
                    ..
                },
        } => assert!(why.contains("containerd.sock"), "{why}"),
        other => panic!("{other:?}"),
    }
    // A job line over the bound is refused before any of it is used.
    let long = vec![b'x'; wire::MAX_JOB + 1];
    let err = super::process::fetch(runtime.handle(), &mut long.as_slice(), &mut Vec::new());
    assert!(err.unwrap_err().to_string().contains("longer than"));
}
