//! The JSON fixture (see README.md): serde types, parsing and validation.

use std::{collections::BTreeMap, fmt};

use serde::Deserialize;

use crate::status;

/// Which AMD SMI release's struct layouts and enum numbering to emulate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Abi {
    V6_2,
    V6_3,
    V6_4,
    /// 7.0 to 7.12.
    V7_0,
    /// 7.13 and later (lib 26.5).
    V7_13,
}

impl Abi {
    fn parse(text: &str) -> Result<Self, String> {
        match text {
            "6.2" => Ok(Self::V6_2),
            "6.3" => Ok(Self::V6_3),
            "6.4" => Ok(Self::V6_4),
            "7.0" => Ok(Self::V7_0),
            "7.13" => Ok(Self::V7_13),
            other => Err(format!(
                "unknown abi {other:?} (expected \"6.2\", \"6.3\", \"6.4\", \"7.0\" or \"7.13\")"
            )),
        }
    }

    /// True for the 7.x library family (`amdsmi_version_t` without `year`).
    pub(crate) fn is_7x(self) -> bool {
        self >= Self::V7_0
    }
}

/// What a `faults` entry makes a symbol do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fault {
    Hang,
    Abort,
    Status(u32),
}

fn parse_fault(value: &serde_json::Value, abi: Abi) -> Result<Fault, String> {
    match value {
        serde_json::Value::String(text) if text == "hang" => Ok(Fault::Hang),
        serde_json::Value::String(text) if text == "abort" => Ok(Fault::Abort),
        serde_json::Value::String(text) => status::parse(text, abi)
            .map(Fault::Status)
            .ok_or_else(|| format!("unknown fault {text:?}")),
        serde_json::Value::Number(number) => number
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Fault::Status)
            .ok_or_else(|| format!("fault status {number} is not a u32")),
        other => Err(format!("fault must be a string or a number, not {other}")),
    }
}

/// A PCI address `dddd:bb:dd.f`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Bdf {
    pub domain: u32,
    pub bus: u8,
    pub device: u8,
    pub function: u8,
}

impl Bdf {
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        let bad = || format!("bad bdf {text:?} (expected \"dddd:bb:dd.f\" in hex)");
        let hex = |s: &str, max_len: usize| -> Result<u32, String> {
            if s.is_empty() || s.len() > max_len || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(bad());
            }
            u32::from_str_radix(s, 16).map_err(|_| bad())
        };
        let (domain, rest) = text.split_once(':').ok_or_else(bad)?;
        let (bus, rest) = rest.split_once(':').ok_or_else(bad)?;
        let (device, function) = rest.split_once('.').ok_or_else(bad)?;
        let domain = hex(domain, 8)?;
        let bus = u8::try_from(hex(bus, 2)?).map_err(|_| bad())?;
        let device = u8::try_from(hex(device, 2)?).map_err(|_| bad())?;
        let function = u8::try_from(hex(function, 1)?).map_err(|_| bad())?;
        if device > 0x1f || function > 7 {
            return Err(bad());
        }
        Ok(Self {
            domain,
            bus,
            device,
            function,
        })
    }

    /// `amdsmi_bdf_t` as a u64 (docs/amd-hardware.md §3.1).
    pub(crate) fn as_u64(self) -> u64 {
        (u64::from(self.domain) << 16)
            | (u64::from(self.bus) << 8)
            | (u64::from(self.device) << 3)
            | u64::from(self.function)
    }

    /// The `amdsmi_get_gpu_bdf_id` value (docs/amd-hardware.md §4.5): partition id in bits 31:28.
    pub(crate) fn id_with_partition(self, partition_id: u32) -> u64 {
        (u64::from(self.domain) << 32)
            | (u64::from(partition_id & 0xF) << 28)
            | (u64::from(self.bus) << 8)
            | (u64::from(self.device) << 3)
            | u64::from(self.function)
    }
}

impl fmt::Display for Bdf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

/// The fixture file, as written.
#[derive(Debug, Deserialize)]
pub(crate) struct Fixture {
    abi: String,
    #[serde(default)]
    pub version: VersionSpec,
    #[serde(default = "default_true")]
    pub root: bool,
    #[serde(default)]
    faults: BTreeMap<String, serde_json::Value>,
    #[serde(default)]
    pub sockets: Vec<Socket>,
    /// The fake host root a switch writes to (see `host.rs`); none: the
    /// switch changes only what the library reports.
    #[serde(default)]
    pub host_root: Option<std::path::PathBuf>,
}

fn default_true() -> bool {
    true
}

