//! The inspector child: the exchange over pipes (the real child's code run
//! on a thread), and children that hang, crash, flood or talk garbage (a
//! shell script standing in for it).

use std::{
    io::BufReader,
    os::unix::net::UnixStream,
    time::{Duration, Instant},
};

use serde_json::json;

use super::{
    child,
    serve::{self, inspect_in_child},
    wire::{self, FailKind, Job, Verdict},
    *,
};
use crate::loader_check::{
    Descriptor, Loader,
    run::RunSpec,
    testimage::{MemSource, TAR_GZIP, TarLayer, gzip},
};

const LIBC: &str = "/lib/x86_64-linux-gnu/libc.so.6";

fn glibc_image(source: &mut MemSource) -> Descriptor {
    let layer = TarLayer::new()
        .dir("./")
        .dir("./bin/")
        .host_file("./bin/true", 0o755, "/usr/bin/true")
        .dir("./lib/")
        .dir("./lib/x86_64-linux-gnu/")
        .host_file("./lib/x86_64-linux-gnu/libc.so.6", 0o755, LIBC)
        .file(
            "./lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
            0o755,
            b"\x7fELF",
        )
        .dir("./lib64/")
        .symlink(
            "./lib64/ld-linux-x86-64.so.2",
            "../lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
        )
        .finish();
    source.image(
        &json!({"Entrypoint": ["/bin/true"]}),
        vec![(TAR_GZIP, gzip(&layer))],
    )
}

/// Runs the child's side on a thread against `serve` over socket pairs.
fn exchange(source: &mut MemSource, target: &Descriptor) -> Result<Verdict, serve::Broke> {
    exchange_run(source, target, RunSpec::default())
}

/// As [`exchange`], for a container started as `run` says.
fn exchange_run(
    source: &mut MemSource,
    target: &Descriptor,
    run: RunSpec,
) -> Result<Verdict, serve::Broke> {
    let (to_child, child_in) = UnixStream::pair().expect("pair");
    let (child_out, from_child) = UnixStream::pair().expect("pair");
    let child = std::thread::spawn(move || child::serve(child_in, child_out));
    let job = Job {
        target: target.into(),
        run,
        budget_ms: 60_000,
    };
    let mut to = to_child;
    let verdict = serve::serve(source, &job, &mut to, &mut BufReader::new(from_child));
    drop(to);
    child.join().expect("child thread").expect("child served");
    verdict
}

#[test]
fn the_child_judges_an_image_from_what_the_parent_streams() {
    let mut source = MemSource::default();
    let target = glibc_image(&mut source);
    let Verdict::Found { loader, evidence } = exchange(&mut source, &target).unwrap() else {
        panic!("no finding");
    };
    assert!(
        matches!(loader, Loader::Glibc { major: 2, .. }),
        "{loader:?}"
    );
    assert!(evidence.contains("/bin/true"), "{evidence}");
}

/// The pod's way of starting the container crosses the pipe with the job
/// (issue 38, F8): the child judges the pod's command.
#[test]
fn the_child_judges_the_pods_command() {
    let mut source = MemSource::default();
    let target = glibc_image(&mut source);
    let run = RunSpec {
        command: vec!["/bin/missing".to_owned()],
        ..RunSpec::default()
    };
    let Verdict::Found { evidence, .. } = exchange_run(&mut source, &target, run).unwrap() else {
        panic!("no finding");
    };
    assert!(
        evidence.starts_with("the pod's command /bin/missing not found"),
        "{evidence}"
    );
}

#[test]
fn the_stores_errors_reach_the_child_as_they_were() {
    let mut source = MemSource::default();
    let target = glibc_image(&mut source);
    let missing: Vec<String> = source
        .blobs
        .keys()
        .filter(|d| **d != target.digest)
        .cloned()
        .collect();
    for digest in missing {
        source.blobs.remove(&digest);
    }
    let Verdict::Failed {
        kind, why, lasting, ..
    } = exchange(&mut source, &target).unwrap()
    else {
        panic!("a finding without blobs");
    };
    assert_eq!(kind, FailKind::Content);
    assert!(why.contains("not in the content store"), "{why}");
    assert!(!lasting, "a missing blob is not the image's fault");
}

