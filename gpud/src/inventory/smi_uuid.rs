//! AMD SMI's device UUID (`amdsmi_get_gpu_device_uuid`), computed from sysfs.
//!
//! AMD SMI does not read a UUID from the driver: it builds one from three
//! numbers (`ROCm/amdsmi:src/amd_smi/amd_smi_uuid.cc`, `amdsmi_uuid_gen`,
//! unchanged in `ROCm/rocm-systems:projects/amdsmi/src/amd_smi/amd_smi_uuid.cc`):
//! a 64-bit serial, the 16-bit PCI device id and an 8-bit "function" byte,
//! laid out as a version-1, variant-2 UUID:
//!
//! ```text
//! SS FF DDDD - 0000 - 1000 - 80 ss - ssss ssssssss
//! │  │  │                       │     └ serial bits 47..0
//! │  │  └ device id             └ serial bits 55..48
//! │  └ function byte
//! └ serial bits 63..56
//! ```
//!
//! What feeds it depends on the release (`amdsmi_get_gpu_device_uuid` in
//! `ROCm/amdsmi:src/amd_smi/amd_smi.cc` and
//! `ROCm/rocm-systems:projects/amdsmi/src/amd_smi/amd_smi.cc`):
//!
//! * **6.2 to 7.12** (the loader's layouts `6.2`, `6.3`, `6.4`, `7.0`): the
//!   serial is `asic_serial` read back as hex, which 6.2 takes from the PCI
//!   device's `unique_id` file (`%016llx`) and 6.4 to 7.12 from
//!   `rsmi_dev_unique_id_get` (the same file, printed back in hex); the device
//!   id is the one the DRM `DEV_INFO` query reports (the PCI `device`); the
//!   function byte is the constant `0xff`, so every partition of a GPU shares
//!   the UUID.
//! * **7.13 and later** (layouts `7.13`, `10.0`; rocm-systems pull request
//!   3614, "Align HIP_UUID with rocminfo", and its partition document
//!   `projects/amdsmi/docs/conceptual/partition.md`): the serial is KFD's
//!   `unique_id`, the device id `rsmi_dev_id_get` (PCI `device`), and the
//!   function byte the partition index (`amdsmi_kfd_info_t.current_partition_id`,
//!   0 for an unpartitioned GPU and for partition 0; `0xff` only when it
//!   cannot be read).
//!
//! KFD's `unique_id` (decimal) and the PCI `unique_id` file (hex) print the
//! same `adev->unique_id`; the whole GPU is its partition 0.
//!
//! amd-gpud publishes a GPU under the 6.2–7.12 form whatever library it
//! loads (see [`published`]): that is what HAMi's Go AMD device plugin
//! registered, its image shipping AMD SMI 7.0.2
//! (`Project-HAMi/amd-device-plugin:Dockerfile`), and what the fake library
//! mimics by default (`tests/fake-amdsmi`, ABI `7.0`). A library of 7.13 or
//! later still reports its own form as `amdsmi_uuid`; [`expected`] is the form
//! a given layout reports, which the inventory compares it with.
//!
//! Checked against a public `amd-smi` output: GPU `0000:05:00.0`, device id
//! `0x74a1`, `ASIC_SERIAL` `0xAF54E92B0A5D57C8`, UUID
//! `afff74a1-0000-1000-8054-e92b0a5d57c8`
//! (`ROCm/rocm-blogs:blogs/software-tools-optimization/amd-smi-overview/README.md`).

/// The partition index AMD SMI 7.13+ writes for a whole GPU (partition 0).
const WHOLE_GPU_PARTITION: u8 = 0;
/// The function byte of AMD SMI 6.2 to 7.12.
const SHARED_FUNCTION: u8 = 0xff;

/// How a release fills the function byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// 6.2 to 7.12: `0xff`, one UUID for all partitions.
    Shared,
    /// 7.13 and later: the partition index.
    PerPartition,
}

impl Scheme {
    /// The scheme of the loader's layout name (`"6.2"` .. `"10.0"`).
    pub fn of_layout(layout: &str) -> Self {
        match layout {
            "6.2" | "6.3" | "6.4" | "7.0" => Self::Shared,
            _ => Self::PerPartition,
        }
    }
}

/// `amdsmi_uuid_gen(serial, device_id, function)`.
pub fn format(serial: u64, device_id: u16, function: u8) -> String {
    let [s7, s6, s5, s4, s3, s2, s1, s0] = serial.to_be_bytes();
    let low = u32::from_be_bytes([s3, s2, s1, s0]);
    let mid = u16::from_be_bytes([s5, s4]);
    format!("{s7:02x}{function:02x}{device_id:04x}-0000-1000-80{s6:02x}-{mid:04x}{low:08x}")
}

/// The UUID a GPU is published under: the 6.2–7.12 form, from the PCI
/// `unique_id` (`serial`) and device id.
pub fn published(serial: u64, device_id: u16) -> String {
    format(serial, device_id, SHARED_FUNCTION)
}

/// The UUID a library of `layout` reports for the whole GPU, given the
/// published (6.2–7.12) form: the same, or from 7.13 the form with KFD's
/// serial (`kfd_serial`) and partition index 0.
pub fn expected(layout: &str, published: &str, kfd_serial: u64, device_id: u16) -> String {
    match Scheme::of_layout(layout) {
        Scheme::Shared => published.to_owned(),
        Scheme::PerPartition => format(kfd_serial, device_id, WHOLE_GPU_PARTITION),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_public_amd_smi_output_is_reproduced() {
        // ROCm/rocm-blogs: amd-smi list / amd-smi static of one MI300X.
        assert_eq!(
            published(0xAF54_E92B_0A5D_57C8, 0x74a1),
            "afff74a1-0000-1000-8054-e92b0a5d57c8"
        );
    }

    #[test]
    fn a_gpu_without_serial_still_has_a_uuid() {
        // amdsmi_uuid_gen does not look at the serial: an APU without one
        // gets zeros around its device id.
        assert_eq!(published(0, 0x150e), "00ff150e-0000-1000-8000-000000000000");
    }

    #[test]
    fn newer_releases_put_the_partition_index() {
        let serial = 0xAF54_E92B_0A5D_57C8;
        let old = published(serial, 0x74a1);
        assert_eq!(
            expected("7.13", &old, serial, 0x74a1),
            "af0074a1-0000-1000-8054-e92b0a5d57c8"
        );
        assert_eq!(expected("7.0", &old, 1, 0x74a1), old);
        assert_eq!(
            format(serial, 0x74a1, 5),
            "af0574a1-0000-1000-8054-e92b0a5d57c8"
        );
        for layout in ["6.2", "6.3", "6.4", "7.0"] {
            assert_eq!(Scheme::of_layout(layout), Scheme::Shared);
        }
        for layout in ["7.13", "10.0"] {
            assert_eq!(Scheme::of_layout(layout), Scheme::PerPartition);
        }
    }

    #[test]
    fn every_byte_lands_where_amdsmi_uuid_gen_puts_it() {
        assert_eq!(
            format(0x0102_0304_0506_0708, 0xabcd, 0xef),
            "01efabcd-0000-1000-8002-030405060708"
        );
        assert_eq!(format(u64::MAX, 0xffff, 0xff).len(), 36);
    }
}
