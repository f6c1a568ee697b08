//! How the node's GPUs are offered, and changing it while the plugin runs.
//!
//! * [`switch`]: `COMPUTE_PARTITION=<mode>`, every idle GPU switched at
//!   start through amd-gpud, and the start-up operating mode.
//! * [`follow`]: the node annotation `hami.io/amd-operating-mode` followed,
//!   changing mode once no container holds an AMD device.
//! * [`compute`]: the node annotation `hami.io/amd-compute-partition`
//!   (else `COMPUTE_PARTITION`) followed, switching idle GPUs.
//!
//! The view of the inventory in each mode is
//! [`inventory::partition`](crate::inventory::partition).

pub(crate) mod compute;
pub(crate) mod follow;
pub(crate) mod switch;
