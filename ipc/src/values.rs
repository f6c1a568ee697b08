//! Typed views of the readable strings some properties carry: a GPU's or
//! partition's health, the compute and memory partition modes, and the VRAM
//! cap backend.
//!
//! The wire keeps the strings (`ipc/interface.xml` does not change); these
//! types are what either side compares instead of them. Parsing never
//! fails: a value this build does not know is kept as sent
//! ([`Health::Other`], ...), so that it is shown and compared exactly as the
//! string was.

use std::fmt;

/// Declares an enum over a closed set of wire strings plus `Other`, with
/// `as_str`, `Display`, `From<&str>` and `from_wire` (known values matched
/// by `$matches`).
macro_rules! wire_values {
    (
        $(#[$meta:meta])*
        $name:ident matched by $matches:path {
            $( $(#[$vmeta:meta])* $variant:ident = $text:expr, )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash)]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )*
            /// A value this build does not know, kept as sent.
            Other(String),
        }

        impl $name {
            /// The string the wire carries.
            #[must_use]
            pub fn as_str(&self) -> &str {
                match self {
                    $( Self::$variant => $text, )*
                    Self::Other(text) => text,
                }
            }

            /// The value a wire string names; [`Self::Other`] when unknown.
            #[must_use]
            pub fn from_wire(text: &str) -> Self {
                $( if $matches($text, text) { return Self::$variant; } )*
                Self::Other(text.to_owned())
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl From<&str> for $name {
            fn from(text: &str) -> Self {
                Self::from_wire(text)
            }
        }
    };
}

wire_values! {
    /// The health of a GPU or partition (the `Health` properties). Matched
    /// exactly: anything but `Healthy` is not healthy.
    Health matched by str::eq {
        /// Passes its health checks ([`crate::HEALTHY`]).
        Healthy = crate::HEALTHY,
        /// Failed its health checks ([`crate::UNHEALTHY`]).
        Unhealthy = crate::UNHEALTHY,
        /// Was in the inventory and is no longer found ([`crate::MISSING`]).
        Missing = crate::MISSING,
    }
}

impl Health {
    /// Whether the device may be offered.
    #[must_use]
    pub fn is_healthy(&self) -> bool {
        *self == Self::Healthy
    }
}

wire_values! {
    /// A compute partition mode (`ComputePartition`, the modes of
    /// `AvailableComputePartitions` and of each `PartitionProfiles` entry),
    /// matched ignoring ASCII case as the plugin always compared them.
    ComputeMode matched by str::eq_ignore_ascii_case {
        /// One partition of the whole GPU.
        Spx = "SPX",
        /// Two partitions.
        Dpx = "DPX",
        /// Three partitions.
        Tpx = "TPX",
        /// Four partitions.
        Qpx = "QPX",
        /// One partition per XCC.
        Cpx = "CPX",
    }
}

impl ComputeMode {
    /// Whether this is the mode `text` names, ignoring ASCII case (an
    /// unknown mode included).
    #[must_use]
    pub fn is(&self, text: &str) -> bool {
        self.as_str().eq_ignore_ascii_case(text)
    }
}

wire_values! {
    /// A memory partition mode (`MemoryPartition`, the memory modes of a
    /// `PartitionProfiles` entry), matched ignoring ASCII case.
    MemoryMode matched by str::eq_ignore_ascii_case {
        /// One NUMA memory domain.
        Nps1 = "NPS1",
        /// Two.
        Nps2 = "NPS2",
        /// Four.
        Nps4 = "NPS4",
        /// Eight.
        Nps8 = "NPS8",
    }
}

/// A mode property that is empty when the GPU has none: `None` then.
fn present<T: for<'a> From<&'a str>>(text: &str) -> Option<T> {
    (!text.is_empty()).then(|| T::from(text))
}

/// amd-gpud's VRAM cap backend (`DmemBackend`): `on`, or `off: <reason>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum DmemBackend {
    /// VRAM caps can be set.
    On,
    /// They cannot, for `reason`.
    Off {
        /// Why (no cgroup v2, no dmem controller, `--dmem-backend off`...).
        reason: String,
    },
}

impl DmemBackend {
    /// The backend a wire string names: `on` is on, anything else off, its
    /// reason after `off: ` (or the whole string without that prefix).
    #[must_use]
    pub fn from_wire(text: &str) -> Self {
        if text == "on" {
            return Self::On;
        }
        let reason = text.strip_prefix("off: ").unwrap_or(text);
        Self::Off {
            reason: reason.to_owned(),
        }
    }

    /// Whether VRAM caps can be set.
    #[must_use]
    pub fn is_on(&self) -> bool {
        *self == Self::On
    }
}

impl Default for DmemBackend {
    /// Off without a reason: nothing read yet.
    fn default() -> Self {
        Self::Off {
            reason: String::new(),
        }
    }
}

impl fmt::Display for DmemBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::On => f.write_str("on"),
            Self::Off { reason } => write!(f, "off: {reason}"),
        }
    }
}

impl crate::types::GpuInfo {
    /// [`Self::health`], typed.
    #[must_use]
    pub fn health_status(&self) -> Health {
        Health::from_wire(&self.health)
    }

    /// [`Self::compute_partition`], typed; `None` when the GPU has none.
    #[must_use]
    pub fn compute_mode(&self) -> Option<ComputeMode> {
        present(&self.compute_partition)
    }

    /// [`Self::memory_partition`], typed; `None` when the GPU has none.
    #[must_use]
    pub fn memory_mode(&self) -> Option<MemoryMode> {
        present(&self.memory_partition)
    }

    /// [`Self::available_compute_partitions`], typed.
    #[must_use]
    pub fn available_compute_modes(&self) -> Vec<ComputeMode> {
        let modes = self.available_compute_partitions.iter();
        modes.map(|m| ComputeMode::from_wire(m)).collect()
    }
}

impl crate::types::PartitionInfo {
    /// [`Self::health`], typed.
    #[must_use]
    pub fn health_status(&self) -> Health {
        Health::from_wire(&self.health)
    }
}

impl crate::types::PartitionProfile {
    /// [`Self::compute_partition`], typed.
    #[must_use]
    pub fn compute_mode(&self) -> ComputeMode {
        ComputeMode::from_wire(&self.compute_partition)
    }

    /// [`Self::memory_partitions`], typed.
    #[must_use]
    pub fn memory_modes(&self) -> Vec<MemoryMode> {
        let modes = self.memory_partitions.iter();
        modes.map(|m| MemoryMode::from_wire(m)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_is_matched_exactly_and_keeps_what_it_does_not_know() {
        for text in [crate::HEALTHY, crate::UNHEALTHY, crate::MISSING] {
            let health = Health::from_wire(text);
            assert!(!matches!(health, Health::Other(_)), "{text}");
            assert_eq!(health.as_str(), text);
            assert_eq!(health.to_string(), text);
        }
        assert!(Health::from_wire("Healthy").is_healthy());
        let odd = Health::from_wire("healthy");
        assert_eq!(odd, Health::Other("healthy".into()));
        assert!(!odd.is_healthy(), "anything but Healthy is unhealthy");
        assert_eq!(odd.as_str(), "healthy");
    }

    #[test]
    fn modes_ignore_case_and_keep_unknown_ones_as_sent() {
        assert_eq!(ComputeMode::from_wire("cpx"), ComputeMode::Cpx);
        assert_eq!(ComputeMode::Cpx.as_str(), "CPX");
        assert!(ComputeMode::Cpx.is("Cpx"));
        let odd = ComputeMode::from_wire("UNKNOWN_6");
        assert_eq!(odd.to_string(), "UNKNOWN_6");
        assert!(odd.is("unknown_6"));
        assert_eq!(MemoryMode::from_wire("nps4"), MemoryMode::Nps4);
        assert_eq!(MemoryMode::from_wire("NPS3").as_str(), "NPS3");
    }

    #[test]
    fn empty_modes_are_none() {
        assert_eq!(present::<ComputeMode>(""), None);
        assert_eq!(present::<MemoryMode>(""), None);
        assert_eq!(present("SPX"), Some(ComputeMode::Spx));
        assert_eq!(present("NPS1"), Some(MemoryMode::Nps1));
    }

    #[test]
    fn the_dmem_backend_reads_and_shows_as_amd_gpud_says_it() {
        assert!(DmemBackend::from_wire("on").is_on());
        let off = DmemBackend::from_wire("off: no dmem controller");
        assert_eq!(
            off,
            DmemBackend::Off {
                reason: "no dmem controller".into()
            }
        );
        assert_eq!(off.to_string(), "off: no dmem controller");
        assert_eq!(DmemBackend::On.to_string(), "on");
        assert!(!DmemBackend::from_wire("ON").is_on(), "only `on` is on");
        assert!(!DmemBackend::default().is_on());
    }
}
