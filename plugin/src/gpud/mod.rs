//! amd-gpud, as the plugin reaches it over D-Bus (crate `ipc`).
//!
//! * [`client`]: the followed inventory ([`client::spawn`]), reconnecting
//!   by itself whenever the bus or amd-gpud goes away.
//! * [`reach`]: why amd-gpud cannot be reached, said once (log and a Node
//!   Event) with the fix.
//! * [`usage`]: what pods and GPUs use (`GetUsage`), kept for `/metrics`.

pub mod client;
pub mod reach;
pub mod usage;
