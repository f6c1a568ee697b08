//! Version detection and the per-release layout choice (docs/amd-hardware.md §1.2, §1.3,
//! §3.1, §4.5).
//!
//! Everything here is a pure function over bytes the library wrote; the struct decoders that
//! use the chosen [`Layout`] live in `decode.rs`.

use super::report::LibVersion;

/// Optional symbol whose presence means "at least 6.3".
pub const KFD_INFO_SYMBOL: &str = "amdsmi_get_gpu_kfd_info";
/// Optional symbol whose presence means "at least 6.4".
pub const ENUMERATION_INFO_SYMBOL: &str = "amdsmi_get_gpu_enumeration_info";

/// ABI family: decides `amdsmi_version_t` and the MORE_DATA status number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// Libraries 24.x and 25.x (ROCm 6.x).
    V6,
    /// Libraries 26.x and later (ROCm 7.x, 10.x).
    V7,
}

/// Struct layout table, ordered from oldest to newest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Layout {
    /// Lib 24.6 and older 24.x.
    V6_2,
    /// Lib 24.7+: `kfd_info`, accelerator profile, `num_of_compute_units`.
    V6_3,
    /// Lib 25.x: 256-byte strings, 704-byte process entries, `enumeration_info`.
    V6_4,
    /// Lib 26.0–26.4.
    V7_0,
    /// Lib 26.5+.
    V7_13,
    /// Lib 27.x; decoded like 7.13.
    V10_0,
}

impl Layout {
    /// Name used in reports and fixtures: `"6.2"`, `"6.3"`, `"6.4"`, `"7.0"`, `"7.13"`, `"10.0"`.
    pub fn name(self) -> &'static str {
        match self {
            Self::V6_2 => "6.2",
            Self::V6_3 => "6.3",
            Self::V6_4 => "6.4",
            Self::V7_0 => "7.0",
            Self::V7_13 => "7.13",
            Self::V10_0 => "10.0",
        }
    }

    /// The ABI family this layout belongs to.
    pub fn family(self) -> Family {
        match self {
            Self::V6_2 | Self::V6_3 | Self::V6_4 => Family::V6,
            Self::V7_0 | Self::V7_13 | Self::V10_0 => Family::V7,
        }
    }

    /// `AMDSMI_MAX_STRING_LENGTH`: 64 up to 6.3, 256 from 6.4.
    pub fn wide_strings(self) -> bool {
        self >= Self::V6_4
    }

    /// Exact size of one `amdsmi_proc_info_t` (§3.10): 224 before 6.4, 704 from 6.4.
    pub fn proc_stride(self) -> usize {
        if self.wide_strings() { 704 } else { 224 }
    }
}

/// Bytes of `amdsmi_version_t` that carry data (both layouts are 24 bytes).
pub const VERSION_BYTES: usize = 24;

/// Decodes `amdsmi_version_t` and chooses the layout from its numbers.
///
/// `build` is the already copied-out build string. On failure the first `u32`
/// (the word that did not match any known family) is returned.
pub fn decode_version(bytes: &[u8], build: Option<String>) -> Result<(LibVersion, Layout), u32> {
    let bytes = bytes.get(..VERSION_BYTES).unwrap_or(bytes);
    let w0 = u32_at(bytes, 0);
    let build = build.map(|b| b.trim().to_owned()).filter(|b| !b.is_empty());
    let (version, layout) = match w0 {
        24 | 25 => {
            let major = u32_at(bytes, 4);
            let layout = match (w0, major) {
                (25, _) => Layout::V6_4,
                (_, m) if m <= 6 => Layout::V6_2,
                _ => Layout::V6_3,
            };
            let version = LibVersion {
                year: Some(w0),
                major,
                minor: u32_at(bytes, 8),
                release: u32_at(bytes, 12),
                build,
            };
            (version, layout)
        }
        26 | 27 => {
            let minor = u32_at(bytes, 4);
            let layout = match (w0, minor) {
                (27, _) => Layout::V10_0,
                (_, m) if m < 5 => Layout::V7_0,
                _ => Layout::V7_13,
            };
            let version = LibVersion {
                year: None,
                major: w0,
                minor,
                release: u32_at(bytes, 8),
                build,
            };
            (version, layout)
        }
        other => return Err(other),
    };
    Ok((version, layout))
}

