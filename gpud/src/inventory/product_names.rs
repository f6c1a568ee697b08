//! Product names from libdrm's `amdgpu.ids`, as AMD SMI reports them.
//!
//! AMD SMI 6.3 and later fill `market_name` with libdrm's
//! `amdgpu_get_marketing_name` (`smi_amdgpu_get_market_name_from_dev_id` in
//! `ROCm/rocm-systems:projects/amdsmi/src/amd_smi/amd_smi_utils.cc`), which
//! looks the PCI device id and revision up in `amdgpu.ids`. Reading the same
//! file gives a node without AMD SMI the same names. The file
//! (`mesa/drm:data/amdgpu.ids`; Debian's `libdrm-common` installs it as
//! `/usr/share/libdrm/amdgpu.ids`, AMD's `libdrm-amdgpu-common` as
//! `/opt/amdgpu/share/libdrm/amdgpu.ids`) is `#` comments, one version line,
//! then `device_id,<tab>revision_id,<tab>product name` lines in hex. Some
//! lines use spaces instead of tabs; where one id and revision appear twice,
//! the first line wins, as in libdrm.
//!
//! The file is read bounded ([`MAX_BYTES`], [`MAX_LINES`]); a missing or
//! malformed one leaves the names to AMD SMI or the gfx fallback, with a
//! warning naming the path.

use std::path::{Path, PathBuf};

use crate::state_file::{self, FileError};

/// Larger files are refused (the real one is about 40 KiB).
pub const MAX_BYTES: u64 = 1 << 20;
/// Lines past this are not read (the real file has about 1,100).
pub const MAX_LINES: usize = 16_384;
/// Longest product name kept.
const MAX_NAME: usize = 128;

/// One `amdgpu.ids` file, parsed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProductNames {
    /// The file it came from.
    pub path: PathBuf,
    /// Its version line.
    pub version: String,
    entries: Vec<(u16, u8, String)>,
}

/// Why a file gave no names.
#[derive(Debug, thiserror::Error)]
pub enum NamesError {
    #[error("product names: {0}")]
    File(#[from] FileError),
    #[error("{path} is not an amdgpu.ids file: {why}")]
    Malformed { path: String, why: String },
}

impl ProductNames {
    /// Reads the first of `candidates` that exists. `Ok(None)` when none
    /// does; an error names the file that exists but cannot be used.
    ///
    /// # Errors
    /// When the file is not a regular file, too large, unreadable or holds no
    /// entry.
    pub fn load(candidates: &[PathBuf]) -> Result<Option<Self>, NamesError> {
        for path in candidates {
            crate::deadline::reading(path);
            if let Some(bytes) = state_file::read_bounded(path, MAX_BYTES)? {
                return Self::parse(path, &String::from_utf8_lossy(&bytes)).map(Some);
            }
        }
        Ok(None)
    }

    /// Parses `text` read from `path`.
    ///
    /// # Errors
    /// When no line is an entry, or the version line is missing.
    pub fn parse(path: &Path, text: &str) -> Result<Self, NamesError> {
        let malformed = |why: String| NamesError::Malformed {
            path: path.display().to_string(),
            why,
        };
        let mut version = None;
        let mut entries = Vec::new();
        let mut bad = 0_usize;
        let lines = text.lines().take(MAX_LINES).map(str::trim);
        for line in lines.filter(|l| !l.is_empty() && !l.starts_with('#')) {
            if version.is_none() {
                if line.contains(',') {
                    return Err(malformed(format!("no version line before {line:?}")));
                }
                version = Some(line.to_owned());
                continue;
            }
            match entry(line) {
                Some(e) => entries.push(e),
                None => bad += 1,
            }
        }
        if entries.is_empty() {
            return Err(malformed(format!(
                "no `device_id, revision, name` line ({bad} unreadable)"
            )));
        }
        if bad > 0 {
            tracing::warn!(path = %path.display(), "{bad} unreadable lines in amdgpu.ids skipped");
        }
        Ok(Self {
            path: path.to_path_buf(),
            version: version.unwrap_or_default(),
            entries,
        })
    }

    /// The name of `device_id` at `revision`. Without a revision, the name
    /// every entry of the device id agrees on, if they do.
    pub fn lookup(&self, device_id: u16, revision: Option<u8>) -> Option<&str> {
        let mut of_device = self.entries.iter().filter(|(d, _, _)| *d == device_id);
        match revision {
            Some(rev) => of_device
                .find(|(_, r, _)| *r == rev)
                .map(|(_, _, n)| n.as_str()),
            None => {
                let first = of_device.next()?.2.as_str();
                of_device.all(|(_, _, n)| n == first).then_some(first)
            }
        }
    }

