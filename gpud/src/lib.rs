//! `amd-gpud`: the privileged half of the AMD GPU sharing stack.
//!
//! It alone touches the hardware and the host. This library holds the whole
//! daemon so tests run it in-process; `main.rs` only parses the command line.
//!
//! Every module is crate-private, so that dead code is flagged: the binary
//! needs [`main`], and what the tests crate drives directly is re-exported
//! by [`testing`].

pub(crate) mod access;
pub(crate) mod amdsmi;
pub(crate) mod cdi;
pub(crate) mod cli;
pub(crate) mod command_line;
pub(crate) mod dbus;
pub(crate) mod deadline;
pub(crate) mod dmem;
pub(crate) mod drm;
pub(crate) mod gfx;
pub(crate) mod health;
pub(crate) mod hostpaths;
pub(crate) mod inspect;
pub(crate) mod inventory;
pub(crate) mod loader_check;
pub(crate) mod partition;
pub(crate) mod pci;
pub(crate) mod published_ids;
pub(crate) mod restore_check;
pub(crate) mod service;
pub(crate) mod state_file;
pub mod testing;
pub(crate) mod topology;
pub(crate) mod usage;

pub use cli::main;
pub use hostpaths::HostPaths;
pub use loader_check::helper::main as loader_check_main;
