//! Finding (and if need be building) the fake `libamd_smi.so`.
//!
//! `cargo test` does not produce the cdylib of another workspace member, so
//! the first caller in a process builds it with the same cargo into a target
//! directory of its own (no contention with the outer build's lock).

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::Mutex,
};

/// The workspace root (the parent of this crate's directory).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// Path of the fake library that exports every symbol (6.4 and later).
///
/// # Panics
/// When cargo cannot build it: every test that needs the library would fail
/// anyway, and the panic says why.
pub fn library() -> &'static Path {
    library_for("7.0")
}

/// Path of the fake library whose export table matches release `abi`
/// (`"6.2"`, `"6.3"`, or anything later), built on first use.
///
/// # Panics
/// As [`library`].
pub fn library_for(abi: &str) -> &'static Path {
    try_library_for(abi).unwrap_or_else(|err| panic!("{err}"))
}

/// As [`library_for`], with why the build failed instead of a panic.
///
/// # Errors
/// When cargo cannot be run or the build fails (the message says which).
pub fn try_library_for(abi: &str) -> Result<&'static Path, String> {
    static BUILDS: Mutex<Vec<(&'static str, &'static Path)>> = Mutex::new(Vec::new());
    let symbols = match abi {
        "6.2" => "abi-6-2",
        "6.3" => "abi-6-3",
        _ => "all",
    };
    let mut builds = BUILDS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((_, path)) = builds.iter().find(|(s, _)| *s == symbols) {
        return Ok(path);
    }
    let path = build(symbols).map_err(|err| format!("fake libamd_smi.so ({symbols}): {err}"))?;
    let path: &'static Path = Box::leak(path.into_boxed_path());
    builds.push((symbols, path));
    Ok(path)
}

/// The ABI named by a fake-library fixture file (`"abi"`), if readable.
pub fn fixture_abi(fixture: &Path) -> Option<String> {
    let text = std::fs::read_to_string(fixture).ok()?;
    let value: serde_json::Value = serde_json::from_str(&text).ok()?;
    value["abi"].as_str().map(str::to_owned)
}

fn build(symbols: &str) -> Result<PathBuf, String> {
    let root = workspace_root();
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| root.join("target"), PathBuf::from)
        .join("fake-amdsmi");
    // Test binaries run at once (tests/run), each building the sets it
    // needs: one at a time, so that another's build of a different set
    // does not replace `debug/libamd_smi.so` between this build and its
    // copy below.
    std::fs::create_dir_all(&target).map_err(|e| format!("creating {}: {e}", target.display()))?;
    let lock_path = target.join("build.lock");
    let lock = std::fs::File::create(&lock_path)
        .and_then(|file| file.lock().map(|()| file))
        .map_err(|e| format!("locking {}: {e}", lock_path.display()))?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(&cargo);
    command
        .current_dir(&root)
        .args(["build", "--quiet", "-p", "fake-amdsmi", "--target-dir"])
        .arg(&target);
    if symbols != "all" {
        command.args(["--features", symbols]);
    }
    let output = command
        .output()
        .map_err(|e| format!("cannot run {}: {e}", cargo.to_string_lossy()))?;
    if !output.status.success() {
        return Err(format!(
            "cargo build -p fake-amdsmi failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    // Each feature set is uplifted to the same file name: keep a copy per
    // set, put in place by a rename, since another test's probe may have
    // the last copy mapped (written over in place, it died of SIGSEGV).
    let built = target.join("debug").join("libamd_smi.so");
    let kept = target.join(format!("libamd_smi-{symbols}.so"));
    let fresh = target.join(format!("libamd_smi-{symbols}.so.{}", std::process::id()));
    std::fs::copy(&built, &fresh).map_err(|e| format!("copying {}: {e}", built.display()))?;
    std::fs::rename(&fresh, &kept).map_err(|e| format!("renaming {}: {e}", fresh.display()))?;
    drop(lock);
    Ok(kept)
}
