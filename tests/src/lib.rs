//! Cross-process tests, fake host roots, and the tools that run the stack without a GPU.
//!
//! [`fixture`] writes fake host roots (KFD topology, DRM/PCI sysfs, `/dev` nodes and the
//! fake AMD SMI library's JSON fixture) for named machine shapes.
//! [`bus`] runs a private system-type `dbus-daemon` with the shipped policy and calls it as
//! other UIDs.
//! [`criu_image`] writes CRIU amdgpu checkpoint images of a fake or captured node.
//! [`hami_emulator`] does what HAMi's scheduler does for AMD pods; [`node_sim`] runs the
//! whole node side on a fake node for `node-sim`.
//! [`containerd`] runs a private containerd; [`oci_images`] builds the OCI image archives
//! the loader check's tests import into it.

pub mod apiserver;
pub mod bus;
pub mod cluster;
pub mod containerd;
pub mod criu_image;
pub mod fake_amdsmi;
pub mod fixture;
pub mod grants;
pub mod hami_emulator;
pub mod kubelet;
pub mod node_sim;
pub mod oci_images;
pub mod release;
pub mod rng;
pub mod stack;
