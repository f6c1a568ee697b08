//! Finding (and if need be building) the fake `libamd_smi.so`.
//!
//! `cargo test` does not produce the cdylib of another workspace member, so
//! the first caller in a process builds it with the same cargo into a target
//! directory of its own (no contention with the outer build's lock).

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
};

/// The workspace root (the parent of this crate's directory).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// Path of the fake library, built on first use.
///
/// # Panics
/// When cargo cannot build it: every test that needs the library would fail
/// anyway, and the panic says why.
pub fn library() -> &'static Path {
    static LIBRARY: OnceLock<PathBuf> = OnceLock::new();
    LIBRARY.get_or_init(|| build().unwrap_or_else(|err| panic!("fake libamd_smi.so: {err}")))
}

fn build() -> Result<PathBuf, String> {
    let root = workspace_root();
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| root.join("target"), PathBuf::from)
        .join("fake-amdsmi");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(&cargo)
        .current_dir(&root)
        .args(["build", "--quiet", "-p", "fake-amdsmi", "--target-dir"])
        .arg(&target)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", cargo.to_string_lossy()))?;
    if !output.status.success() {
        return Err(format!(
            "cargo build -p fake-amdsmi failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let lib = target.join("debug").join("libamd_smi.so");
    if lib.is_file() {
        Ok(lib)
    } else {
        Err(format!(
            "cargo built fake-amdsmi but {} is missing",
            lib.display()
        ))
    }
}
