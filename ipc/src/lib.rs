//! The D-Bus contract between `amd-gpud` and `amd-device-plugin`.
//!
//! This crate depends on nothing else in the workspace. It holds the names
//! both sides must agree on; the typed interfaces, errors and the client proxy
//! join it when the service is built on top of the inventory.

/// Well-known bus name owned by `amd-gpud`. The trailing `1` is the major
/// version of the API: a breaking change makes `io.hami.AmdGpu2`.
pub const BUS_NAME: &str = "io.hami.AmdGpu1";

/// Object path of the node's root object.
pub const ROOT_PATH: &str = "/io/hami/AmdGpu1";

/// Prefix of every interface name served by `amd-gpud`.
pub const INTERFACE_PREFIX: &str = "io.hami.AmdGpu1";

/// Prefix of every typed error name sent on the wire.
pub const ERROR_PREFIX: &str = "io.hami.AmdGpu1.Error";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_share_the_major_version() {
        assert!(ROOT_PATH.ends_with("AmdGpu1"));
        assert!(ERROR_PREFIX.starts_with(BUS_NAME));
        assert_eq!(INTERFACE_PREFIX, BUS_NAME);
    }
}
