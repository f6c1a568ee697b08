//! Files amd-gpud owns and rewrites whole (the CDI spec, the published IDs):
//! read back without following a symlink, only when they are regular files
//! and within a size bound; replaced through an exclusively created
//! temporary file of a random name in the same directory, synced and
//! renamed over the old one.
//!
//! Someone who can plant a name in one of these directories must not be
//! able to make root read for ever (a link to `/dev/zero`, a FIFO), run out
//! of memory (a huge file) or write through a link to another file (a
//! temporary file of a predictable name). A failed replacement leaves the
//! old file and no temporary one behind.

use std::{
    fs,
    io::{self, Read, Write},
    os::unix::fs::{OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
};

/// Why a state file could not be read or replaced.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FileError {
    #[error("{path} is a symbolic link; refused (amd-gpud writes only plain files there)")]
    Symlink { path: PathBuf },
    #[error("{path} is not a regular file (a FIFO, device or directory?); refused")]
    NotRegular { path: PathBuf },
    #[error("{path} holds more than the {limit} bytes accepted; refused")]
    TooLarge { path: PathBuf, limit: u64 },
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// The contents of `path`, at most `limit` bytes; `None` when it does not
/// exist.
///
/// # Errors
/// [`FileError`]: a symlink, anything but a regular file (refused before a
/// byte is read: a FIFO is opened without blocking), more than `limit`
/// bytes, or a failed read.
pub(crate) fn read_bounded(path: &Path, limit: u64) -> Result<Option<Vec<u8>>, FileError> {
    let read_error = |source| FileError::Read {
        path: path.to_owned(),
        source,
    };
    crate::deadline::reading(path);
    // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a
    // writer; it changes nothing for a regular file.
    let opened = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path);
    let file = match opened {
        Ok(file) => file,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(err) if err.raw_os_error() == Some(libc::ELOOP) => {
            return Err(FileError::Symlink {
                path: path.to_owned(),
            });
        }
        Err(err) => return Err(read_error(err)),
    };
    let meta = file.metadata().map_err(read_error)?;
    if !meta.file_type().is_file() {
        return Err(FileError::NotRegular {
            path: path.to_owned(),
        });
    }
    let too_large = || FileError::TooLarge {
        path: path.to_owned(),
        limit,
    };
    if meta.len() > limit {
        return Err(too_large());
    }
    // The file may grow between the stat and the read: read one byte more
    // than the bound to see it.
    let mut bytes = Vec::new();
    file.take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(read_error)?;
    if u64::try_from(bytes.len()).map_or(true, |n| n > limit) {
        return Err(too_large());
    }
    Ok(Some(bytes))
}

/// Replaces `path` with `bytes` (mode `mode`, less the umask), whole or not
/// at all: see [`replace_with`].
///
/// # Errors
/// [`FileError::Write`] naming `path`.
pub(crate) fn replace(path: &Path, bytes: &[u8], mode: u32) -> Result<(), FileError> {
    replace_with(path, mode, |file| file.write_all(bytes))
}

/// Replaces `path` with what `fill` writes into a new file (mode `mode`,
/// less the umask), whole or not at all: an exclusively created temporary
/// file of a random name beside it (`O_CREAT|O_EXCL`, so no planted link
/// is followed), synced, renamed over `path`, and the directory synced.
/// The directory is created when missing. On any failure the temporary
/// file is removed.
///
/// # Errors
/// [`FileError::Write`] naming `path`, also when `fill` fails.
pub(crate) fn replace_with(
    path: &Path,
    mode: u32,
    fill: impl FnOnce(&mut fs::File) -> io::Result<()>,
) -> Result<(), FileError> {
    let fail = |source| FileError::Write {
        path: path.to_owned(),
        source,
    };
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(fail(io::Error::new(
            io::ErrorKind::InvalidInput,
            "no directory or file name",
        )));
    };
    fs::create_dir_all(dir).map_err(fail)?;
    let mut prefix = std::ffi::OsString::from(".");
    prefix.push(name);
    prefix.push(".");
    // Dropped (and so removed) on every early return below.
    let mut temp = tempfile::Builder::new()
        .prefix(&prefix)
        .suffix(".tmp")
        .permissions(fs::Permissions::from_mode(mode))
        .tempfile_in(dir)
        .map_err(fail)?;
    fill(temp.as_file_mut()).map_err(fail)?;
    temp.as_file().sync_all().map_err(fail)?;
    temp.persist(path).map_err(|err| fail(err.error))?;
    fs::File::open(dir).and_then(|d| d.sync_all()).map_err(fail)
}

#[cfg(test)]
pub(crate) mod tests;