/// `version`: every field is optional; missing ones default per ABI.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct VersionSpec {
    pub year: Option<u32>,
    pub major: Option<u32>,
    pub minor: Option<u32>,
    pub release: Option<u32>,
    pub build: Option<String>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct Socket {
    #[serde(default)]
    pub processors: Vec<Processor>,
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Processor {
    bdf: String,
    #[serde(skip, default = "default_bdf")]
    pub pci: Bdf,
    #[serde(default)]
    pub partition_id: u32,
    pub kfd_id: Option<u64>,
    pub kfd_node: Option<u32>,
    pub uuid: Option<String>,
    pub market_name: Option<String>,
    pub vendor_id: Option<u32>,
    pub subvendor_id: Option<u32>,
    pub device_id: Option<u64>,
    pub rev_id: Option<u32>,
    pub asic_serial: Option<String>,
    pub oam_id: Option<u32>,
    pub num_compute_units: Option<u32>,
    pub target_graphics_version: Option<u64>,
    pub subsystem_id: Option<u32>,
    pub vram_total_bytes: Option<u64>,
    pub compute_partition: Option<String>,
    pub memory_partition: Option<String>,
    pub drm_render: Option<u32>,
    pub drm_card: Option<u32>,
    pub hsa_id: Option<u32>,
    pub hip_id: Option<u32>,
    pub hip_uuid: Option<String>,
    pub profile: Option<Profile>,
    pub profile_config: Option<ProfileConfig>,
    pub processes: Option<Vec<Process>>,
    /// `amdsmi_get_gpu_activity`: percent; all three absent: `NOT_SUPPORTED`.
    pub gfx_activity: Option<u32>,
    pub umc_activity: Option<u32>,
    pub mm_activity: Option<u32>,
    /// `amdsmi_get_gpu_vram_usage`'s `vram_used`, MiB; absent: `NOT_SUPPORTED`.
    pub vram_used_mib: Option<u32>,
}

fn default_bdf() -> Bdf {
    Bdf {
        domain: 0,
        bus: 0,
        device: 0,
        function: 0,
    }
}

/// An accelerator partition profile (docs/amd-hardware.md §3.6).
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Profile {
    pub profile_type: String,
    pub num_partitions: u32,
    #[serde(default)]
    pub memory_caps: Vec<String>,
    pub profile_index: u32,
    #[serde(default)]
    pub partition_ids: Vec<u32>,
    pub xcc_per_partition: Option<u32>,
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct ProfileConfig {
    #[serde(default)]
    pub default_profile_index: u32,
    #[serde(default)]
    pub profiles: Vec<Profile>,
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Process {
    pub pid: u32,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub mem_bytes: u64,
    #[serde(default)]
    pub vram_bytes: u64,
    #[serde(default)]
    pub container_name: String,
}

/// Accelerator partition type names (docs/amd-hardware.md §2.4) and their values.
const ACCEL_TYPES: [(&str, u32); 5] = [("SPX", 1), ("DPX", 2), ("TPX", 3), ("QPX", 4), ("CPX", 5)];
/// `amdsmi_nps_caps_t` bits (docs/amd-hardware.md §2.7).
const NPS_BITS: [(&str, u32); 4] = [("NPS1", 1), ("NPS2", 2), ("NPS4", 4), ("NPS8", 8)];
/// Compute partition enum (docs/amd-hardware.md §2.3) on 6.2 and on 6.3+.
const COMPUTE_6_2: [(&str, u32); 5] = [("CPX", 1), ("SPX", 2), ("DPX", 3), ("TPX", 4), ("QPX", 5)];
const COMPUTE_6_3: [(&str, u32); 5] = [("SPX", 1), ("DPX", 2), ("TPX", 3), ("QPX", 4), ("CPX", 5)];

/// `amdsmi_accelerator_partition_type_t` of a profile type name.
pub(crate) fn accel_type_value(name: &str) -> Option<u32> {
    ACCEL_TYPES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, v)| *v)
}

/// The `amdsmi_nps_caps_t` bit of a memory partition name.
pub(crate) fn nps_bit(name: &str) -> Option<u32> {
    NPS_BITS.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
}

/// The mode name of an `amdsmi_compute_partition_type_t` value at `abi`.
pub(crate) fn compute_mode_name(abi: Abi, value: u32) -> Option<&'static str> {
    let table = if abi == Abi::V6_2 {
        &COMPUTE_6_2
    } else {
        &COMPUTE_6_3
    };
    table.iter().find(|(_, v)| *v == value).map(|(n, _)| *n)
}

