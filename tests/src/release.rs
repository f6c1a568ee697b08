//! A release build of `amd-gpud` for benchmarks, in a target directory of its
//! own (the outer cargo may hold the main one's lock).

use std::{io, path::PathBuf, process::Command};

use crate::fake_amdsmi::workspace_root;

/// Builds (if needed) and returns the path of a release `amd-gpud`.
///
/// # Errors
/// When cargo cannot be run or the build fails.
pub fn amd_gpud() -> io::Result<PathBuf> {
    let ws = workspace_root();
    let target = ws.join("target/bench-gpud");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(&ws)
        .args([
            "build",
            "--quiet",
            "--release",
            "-p",
            "gpud",
            "--bin",
            "amd-gpud",
        ])
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