/// Raises a 6.x layout to what the exported symbols prove (§1.3 step 4).
///
/// Symbols never move the family: a 7.x layout is returned unchanged.
pub fn refine(layout: Layout, has_symbol: impl Fn(&str) -> bool) -> Layout {
    if layout.family() != Family::V6 {
        return layout;
    }
    let mut refined = layout;
    if has_symbol(KFD_INFO_SYMBOL) {
        refined = refined.max(Layout::V6_3);
    }
    if has_symbol(ENUMERATION_INFO_SYMBOL) {
        refined = refined.max(Layout::V6_4);
    }
    refined
}

/// Formats an `amdsmi_bdf_t` (§3.1) as `dddd:bb:dd.f`.
pub fn format_bdf(bdf: u64) -> String {
    let function = bdf & 0x7;
    let device = (bdf >> 3) & 0x1f;
    let bus = (bdf >> 8) & 0xff;
    let domain = bdf >> 16;
    format!("{domain:04x}:{bus:02x}:{device:02x}.{function:x}")
}

/// Partition id from `amdsmi_get_gpu_bdf_id` (§4.5): bits 31:28.
pub fn bdf_id_partition(bdf_id: u64) -> u32 {
    u32::try_from((bdf_id >> 28) & 0xf).unwrap_or(0)
}

/// Native-endian `u32` at `offset`, or 0 when the buffer is too short.
pub fn u32_at(bytes: &[u8], offset: usize) -> u32 {
    array_at(bytes, offset).map_or(0, u32::from_ne_bytes)
}

/// Native-endian `u64` at `offset`, or 0 when the buffer is too short.
pub fn u64_at(bytes: &[u8], offset: usize) -> u64 {
    array_at(bytes, offset).map_or(0, u64::from_ne_bytes)
}

fn array_at<const N: usize>(bytes: &[u8], offset: usize) -> Option<[u8; N]> {
    let end = offset.checked_add(N)?;
    bytes.get(offset..end)?.try_into().ok()
}

