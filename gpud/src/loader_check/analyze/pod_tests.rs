//! The analysis of a container its pod starts its own way (issue 38, F8):
//! the pod's `command`, `args`, `workingDir` and `PATH` over the image's.

use serde_json::json;

use super::tests::{BUSYBOX, debian_base, host};
use super::*;
use crate::loader_check::testimage::{MemSource, TAR, TAR_GZIP, TarLayer, gzip};
use crate::loader_check::{Loader, run::RunSpec};

/// A Debian image with the host's static busybox at /opt/static.
fn with_static(s: &mut MemSource, config: &serde_json::Value) -> Descriptor {
    let opt = TarLayer::new()
        .dir("./opt/")
        .host_file("./opt/static", 0o755, BUSYBOX)
        .finish();
    s.image(config, vec![(TAR_GZIP, gzip(&debian_base())), (TAR, opt)])
}

/// Issue 38, F8: a pod's `command` (and `args`, `workingDir`, `PATH`)
/// decide the program that runs; the image's entrypoint is judged only
/// when the pod leaves it in place. Before, a glibc image whose pod ran a
/// static binary got the hook.
#[test]
fn the_pods_command_is_judged_not_the_images_entrypoint() {
    let mut s = MemSource::default();
    let target = with_static(&mut s, &json!({"Entrypoint": ["/bin/true"], "Cmd": ["-x"]}));
    let judged = |s: &mut MemSource, run: RunSpec| {
        inspect_target(s, &target, &host(), &run, &Limits::default()).unwrap()
    };
    let glibc = Loader::Glibc {
        major: 2,
        minor: 36,
    };
    assert_eq!(judged(&mut s, RunSpec::default()).loader, glibc);
    let command = judged(
        &mut s,
        RunSpec {
            command: vec!["/opt/static".to_owned()],
            ..RunSpec::default()
        },
    );
    assert_eq!(command.loader, Loader::Static, "{}", command.evidence);
    assert!(
        command
            .evidence
            .starts_with("the pod's command /opt/static is static"),
        "{}",
        command.evidence
    );
    // args replace Cmd only: the entrypoint still runs.
    let args = RunSpec {
        args: vec!["/opt/static".to_owned()],
        ..RunSpec::default()
    };
    assert_eq!(judged(&mut s, args).loader, glibc);
    let in_path = RunSpec {
        command: vec!["static".to_owned()],
        path: "/usr/local/bin:/opt".to_owned(),
        ..RunSpec::default()
    };
    assert_eq!(judged(&mut s, in_path).loader, Loader::Static);
    let relative = RunSpec {
        command: vec!["./static".to_owned()],
        working_dir: "/opt".to_owned(),
        ..RunSpec::default()
    };
    assert_eq!(judged(&mut s, relative).loader, Loader::Static);
    let unknown_path = RunSpec {
        command: vec!["static".to_owned()],
        path_unknown: true,
        ..RunSpec::default()
    };
    let found = judged(&mut s, unknown_path);
    assert!(matches!(found.loader, Loader::Unknown { .. }), "{found:?}");
    assert!(
        found.evidence.contains("envFrom or valueFrom"),
        "{}",
        found.evidence
    );
}

/// An image with no entrypoint runs what the pod's args name.
#[test]
fn args_name_the_program_of_an_image_without_an_entrypoint() {
    let mut s = MemSource::default();
    let target = with_static(&mut s, &json!({"Cmd": ["/bin/true"]}));
    let run = RunSpec {
        args: vec!["/opt/static".to_owned(), "sh".to_owned()],
        ..RunSpec::default()
    };
    let f = inspect_target(&mut s, &target, &host(), &run, &Limits::default()).unwrap();
    assert_eq!(f.loader, Loader::Static, "{}", f.evidence);
    assert!(
        f.evidence.starts_with("the pod's args /opt/static"),
        "{}",
        f.evidence
    );
}
