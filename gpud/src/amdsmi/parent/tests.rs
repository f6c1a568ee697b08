//! Tests of the helper process: timeouts, signals, garbage, the real child's output.

use std::{ffi::OsString, path::Path};

use super::*;
use crate::amdsmi::{
    ProbeArgs,
    report::{LibVersion, ProbeFailure},
    run_probe_command,
};

/// A helper that runs `script` under `/bin/sh` (the probe arguments become `$1...`).
fn sh(script: &str, env: &[(&str, &str)], timeout: Duration) -> AmdSmiConfig {
    AmdSmiConfig {
        library: LibrarySource::Path("/opt/rocm/lib/libamd_smi.so.26".into()),
        helper: vec!["/bin/sh".into(), "-c".into(), script.into(), "sh".into()],
        timeout,
        child_env: env
            .iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v)))
            .collect(),
    }
}

fn report() -> AmdSmiReport {
    AmdSmiReport {
        library: "/opt/rocm/lib/libamd_smi.so.26".into(),
        version: LibVersion {
            year: None,
            major: 26,
            minor: 1,
            release: 0,
            build: None,
        },
        layout: "7.0".into(),
        processors: vec![],
        errors: vec![],
        profile_switch: None,
        usage: None,
    }
}

fn doc(outcome: &ProbeOutcome) -> String {
    serde_json::to_string(outcome).unwrap()
}

const PRINT_DOC: &str = r#"printf '%s\n' "$DOC""#;
const SHORT: Duration = Duration::from_secs(5);

#[test]
fn a_valid_report_is_returned() {
    let d = doc(&ProbeOutcome::Ok { report: report() });
    let got = probe(&sh(PRINT_DOC, &[("DOC", &d)], SHORT)).unwrap();
    assert_eq!(got, report());
}

#[test]
fn noise_before_the_document_is_skipped() {
    let d = doc(&ProbeOutcome::Ok { report: report() });
    let script = r#"echo "rsmi: chatter"; printf 'partial'; printf '\n%s\n' "$DOC"; echo '{bye'"#;
    assert_eq!(probe(&sh(script, &[("DOC", &d)], SHORT)).unwrap(), report());
}

#[test]
fn a_child_failure_becomes_the_same_typed_error() {
    let failure = ProbeFailure::Status {
        call: "amdsmi_init".into(),
        device: None,
        status: 18,
        name: "INIT_ERROR".into(),
    };
    let d = doc(&ProbeOutcome::Error { error: failure });
    let err = probe(&sh(&format!("{PRINT_DOC}; exit 1"), &[("DOC", &d)], SHORT)).unwrap_err();
    let AmdSmiError::Status {
        call, status, name, ..
    } = &err
    else {
        panic!("{err:?}")
    };
    assert_eq!(
        (call.as_str(), *status, name.as_str()),
        ("amdsmi_init", 18, "INIT_ERROR")
    );
}

#[test]
fn the_real_child_output_round_trips() {
    let args = ProbeArgs {
        library: Some("/nonexistent/libamd_smi.so".into()),
        ..ProbeArgs::default()
    };
    let mut out = Vec::new();
    let code = run_probe_command(&args, &mut out);
    let d = String::from_utf8(out).unwrap();
    let script = format!("{PRINT_DOC}; exit {code}");
    let err = probe(&sh(&script, &[("DOC", &d)], SHORT)).unwrap_err();
    let AmdSmiError::Load { library, reason } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(library, "/nonexistent/libamd_smi.so");
    assert!(reason.contains("No such file"), "{reason}");
}

#[test]
fn garbage_output_is_a_helper_output_error() {
    let err = probe(&sh("echo 'this is not json'", &[], SHORT)).unwrap_err();
    let AmdSmiError::HelperOutput { library, reason } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(library, "/opt/rocm/lib/libamd_smi.so.26");
    assert!(reason.contains("not a probe result"), "{reason}");
}

