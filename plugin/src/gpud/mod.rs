//! amd-gpud, as the plugin reaches it over D-Bus (crate `ipc`).
//!
//! * [`bus`]: where amd-gpud is, and why a session with it ended.
//! * [`client`]: the followed inventory ([`client::spawn`]), reconnecting
//!   by itself whenever the bus or amd-gpud goes away.
//! * [`reach`]: why amd-gpud cannot be reached, said once (log and a Node
//!   Event) with the fix.
//! * [`usage`]: what pods and GPUs use (`GetUsage`), kept for `/metrics`.

pub mod bus;
pub mod client;
pub mod reach;
pub mod usage;

pub use bus::{Bus, SessionError, connect};
