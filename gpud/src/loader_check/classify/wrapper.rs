//! Programs whose only job is to start another one (issue 38, F8): a shell
//! given `-c`, `env`, `tini`, `dumb-init`, `nice` and the like. Judging the
//! wrapper would judge the wrong program: `sh -c /static` or `tini --
//! /static` runs a static binary under a glibc shell or init. So the
//! program they start is judged instead, read from their arguments the way
//! each parses its own options; a shell's command line is read only when it
//! is one plain command (words, `NAME=value` prefixes, `exec`): anything
//! the shell would have to interpret (`;`, `&&`, `|`, quotes, `$`,
//! globs, ...) may start programs that cannot be told without running it.
//!
//! Pure: strings in, the next argv out. A script's content is not read
//! here: a `#!` script is judged by its interpreter (`classify::follow`).

/// What a program given `args` goes on to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Next {
    /// Nothing else, or nothing known: the program itself is judged.
    Itself,
    /// Another program: its argv (`argv[0]` first), and the words that
    /// join the wrapper's evidence to the program's.
    Runs { argv: Vec<String>, how: String },
    /// Something that cannot be told without running it, and why.
    Unknowable(String),
}

/// How a wrapper's options are read (getopt-style): short option letters
/// and long option names that take a value, and how many positional
/// arguments come before the program.
struct Syntax {
    short_with_value: &'static str,
    long_with_value: &'static [&'static str],
    positionals: usize,
}

const SHELLS: &[&str] = &[
    "sh", "bash", "dash", "ash", "ksh", "mksh", "zsh", "hush", "rbash",
];

/// The wrappers read here, by the name they are run as: each
/// `getopt_long` option table as its manual page gives it.
fn syntax(name: &str) -> Option<Syntax> {
    let syntax = |short_with_value, long_with_value, positionals| Syntax {
        short_with_value,
        long_with_value,
        positionals,
    };
    Some(match name {
        "tini" | "tini-static" | "docker-init" => syntax("ep", &[], 0),
        "dumb-init" => syntax("r", &["rewrite"], 0),
        "nohup" | "setsid" => syntax("", &[], 0),
        "nice" => syntax("n", &["adjustment"], 0),
        "timeout" => syntax("ks", &["kill-after", "signal"], 1),
        "stdbuf" => syntax("ioe", &["input", "output", "error"], 0),
        "taskset" => syntax("", &[], 1),
        "numactl" => syntax(
            "imNCpPwb",
            &[
                "interleave",
                "membind",
                "cpunodebind",
                "physcpubind",
                "preferred",
                "preferred-many",
                "weighted-interleave",
                "balancing",
            ],
            0,
        ),
        _ => return None,
    })
}

/// What the program `invoked` (the name argv[0] gave it; busybox picks its
/// applet by it), found at a path whose last component is `real`, runs when
/// given `args`.
pub(crate) fn next(invoked: &str, real: &str, args: &[String]) -> Next {
    let name = if known(invoked) || real == "busybox" {
        invoked
    } else {
        real
    };
    by_name(name, args)
}

fn known(name: &str) -> bool {
    SHELLS.contains(&name) || name == "env" || name == "busybox" || syntax(name).is_some()
}

fn by_name(name: &str, args: &[String]) -> Next {
    if name == "busybox" {
        // `busybox APPLET ARGS...`
        return match args.split_first() {
            Some((applet, rest)) if applet != "busybox" => by_name(applet, rest),
            _ => Next::Itself,
        };
    }
    if SHELLS.contains(&name) {
        return shell(name, args);
    }
    if name == "env" {
        return env(args);
    }
    match syntax(name) {
        Some(syntax) => wrapped(&syntax, args),
        None => Next::Itself,
    }
}

/// The program after a wrapper's options and positionals.
fn wrapped(syntax: &Syntax, args: &[String]) -> Next {
    let mut rest = args.iter().map(String::as_str).enumerate();
    let mut positionals = syntax.positionals;
    while let Some((i, arg)) = rest.next() {
        if arg == "--" {
            return runs(args.get(i + 1..).unwrap_or_default());
        }
        if let Some(long) = arg.strip_prefix("--") {
            if !long.contains('=') && syntax.long_with_value.contains(&long) {
                rest.next();
            }
        } else if let Some(cluster) = arg.strip_prefix('-').filter(|c| !c.is_empty()) {
            if takes_value(cluster, syntax.short_with_value) {
                rest.next();
            }
        } else if positionals > 0 {
            positionals -= 1;
        } else {
            return runs(&args[i..]);
        }
    }
    Next::Itself
}

