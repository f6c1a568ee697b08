use std::time::Duration;

use super::*;
use crate::loader_check::elf::{ElfClass, ElfSummary, Shebang};
use crate::loader_check::layers::FileSummary;

/// The classification with time to spare.
fn classify(t: &Tree, cmd: &Command) -> (Loader, String) {
    let deadline = Instant::now() + Duration::from_secs(600);
    super::classify(t, cmd, deadline).expect("within the deadline")
}

const GLIBC_LD: &str = "/lib64/ld-linux-x86-64.so.2";
const MUSL_LD: &str = "/lib/ld-musl-x86_64.so.1";

fn file(kind: FileKind) -> Node {
    Node::File(FileSummary {
        mode: 0o755,
        kind,
        glibc: None,
    })
}

fn elf(interp: Option<&str>) -> Node {
    file(FileKind::Elf(ElfSummary {
        class: ElfClass::Elf64,
        machine: 62,
        interp: interp.map_or(Interp::Absent, |p| Interp::Path(p.to_owned())),
        dynamic: interp.is_some(),
    }))
}

fn script(interpreter: &str, arg: Option<&str>) -> Node {
    file(FileKind::Script(Shebang {
        interpreter: interpreter.to_owned(),
        arg: arg.map(str::to_owned),
    }))
}

fn libc(newest: u32) -> Node {
    let versions = [(2, 2, 5), (2, 3, 0), (2, newest, 0)]
        .map(|(major, minor, patch)| GlibcVersion {
            major,
            minor,
            patch,
        })
        .to_vec();
    Node::File(FileSummary {
        mode: 0o755,
        kind: FileKind::Other,
        glibc: Some(Ok(versions)),
    })
}

fn link(to: &str) -> Node {
    Node::Symlink(to.to_owned())
}

/// A Debian-like merged-/usr tree with glibc 2.`minor`.
fn debian(minor: u32) -> Tree {
    let mut t = Tree::default();
    for (p, n) in [
        ("/bin", link("usr/bin")),
        ("/lib", link("usr/lib")),
        ("/lib64", link("usr/lib64")),
        ("/usr", Node::Dir),
        ("/usr/bin", Node::Dir),
        ("/usr/bin/true", elf(Some(GLIBC_LD))),
        ("/usr/lib/x86_64-linux-gnu", Node::Dir),
        ("/usr/lib/x86_64-linux-gnu/libc.so.6", libc(minor)),
        ("/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2", elf(None)),
        (
            "/usr/lib64/ld-linux-x86-64.so.2",
            link("../lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"),
        ),
    ] {
        t.insert(p, n);
    }
    t
}

fn run(t: &Tree, argv0: &str) -> (Loader, String) {
    let cmd = Command {
        argv0: Some(argv0.to_owned()),
        ..Command::default()
    };
    classify(t, &cmd)
}

fn glibc(minor: u32) -> Loader {
    Loader::Glibc { major: 2, minor }
}

#[test]
fn merged_usr_glibc() {
    let (loader, evidence) = run(&debian(36), "/bin/true");
    assert_eq!(loader, glibc(36));
    assert_eq!(
        evidence,
        "entrypoint /bin/true (-> /usr/bin/true) -> interpreter /lib64/ld-linux-x86-64.so.2; \
         /lib/x86_64-linux-gnu/libc.so.6 defines GLIBC_2.36"
    );
}

#[test]
fn path_lookup_and_working_dir() {
    let t = debian(36);
    assert_eq!(run(&t, "true").0, glibc(36));
    let cmd = Command {
        argv0: Some("./true".to_owned()),
        working_dir: "/usr/bin".to_owned(),
        ..Command::default()
    };
    assert_eq!(classify(&t, &cmd).0, glibc(36));
    let cmd = Command {
        argv0: Some("true".to_owned()),
        path: "/nowhere:bin".to_owned(),
        ..Command::default()
    };
    assert_eq!(classify(&t, &cmd).0, glibc(36));
}

