//! A release build of `amd-gpud` for benchmarks, in a target directory of its
//! own (the outer cargo may hold the main one's lock).

use std::{io, path::PathBuf, process::Command};

use crate::fake_amdsmi::workspace_root;

/// Builds (if needed) and returns the path of a release `amd-gpud` (and
/// its helper `amd-gpud-loader-check` beside it), or the binary named by
/// `BENCH_AMD_GPUD`.
///
/// # Errors
/// When cargo cannot be run or the build fails.
pub fn amd_gpud() -> io::Result<PathBuf> {
    // A binary built elsewhere (another commit's, to compare in one run).
    if let Some(path) = std::env::var_os("BENCH_AMD_GPUD") {
        return Ok(path.into());
    }
    let ws = workspace_root();
    let target = ws.join("target/bench-gpud");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(&ws)
        .args(["build", "--quiet", "--release", "-p", "gpud", "--bins"])
        .arg("--target-dir")
        .arg(&target)
        .status()?;
    if !status.success() {
        return Err(io::Error::other(format!(
            "building amd-gpud failed: {status}"
        )));
    }
    Ok(target.join("release/amd-gpud"))
}

/// The `Environment=` assignments of the shipped unit
/// (`systemd/amd-gpud.service`, or the unit file `BENCH_UNIT` names: an
/// older commit's, to measure that commit as it shipped), so that a
/// benchmark runs amd-gpud as systemd would (`MALLOC_ARENA_MAX`,
/// `GPUD_LOG`). Each line's space-separated `NAME=VALUE` words; the unit
/// quotes none.
///
/// # Errors
/// The unit cannot be read, or a word is no assignment.
pub fn unit_environment() -> io::Result<Vec<(String, String)>> {
    let unit = std::env::var_os("BENCH_UNIT").map_or_else(
        || workspace_root().join("systemd/amd-gpud.service"),
        PathBuf::from,
    );
    let text = std::fs::read_to_string(&unit)?;
    let mut found = Vec::new();
    for line in text.lines() {
        let Some(words) = line.trim().strip_prefix("Environment=") else {
            continue;
        };
        for word in words.split_whitespace() {
            let (name, value) = word.split_once('=').ok_or_else(|| {
                io::Error::other(format!(
                    "{}: {word:?} in Environment= is no NAME=VALUE",
                    unit.display()
                ))
            })?;
            found.push((name.to_owned(), value.to_owned()));
        }
    }
    Ok(found)
}
