//! amd-gpud, as the plugin reaches it over D-Bus (crate `ipc`).
//!
//! * [`bus`]: where amd-gpud is, and why a session with it ended.
//! * [`client`]: the followed inventory ([`client::spawn`]), reconnecting
//!   by itself whenever the bus or amd-gpud goes away.
//! * [`reach`]: why amd-gpud cannot be reached, said once (log and a Node
//!   Event) with the fix.
//! * [`usage`]: what pods and GPUs use (`GetUsage`), kept for `/metrics`.

pub(crate) mod bus;
pub(crate) mod client;
pub(crate) mod reach;
pub(crate) mod usage;

pub(crate) use bus::{Bus, SessionError, connect, node_proxy};
