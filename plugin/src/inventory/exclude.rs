//! `--exclude-gpus`: GPUs the node keeps for itself, as the Go plugin's
//! `excludeGPUs` (its chart: "GPUs this node keeps for itself and does not
//! register, as PCI BDFs (`0000:06:00.0`) or DRM cards (`card1`)",
//! Project-HAMi/amd-device-plugin:helm/amd-gpu/README.md).
//!
//! An excluded GPU, and every partition of it, is dropped from amd-gpud's
//! answer before anything else sees it: kubelet is not offered it, HAMi's
//! register annotation does not carry it, and the start-up partition switch
//! leaves it alone. The list is comma- or space-separated (the chart joins
//! its list with commas); each entry is a PCI address, full
//! (`0000:83:00.0`) or without the domain (`83:00.0`, domain 0), in any
//! case, or `card<N>`, the DRM card minor of the GPU or of one of its
//! partitions. A well-formed entry that names no GPU of the node is a
//! warning (a mistyped address must not pass silently), not an error: the
//! same DaemonSet runs on nodes with other GPUs.

use std::{collections::BTreeMap, fmt, str::FromStr};

use ipc::types::{GpuInfo, PartitionInfo};

use crate::choice::InvalidChoice;

/// One entry of the list.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Entry {
    /// A PCI address, `dddd:bb:dd.f` in lower case.
    Pci(String),
    /// A DRM card minor.
    Card(i32),
}

impl fmt::Display for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Pci(bdf) => f.write_str(bdf),
            Self::Card(minor) => write!(f, "card{minor}"),
        }
    }
}

/// The GPUs `--exclude-gpus` names; empty by default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ExcludeGpus(Vec<Entry>);

const WHAT: &str = "an --exclude-gpus (AMDGPU_DP_EXCLUDE_GPUS) entry";
const EXPECTED: &str = "a PCI address (0000:83:00.0 or 83:00.0) or a DRM card (card1)";

impl FromStr for ExcludeGpus {
    type Err = InvalidChoice;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        let entries = value
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|e| !e.is_empty())
            .map(|e| entry(e).ok_or_else(|| InvalidChoice::new(WHAT, EXPECTED, e)))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self(entries))
    }
}

fn entry(text: &str) -> Option<Entry> {
    let lower = text.to_ascii_lowercase();
    if let Some(minor) = lower.strip_prefix("card") {
        if minor.is_empty() || !minor.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        return minor.parse().ok().map(Entry::Card);
    }
    let full = if lower.matches(':').count() == 1 {
        format!("0000:{lower}")
    } else {
        lower
    };
    pci_address(&full).then_some(Entry::Pci(full))
}

/// Whether `text` is `dddd:bb:dd.f` in hex digits.
fn pci_address(text: &str) -> bool {
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    let Some((head, function)) = text.rsplit_once('.') else {
        return false;
    };
    let parts: Vec<&str> = head.split(':').collect();
    matches!(parts.as_slice(), [domain, bus, device]
        if hex(domain, 4) && hex(bus, 2) && hex(device, 2) && hex(function, 1))
}

/// amd-gpud's answer with the excluded GPUs taken out.
#[derive(Debug, Default)]
pub(crate) struct Kept {
    pub(crate) gpus: Vec<GpuInfo>,
    pub(crate) partitions: BTreeMap<String, Vec<PartitionInfo>>,
    /// The PCI addresses of the GPUs taken out.
    pub(crate) excluded: Vec<String>,
    /// The entries that named no GPU of the node, as written back.
    pub(crate) unmatched: Vec<String>,
}

impl ExcludeGpus {
    /// Whether no GPU is excluded.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Takes the excluded GPUs (and their partitions) out of `gpus` and
    /// `partitions` (keyed by the GPU's PCI address).
    pub(crate) fn apply(
        &self,
        gpus: Vec<GpuInfo>,
        mut partitions: BTreeMap<String, Vec<PartitionInfo>>,
    ) -> Kept {
        let mut matched = vec![false; self.0.len()];
        let mut kept = Kept::default();
        for gpu in gpus {
            let parts = partitions.get(&gpu.bdf).map_or(&[][..], Vec::as_slice);
            let mut hit = false;
            for (entry, seen) in self.0.iter().zip(matched.iter_mut()) {
                if names(entry, &gpu, parts) {
                    (hit, *seen) = (true, true);
                }
            }
            if hit {
                partitions.remove(&gpu.bdf);
                kept.excluded.push(gpu.bdf);
            } else {
                kept.gpus.push(gpu);
            }
        }
        kept.partitions = partitions;
        kept.unmatched = self
            .0
            .iter()
            .zip(matched)
            .filter(|(_, seen)| !seen)
            .map(|(entry, _)| entry.to_string())
            .collect();
        kept
    }
}

