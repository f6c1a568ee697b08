//! tonic over Unix domain sockets, the only transport kubelet uses for the
//! device-plugin and pod-resources APIs.
//!
//! * [`channel`] dials a socket as a tonic [`Channel`] (client side: the
//!   plugin calling kubelet's `Registration` or `PodResourcesLister`).
//! * [`bind_fresh`] + [`incoming`] feed a socket to
//!   `Server::serve_with_incoming` (server side: the plugin's `DevicePlugin`).

use std::{
    fs, io,
    os::unix::fs::FileTypeExt,
    path::{Path, PathBuf},
};

use hyper_util::rt::TokioIo;
use tokio::net::{UnixListener, UnixStream};
use tokio_stream::{Stream, wrappers::UnixListenerStream};
use tonic::transport::{Channel, Endpoint, Uri};

/// Size of `sockaddr_un.sun_path` on Linux. A socket path must be shorter,
/// leaving room for the terminating NUL.
pub const SUN_PATH_LEN: usize = 108;

/// Connects to the gRPC server listening on the Unix socket at `path`.
///
/// The HTTP/2 `:authority` is `localhost`, which kubelet's own client also
/// sends (kubelet >= 1.26) and which tonic servers accept.
///
/// # Errors
/// When the socket cannot be connected to or the HTTP/2 handshake fails.
pub async fn channel(path: &Path) -> Result<Channel, tonic::transport::Error> {
    let path: PathBuf = path.to_owned();
    Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { UnixStream::connect(path).await.map(TokioIo::new) }
        }))
        .await
}

/// Turns a bound listener into the connection stream
/// `tonic::transport::Server::serve_with_incoming` takes.
pub fn incoming(
    listener: UnixListener,
) -> impl Stream<Item = io::Result<UnixStream>> + Send + Unpin + 'static {
    UnixListenerStream::new(listener)
}

/// Checks that `path` fits `sun_path` ([`SUN_PATH_LEN`] bytes with the NUL).
///
/// # Errors
/// `InvalidInput`, naming the path and its length, when it is too long.
pub fn check_socket_path(path: &Path) -> io::Result<()> {
    let len = path.as_os_str().len();
    if len >= SUN_PATH_LEN {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "socket path {} is {len} bytes; a Unix socket path must be shorter than \
                 {SUN_PATH_LEN} bytes (sun_path)",
                path.display()
            ),
        ));
    }
    Ok(())
}

/// Binds a listener at `path`, first unlinking a stale socket left there
/// (by an earlier run of the plugin, say).
///
/// Only a socket is removed: a regular file, directory, symlink or anything
/// else at `path` is left alone and is an error. Must be called inside a
/// tokio runtime.
///
/// # Errors
/// The path is too long ([`check_socket_path`]), something other than a
/// socket is in the way, or unlinking or binding fails. Every error names
/// the path.
pub fn bind_fresh(path: &Path) -> io::Result<UnixListener> {
    check_socket_path(path)?;
    let with_path = |what: &str, err: io::Error| {
        io::Error::new(err.kind(), format!("{what} {}: {err}", path.display()))
    };
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            remove_stale_socket(path).map_err(|e| with_path("removing stale socket", e))?;
        }
        Ok(meta) => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!(
                    "refusing to replace {}: it is a {}, not a socket",
                    path.display(),
                    kind_name(meta.file_type())
                ),
            ));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(with_path("inspecting", e)),
    }
    UnixListener::bind(path).map_err(|e| with_path("binding socket", e))
}

/// Unlinks a stale socket; one already gone is what was wanted. Kubelet
/// removes every socket in its directory as it starts, and it can do so
/// between our look at the path and the unlink: that must not fail the
/// bind (the plugin then stopped re-registering after a kubelet restart).
fn remove_stale_socket(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// Human name of a non-socket file type, for errors.
fn kind_name(file_type: fs::FileType) -> &'static str {
    if file_type.is_dir() {
        "directory"
    } else if file_type.is_file() {
        "regular file"
    } else if file_type.is_symlink() {
        "symlink"
    } else {
        "special file"
    }
}

#[cfg(test)]
mod tests;