#[test]
fn old_glibc_is_reported_as_is() {
    assert_eq!(run(&debian(33), "/usr/bin/true").0, glibc(33));
}

#[test]
fn musl_and_static() {
    let mut t = Tree::default();
    t.insert("/bin/app", elf(Some(MUSL_LD)));
    t.insert("/bin/static", elf(None));
    let (loader, evidence) = run(&t, "/bin/app");
    assert_eq!(loader, Loader::Musl);
    assert!(evidence.contains(MUSL_LD), "{evidence}");
    assert_eq!(run(&t, "/bin/static").0, Loader::Static);
}

#[test]
fn shebang_to_static_busybox() {
    let mut t = Tree::default();
    t.insert("/bin/busybox", elf(None));
    t.insert("/bin/sh", link("busybox"));
    t.insert("/entry.sh", script("/bin/sh", Some("-e")));
    let (loader, evidence) = run(&t, "/entry.sh");
    assert_eq!(loader, Loader::Static);
    assert!(
        evidence.contains("script interpreter /bin/sh (-> /bin/busybox)"),
        "{evidence}"
    );
}

#[test]
fn env_script_follows_its_program() {
    let mut t = debian(36);
    t.insert("/usr/bin/env", elf(Some(GLIBC_LD)));
    t.insert("/usr/local/bin/tool", elf(Some(MUSL_LD)));
    t.insert("/run.py", script("/usr/bin/env", Some("tool")));
    assert_eq!(run(&t, "/run.py").0, Loader::Musl);
}

#[test]
fn script_chains_are_bounded() {
    let mut t = Tree::default();
    t.insert("/a", script("/a", None));
    assert!(matches!(run(&t, "/a").0, Loader::Unknown { .. }));
}

#[test]
fn escaping_symlink_stays_in_the_image() {
    let mut t = Tree::default();
    t.insert("/usr/bin/app", link("../../../../etc/x"));
    t.insert("/etc/x", elf(None));
    assert_eq!(run(&t, "/usr/bin/app").0, Loader::Static);
    t.insert("/usr/bin/abs", link("/../../etc/x"));
    assert_eq!(run(&t, "/usr/bin/abs").0, Loader::Static);
}

#[test]
fn symlink_loop_is_unknown() {
    let mut t = Tree::default();
    t.insert("/bin/a", link("b"));
    t.insert("/bin/b", link("/bin/a"));
    let (loader, _) = run(&t, "/bin/a");
    let Loader::Unknown { why } = loader else {
        panic!("{loader:?}")
    };
    assert!(why.contains("symlinks"), "{why}");
}

#[test]
fn hardlink_is_followed() {
    let mut t = Tree::default();
    t.insert("/bin/real", elf(None));
    t.insert("/bin/alias", Node::Hardlink("/bin/real".to_owned()));
    assert_eq!(run(&t, "/bin/alias").0, Loader::Static);
}

#[test]
fn missing_entrypoint_uses_the_loaders_present() {
    let glibc_tree = debian(36);
    let (loader, evidence) = run(&glibc_tree, "/nope");
    assert_eq!(loader, glibc(36));
    assert!(
        evidence.starts_with("entrypoint /nope not found"),
        "{evidence}"
    );

    let mut musl = Tree::default();
    musl.insert(MUSL_LD, link("/usr/lib/libc.so"));
    assert_eq!(classify(&musl, &Command::default()).0, Loader::Musl);

    let mut none = Tree::default();
    none.insert("/etc/passwd", file(FileKind::NotRead));
    let (loader, evidence) = classify(&none, &Command::default());
    assert_eq!(loader, Loader::Static);
    assert!(evidence.contains("no loader in the image"), "{evidence}");

    let mut both = debian(36);
    both.insert(MUSL_LD, elf(None));
    assert!(matches!(
        classify(&both, &Command::default()).0,
        Loader::Unknown { .. }
    ));
}

