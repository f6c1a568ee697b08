//! `amdsmi_get_gpu_device_uuid` as the real library builds it when the
//! fixture gives no `uuid`: the `uuid_t` bit fields of
//! `ROCm/amdsmi:src/amd_smi/amd_smi_uuid.cc` filled and printed the way
//! `amdsmi_uuid_gen` does, from the inputs each release feeds it
//! (`amdsmi_get_gpu_device_uuid` in `ROCm/amdsmi:src/amd_smi/amd_smi.cc` and
//! `ROCm/rocm-systems:projects/amdsmi/src/amd_smi/amd_smi.cc`):
//!
//! * up to 7.12 (ABIs `6.2` to `7.0`): `strtoull(asic_serial, 16)`, the
//!   device id, function byte `0xff`. A missing serial reads as 0 on 6.2 (an
//!   empty string) and as `ffffffffffffffff` from 6.4 (the default the
//!   library writes first).
//! * 7.13 (ABI `7.13`): KFD's `unique_id` (here the hex of `hip_uuid`, else
//!   the serial), the device id, the partition index as function byte.
//!
//! Written apart from amd-gpud's `inventory::smi_uuid` on purpose: the two
//! are checked against each other by the tests.

use crate::fixture::{Abi, Processor};

/// The C `uuid_t` of `amd_smi_uuid.cc`, field by field.
struct UuidT {
    /// `did:16 | fcn:8 | asic_7:8`, overlaid on `time_low`.
    time_low: u32,
    time_mid: u16,
    /// `time_high:12 | version:4`.
    time_hi_version: u16,
    /// `clk_seq_hi:6 | variant:2`.
    seq_hi_variant: u8,
    /// `clk_seq_low`, overlaid by `asic_6`.
    seq_low: u8,
    asic_4: u16,
    asic_0: u32,
}

/// `amdsmi_uuid_gen(str, serial, did, idx)`.
pub(crate) fn uuid_gen(serial: u64, did: u16, idx: u8) -> String {
    let byte = |shift: u32| u8::try_from((serial >> shift) & 0xff).unwrap_or(0);
    let u = UuidT {
        time_low: u32::from(did) | (u32::from(idx) << 16) | (u32::from(byte(56)) << 24),
        time_mid: 0,
        time_hi_version: 1 << 12,
        seq_hi_variant: 2 << 6,
        seq_low: byte(48),
        asic_4: u16::try_from((serial >> 32) & 0xffff).unwrap_or(0),
        asic_0: u32::try_from(serial & 0xffff_ffff).unwrap_or(0),
    };
    format!(
        "{:08x}-{:04x}-{:04x}-{:02x}{:02x}-{:04x}{:08x}",
        u.time_low, u.time_mid, u.time_hi_version, u.seq_hi_variant, u.seq_low, u.asic_4, u.asic_0
    )
}

/// The UUID the release `abi` reports for `p`; `None` when the fixture has
/// neither a serial nor a device id (`amdsmi_get_gpu_asic_info` fails).
pub(crate) fn derived(abi: Abi, p: &Processor) -> Option<String> {
    if p.asic_serial.is_none() && p.device_id.is_none() {
        return None;
    }
    let did = u16::try_from(p.device_id.unwrap_or(0) & 0xffff).unwrap_or(0);
    let serial = |missing: u64| p.asic_serial.as_deref().map_or(missing, strtoull_hex);
    Some(match abi {
        Abi::V6_2 => uuid_gen(serial(0), did, 0xff),
        Abi::V6_3 | Abi::V6_4 | Abi::V7_0 => uuid_gen(serial(u64::MAX), did, 0xff),
        Abi::V7_13 => {
            let kfd = p.hip_uuid.as_deref().and_then(|h| h.strip_prefix("GPU-"));
            let serial = kfd.map_or_else(|| serial(u64::MAX), strtoull_hex);
            let idx = u8::try_from(p.partition_id).unwrap_or(0xff);
            uuid_gen(serial, did, idx)
        }
    })
}

/// `strtoull(text, NULL, 16)`: leading blanks, an optional `0x`, then hex
/// digits up to the first other character; 0 without any; saturated on
/// overflow.
fn strtoull_hex(text: &str) -> u64 {
    let text = text.trim_start();
    let text = text
        .strip_prefix("0x")
        .or_else(|| text.strip_prefix("0X"))
        .unwrap_or(text);
    let mut value: u64 = 0;
    for c in text.chars() {
        let Some(d) = c.to_digit(16) else { break };
        value = match value
            .checked_mul(16)
            .and_then(|v| v.checked_add(u64::from(d)))
        {
            Some(v) => v,
            None => return u64::MAX,
        };
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_public_amd_smi_output() {
        // ROCm/rocm-blogs:blogs/software-tools-optimization/amd-smi-overview/README.md:
        // DEVICE_ID 0x74a1, ASIC_SERIAL 0xAF54E92B0A5D57C8.
        assert_eq!(
            uuid_gen(strtoull_hex("0xAF54E92B0A5D57C8"), 0x74a1, 0xff),
            "afff74a1-0000-1000-8054-e92b0a5d57c8"
        );
    }

    fn processor(fields: serde_json::Value) -> Processor {
        let mut value = serde_json::json!({"bdf": "0000:05:00.0"});
        value
            .as_object_mut()
            .unwrap()
            .extend(fields.as_object().unwrap().clone());
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn each_release_feeds_its_own_inputs() {
        let p = processor(serde_json::json!({
            "asic_serial": "0xE3A7C0FFEE01F431", "device_id": 29857, "partition_id": 3,
            "hip_uuid": "GPU-e3a7c0ffee01f431"
        }));
        let older = "e3ff74a1-0000-1000-80a7-c0ffee01f431";
        for abi in [Abi::V6_2, Abi::V6_3, Abi::V6_4, Abi::V7_0] {
            assert_eq!(derived(abi, &p).as_deref(), Some(older), "{abi:?}");
        }
        let newer = derived(Abi::V7_13, &p).unwrap();
        assert_eq!(newer, "e30374a1-0000-1000-80a7-c0ffee01f431");
        let no_serial = processor(serde_json::json!({"device_id": 29857}));
        assert_eq!(
            derived(Abi::V6_2, &no_serial).unwrap(),
            "00ff74a1-0000-1000-8000-000000000000"
        );
        assert_eq!(
            derived(Abi::V7_0, &no_serial).unwrap(),
            "ffff74a1-0000-1000-80ff-ffffffffffff"
        );
        assert_eq!(derived(Abi::V7_0, &processor(serde_json::json!({}))), None);
    }

    #[test]
    fn strtoull_reads_what_c_reads() {
        assert_eq!(strtoull_hex("0xE3A7C0FFEE01F431"), 0xE3A7_C0FF_EE01_F431);
        assert_eq!(strtoull_hex("e3a7"), 0xe3a7);
        assert_eq!(strtoull_hex("N/A"), 0);
        assert_eq!(strtoull_hex(""), 0);
        assert_eq!(strtoull_hex("12zz"), 0x12);
        assert_eq!(strtoull_hex("1ffffffffffffffff"), u64::MAX);
    }
}
