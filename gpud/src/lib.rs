//! `amd-gpud`: the privileged half of the AMD GPU sharing stack.
//!
//! It alone touches the hardware and the host. This library holds the whole
//! daemon so tests run it in-process; `main.rs` only parses the command line.
//!
//! Modules are crate-private unless the binary, the tests crate, the fuzz
//! targets or a bench reaches into them, so that dead code is flagged.

pub(crate) mod access;
pub mod amdsmi;
pub(crate) mod cdi;
pub mod cli;
pub(crate) mod dbus;
pub(crate) mod deadline;
pub mod dmem;
pub(crate) mod drm;
pub(crate) mod gfx;
pub(crate) mod health;
pub(crate) mod hostpaths;
pub mod inspect;
pub mod inventory;
pub mod loader_check;
pub mod partition;
pub(crate) mod pci;
pub(crate) mod published_ids;
pub mod restore_check;
pub(crate) mod service;
pub mod topology;
pub mod usage;

pub use hostpaths::HostPaths;
