//! The per-GPU comparison CRIU makes before it maps a checkpoint GPU onto a
//! local one: six values with an option (checkpoint ≤ local, or equal for
//! `capability`) and eighteen always compared for equality.

use super::{
    model::GpuProps,
    options::{Check, Options},
};

/// How a value is compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// Checkpoint value == local value.
    Equal,
    /// Checkpoint value <= local value.
    AtMost,
}

/// One compared property.
#[derive(Debug, Clone, Copy)]
pub struct Property {
    pub name: &'static str,
    pub rule: Rule,
    /// The option that switches the comparison off; `None`: always compared.
    pub option: Option<Check>,
    pub get: fn(&GpuProps) -> u64,
}

macro_rules! prop {
    ($name:ident, $rule:ident, $option:expr) => {
        Property {
            name: stringify!($name),
            rule: Rule::$rule,
            option: $option,
            get: |p: &GpuProps| u64::from(p.$name),
        }
    };
}

/// Every compared property.
pub const PROPERTIES: [Property; 24] = [
    prop!(fw_version, AtMost, Some(Check::FwVersion)),
    prop!(sdma_fw_version, AtMost, Some(Check::SdmaFwVersion)),
    prop!(caches_count, AtMost, Some(Check::CachesCount)),
    prop!(num_gws, AtMost, Some(Check::NumGws)),
    prop!(vram_size, AtMost, Some(Check::VramSize)),
    prop!(capability, Equal, Some(Check::Capability)),
    prop!(simd_count, Equal, None),
    prop!(mem_banks_count, Equal, None),
    prop!(io_links_count, Equal, None),
    prop!(max_waves_per_simd, Equal, None),
    prop!(lds_size_in_kb, Equal, None),
    prop!(wave_front_size, Equal, None),
    prop!(array_count, Equal, None),
    prop!(simd_arrays_per_engine, Equal, None),
    prop!(cu_per_simd_array, Equal, None),
    prop!(simd_per_cu, Equal, None),
    prop!(max_slots_scratch_cu, Equal, None),
    prop!(vendor_id, Equal, None),
    prop!(device_id, Equal, None),
    prop!(num_sdma_engines, Equal, None),
    prop!(num_sdma_xgmi_engines, Equal, None),
    prop!(num_sdma_queues_per_engine, Equal, None),
    prop!(num_cp_queues, Equal, None),
    prop!(vram_public, Equal, None),
];

/// A property that failed for a pair of GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    pub property: &'static str,
    pub checkpoint: u64,
    pub local: u64,
    pub option: Option<Check>,
}

impl Property {
    fn passes(&self, src: &GpuProps, dst: &GpuProps) -> bool {
        let (s, d) = ((self.get)(src), (self.get)(dst));
        match self.rule {
            Rule::Equal => s == d,
            Rule::AtMost => s <= d,
        }
    }

    fn enforced(&self, options: &Options) -> bool {
        self.option.is_none_or(|c| options.is_on(c))
    }
}

/// Whether every enforced property passes.
pub fn matches(src: &GpuProps, dst: &GpuProps, options: &Options) -> bool {
    PROPERTIES
        .iter()
        .all(|p| !p.enforced(options) || p.passes(src, dst))
}

