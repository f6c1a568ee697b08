//! Opening cgroup directories and control files relative to a held directory
//! handle, never by a path string from the root of the file system
//! (openat2(2) `RESOLVE_BENEATH`; how the controller's files are laid out:
//! torvalds/linux:Documentation/admin-guide/cgroup-v2.rst, "DMEM").
//!
//! Every open is `openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//! RESOLVE_NO_MAGICLINKS`: a symlink anywhere on the way or a `..` that
//! climbs out fails the open. Each opened directory and file must then be on
//! the same file system (`st_dev`) as the handle it was opened from, else the
//! open fails with `EXDEV`: a foreign file system mounted into the tree is
//! refused. This replaces the `RESOLVE_NO_XDEV` of docs/dmem.md §4.2 R2,
//! which refuses *every* mount crossing, including the bind mounts of the
//! cgroup tree onto itself that systemd makes for `ReadWritePaths=` under
//! `ProtectControlGroups=yes` (systemd/amd-gpud.service): with it,
//! `kubepods.slice` could never be opened under the shipped unit. Control
//! files are opened without `O_CREAT` and `O_TRUNC`, so a wrong path can
//! never make a file appear; writes are one `write(2)` each. Only the files
//! in [`WRITABLE`] can be opened for writing at all.

use std::{
    fs::File,
    io::{self, Read, Write},
    os::fd::{AsFd, BorrowedFd, OwnedFd},
    path::Path,
};

use rustix::fs::{Mode, OFlags, ResolveFlags};

/// The only files ever opened for writing (docs/dmem.md §5.3).
pub const WRITABLE: [&str; 2] = [DMEM_MAX, SUBTREE_CONTROL];
/// The per-cgroup VRAM limit.
pub const DMEM_MAX: &str = "dmem.max";
/// Where `+dmem` enables the controller for a cgroup's children.
pub const SUBTREE_CONTROL: &str = "cgroup.subtree_control";
/// Longest control file read (docs/dmem.md §5.7); `dmem.*` files hold one short line per
/// region, `cgroup.subtree_control` a dozen words.
pub const MAX_READ: u64 = 64 * 1024;

fn resolve() -> ResolveFlags {
    ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS
}

/// `EXDEV` unless `opened` is on the same file system as `from`.
fn same_fs(from: BorrowedFd<'_>, opened: BorrowedFd<'_>) -> io::Result<()> {
    if rustix::fs::fstat(from)?.st_dev == rustix::fs::fstat(opened)?.st_dev {
        Ok(())
    } else {
        Err(rustix::io::Errno::XDEV.into())
    }
}

/// Opens the directory `rel` beneath `dir` as an `O_PATH` handle. An empty
/// `rel` re-opens `dir` itself.
///
/// # Errors
/// The `openat2` error: `ENOENT`, `ELOOP` (a symlink), `EXDEV` (an escape,
/// or another file system), `ENOTDIR`...
pub fn open_dir(dir: BorrowedFd<'_>, rel: &Path) -> io::Result<OwnedFd> {
    let rel = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    // No O_NOFOLLOW: with O_PATH it would return a handle on a trailing
    // symlink instead of failing; RESOLVE_NO_SYMLINKS refuses it with ELOOP.
    let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let fd = rustix::fs::openat2(dir, rel, flags, Mode::empty(), resolve())?;
    same_fs(dir, fd.as_fd())?;
    Ok(fd)
}

/// Opens the directory at an absolute `path` from the process (the cgroup
/// mount; it comes from [`crate::HostPaths`], never from a caller).
///
/// # Errors
/// The `open` error.
pub fn open_root(path: &Path) -> io::Result<OwnedFd> {
    let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
    Ok(rustix::fs::open(path, flags, Mode::empty())?)
}

/// Whether `err` means that a path left the held directory, met a symlink
/// or reached another file system: `ELOOP` from `RESOLVE_NO_SYMLINKS`,
/// `EXDEV` from `RESOLVE_BENEATH` or the file system check.
pub fn is_escape(err: &io::Error) -> bool {
    matches!(
        err.raw_os_error(),
        Some(code) if code == rustix::io::Errno::LOOP.raw_os_error()
            || code == rustix::io::Errno::XDEV.raw_os_error()
    )
}

fn open_file(dir: BorrowedFd<'_>, name: &str, flags: OFlags) -> io::Result<File> {
    if name.contains('/') || name.is_empty() || name == "." || name == ".." {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name:?} is not a file name"),
        ));
    }
    let flags = flags | OFlags::CLOEXEC | OFlags::NOFOLLOW;
    let fd = rustix::fs::openat2(dir, name, flags, Mode::empty(), resolve())?;
    same_fs(dir, fd.as_fd())?;
    Ok(File::from(fd))
}