/// Whether `entry` names `gpu` (whose partitions are `parts`).
fn names(entry: &Entry, gpu: &GpuInfo, parts: &[PartitionInfo]) -> bool {
    match entry {
        Entry::Pci(bdf) => {
            gpu.bdf.eq_ignore_ascii_case(bdf)
                || parts.iter().any(|p| p.bdf.eq_ignore_ascii_case(bdf))
        }
        Entry::Card(minor) => parts.iter().any(|p| p.card_minor == *minor),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{mi300x, partition};

    fn node() -> (Vec<GpuInfo>, BTreeMap<String, Vec<PartitionInfo>>) {
        let bdfs = ["0000:06:00.0", "0000:83:00.0", "0000:c3:00.0"];
        let gpus = bdfs.iter().map(|b| mi300x(b, "")).collect();
        let partitions = bdfs
            .iter()
            .zip(1..)
            .map(|(b, card)| ((*b).to_owned(), vec![partition(b, 0, card)]))
            .collect();
        (gpus, partitions)
    }

    fn kept_bdfs(list: &str) -> (Vec<String>, Kept) {
        let (gpus, partitions) = node();
        let kept = list.parse::<ExcludeGpus>().unwrap().apply(gpus, partitions);
        let bdfs = kept.gpus.iter().map(|g| g.bdf.clone()).collect();
        (bdfs, kept)
    }

    #[test]
    fn the_go_plugins_forms_name_gpus() {
        // The chart's examples: a PCI BDF and a DRM card.
        let (bdfs, kept) = kept_bdfs("0000:06:00.0,card2");
        assert_eq!(bdfs, ["0000:c3:00.0"]);
        assert_eq!(kept.excluded, ["0000:06:00.0", "0000:83:00.0"]);
        assert!(
            !kept.partitions.contains_key("0000:83:00.0"),
            "its partitions go"
        );
        assert!(kept.partitions.contains_key("0000:c3:00.0"));
        assert!(kept.unmatched.is_empty());
        // Short BDF, upper case, spaces.
        let (bdfs, _) = kept_bdfs(" C3:00.0  CARD1 ");
        assert_eq!(bdfs, ["0000:83:00.0"]);
    }

    #[test]
    fn an_entry_naming_no_gpu_is_reported_and_nothing_else_changes() {
        let (bdfs, kept) = kept_bdfs("0000:99:00.0,card7");
        assert_eq!(bdfs.len(), 3);
        assert_eq!(kept.unmatched, ["0000:99:00.0", "card7"]);
        let (bdfs, kept) = kept_bdfs("");
        assert_eq!((bdfs.len(), kept.unmatched.len()), (3, 0));
    }

    #[test]
    fn the_flag_and_its_env_twin() {
        use clap::{CommandFactory, Parser};
        let cli = crate::config::Cli::parse_from(["x"]);
        assert!(cli.exclude_gpus.is_empty());
        let cli = crate::config::Cli::parse_from(["x", "--exclude-gpus", "card3"]);
        assert_eq!(cli.exclude_gpus, ExcludeGpus(vec![Entry::Card(3)]));
        let command = crate::config::Cli::command();
        let env = command
            .get_arguments()
            .find(|a| a.get_long() == Some("exclude-gpus"))
            .and_then(clap::Arg::get_env);
        assert_eq!(env, Some(std::ffi::OsStr::new("AMDGPU_DP_EXCLUDE_GPUS")));
        let err = crate::config::Cli::try_parse_from(["x", "--exclude-gpus", "gpu0"]).unwrap_err();
        assert!(err.to_string().contains("\"gpu0\""), "{err}");
    }

    #[test]
    fn malformed_entries_are_refused_naming_them() {
        for bad in [
            "card",
            "cardx",
            "83:00",
            "0000:83:00.0.1",
            "gpu0",
            "0:83:00.0",
            "83:0.0",
        ] {
            let err = bad.parse::<ExcludeGpus>().unwrap_err().to_string();
            assert!(err.contains(&format!("{bad:?}")), "{err}");
            assert!(err.contains("--exclude-gpus"), "{err}");
        }
    }
}
