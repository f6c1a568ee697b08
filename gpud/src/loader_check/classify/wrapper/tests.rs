use super::*;

fn argv(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

/// The argv `name` runs with `args`, `None` for itself; panics when
/// unknowable.
fn runs_of(name: &str, args: &[&str]) -> Option<Vec<String>> {
    match next(name, name, &argv(args)) {
        Next::Itself => None,
        Next::Runs { argv, .. } => Some(argv),
        Next::Unknowable(why) => panic!("{name} {args:?}: unknowable: {why}"),
    }
}

fn unknowable(name: &str, args: &[&str]) -> String {
    match next(name, name, &argv(args)) {
        Next::Unknowable(why) => why,
        other => panic!("{name} {args:?}: {other:?}"),
    }
}

#[test]
fn a_shell_with_a_plain_command_line_runs_its_program() {
    let cases: &[(&[&str], &[&str])] = &[
        (&["-c", "/static"], &["/static"]),
        (&["-c", "exec /static --flag=1"], &["/static", "--flag=1"]),
        (
            &["-ec", "A=1 B=2 exec python3 train.py"],
            &["python3", "train.py"],
        ),
        (&["-lc", "  ./run  x "], &["./run", "x"]),
        (&["-e", "-o", "pipefail", "-c", "/static"], &["/static"]),
        (&["--login", "-c", "/static", "name", "arg1"], &["/static"]),
    ];
    for (args, want) in cases {
        assert_eq!(runs_of("sh", args), Some(argv(want)), "sh {args:?}");
    }
    assert_eq!(
        runs_of("bash", &["-c", "/static"]),
        Some(argv(&["/static"]))
    );
}

#[test]
fn a_shell_line_the_shell_must_interpret_is_unknowable() {
    for line in [
        "true; /static",
        "cd /x && /static",
        "/static | tee log",
        "exec \"/static\"",
        "$BIN",
        "/opt/*/static",
        "/static > /log",
        "`which static`",
        "python3 -c 'print(1)'",
        "one\ntwo",
    ] {
        let why = unknowable("sh", &["-c", line]);
        assert!(
            why.contains("cannot be told without running it"),
            "{line:?}: {why}"
        );
    }
    let why = unknowable("bash", &["-c"]);
    assert!(why.contains("without a command line"), "{why}");
}

#[test]
fn a_shell_running_a_script_or_stdin_is_judged_itself() {
    assert_eq!(runs_of("sh", &["/entrypoint.sh", "-c", "x"]), None);
    assert_eq!(runs_of("sh", &[]), None);
    assert_eq!(runs_of("bash", &["-e", "run.sh"]), None);
    // An empty or assignment-only line starts no program.
    assert_eq!(runs_of("sh", &["-c", "A=1"]), None);
    // +c is not -c.
    assert_eq!(runs_of("sh", &["+c", "/static"]), None);
}

#[test]
fn wrappers_run_the_program_after_their_options() {
    let cases: &[(&str, &[&str], &[&str])] = &[
        ("tini", &["--", "/static", "-x"], &["/static", "-x"]),
        ("tini", &["-s", "-e", "143", "/static"], &["/static"]),
        ("tini-static", &["-g", "/static"], &["/static"]),
        ("dumb-init", &["--rewrite", "15:2", "/static"], &["/static"]),
        (
            "dumb-init",
            &["-r", "15:2", "--single-child", "/static"],
            &["/static"],
        ),
        ("nice", &["-n", "5", "/static"], &["/static"]),
        ("nice", &["-n5", "/static"], &["/static"]),
        ("timeout", &["-s", "KILL", "1h", "/static"], &["/static"]),
        (
            "timeout",
            &["--kill-after=5", "10", "/static"],
            &["/static"],
        ),
        ("taskset", &["-c", "0-3", "/static"], &["/static"]),
        (
            "numactl",
            &["--cpunodebind=0", "--membind", "0", "/static"],
            &["/static"],
        ),
        ("numactl", &["-N", "0", "-m", "0", "/static"], &["/static"]),
        ("nohup", &["/static"], &["/static"]),
        ("stdbuf", &["-oL", "/static"], &["/static"]),
        (
            "env",
            &["-i", "A=1", "PATH=/x", "/static", "y"],
            &["/static", "y"],
        ),
        ("env", &["-u", "HOME", "--", "/static"], &["/static"]),
    ];
    for (name, args, want) in cases {
        assert_eq!(runs_of(name, args), Some(argv(want)), "{name} {args:?}");
    }
    assert_eq!(
        runs_of("env", &["A=1"]),
        None,
        "env alone prints the environment"
    );
    assert_eq!(runs_of("tini", &["-s"]), None);
    let why = unknowable("env", &["-S", "/static -x"]);
    assert!(why.contains("splits a string"), "{why}");
}

#[test]
fn busybox_is_read_by_its_applet_and_other_programs_are_themselves() {
    assert_eq!(
        next("sh", "busybox", &argv(&["-c", "/static"])),
        Next::Runs {
            argv: argv(&["/static"]),
            how: " -c \"/static\", which runs".to_owned(),
        }
    );
    assert_eq!(
        runs_of("busybox", &["env", "/static"]),
        Some(argv(&["/static"]))
    );
    assert_eq!(runs_of("busybox", &["ls"]), None);
    // A symlink to a shell under another name runs the shell.
    assert_eq!(
        next("entry", "bash", &argv(&["-c", "/static"])),
        Next::Runs {
            argv: argv(&["/static"]),
            how: " -c \"/static\", which runs".to_owned(),
        }
    );
    for program in ["python3", "torchrun", "mpirun", "static"] {
        assert_eq!(runs_of(program, &["-c", "/static"]), None, "{program}");
    }
}