/// Reads and writes control files of cgroups held open as directory handles.
/// The production implementation is [`Beneath`]; tests substitute fakes that
/// refuse writes or read back something else.
pub trait ControlFiles: Send + Sync {
    /// The content of `name` in `dir`, at most [`MAX_READ`] bytes.
    ///
    /// # Errors
    /// When it cannot be opened or read, or is not UTF-8.
    fn read(&self, dir: BorrowedFd<'_>, name: &str) -> io::Result<String>;

    /// Writes `bytes` to `name` in `dir` with a single `write(2)`.
    ///
    /// # Errors
    /// When `name` is not in [`WRITABLE`], the open fails, the kernel refuses
    /// the write, or the write is short.
    fn write(&self, dir: BorrowedFd<'_>, name: &str, bytes: &[u8]) -> io::Result<()>;
}

/// The real thing: `openat2` beneath the handle, then `read`/`write`.
#[derive(Debug, Default, Clone, Copy)]
pub struct Beneath;

impl ControlFiles for Beneath {
    fn read(&self, dir: BorrowedFd<'_>, name: &str) -> io::Result<String> {
        let file = open_file(dir, name, OFlags::RDONLY)?;
        let mut text = String::new();
        file.take(MAX_READ).read_to_string(&mut text)?;
        Ok(text)
    }

    fn write(&self, dir: BorrowedFd<'_>, name: &str, bytes: &[u8]) -> io::Result<()> {
        if !WRITABLE.contains(&name) {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("{name:?} is not a file amd-gpud writes"),
            ));
        }
        let mut file = open_file(dir, name, OFlags::WRONLY)?;
        loop {
            match file.write(bytes) {
                Ok(n) if n == bytes.len() => return Ok(()),
                Ok(n) => {
                    return Err(io::Error::new(
                        io::ErrorKind::WriteZero,
                        format!("short write: {n} of {} bytes", bytes.len()),
                    ));
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

/// The `st_ino` of a directory handle (the cgroup ID on cgroupfs).
///
/// # Errors
/// The `fstat` error.
pub fn inode(dir: impl AsFd) -> io::Result<u64> {
    Ok(rustix::fs::fstat(dir)?.st_ino)
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::*;

    #[test]
    fn symlinks_and_escapes_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let top = tmp.path().join("top");
        std::fs::create_dir_all(top.join("a/b")).unwrap();
        std::fs::create_dir_all(tmp.path().join("outside")).unwrap();
        std::fs::write(tmp.path().join("outside/dmem.max"), "").unwrap();
        std::os::unix::fs::symlink("../../outside", top.join("a/link")).unwrap();
        std::os::unix::fs::symlink("/", top.join("abs")).unwrap();
        let root = open_root(&top).unwrap();
        assert!(open_dir(root.as_fd(), Path::new("a/b")).is_ok());
        for rel in ["a/link", "abs", "..", "a/../../outside", "/tmp"] {
            let err = open_dir(root.as_fd(), Path::new(rel)).unwrap_err();
            assert!(is_escape(&err), "{rel}: {err}");
        }
        let a = open_dir(root.as_fd(), Path::new("a")).unwrap();
        for name in ["../x", "link", "", ".."] {
            assert!(Beneath.write(a.as_fd(), name, b"x").is_err(), "{name}");
        }
        assert!(
            std::fs::read_to_string(tmp.path().join("outside/dmem.max"))
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn other_file_systems_are_refused() {
        // `/proc` is a mount of another file system below `/`.
        let root = open_root(Path::new("/")).unwrap();
        let err = open_dir(root.as_fd(), Path::new("proc")).unwrap_err();
        assert!(is_escape(&err), "{err}");
        let err = Beneath.read(root.as_fd(), "proc").unwrap_err();
        assert!(is_escape(&err), "{err}");
        let proc = open_root(Path::new("/proc")).unwrap();
        assert!(open_dir(proc.as_fd(), Path::new("self")).is_err());
        assert!(open_dir(proc.as_fd(), Path::new("sys")).is_ok());
    }

    #[test]
    fn writes_only_allowlisted_existing_files_in_one_piece() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("dmem.max"), "").unwrap();
        std::fs::write(tmp.path().join("cgroup.procs"), "").unwrap();
        let dir = open_root(tmp.path()).unwrap();
        Beneath.write(dir.as_fd(), DMEM_MAX, b"r 1\n").unwrap();
        assert_eq!(Beneath.read(dir.as_fd(), DMEM_MAX).unwrap(), "r 1\n");
        let err = Beneath
            .write(dir.as_fd(), "cgroup.procs", b"1")
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied);
        let err = Beneath
            .write(dir.as_fd(), SUBTREE_CONTROL, b"+dmem")
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound, "never created");
        assert!(!tmp.path().join(SUBTREE_CONTROL).exists());
        assert_eq!(
            std::fs::read_to_string(tmp.path().join("cgroup.procs")).unwrap(),
            ""
        );
    }
}
