//! What the workspace's tests and benches (`tests/`, `plugin/benches/`)
//! drive directly, re-exported under the names of the modules it lives in.
//! Every module of the crate is crate-private, so the compiler flags what
//! neither the plugin nor this list uses.

/// The inventory as followed from amd-gpud, and kubelet's device table.
pub mod inventory {
    pub use crate::inventory::{DeviceTable, Snapshot};
}

/// The metrics the plugin serves.
pub mod metrics {
    pub use crate::metrics::{Metrics, Usage};

    /// HAMi's series.
    pub mod hami {
        pub use crate::metrics::hami::{HAMI_SERIES, HAMI_UNFILLED, Inputs};
    }
}

/// GetPreferredAllocation's search.
pub mod preferred {
    pub use crate::preferred::{
        GpuTopology, Link, LinkKind, Policy, parse_slot, preferred, slot_id,
    };
}

/// The landlock sandbox.
pub mod sandbox {
    pub use crate::sandbox::{Enforcement, probe};
}