/// Sockets and processors per socket must fit the handle encoding.
pub(crate) const MAX_ITEMS: usize = 0x7FFF;
/// `AMDSMI_MAX_ACCELERATOR_PROFILE`.
pub(crate) const MAX_PROFILES: usize = 32;

/// A parsed and validated fixture.
#[derive(Debug)]
pub(crate) struct Loaded {
    pub abi: Abi,
    pub fixture: Fixture,
    pub faults: BTreeMap<String, Fault>,
}

impl Loaded {
    pub(crate) fn parse(bytes: &[u8]) -> Result<Self, String> {
        let mut fixture: Fixture =
            serde_json::from_slice(bytes).map_err(|e| format!("invalid JSON: {e}"))?;
        let abi = Abi::parse(&fixture.abi)?;
        let mut faults = BTreeMap::new();
        for (symbol, value) in &fixture.faults {
            let fault = parse_fault(value, abi).map_err(|e| format!("faults[{symbol:?}]: {e}"))?;
            faults.insert(symbol.clone(), fault);
        }
        if fixture.sockets.len() > MAX_ITEMS {
            return Err(format!("more than {MAX_ITEMS} sockets"));
        }
        for (s, socket) in fixture.sockets.iter_mut().enumerate() {
            if socket.processors.len() > MAX_ITEMS {
                return Err(format!("sockets[{s}]: more than {MAX_ITEMS} processors"));
            }
            for (p, processor) in socket.processors.iter_mut().enumerate() {
                validate_processor(processor)
                    .map_err(|e| format!("sockets[{s}].processors[{p}]: {e}"))?;
            }
        }
        Ok(Self {
            abi,
            fixture,
            faults,
        })
    }
}

fn validate_processor(processor: &mut Processor) -> Result<(), String> {
    processor.pci = Bdf::parse(&processor.bdf)?;
    if let Some(profile) = &processor.profile {
        validate_profile(profile).map_err(|e| format!("profile: {e}"))?;
    }
    if let Some(config) = &processor.profile_config {
        if config.profiles.len() > MAX_PROFILES {
            return Err(format!("profile_config: more than {MAX_PROFILES} profiles"));
        }
        for (i, profile) in config.profiles.iter().enumerate() {
            validate_profile(profile).map_err(|e| format!("profile_config.profiles[{i}]: {e}"))?;
        }
    }
    Ok(())
}