/// Whether the short-option cluster `cluster` ends in an option that takes
/// its value from the next argument (`-n 5`, not `-n5`).
fn takes_value(cluster: &str, with_value: &str) -> bool {
    let mut letters = cluster.chars();
    while let Some(c) = letters.next() {
        if with_value.contains(c) {
            return letters.as_str().is_empty();
        }
    }
    false
}

fn runs(argv: &[String]) -> Next {
    if argv.is_empty() {
        return Next::Itself;
    }
    Next::Runs {
        argv: argv.to_vec(),
        how: ", which runs".to_owned(),
    }
}

/// `env [OPTION]... [NAME=VALUE]... [COMMAND [ARG]...]` (GNU coreutils and
/// busybox).
fn env(args: &[String]) -> Next {
    let syntax = Syntax {
        short_with_value: "uCaS",
        long_with_value: &["unset", "chdir", "argv0", "split-string"],
        positionals: 0,
    };
    let splits = |a: &String| {
        a == "--split-string"
            || a.starts_with("--split-string=")
            || (a.starts_with('-') && !a.starts_with("--") && a.contains('S'))
    };
    if let Some(a) = args
        .iter()
        .take_while(|a| a.starts_with('-'))
        .find(|a| splits(a))
    {
        return Next::Unknowable(format!(
            "env {a} splits a string into the command line, which is not read"
        ));
    }
    match wrapped(&syntax, args) {
        Next::Runs { argv, .. } => {
            let program = argv.iter().position(|a| !is_assignment(a));
            match program {
                Some(at) => runs(&argv[at..]),
                None => Next::Itself,
            }
        }
        other => other,
    }
}

fn is_assignment(word: &str) -> bool {
    match word.split_once('=') {
        Some((name, _)) => {
            let mut chars = name.chars();
            chars
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        }
        None => false,
    }
}

/// A shell: with `-c` (alone or in a cluster such as `-ec`, `-lc`), the
/// first operand is a command line, read when it is one plain command;
/// without, the operand is a script (judged as the shell running it) or
/// there is none (it reads standard input).
fn shell(name: &str, args: &[String]) -> Next {
    let mut command_mode = false;
    let mut i = 0;
    while let Some(arg) = args.get(i) {
        i += 1;
        if arg == "--" || arg == "-" {
            break;
        }
        if let Some(long) = arg.strip_prefix("--") {
            if ["rcfile", "init-file"].contains(&long) {
                i += 1;
            }
            continue;
        }
        let Some(cluster) = arg.strip_prefix(['-', '+']).filter(|c| !c.is_empty()) else {
            i -= 1;
            break;
        };
        command_mode |= arg.starts_with('-') && cluster.contains('c');
        // -o OPTION, +o OPTION, bash's -O/+O SHOPT: the value is the next argument.
        if cluster.contains(['o', 'O']) {
            i += 1;
        }
    }
    if !command_mode {
        return Next::Itself;
    }
    let Some(line) = args.get(i) else {
        return Next::Unknowable(format!("{name} -c without a command line"));
    };
    match plain_command(line) {
        Ok(argv) if argv.is_empty() => Next::Itself,
        Ok(argv) => Next::Runs {
            argv,
            how: format!(" -c {:?}, which runs", excerpt(line)),
        },
        Err(why) => Next::Unknowable(format!(
            "{name} -c {:?}: {why}, so the programs it runs cannot be told without running it",
            excerpt(line)
        )),
    }
}

/// Characters a shell interprets: separators, redirections, expansions,
/// quoting, globs, comments, groups.
const SHELL_SYNTAX: &[char] = &[
    ';', '&', '|', '<', '>', '(', ')', '$', '`', '\\', '"', '\'', '*', '?', '[', ']', '#', '~',
    '{', '}', '!', '\n', '\r',
];

/// The argv of `line` if it is one plain command: words split on blanks,
/// leading `NAME=value` assignments and one `exec` dropped.
fn plain_command(line: &str) -> Result<Vec<String>, String> {
    if let Some(c) = line.chars().find(|c| SHELL_SYNTAX.contains(c)) {
        return Err(format!("it holds {c:?}, which the shell interprets"));
    }
    let mut words = line.split([' ', '\t']).filter(|w| !w.is_empty()).peekable();
    while words.next_if(|w| is_assignment(w)).is_some() {}
    words.next_if_eq(&"exec");
    Ok(words.map(str::to_owned).collect())
}

/// The first 80 characters of `line`.
fn excerpt(line: &str) -> String {
    line.chars().take(80).collect()
}

#[cfg(test)]
mod tests;