/// A stand-in child: `script` under `/bin/sh`, the child's arguments
/// after it.
fn sh(script: &str) -> Sandbox {
    Sandbox {
        grace: Duration::ZERO,
        ..Sandbox::new(vec![
            "/bin/sh".into(),
            "-c".into(),
            script.into(),
            "sh".into(),
        ])
    }
}

fn run(script: &str, budget: Duration) -> Result<Verdict, super::ChildFailure> {
    let mut source = MemSource::default();
    let target = glibc_image(&mut source);
    inspect_in_child(
        &sh(script),
        &mut source,
        &target,
        &RunSpec::default(),
        budget,
    )
}

#[test]
fn a_child_that_hangs_is_killed_at_the_deadline() {
    let started = Instant::now();
    let got = run("exec sleep 60", Duration::from_secs(1));
    assert!(
        matches!(got, Err(super::ChildFailure::Deadline { .. })),
        "{got:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn a_child_that_crashes_is_named_by_its_signal() {
    let got = run(
        "echo 'memory allocation of 4096 bytes failed' >&2; kill -ABRT $$",
        Duration::from_secs(30),
    );
    let err = got.unwrap_err().to_string();
    assert!(
        err.contains("SIGABRT") && err.contains("memory allocation"),
        "{err}"
    );
}

#[test]
fn garbage_and_floods_are_refused_unparsed() {
    let err = run("echo hello; sleep 5", Duration::from_secs(30))
        .unwrap_err()
        .to_string();
    assert!(err.contains("no request") && err.contains("hello"), "{err}");
    let flood = "head -c 100000000 /dev/zero | tr '\\0' a";
    let err = run(flood, Duration::from_secs(30)).unwrap_err().to_string();
    assert!(err.contains("longer than 8192"), "{err}");
}

#[test]
fn a_child_that_exits_early_says_how() {
    let err = run(
        "echo 'refusing to run' >&2; exit 3",
        Duration::from_secs(30),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("status 3") && err.contains("refusing"),
        "{err}"
    );
}

#[test]
fn a_small_verdict_is_taken() {
    let verdict = r#"{"ask":"verdict","outcome":"found","loader":{"kind":"musl"},"evidence":"e"}"#;
    let got = run(&format!("echo '{verdict}'"), Duration::from_secs(30)).unwrap();
    assert_eq!(
        got,
        Verdict::Found {
            loader: Loader::Musl,
            evidence: "e".into()
        }
    );
}

#[test]
fn a_child_that_ends_itself_at_its_wall_clock_limit_is_out_of_time() {
    // What the child's own timer does where amd-gpud may not kill it.
    let err = run("exit 124", Duration::from_secs(30)).unwrap_err();
    assert!(
        matches!(err, super::ChildFailure::Deadline { .. }),
        "{err:?}"
    );
}

#[test]
fn the_child_cannot_make_amd_gpud_read_a_blob_whole() {
    use std::io::Read;
    let mut source = MemSource::default();
    let target = glibc_image(&mut source);
    let big = source.put(crate::loader_check::testimage::TAR, vec![0; 5 << 20]);
    let (mut to_child, mut child_in) = UnixStream::pair().expect("pair");
    let (mut child_out, from_child) = UnixStream::pair().expect("pair");
    let ask = wire::Request::Blob {
        desc: (&big).into(),
        max: u64::MAX,
    };
    wire::write_request(&mut child_out, &ask).unwrap();
    let job = Job {
        target: (&target).into(),
        run: RunSpec::default(),
        budget_ms: 60_000,
    };
    let parent = std::thread::spawn(move || {
        serve::serve(
            &mut source,
            &job,
            &mut to_child,
            &mut BufReader::new(from_child),
        )
    });
    let wire::Frame::Job(_) = wire::read_frame(&mut child_in, 0).unwrap() else {
        panic!("no job first");
    };
    let mut head = [0_u8; 5];
    child_in.read_exact(&mut head).unwrap();
    assert_eq!(head[0], wire::ERROR, "5 MiB sent whole: {head:?}");
    drop(child_out);
    assert!(parent.join().unwrap().is_err());
}