fn validate_profile(profile: &Profile) -> Result<(), String> {
    if accel_type_value(&profile.profile_type).is_none() {
        return Err(format!("unknown profile_type {:?}", profile.profile_type));
    }
    if let Some(cap) = profile.memory_caps.iter().find(|c| nps_bit(c).is_none()) {
        return Err(format!("unknown memory cap {cap:?}"));
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The example of README.md, verbatim.
    pub(crate) const README_EXAMPLE: &str = r#"{
  "abi": "7.0",
  "version": { "major": 26, "minor": 1, "release": 0, "build": "26.1.0" },
  "root": true,
  "faults": { "amdsmi_init": "hang", "amdsmi_get_gpu_compute_partition": "BUSY" },
  "sockets": [
    { "processors": [
      {
        "bdf": "0000:05:00.0",
        "partition_id": 0,
        "kfd_id": 53862,
        "kfd_node": 2,
        "uuid": "a1ff74a1-0000-1000-80f4-e3a7c0ffee01",
        "market_name": "AMD Instinct MI300X",
        "vendor_id": 4098, "device_id": 29857, "rev_id": 0,
        "asic_serial": "0xE3A7C0FFEE01F431", "oam_id": 0,
        "num_compute_units": 38,
        "vram_total_bytes": 206158430208,
        "compute_partition": "CPX",
        "memory_partition": "NPS1",
        "drm_render": 128, "drm_card": 0, "hsa_id": 2, "hip_id": 0,
        "hip_uuid": "GPU-e3a7c0ffee01f431",
        "profile": { "profile_type": "CPX", "num_partitions": 8, "memory_caps": ["NPS1", "NPS4"],
                     "profile_index": 3, "partition_ids": [0,1,2,3,4,5,6,7], "xcc_per_partition": 1 },
        "profile_config": { "default_profile_index": 0, "profiles": [
          { "profile_type": "SPX", "num_partitions": 1, "memory_caps": ["NPS1"], "profile_index": 0,
            "partition_ids": [], "xcc_per_partition": 8 }
        ] },
        "processes": [ { "pid": 4242, "name": "python3", "mem_bytes": 1048576, "vram_bytes": 1048576 } ]
      }
    ] }
  ]
}"#;

    #[test]
    fn readme_example_parses() {
        let loaded = Loaded::parse(README_EXAMPLE.as_bytes()).unwrap();
        assert_eq!(loaded.abi, Abi::V7_0);
        assert_eq!(loaded.faults.get("amdsmi_init"), Some(&Fault::Hang));
        assert_eq!(
            loaded.faults.get("amdsmi_get_gpu_compute_partition"),
            Some(&Fault::Status(status::BUSY))
        );
        let fixture = &loaded.fixture;
        assert!(fixture.root);
        assert_eq!(fixture.version.major, Some(26));
        assert_eq!(fixture.version.build.as_deref(), Some("26.1.0"));
        let p = &fixture.sockets[0].processors[0];
        assert_eq!(
            p.pci,
            Bdf {
                domain: 0,
                bus: 5,
                device: 0,
                function: 0
            }
        );
        assert_eq!(p.kfd_id, Some(53862));
        assert_eq!(p.device_id, Some(29857));
        assert_eq!(p.vram_total_bytes, Some(206_158_430_208));
        let profile = p.profile.as_ref().unwrap();
        assert_eq!(profile.partition_ids.len(), 8);
        assert_eq!(profile.xcc_per_partition, Some(1));
        assert_eq!(
            p.profile_config.as_ref().unwrap().profiles[0].xcc_per_partition,
            Some(8)
        );
        assert_eq!(p.processes.as_ref().unwrap()[0].pid, 4242);
    }

    #[test]
    fn rejects_bad_fixtures() {
        let bad = |json: &str| Loaded::parse(json.as_bytes()).unwrap_err();
        assert!(bad(r#"{"abi": "6.5"}"#).contains("unknown abi"));
        assert!(bad(r#"{"abi": "7.0", "faults": {"amdsmi_init": "SLEEPY"}}"#).contains("SLEEPY"));
        assert!(
            bad(r#"{"abi": "7.0", "sockets": [{"processors": [{"bdf": "05:00.0"}]}]}"#)
                .contains("bad bdf")
        );
        assert!(bad("{").contains("invalid JSON"));
        let bad_type = r#"{"abi": "6.4", "sockets": [{"processors": [{"bdf": "0000:05:00.0",
            "profile": {"profile_type": "XPX", "num_partitions": 1, "profile_index": 0}}]}]}"#;
        assert!(bad(bad_type).contains("XPX"));
    }

    #[test]
    fn faults_accept_numbers_and_abort() {
        let json =
            r#"{"abi": "6.2", "faults": {"a": 30, "b": "abort", "c": "7", "d": "MORE_DATA"}}"#;
        let loaded = Loaded::parse(json.as_bytes()).unwrap();
        assert_eq!(loaded.faults["a"], Fault::Status(30));
        assert_eq!(loaded.faults["b"], Fault::Abort);
        assert_eq!(loaded.faults["c"], Fault::Status(7));
        assert_eq!(loaded.faults["d"], Fault::Status(57));
        assert!(loaded.fixture.root, "root defaults to true");
    }

    #[test]
    fn bdf_encodings() {
        let bdf = Bdf::parse("0001:c1:1f.7").unwrap();
        assert_eq!(bdf.as_u64(), (1 << 16) | (0xc1 << 8) | (0x1f << 3) | 7);
        assert_eq!(
            bdf.id_with_partition(3),
            (1 << 32) | (3 << 28) | (0xc1 << 8) | (0x1f << 3) | 7
        );
        assert_eq!(bdf.to_string(), "0001:c1:1f.7");
        assert!(Bdf::parse("0000:05:20.0").is_err(), "device > 0x1f");
        assert!(Bdf::parse("0000:05:00.8").is_err(), "function > 7");
        assert!(Bdf::parse("0000:105:00.0").is_err());
    }

    #[test]
    fn compute_partition_enum_is_renumbered_in_6_3() {
        assert_eq!(compute_mode_name(Abi::V6_2, 1), Some("CPX"));
        assert_eq!(compute_mode_name(Abi::V6_2, 2), Some("SPX"));
        assert_eq!(compute_mode_name(Abi::V6_3, 1), Some("SPX"));
        assert_eq!(compute_mode_name(Abi::V7_0, 5), Some("CPX"));
        assert_eq!(compute_mode_name(Abi::V7_0, 0), None);
        assert_eq!(compute_mode_name(Abi::V6_2, 6), None);
    }
}