    /// How many entries the file has.
    pub fn len(&self) -> usize {
        self.entries.len()
    }
}

fn entry(line: &str) -> Option<(u16, u8, String)> {
    let mut parts = line.splitn(3, ',');
    let device = u16::from_str_radix(parts.next()?.trim(), 16).ok()?;
    let revision = u8::from_str_radix(parts.next()?.trim(), 16).ok()?;
    let name = parts.next()?.trim();
    let printable = name.chars().all(|c| !c.is_control());
    (!name.is_empty() && name.len() <= MAX_NAME && printable)
        .then(|| (device, revision, name.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines as `mesa/drm:data/amdgpu.ids` has them, including one with
    /// spaces and a repeated id and revision.
    const SAMPLE: &str = "# List of AMDGPU IDs\n#\n# Syntax:\n\
        # device_id,\trevision_id,\tproduct_name        <-- single tab after comma\n\n\
        1.0.0\n\
        15D8,\t91,\tAMD Radeon Vega 3 Graphics\n\
        15D8,\t91,\tAMD Ryzen Embedded R1606G with Radeon Vega Gfx\n\
        6860,\t00,\tAMD Radeon Instinct MI25\n\
        6860,\t03,\tAMD Radeon Pro V340\n\
        740F,\t02,\tAMD Instinct MI210\n\
        7481,   C7,     AMD Steam Machine\n\
        74A1,\t00,\tAMD Instinct MI300X\n\
        7550,\tC0,\tAMD Radeon RX 9070 XT\n";

    fn sample() -> ProductNames {
        ProductNames::parse(Path::new("/x/amdgpu.ids"), SAMPLE).unwrap()
    }

    #[test]
    fn looks_up_by_device_and_revision() {
        let names = sample();
        assert_eq!(names.version, "1.0.0");
        assert_eq!(names.len(), 8);
        assert_eq!(names.lookup(0x74a1, Some(0)), Some("AMD Instinct MI300X"));
        assert_eq!(
            names.lookup(0x7550, Some(0xc0)),
            Some("AMD Radeon RX 9070 XT")
        );
        assert_eq!(names.lookup(0x7550, Some(0xc1)), None);
        assert_eq!(names.lookup(0x7481, Some(0xc7)), Some("AMD Steam Machine"));
        assert_eq!(
            names.lookup(0x15d8, Some(0x91)),
            Some("AMD Radeon Vega 3 Graphics")
        );
        assert_eq!(names.lookup(0x1234, Some(0)), None);
    }

    #[test]
    fn without_a_revision_only_an_unambiguous_name() {
        let names = sample();
        assert_eq!(names.lookup(0x74a1, None), Some("AMD Instinct MI300X"));
        assert_eq!(names.lookup(0x740f, None), Some("AMD Instinct MI210"));
        assert_eq!(names.lookup(0x6860, None), None);
    }

    #[test]
    fn malformed_files_are_refused_and_bad_lines_skipped() {
        let path = Path::new("/x/amdgpu.ids");
        let err = ProductNames::parse(path, "74A1,\t00,\tAMD Instinct MI300X\n").unwrap_err();
        assert!(err.to_string().contains("/x/amdgpu.ids"), "{err}");
        assert!(ProductNames::parse(path, "1.0.0\nnot an entry\n").is_err());
        assert!(ProductNames::parse(path, "").is_err());
        let names =
            ProductNames::parse(path, "1.0.0\nzz,\t00,\tX\n74A1,\t100,\tY\n74A1,\t00,\tZ\n")
                .unwrap();
        assert_eq!(names.len(), 1);
        let long = format!("1.0.0\n74A1,\t00,\t{}\n", "N".repeat(MAX_NAME + 1));
        assert!(ProductNames::parse(path, &long).is_err());
    }

    #[test]
    fn lines_past_the_bound_are_not_read() {
        let mut text = String::from("1.0.0\n");
        text.push_str(&"# comment\n".repeat(MAX_LINES));
        text.push_str("74A1,\t00,\tAMD Instinct MI300X\n");
        assert!(ProductNames::parse(Path::new("/x"), &text).is_err());
    }

    #[test]
    fn loads_the_first_existing_candidate() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("none/amdgpu.ids");
        let file = dir.path().join("amdgpu.ids");
        std::fs::write(&file, SAMPLE).unwrap();
        let names = ProductNames::load(&[missing.clone(), file.clone()])
            .unwrap()
            .unwrap();
        assert_eq!(names.path, file);
        assert!(
            ProductNames::load(std::slice::from_ref(&missing))
                .unwrap()
                .is_none()
        );
        std::fs::write(&file, vec![b'#'; usize::try_from(MAX_BYTES).unwrap() + 1]).unwrap();
        let err = ProductNames::load(&[file]).unwrap_err();
        assert!(err.to_string().contains("amdgpu.ids"), "{err}");
    }
}
