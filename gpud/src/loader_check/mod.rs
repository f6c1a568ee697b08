//! What an image's dynamic loader will do with the `LD_AUDIT` memory hook
//! (`dp.muslFailClosed`, docs/loader-check.md).
//!
//! The hook (`libamvgpu.so`) is loaded through `LD_AUDIT`, which only glibc
//! 2.34 or newer honours for it: musl's loader ignores `LD_AUDIT`, a static
//! binary runs no loader, and an older glibc fails to load the hook. Before a
//! sliced container starts, amd-gpud has its image read from the container
//! runtime's content store ([`ImageSource`], containerd's in production) and
//! parsed ([`fetch`]: the processes of the helper binary, [`helper`]) and
//! says which loader the entrypoint runs under ([`Loader`]); the plugin then
//! gives the container the hook, no hook, or a refusal.
//!
//! The analysis is pure: it reads blobs through [`ImageSource`] and never
//! touches a host path, so an image's symlinks cannot lead it anywhere.

pub mod analyze;
pub mod checker;
mod classify;
pub mod config;
pub mod containerd;
pub(crate) mod elf;
pub mod fetch;
pub mod helper;
mod inspection;
mod layers;
mod oci;
pub mod reference;
pub mod run;
pub mod sandbox;
pub mod source;
pub mod stage;
#[cfg(test)]
mod testelf;
#[cfg(test)]
mod testimage;
mod zstd;

pub use source::{Descriptor, ImageSource, SourceError};

/// The loader an image's entrypoint runs under.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Loader {
    /// glibc's `ld-linux*.so`, with the newest `GLIBC_x.y` version that the
    /// image's `libc.so.6` defines (from its ELF version definitions).
    Glibc { major: u32, minor: u32 },
    /// musl's `ld-musl-*.so.1`.
    Musl,
    /// A static binary, or an image with no loader at all.
    Static,
    /// Could not be told; `why` says what was missing or unreadable.
    Unknown { why: String },
}

/// What the inspection of one image found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// The digest of the image's target (manifest or index): the cache key.
    pub digest: String,
    pub loader: Loader,
    /// How it was decided, for Events and logs: e.g. "entrypoint
    /// /usr/bin/python3 -> interpreter /lib64/ld-linux-x86-64.so.2;
    /// /lib/x86_64-linux-gnu/libc.so.6 defines GLIBC_2.36".
    pub evidence: String,
}
