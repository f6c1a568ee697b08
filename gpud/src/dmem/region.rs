//! amdgpu VRAM regions and the `<region> <value>` files of the dmem controller.
//!
//! amdgpu registers one region per PCI function, `drm/<dddd:bb:dd.f>/vram`
//! (torvalds/linux:drivers/gpu/drm/drm_drv.c `drmm_cgroup_register_region`,
//! drivers/gpu/drm/amd/amdgpu/amdgpu_ttm.c). Region names are derived here from a
//! validated PCI address, never taken from a caller. Files are parsed per
//! docs/dmem.md §4.2 R6: split each line at its last space, the value is `max`
//! or a `u64`.

use std::{collections::BTreeMap, fmt};

use crate::pci::PciAddress;

/// Longest region name accepted (docs/dmem.md §4.2 R7).
pub const MAX_REGION_LEN: usize = 64;
/// Canonical length of `dddd:bb:dd.f`.
const BDF_LEN: usize = 12;

/// Why a string is not a GPU address we cap.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{excerpt} is not a PCI address in canonical form (dddd:bb:dd.f, lowercase hex, function 0-7)"
)]
pub struct RegionError {
    pub excerpt: String,
}

/// A GPU's PCI address in canonical form (`0000:03:00.0`): lowercase hex,
/// four-digit domain, function 0-7. Exactly what `drm/<bdf>/vram` contains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Bdf(PciAddress);

impl Bdf {
    /// Accepts only the canonical spelling: parsing then printing must give
    /// back `text` byte for byte (no `+`, no uppercase, no short domain).
    ///
    /// # Errors
    /// [`RegionError`] otherwise.
    pub fn parse(text: &str) -> Result<Self, RegionError> {
        let err = || RegionError {
            excerpt: super::uid::excerpt(text),
        };
        if text.len() != BDF_LEN {
            return Err(err());
        }
        let address: PciAddress = text.parse().map_err(|_| err())?;
        if address.to_string() == text {
            Ok(Self(address))
        } else {
            Err(err())
        }
    }

    /// The region amdgpu registers for this function: `drm/<bdf>/vram`.
    pub fn region(&self) -> String {
        format!("drm/{}/vram", self.0)
    }

    /// The address of an amdgpu VRAM region name, if `region` is one.
    pub fn from_region(region: &str) -> Option<Self> {
        if region.len() > MAX_REGION_LEN {
            return None;
        }
        let bdf = region.strip_prefix("drm/")?.strip_suffix("/vram")?;
        Self::parse(bdf).ok()
    }
}

impl fmt::Display for Bdf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// One value of a `dmem.*` file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value {
    Bytes(u64),
    Max,
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Bytes(n) => write!(f, "{n}"),
            Self::Max => f.write_str("max"),
        }
    }
}

/// Splits a `<region> <value>` line at its last space. `None` when the line
/// has no space, an empty or over-long region, a control character, or a
/// value that is neither `max` nor a decimal `u64`.
pub fn parse_line(line: &str) -> Option<(&str, Value)> {
    let (region, value) = line.trim_end().rsplit_once(' ')?;
    if region.is_empty()
        || region.len() > MAX_REGION_LEN
        || region.chars().any(|c| c.is_control() || c.is_whitespace())
    {
        return None;
    }
    let value = match value {
        "max" => Value::Max,
        digits if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) => {
            Value::Bytes(digits.parse().ok()?)
        }
        _ => return None,
    };
    Some((region, value))
}

/// The value of `region` in the text of a `dmem.max`/`dmem.current` file.
pub fn value_of(text: &str, region: &str) -> Option<Value> {
    text.lines()
        .filter_map(parse_line)
        .find(|(r, _)| *r == region)
        .map(|(_, v)| v)
}

/// The amdgpu VRAM regions of a root `dmem.capacity`, by PCI address, with
/// their registered size in bytes. Other drivers' regions (xe's `vram0`,
/// `stolen`) and malformed lines are left out.
pub fn amdgpu_capacity(text: &str) -> BTreeMap<Bdf, u64> {
    text.lines()
        .filter_map(parse_line)
        .filter_map(|(region, value)| match value {
            Value::Bytes(n) => Some((Bdf::from_region(region)?, n)),
            Value::Max => None,
        })
        .collect()
}

/// The exact bytes written to `dmem.max` for one region: canonical decimal
/// (no leading zeros, no suffix: the kernel's memparse reads `0…` as octal)
/// and one trailing newline.
pub fn max_line(bdf: Bdf, bytes: u64) -> String {
    format!("{} {bytes}\n", bdf.region())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_canonical_addresses_pass() {
        let bdf = Bdf::parse("0000:c1:1f.7").unwrap();
        assert_eq!(bdf.region(), "drm/0000:c1:1f.7/vram");
        assert_eq!(Bdf::from_region("drm/0000:c1:1f.7/vram"), Some(bdf));
        for bad in [
            "",
            "0000:C1:00.0",
            "000:c1:00.0",
            "00000:c1:00.0",
            "+000:c1:00.0",
            "0000:c1:00.8",
            "0000:c1:20.0",
            "0000:c1:00.0\n",
            "0000:c1:00.0/../x",
            "../../../x/y",
        ] {
            assert!(Bdf::parse(bad).is_err(), "{bad:?}");
        }
        assert!(Bdf::from_region("drm/0000:03:00.0/vram0").is_none());
        assert!(Bdf::from_region("drm/0000:03:00.0/stolen").is_none());
    }

    #[test]
    fn capacity_keeps_amdgpu_vram_lines() {
        let text = "drm/0000:03:00.0/vram 17163091968\n\
                    drm/0000:00:02.0/vram0 4294967296\n\
                    drm/0000:00:02.0/stolen 67108864\n\
                    garbage\n\
                    drm/0000:83:00.0/vram 0x10\n\
                    drm/0000:84:00.0/vram 1024\n";
        let cap = amdgpu_capacity(text);
        let got: Vec<(String, u64)> = cap.iter().map(|(b, n)| (b.to_string(), *n)).collect();
        assert_eq!(
            got,
            [
                ("0000:03:00.0".to_owned(), 17_163_091_968),
                ("0000:84:00.0".to_owned(), 1024)
            ]
        );
    }

    #[test]
    fn lines_split_at_the_last_space() {
        assert_eq!(
            parse_line("drm/0000:03:00.0/vram max\n"),
            Some(("drm/0000:03:00.0/vram", Value::Max))
        );
        assert_eq!(
            parse_line("drm/0000:03:00.0/vram 8589934592"),
            Some(("drm/0000:03:00.0/vram", Value::Bytes(8_589_934_592)))
        );
        for bad in [
            "nospace",
            " 12",
            "r 12k",
            "r -1",
            "r 99999999999999999999999",
            "a\tb 1",
        ] {
            assert_eq!(parse_line(bad), None, "{bad:?}");
        }
        let text = "drm/0000:03:00.0/vram max\ndrm/0000:04:00.0/vram 1\n";
        assert_eq!(
            value_of(text, "drm/0000:04:00.0/vram"),
            Some(Value::Bytes(1))
        );
        assert_eq!(value_of(text, "drm/0000:05:00.0/vram"), None);
    }

    #[test]
    fn written_lines_are_canonical_decimal() {
        let bdf = Bdf::parse("0000:03:00.0").unwrap();
        assert_eq!(max_line(bdf, 8 << 30), "drm/0000:03:00.0/vram 8589934592\n");
        assert_eq!(max_line(bdf, 0), "drm/0000:03:00.0/vram 0\n");
    }
}
