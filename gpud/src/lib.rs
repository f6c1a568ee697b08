//! `amd-gpud`: the privileged half of the AMD GPU sharing stack.
//!
//! It alone touches the hardware and the host. This library holds the whole
//! daemon so tests run it in-process; `main.rs` only parses the command line.

pub mod access;
pub mod amdsmi;
pub mod cdi;
pub mod cli;
pub mod dbus;
pub mod deadline;
pub mod dmem;
pub mod drm;
pub mod gfx;
pub mod health;
pub mod hostpaths;
pub mod inspect;
pub mod inventory;
pub mod loader_check;
pub mod partition;
pub mod pci;
pub mod published_ids;
pub mod restore_check;
pub mod service;
pub mod topology;
pub mod usage;

pub use hostpaths::HostPaths;
