//! ELF files compiled at test time with the host's `cc`.

use std::{fmt::Write as _, fs, path::Path, process::Command};

use super::{ImageError, io_error};

/// The version nodes glibc 2.33's `libc.so.6` defines on x86-64, oldest
/// first (glibc 2.19 to 2.21 added no symbols there, so have no node).
pub const OLD_GLIBC_VERSIONS: &[&str] = &[
    "2.2.5", "2.2.6", "2.3", "2.3.2", "2.3.3", "2.3.4", "2.4", "2.5", "2.6", "2.7", "2.8", "2.9",
    "2.10", "2.11", "2.12", "2.13", "2.14", "2.15", "2.16", "2.17", "2.18", "2.22", "2.23", "2.24",
    "2.25", "2.26", "2.27", "2.28", "2.29", "2.30", "2.31", "2.32", "2.33",
];

/// A `_start` that calls `exit(0)` directly: no libc needed.
const START_C: &str = r#"void _start(void) {
  __asm__ volatile("mov $60, %eax\n xor %edi, %edi\n syscall");
  for (;;) {}
}
"#;

/// Runs `cc args...` in `dir`.
fn cc(dir: &Path, args: &[&str]) -> Result<(), ImageError> {
    let command = format!("cc {}", args.join(" "));
    let output = Command::new("cc")
        .args(args)
        .current_dir(dir)
        .output()
        .map_err(|e| ImageError::Tool {
            command: command.clone(),
            why: format!("{e} (install Debian's gcc)"),
        })?;
    if !output.status.success() {
        let why = format!(
            "{}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
        return Err(ImageError::Tool { command, why });
    }
    Ok(())
}

/// A program whose ELF interpreter is musl's loader.
///
/// # Errors
/// `cc` fails or its output cannot be read.
pub fn musl_app(cache: &Path) -> Result<Vec<u8>, ImageError> {
    let dir = cache.join("musl-app");
    fs::create_dir_all(&dir).map_err(io_error("creating", &dir))?;
    let source = dir.join("start.c");
    fs::write(&source, START_C).map_err(io_error("writing", &source))?;
    cc(
        &dir,
        &[
            "-nostdlib",
            "-fno-stack-protector",
            "-Wl,--dynamic-linker=/lib/ld-musl-x86_64.so.1",
            "-o",
            "app",
            "start.c",
        ],
    )?;
    let app = dir.join("app");
    fs::read(&app).map_err(io_error("reading", &app))
}

/// A `libc.so.6` (soname too) defining [`OLD_GLIBC_VERSIONS`] as a chain of
/// version nodes, each with one dummy function, plus `GLIBC_PRIVATE`.
///
/// # Errors
/// `cc` fails or its output cannot be read.
pub fn old_libc(cache: &Path) -> Result<Vec<u8>, ImageError> {
    let dir = cache.join("old-libc");
    fs::create_dir_all(&dir).map_err(io_error("creating", &dir))?;
    let mut map = String::new();
    let mut source = String::new();
    let mut previous: Option<&str> = None;
    let nodes = OLD_GLIBC_VERSIONS
        .iter()
        .map(|v| (format!("GLIBC_{v}"), v.replace('.', "_")));
    let nodes: Vec<_> = nodes
        .chain([("GLIBC_PRIVATE".into(), "private".into())])
        .collect();
    for (node, suffix) in &nodes {
        let function = format!("hami_glibc_{suffix}");
        let _ = writeln!(source, "int {function}(void) {{ return 0; }}");
        let _ = match previous {
            None => writeln!(map, "{node} {{ global: {function}; local: *; }};"),
            Some(prev) => writeln!(map, "{node} {{ global: {function}; }} {prev};"),
        };
        previous = Some(node);
    }
    let map_path = dir.join("v.map");
    fs::write(&map_path, map).map_err(io_error("writing", &map_path))?;
    let source_path = dir.join("libc.c");
    fs::write(&source_path, source).map_err(io_error("writing", &source_path))?;
    cc(
        &dir,
        &[
            "-shared",
            "-fPIC",
            "-nostdlib",
            "-Wl,--version-script=v.map",
            "-Wl,-soname,libc.so.6",
            "-o",
            "libc.so.6",
            "libc.c",
        ],
    )?;
    let libc = dir.join("libc.so.6");
    fs::read(&libc).map_err(io_error("reading", &libc))
}
