//! `amdsmi_status_t` values and their symbolic names (docs/amd-hardware.md §5).

use super::layout::Family;

/// `AMDSMI_STATUS_SUCCESS`.
pub const SUCCESS: u32 = 0;
/// `AMDSMI_STATUS_INVAL`: bad argument or buffer too small.
pub const INVAL: u32 = 1;
/// `AMDSMI_STATUS_OUT_OF_RESOURCES`: a list buffer was too small.
pub const OUT_OF_RESOURCES: u32 = 15;
/// `AMDSMI_STATUS_BUSY`: retryable with backoff.
pub const BUSY: u32 = 30;
/// `AMDSMI_STATUS_NOT_INIT`: the call needs `amdsmi_init` first.
pub const NOT_INIT: u32 = 32;
/// `AMDSMI_STATUS_MORE_DATA` on 6.x libraries.
pub const MORE_DATA_6X: u32 = 57;
/// `AMDSMI_STATUS_MORE_DATA` from 7.0 on.
pub const MORE_DATA_7X: u32 = 39;

/// Codes whose number never changed (everything except MORE_DATA).
const STABLE: &[(u32, &str)] = &[
    (0, "SUCCESS"),
    (1, "INVAL"),
    (2, "NOT_SUPPORTED"),
    (3, "NOT_YET_IMPLEMENTED"),
    (4, "FAIL_LOAD_MODULE"),
    (5, "FAIL_LOAD_SYMBOL"),
    (6, "DRM_ERROR"),
    (7, "API_FAILED"),
    (8, "TIMEOUT"),
    (9, "RETRY"),
    (10, "NO_PERM"),
    (11, "INTERRUPT"),
    (12, "IO"),
    (13, "ADDRESS_FAULT"),
    (14, "FILE_ERROR"),
    (15, "OUT_OF_RESOURCES"),
    (16, "INTERNAL_EXCEPTION"),
    (17, "INPUT_OUT_OF_BOUNDS"),
    (18, "INIT_ERROR"),
    (19, "REFCOUNT_OVERFLOW"),
    (20, "DIRECTORY_NOT_FOUND"),
    (21, "IPC_ERROR"),
    (30, "BUSY"),
    (31, "NOT_FOUND"),
    (32, "NOT_INIT"),
    (33, "NO_SLOT"),
    (34, "DRIVER_NOT_LOADED"),
    (40, "NO_DATA"),
    (41, "INSUFFICIENT_SIZE"),
    (42, "UNEXPECTED_SIZE"),
    (43, "UNEXPECTED_DATA"),
    (54, "AMDGPU_RESTART_ERR"),
    (55, "SETTING_UNAVAILABLE"),
    (56, "CORRUPTED_EEPROM"),
    (0xFFFF_FFFE, "MAP_ERROR"),
    (0xFFFF_FFFF, "UNKNOWN_ERROR"),
];

/// Symbolic name of `status` (without the `AMDSMI_STATUS_` prefix).
///
/// `family` decides the one renumbered code, MORE_DATA (57 on 6.x, 39 on 7.x).
/// Before the version is known (`None`) both numbers read as MORE_DATA.
/// Codes the doc does not name (44–53 are CPU/esmi codes) read as `STATUS_<n>`.
pub fn status_name(status: u32, family: Option<Family>) -> String {
    let more_data = match family {
        Some(Family::V6) => status == MORE_DATA_6X,
        Some(Family::V7) => status == MORE_DATA_7X,
        None => status == MORE_DATA_6X || status == MORE_DATA_7X,
    };
    if more_data {
        return "MORE_DATA".to_owned();
    }
    STABLE.iter().find(|(code, _)| *code == status).map_or_else(
        || format!("STATUS_{status}"),
        |(_, name)| (*name).to_owned(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_common_codes() {
        assert_eq!(status_name(SUCCESS, None), "SUCCESS");
        assert_eq!(status_name(INVAL, Some(Family::V6)), "INVAL");
        assert_eq!(status_name(2, Some(Family::V7)), "NOT_SUPPORTED");
        assert_eq!(status_name(10, None), "NO_PERM");
        assert_eq!(status_name(OUT_OF_RESOURCES, None), "OUT_OF_RESOURCES");
        assert_eq!(status_name(18, None), "INIT_ERROR");
        assert_eq!(status_name(BUSY, None), "BUSY");
        assert_eq!(status_name(NOT_INIT, None), "NOT_INIT");
        assert_eq!(status_name(41, None), "INSUFFICIENT_SIZE");
        assert_eq!(status_name(55, None), "SETTING_UNAVAILABLE");
        assert_eq!(status_name(u32::MAX, None), "UNKNOWN_ERROR");
        assert_eq!(status_name(0xFFFF_FFFE, None), "MAP_ERROR");
    }

    #[test]
    fn more_data_follows_the_family() {
        assert_eq!(status_name(57, Some(Family::V6)), "MORE_DATA");
        assert_eq!(status_name(39, Some(Family::V6)), "STATUS_39");
        assert_eq!(status_name(39, Some(Family::V7)), "MORE_DATA");
        assert_eq!(status_name(57, Some(Family::V7)), "STATUS_57");
        assert_eq!(status_name(39, None), "MORE_DATA");
        assert_eq!(status_name(57, None), "MORE_DATA");
    }

    #[test]
    fn unnamed_codes_keep_their_number() {
        assert_eq!(status_name(44, None), "STATUS_44");
        assert_eq!(status_name(99, Some(Family::V7)), "STATUS_99");
    }

    #[test]
    fn table_has_no_duplicate_codes() {
        let mut codes: Vec<u32> = STABLE.iter().map(|(c, _)| *c).collect();
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), STABLE.len());
    }
}
