//! The pieces of the daemon that the workspace's tests, benches and
//! simulator (`tests/`) and the fuzz targets (`gpud/fuzz/`) drive directly,
//! re-exported under the names of the modules they live in. Every module of the crate is crate-private, so the
//! compiler flags what neither the daemon nor this list uses.

/// AMD SMI through its child process.
pub mod amdsmi {
    pub use crate::amdsmi::{
        AmdSmiConfig, AmdSmiError, LibrarySource, PROBE_SUBCOMMAND, gpu_usage, probe,
    };

    /// What the child reports.
    pub mod report {
        pub use crate::amdsmi::report::{AmdSmiReport, GpuUsage};
    }
}

/// The command line, for the simulator's `inspect`.
pub mod cli {
    pub use crate::cli::{Cli, Command, inventory_with};
}

/// The dmem controller: its validators and the pod cgroup resolver.
pub mod dmem {
    pub use crate::dmem::{beneath, region, resolve, uid};

    /// Where pod cgroups are.
    pub mod layout {
        pub use crate::dmem::layout::{Driver, Layout, Qos};
    }
}

/// `amd-gpud inspect`'s renderings.
pub mod inspect {
    pub use crate::inspect::{write_json, write_table};
}

/// The inventory.
pub mod inventory {
    pub use crate::inventory::{Inventory, RestoreProps, discover};
}

/// The loader check's image sources and parsers.
pub mod loader_check {
    pub use crate::loader_check::{
        Descriptor, ImageSource, SourceError, fetch::FETCH_SUBCOMMAND, sandbox::INSPECT_SUBCOMMAND,
    };

    /// The ELF, script and layer parsers.
    pub mod analyze {
        pub use crate::loader_check::{
            analyze::read_layer_for_fuzz,
            elf::{Interp, elf_summary, glibc_versions, shebang},
        };
    }

    /// containerd as an image source.
    pub mod containerd {
        pub use crate::loader_check::containerd::ContainerdSource;
    }
}

/// Compute partitions.
pub mod partition {
    pub use crate::partition::profiles;
}

/// The CRIU restore check, and CRIU's checkpoint images.
pub mod restore_check {
    pub use crate::restore_check::{LocalTopology, Mode, Request, check, image};

    /// CRIU's image schema, current and v3.17.
    pub mod proto {
        pub use crate::restore_check::proto::{current, v3_17};
    }
}

/// The KFD topology.
pub mod topology {
    pub use crate::topology::{KfdNode, LinkType, Properties, read_topology};
}

/// Per-pod usage.
pub mod usage {
    pub use crate::usage::{Targets, read};
}