#[test]
fn copies_that_disagree_give_the_lowest() {
    let mut t = debian(36);
    t.insert("/usr/lib64/libc.so.6", libc(28));
    let (loader, evidence) = run(&t, "/usr/bin/true");
    assert_eq!(loader, glibc(28));
    assert!(evidence.contains("lowest of 2 copies"), "{evidence}");
}

#[test]
fn glibc_without_libc_or_verdef_is_unknown() {
    let mut t = debian(36);
    t.insert(
        "/usr/lib/x86_64-linux-gnu/libc.so.6",
        Node::File(FileSummary {
            mode: 0o755,
            kind: FileKind::Other,
            glibc: Some(Err("no symbol version definitions".to_owned())),
        }),
    );
    let (loader, _) = run(&t, "/usr/bin/true");
    assert!(matches!(loader, Loader::Unknown { ref why } if why.contains("no symbol")));
    let mut t = Tree::default();
    t.insert("/app", elf(Some(GLIBC_LD)));
    let (loader, _) = run(&t, "/app");
    assert!(matches!(loader, Loader::Unknown { ref why } if why.contains("no libc.so.6")));
}

#[test]
fn odd_files_are_unknown() {
    let mut t = Tree::default();
    t.insert(
        "/plain",
        Node::File(FileSummary {
            mode: 0o644,
            kind: FileKind::NotRead,
            glibc: None,
        }),
    );
    t.insert("/dir", Node::Dir);
    t.insert("/other-ld", elf(Some("/lib/ld.so")));
    t.insert("/file", elf(None));
    for argv0 in ["/plain", "/dir", "/other-ld", "/file/x"] {
        assert!(
            matches!(run(&t, argv0).0, Loader::Unknown { .. }),
            "{argv0}"
        );
    }
}

/// Links that each walk 201 components (`a/` 100 times, back up, on to
/// the next link): 40 of them stay within `MAX_HOPS` but not `MAX_WALK`.
#[test]
fn a_chain_of_long_links_stops_at_the_walk_bound() {
    let mut t = Tree::default();
    let detour = format!("{}{}", "a/".repeat(100), "../".repeat(100));
    for i in 0..39 {
        t.insert(&format!("/l{i}"), link(&format!("{detour}l{}", i + 1)));
    }
    t.insert("/l39", elf(None));
    let (loader, evidence) = run(&t, "/l0");
    assert!(
        matches!(&loader, Loader::Unknown { why } if why.contains("MAX_WALK")),
        "{loader:?}"
    );
    assert!(evidence.contains(&MAX_WALK.to_string()), "{evidence}");
    // The same chain, 20 links long, is followed to its end.
    t.insert("/l20", elf(None));
    assert_eq!(run(&t, "/l0").0, Loader::Static);
}

#[test]
fn classification_stops_at_the_deadline() {
    let cmd = Command {
        argv0: Some("true".to_owned()),
        ..Command::default()
    };
    let err = super::classify(&debian(36), &cmd, Instant::now()).unwrap_err();
    assert_eq!(
        err,
        InspectError::OutOfTime {
            stage: "resolving the command"
        }
    );
}

#[test]
fn command_paths_are_bounded_before_any_walk() {
    let deep = format!("/{}", "a/".repeat(MAX_COMPONENTS + 1));
    let cmd = Command {
        argv0: Some(deep),
        ..Command::default()
    };
    let err = cmd.bounded().unwrap_err();
    assert_eq!(
        (err.field, err.bound, err.found),
        ("argv[0]", "MAX_COMPONENTS", MAX_COMPONENTS + 1)
    );
    assert_eq!(err.limit, MAX_COMPONENTS);
    let cmd = Command {
        working_dir: format!("/{}", "w".repeat(5000)),
        ..Command::default()
    };
    let err = cmd.bounded().unwrap_err();
    assert_eq!((err.field, err.bound), ("WorkingDir", "MAX_PATH_BYTES"));
    let cmd = Command {
        argv0: Some("x".to_owned()),
        path: vec!["/b"; MAX_PATH_ENTRIES + 1].join(":"),
        ..Command::default()
    };
    let err = cmd.bounded().unwrap_err();
    assert_eq!((err.field, err.bound), ("PATH", "MAX_PATH_ENTRIES"));
    assert!(err.to_string().contains("65 entries"), "{err}");
    let fine = Command {
        argv0: Some("/usr/bin/true".to_owned()),
        path: vec!["/b"; MAX_PATH_ENTRIES].join(":"),
        ..Command::default()
    };
    assert_eq!(fine.clone().bounded(), Ok(fine));
}