/// A fixed-size `char[len]` at `offset`: up to the first NUL, lossy UTF-8, trimmed.
pub fn cstr_at(bytes: &[u8], offset: usize, len: usize) -> String {
    let end = offset.saturating_add(len).min(bytes.len());
    let field = bytes.get(offset..end).unwrap_or_default();
    let used = field
        .iter()
        .position(|&b| b == 0)
        .map_or(field, |nul| &field[..nul]);
    String::from_utf8_lossy(used).trim().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(ws: &[u32]) -> Vec<u8> {
        let mut b: Vec<u8> = ws.iter().flat_map(|w| w.to_ne_bytes()).collect();
        b.resize(VERSION_BYTES, 0);
        b
    }

    fn layout_of(ws: &[u32]) -> Layout {
        decode_version(&words(ws), None).expect("known version").1
    }

    #[test]
    fn six_x_versions() {
        let (v, l) = decode_version(&words(&[24, 6, 2, 0]), Some(" 24.6.2.0 ".into())).unwrap();
        assert_eq!(l, Layout::V6_2);
        assert_eq!(
            v,
            LibVersion {
                year: Some(24),
                major: 6,
                minor: 2,
                release: 0,
                build: Some("24.6.2.0".into())
            }
        );
        assert_eq!(layout_of(&[24, 5, 0, 0]), Layout::V6_2);
        assert_eq!(layout_of(&[24, 7, 0, 0]), Layout::V6_3);
        assert_eq!(layout_of(&[24, 8, 1, 0]), Layout::V6_3);
        assert_eq!(layout_of(&[25, 3, 0, 0]), Layout::V6_4);
        assert_eq!(layout_of(&[25, 0, 0, 0]).family(), Family::V6);
    }

    #[test]
    fn seven_x_versions() {
        let (v, l) = decode_version(&words(&[26, 1, 3]), Some(String::new())).unwrap();
        assert_eq!(l, Layout::V7_0);
        assert_eq!(
            v,
            LibVersion {
                year: None,
                major: 26,
                minor: 1,
                release: 3,
                build: None
            }
        );
        assert_eq!(layout_of(&[26, 0, 0]), Layout::V7_0);
        assert_eq!(layout_of(&[26, 4, 9]), Layout::V7_0);
        assert_eq!(layout_of(&[26, 5, 0]), Layout::V7_13);
        assert_eq!(layout_of(&[26, 12, 0]), Layout::V7_13);
        assert_eq!(layout_of(&[27, 0, 0]), Layout::V10_0);
        assert_eq!(Layout::V10_0.family(), Family::V7);
    }

    #[test]
    fn unknown_words_are_refused() {
        for w in [0, 1, 6, 23, 28, 1000] {
            assert_eq!(decode_version(&words(&[w, 6, 2]), None), Err(w));
        }
        assert_eq!(decode_version(&[], None), Err(0));
    }

    #[test]
    fn symbols_raise_six_x_but_never_move_the_family() {
        let none = |_: &str| false;
        let kfd = |s: &str| s == KFD_INFO_SYMBOL;
        let all = |s: &str| s == KFD_INFO_SYMBOL || s == ENUMERATION_INFO_SYMBOL;
        assert_eq!(refine(Layout::V6_2, none), Layout::V6_2);
        assert_eq!(refine(Layout::V6_2, kfd), Layout::V6_3);
        assert_eq!(refine(Layout::V6_2, all), Layout::V6_4);
        assert_eq!(refine(Layout::V6_3, kfd), Layout::V6_3);
        assert_eq!(refine(Layout::V6_4, none), Layout::V6_4);
        assert_eq!(refine(Layout::V7_0, all), Layout::V7_0);
        assert_eq!(refine(Layout::V7_13, none), Layout::V7_13);
    }

    #[test]
    fn layout_properties() {
        assert_eq!(Layout::V6_2.proc_stride(), 224);
        assert_eq!(Layout::V6_3.proc_stride(), 224);
        for l in [Layout::V6_4, Layout::V7_0, Layout::V7_13, Layout::V10_0] {
            assert_eq!(l.proc_stride(), 704);
            assert!(l.wide_strings());
        }
        assert_eq!(Layout::V7_13.name(), "7.13");
        assert_eq!(Layout::V6_2.family(), Family::V6);
    }

    #[test]
    fn bdf_formatting() {
        let bdf = (0x0001_u64 << 16) | (0xc1 << 8) | (0x1f << 3) | 0x7;
        assert_eq!(format_bdf(bdf), "0001:c1:1f.7");
        assert_eq!(format_bdf(0x05 << 8), "0000:05:00.0");
        assert_eq!(format_bdf(0x1_0000_0000 << 16), "100000000:00:00.0");
    }

    #[test]
    fn bdf_id_partition_bits() {
        let id = (0x0001_u64 << 32) | (5 << 28) | (0x05 << 8);
        assert_eq!(bdf_id_partition(id), 5);
        assert_eq!(bdf_id_partition(0xffff_ffff_0fff_ffff), 0);
        assert_eq!(bdf_id_partition(0xf000_0000), 15);
    }

    #[test]
    fn readers_tolerate_short_buffers() {
        let b = [1, 0, 0, 0, 2, 0];
        assert_eq!(u32_at(&b, 0), 1);
        assert_eq!(u32_at(&b, 4), 0);
        assert_eq!(u64_at(&b, 0), 0);
        assert_eq!(u32_at(&b, usize::MAX), 0);
        assert_eq!(cstr_at(&b, 10, 4), "");
    }

    #[test]
    fn c_strings() {
        let mut b = vec![0u8; 16];
        b[..7].copy_from_slice(b" MI300\0");
        b[7..11].copy_from_slice(b"junk");
        assert_eq!(cstr_at(&b, 0, 16), "MI300");
        let full = b"ABCDEFGH";
        assert_eq!(cstr_at(full, 0, 4), "ABCD");
        assert_eq!(cstr_at(&[0xff, b'x', 0], 0, 3), "\u{fffd}x");
        assert_eq!(cstr_at(full, 6, 64), "GH");
    }
}