#[test]
fn a_failing_helper_reports_code_stderr_and_got_the_probe_args() {
    let err = probe(&sh(r#"echo "args: $*" >&2; exit 3"#, &[], SHORT)).unwrap_err();
    let AmdSmiError::HelperFailed { code, stderr, .. } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(*code, 3);
    assert_eq!(
        stderr,
        "args: amdsmi-probe --library /opt/rocm/lib/libamd_smi.so.26"
    );
}

#[test]
fn a_hanging_helper_is_killed_and_reaped() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    let pidfile_str = pidfile.to_str().unwrap();
    let script = r#"echo $$ > "$PIDFILE"; exec sleep 600"#;
    let start = Instant::now();
    let cfg = sh(
        script,
        &[("PIDFILE", pidfile_str)],
        Duration::from_millis(500),
    );
    let err = probe(&cfg).unwrap_err();
    assert!(
        start.elapsed() < Duration::from_secs(4),
        "took {:?}",
        start.elapsed()
    );
    let AmdSmiError::HelperTimeout { after, .. } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(*after, Duration::from_millis(500));
    let pid = std::fs::read_to_string(&pidfile).unwrap();
    let proc_dir = format!("/proc/{}", pid.trim());
    // Reaped, so the pid is gone (or, in the unlikely event of reuse, no longer our sleep).
    let cmdline = std::fs::read(Path::new(&proc_dir).join("cmdline")).unwrap_or_default();
    assert!(
        !String::from_utf8_lossy(&cmdline).contains("sleep"),
        "helper {pid} still alive"
    );
}

#[test]
fn a_helper_killed_by_sigabrt_names_the_signal() {
    let err = probe(&sh("kill -ABRT $$", &[], SHORT)).unwrap_err();
    let AmdSmiError::HelperKilled {
        signal,
        signal_name,
        ..
    } = &err
    else {
        panic!("{err:?}")
    };
    assert_eq!(*signal, 6);
    assert_eq!(signal_name, "SIGABRT");
    assert!(err.to_string().contains("SIGABRT (6)"), "{err}");
}

#[test]
fn a_document_written_before_a_crash_at_exit_is_used() {
    let d = doc(&ProbeOutcome::Ok { report: report() });
    let script = format!("{PRINT_DOC}; kill -SEGV $$");
    assert_eq!(
        probe(&sh(&script, &[("DOC", &d)], SHORT)).unwrap(),
        report()
    );
}

#[test]
fn spawn_failures_name_the_program() {
    let mut cfg = sh("", &[], SHORT);
    cfg.helper = vec!["/nonexistent/amd-gpud".into()];
    let err = probe(&cfg).unwrap_err();
    let AmdSmiError::HelperSpawn { program, source } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(program, "/nonexistent/amd-gpud");
    assert_eq!(source.kind(), io::ErrorKind::NotFound);
    cfg.helper.clear();
    assert!(matches!(probe(&cfg), Err(AmdSmiError::HelperSpawn { .. })));
}

#[test]
fn disabled_spawns_nothing() {
    let mut cfg = sh("exit 99", &[], SHORT);
    cfg.library = LibrarySource::Disabled;
    assert!(matches!(probe(&cfg), Err(AmdSmiError::Disabled)));
}

#[test]
fn signal_names() {
    assert_eq!(signal_name(libc::SIGSEGV), "SIGSEGV");
    assert_eq!(signal_name(libc::SIGKILL), "SIGKILL");
    assert_eq!(signal_name(64), "signal 64");
}

#[test]
fn sources_are_described_for_operators() {
    let mut cfg = sh("", &[("AMDSMI_LIB_DIR", "")], SHORT);
    assert_eq!(describe(&cfg), "/opt/rocm/lib/libamd_smi.so.26");
    cfg.library = LibrarySource::Search {
        dirs: vec!["/opt/rocm/lib".into(), "/usr/lib".into()],
    };
    assert_eq!(
        describe(&cfg),
        "search /opt/rocm/lib:/usr/lib (then loader path)"
    );
    cfg.child_env = vec![("AMDSMI_LIB_DIR".into(), "/env".into())];
    assert_eq!(
        describe(&cfg),
        "search /env:/opt/rocm/lib:/usr/lib (then loader path)"
    );
    cfg.library = LibrarySource::Search { dirs: vec![] };
    cfg.child_env = vec![("AMDSMI_LIB_DIR".into(), "".into())];
    assert_eq!(describe(&cfg), "search (loader path)");
}
