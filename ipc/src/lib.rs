//! The D-Bus contract between `amd-gpud` and `amd-device-plugin`.
//!
//! This crate depends on nothing else in the workspace: the names both sides
//! agree on ([`names`]), the types that cross the bus ([`types`], the GPU and
//! partition properties each declared once in a table, [`table`]), the typed
//! error every method returns ([`Error`]), the client proxies the plugin
//! uses ([`proxy`]), and typed views of the readable strings some properties
//! carry: health, partition modes, the VRAM cap backend ([`values`]). `ipc/interface.xml` is the introspection of every
//! interface; a test in `tests/` fails when what the daemon serves differs.

#![deny(unsafe_code)]

pub mod error;
pub mod names;
pub mod proxy;
pub mod report;
pub mod table;
pub mod types;
pub mod usage;
pub mod values;

pub use error::ApiError;
pub use names::*;
pub use values::{ComputeMode, DmemBackend, Health, MemoryMode};