/// Every enforced property that fails.
pub fn mismatches(src: &GpuProps, dst: &GpuProps, options: &Options) -> Vec<Mismatch> {
    PROPERTIES
        .iter()
        .filter(|p| p.enforced(options) && !p.passes(src, dst))
        .map(|p| Mismatch {
            property: p.name,
            checkpoint: (p.get)(src),
            local: (p.get)(dst),
            option: p.option,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GPU with every compared value distinct and non-zero.
    pub(crate) fn sample() -> GpuProps {
        let mut p = GpuProps::default();
        for (i, prop) in PROPERTIES.iter().enumerate() {
            set(&mut p, prop.name, 100 + u64::try_from(i).unwrap());
        }
        p.vram_public = 1;
        p
    }

    fn set(p: &mut GpuProps, name: &str, value: u64) {
        let v32 = u32::try_from(value).unwrap();
        match name {
            "fw_version" => p.fw_version = v32,
            "sdma_fw_version" => p.sdma_fw_version = v32,
            "caches_count" => p.caches_count = v32,
            "num_gws" => p.num_gws = v32,
            "vram_size" => p.vram_size = value,
            "capability" => p.capability = v32,
            "simd_count" => p.simd_count = v32,
            "mem_banks_count" => p.mem_banks_count = v32,
            "io_links_count" => p.io_links_count = v32,
            "max_waves_per_simd" => p.max_waves_per_simd = v32,
            "lds_size_in_kb" => p.lds_size_in_kb = v32,
            "wave_front_size" => p.wave_front_size = v32,
            "array_count" => p.array_count = v32,
            "simd_arrays_per_engine" => p.simd_arrays_per_engine = v32,
            "cu_per_simd_array" => p.cu_per_simd_array = v32,
            "simd_per_cu" => p.simd_per_cu = v32,
            "max_slots_scratch_cu" => p.max_slots_scratch_cu = v32,
            "vendor_id" => p.vendor_id = v32,
            "device_id" => p.device_id = v32,
            "num_sdma_engines" => p.num_sdma_engines = v32,
            "num_sdma_xgmi_engines" => p.num_sdma_xgmi_engines = v32,
            "num_sdma_queues_per_engine" => p.num_sdma_queues_per_engine = v32,
            "num_cp_queues" => p.num_cp_queues = v32,
            "vram_public" => p.vram_public = v32,
            other => panic!("unknown property {other}"),
        }
    }

    #[test]
    fn six_options_relax_six_values_and_eighteen_are_always_equal() {
        let with_option = PROPERTIES.iter().filter(|p| p.option.is_some()).count();
        assert_eq!(with_option, 6);
        let equal_only = PROPERTIES
            .iter()
            .filter(|p| p.option.is_none() && p.rule == Rule::Equal)
            .count();
        assert_eq!(equal_only, 18);
        // NUMA is the seventh option; it is about links, not a value.
        assert!(PROPERTIES.iter().all(|p| p.option != Some(Check::Numa)));
    }

    #[test]
    fn each_relaxable_check_with_its_option_on_and_off() {
        for prop in PROPERTIES.iter().filter(|p| p.option.is_some()) {
            let check = prop.option.unwrap();
            let src = sample();
            let base = (prop.get)(&src);
            let mut lower = src.clone();
            set(&mut lower, prop.name, base - 1);
            let mut higher = src.clone();
            set(&mut higher, prop.name, base + 1);
            let on = Options::default();
            let off = Options::default().with(check, false);
            // Local lower than the checkpoint: refused while the check is on.
            let m = mismatches(&src, &lower, &on);
            assert_eq!(m.len(), 1, "{}", prop.name);
            assert_eq!(
                m[0],
                Mismatch {
                    property: prop.name,
                    checkpoint: base,
                    local: base - 1,
                    option: Some(check)
                }
            );
            assert!(matches(&src, &lower, &off), "{} off", prop.name);
            // Local higher: fine for ≤ rules, refused for capability (equality).
            let higher_ok = prop.rule == Rule::AtMost;
            assert_eq!(matches(&src, &higher, &on), higher_ok, "{}", prop.name);
            assert!(matches(&src, &higher, &off));
            assert!(matches(&src, &src, &on));
        }
    }

    #[test]
    fn exactly_matched_values_fail_both_ways_whatever_the_options() {
        let all_off = Check::ALL
            .iter()
            .fold(Options::default(), |o, c| o.with(*c, false));
        for prop in PROPERTIES.iter().filter(|p| p.option.is_none()) {
            let src = sample();
            let base = (prop.get)(&src);
            for other in [base - 1, base + 1] {
                let mut dst = src.clone();
                set(&mut dst, prop.name, other);
                let m = mismatches(&src, &dst, &all_off);
                assert_eq!(m.len(), 1, "{} {other}", prop.name);
                assert_eq!(m[0].property, prop.name);
                assert_eq!(m[0].option, None);
            }
        }
    }

    #[test]
    fn values_that_are_not_compared_do_not_matter() {
        let src = sample();
        let mut dst = src.clone();
        dst.domain = 7;
        dst.drm_render_minor = 200;
        dst.hive_id = 99;
        assert!(matches(&src, &dst, &Options::default()));
    }

    #[test]
    fn capability_compares_all_32_bits() {
        let mut src = sample();
        src.capability = 0xac77_a280;
        let mut dst = src.clone();
        dst.capability = 0x2c77_a280; // per-queue reset (bit 31) withheld
        let m = mismatches(&src, &dst, &Options::default());
        assert_eq!(m[0].property, "capability");
        assert_eq!((m[0].checkpoint, m[0].local), (0xac77_a280, 0x2c77_a280));
    }
}
