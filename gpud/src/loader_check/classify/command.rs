//! What the container runs, from its image config, and the bounds its
//! paths are held to before any of them is resolved (issue 38, F1: an
//! entrypoint of 20,000 components, or a `PATH` of thousands of entries,
//! each walked, kept an inspection busy for minutes).

use crate::loader_check::inspection::CommandBound;

/// `PATH` when the config sets none (what Docker and containerd use).
pub(crate) const DEFAULT_PATH: &str =
    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Bytes of argv0, of `WorkingDir` and of each `PATH` entry: `execve(2)`
/// and `chdir(2)` fail with `ENAMETOOLONG` on a path of `PATH_MAX` (4096)
/// bytes or more, its NUL included, so no longer path can be run or be
/// the working directory.
pub(crate) const MAX_PATH_BYTES: usize = 4095;
/// Components (`/`-separated, empty ones and `.` not counted) of argv0, of
/// `WorkingDir` and of each `PATH` entry. Linux counts none, but the
/// deepest paths of distribution images are about 20 components; 256 is
/// ten times that with room, and keeps one walk short.
pub(crate) const MAX_COMPONENTS: usize = 256;
/// Entries of `PATH`. Docker's default has 6 and images add a few; each
/// entry is one more walk when argv0 has no `/`.
pub(crate) const MAX_PATH_ENTRIES: usize = 64;
/// Bytes of the whole `PATH`: its entries average about 30 bytes in real
/// images; 16 KiB holds [`MAX_PATH_ENTRIES`] entries of 256 bytes.
pub(crate) const MAX_PATH_VAR_BYTES: usize = 16 << 10;

/// Arguments after `argv[0]` kept: the wrappers read (`wrapper`) find their
/// program within the first few; the rest of a long argv is not needed.
pub(crate) const MAX_ARGS_KEPT: usize = 64;

/// What the container runs: its image config, overridden by its pod spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Command {
    /// `argv[0]`: `None` when neither the pod nor the config name a program.
    pub(crate) argv0: Option<String>,
    /// The arguments after it, at most [`MAX_ARGS_KEPT`].
    pub(crate) args: Vec<String>,
    /// Where argv[0] came from, for the evidence: "entrypoint" (the
    /// image's `Entrypoint` or `Cmd`), "the pod's command" or "the pod's
    /// args".
    pub(crate) origin: &'static str,
    pub(crate) working_dir: String,
    pub(crate) path: String,
    /// The pod sets `PATH` from a source the plugin cannot read: a program
    /// without a `/` cannot be found.
    pub(crate) path_unknown: bool,
}

impl Default for Command {
    fn default() -> Self {
        Self {
            argv0: None,
            args: Vec::new(),
            origin: "entrypoint",
            working_dir: "/".to_owned(),
            path: DEFAULT_PATH.to_owned(),
            path_unknown: false,
        }
    }
}

fn components(path: &str) -> usize {
    path.split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .count()
}

/// `path` (the config's `field`) within the bytes and depth bounds.
pub(crate) fn bounded_path(field: &'static str, path: &str) -> Result<(), CommandBound> {
    if path.len() > MAX_PATH_BYTES {
        return Err(CommandBound {
            field,
            unit: "bytes",
            found: path.len(),
            bound: "MAX_PATH_BYTES",
            limit: MAX_PATH_BYTES,
        });
    }
    let depth = components(path);
    if depth > MAX_COMPONENTS {
        return Err(CommandBound {
            field,
            unit: "path components",
            found: depth,
            bound: "MAX_COMPONENTS",
            limit: MAX_COMPONENTS,
        });
    }
    Ok(())
}

impl Command {
    /// This command, if its paths are within the bounds above.
    ///
    /// # Errors
    /// [`CommandBound`] naming the field and the bound it exceeds.
    pub(crate) fn bounded(self) -> Result<Self, CommandBound> {
        if let Some(argv0) = &self.argv0 {
            bounded_path("argv[0]", argv0)?;
        }
        bounded_path("WorkingDir", &self.working_dir)?;
        if self.path.len() > MAX_PATH_VAR_BYTES {
            return Err(CommandBound {
                field: "PATH",
                unit: "bytes",
                found: self.path.len(),
                bound: "MAX_PATH_VAR_BYTES",
                limit: MAX_PATH_VAR_BYTES,
            });
        }
        let entries = self.path.split(':').count();
        if entries > MAX_PATH_ENTRIES {
            return Err(CommandBound {
                field: "PATH",
                unit: "entries",
                found: entries,
                bound: "MAX_PATH_ENTRIES",
                limit: MAX_PATH_ENTRIES,
            });
        }
        for entry in self.path.split(':') {
            bounded_path("PATH entry", entry)?;
        }
        Ok(self)
    }
}