/// A Debian tree with a shell, tini, and a static binary in /opt.
fn with_wrappers() -> Tree {
    let mut t = debian(36);
    for (p, n) in [
        ("/usr/bin/dash", elf(Some(GLIBC_LD))),
        ("/usr/bin/sh", link("dash")),
        ("/usr/bin/tini", elf(Some(GLIBC_LD))),
        ("/usr/bin/env", elf(Some(GLIBC_LD))),
        ("/opt", Node::Dir),
        ("/opt/static", elf(None)),
    ] {
        t.insert(p, n);
    }
    t
}

fn run_with(t: &Tree, argv: &[&str]) -> (Loader, String) {
    let (argv0, args) = argv.split_first().expect("an argv");
    let cmd = Command {
        argv0: Some((*argv0).to_owned()),
        args: args.iter().map(|a| (*a).to_owned()).collect(),
        origin: "the pod's command",
        ..Command::default()
    };
    classify(t, &cmd)
}

/// Issue 38, F8: a shell's `-c` line and wrappers such as tini and env are
/// followed to the program they start; a line the shell must interpret is
/// unknown.
#[test]
fn wrappers_are_followed_to_the_program_they_start() {
    let t = with_wrappers();
    let (loader, evidence) = run_with(&t, &["/bin/sh", "-c", "exec /opt/static --serve"]);
    assert_eq!(loader, Loader::Static, "{evidence}");
    assert_eq!(
        evidence,
        "the pod's command /bin/sh -c \"exec /opt/static --serve\", which runs /opt/static \
         is static (no PT_INTERP)"
    );
    for argv in [
        &["tini", "--", "/opt/static"][..],
        &["env", "A=1", "/opt/static"],
        &["sh", "-ec", "tini -- env B=2 /opt/static"],
    ] {
        let (loader, evidence) = run_with(&t, argv);
        assert_eq!(loader, Loader::Static, "{argv:?}: {evidence}");
    }
    let (loader, _) = run_with(&t, &["sh", "-c", "true"]);
    assert_eq!(loader, glibc(36));
    let (loader, evidence) = run_with(&t, &["sh", "-c", "true && /opt/static"]);
    assert!(matches!(loader, Loader::Unknown { .. }), "{evidence}");
    assert!(
        evidence.contains("cannot be told without running it"),
        "{evidence}"
    );
    // A shell running a script is judged as the shell (its content is not read).
    assert_eq!(run_with(&t, &["sh", "/opt/run.sh"]).0, glibc(36));
}

#[test]
fn wrapper_chains_and_their_programs_are_bounded() {
    let t = with_wrappers();
    let mut argv = vec!["env"; MAX_WRAPPERS as usize + 1];
    argv.push("/opt/static");
    let (loader, evidence) = run_with(&t, &argv);
    assert!(matches!(loader, Loader::Unknown { .. }), "{evidence}");
    assert!(
        evidence.contains("programs that each start the next"),
        "{evidence}"
    );
    let deep = format!("/{}", "a/".repeat(MAX_COMPONENTS + 1));
    let (loader, evidence) = run_with(&t, &["sh", "-c", &deep]);
    assert!(matches!(loader, Loader::Unknown { .. }), "{evidence}");
    assert!(evidence.contains("MAX_COMPONENTS"), "{evidence}");
}
