//! `amdsmi_status_t` values (docs/amd-hardware.md §5), their names and the static strings of
//! `amdsmi_status_code_to_string`.

use std::ffi::CStr;

use crate::fixture::Abi;

pub(crate) const SUCCESS: u32 = 0;
pub(crate) const INVAL: u32 = 1;
pub(crate) const NOT_SUPPORTED: u32 = 2;
pub(crate) const NO_PERM: u32 = 10;
pub(crate) const OUT_OF_RESOURCES: u32 = 15;
pub(crate) const INTERNAL_EXCEPTION: u32 = 16;
pub(crate) const INIT_ERROR: u32 = 18;
pub(crate) const REFCOUNT_OVERFLOW: u32 = 19;
pub(crate) const BUSY: u32 = 30;
pub(crate) const NOT_FOUND: u32 = 31;
pub(crate) const NOT_INIT: u32 = 32;
pub(crate) const INSUFFICIENT_SIZE: u32 = 41;
pub(crate) const SETTING_UNAVAILABLE: u32 = 55;
pub(crate) const UNKNOWN_ERROR: u32 = 0xFFFF_FFFF;

/// `MORE_DATA` is 57 on 6.x and was renumbered to 39 in 7.0.
const MORE_DATA_6X: u32 = 57;
const MORE_DATA_7X: u32 = 39;

/// (value, name without the `AMDSMI_STATUS_` prefix, English description).
const TABLE: &[(u32, &str, &CStr)] = &[
    (0, "SUCCESS", c"AMDSMI_STATUS_SUCCESS: Call succeeded"),
    (1, "INVAL", c"AMDSMI_STATUS_INVAL: Invalid parameters"),
    (2, "NOT_SUPPORTED", c"AMDSMI_STATUS_NOT_SUPPORTED: Command not supported"),
    (3, "NOT_YET_IMPLEMENTED", c"AMDSMI_STATUS_NOT_YET_IMPLEMENTED: Not implemented yet"),
    (4, "FAIL_LOAD_MODULE", c"AMDSMI_STATUS_FAIL_LOAD_MODULE: Fail to load lib"),
    (5, "FAIL_LOAD_SYMBOL", c"AMDSMI_STATUS_FAIL_LOAD_SYMBOL: Fail to load symbol"),
    (6, "DRM_ERROR", c"AMDSMI_STATUS_DRM_ERROR: Error when call libdrm"),
    (7, "API_FAILED", c"AMDSMI_STATUS_API_FAILED: API call failed"),
    (8, "TIMEOUT", c"AMDSMI_STATUS_TIMEOUT: Timeout in API call"),
    (9, "RETRY", c"AMDSMI_STATUS_RETRY: Retry operation"),
    (10, "NO_PERM", c"AMDSMI_STATUS_NO_PERM: Permission Denied"),
    (11, "INTERRUPT", c"AMDSMI_STATUS_INTERRUPT: An interrupt occurred during execution"),
    (12, "IO", c"AMDSMI_STATUS_IO: I/O Error"),
    (13, "ADDRESS_FAULT", c"AMDSMI_STATUS_ADDRESS_FAULT: Bad address"),
    (14, "FILE_ERROR", c"AMDSMI_STATUS_FILE_ERROR: Problem accessing a file"),
    (15, "OUT_OF_RESOURCES", c"AMDSMI_STATUS_OUT_OF_RESOURCES: Not enough memory"),
    (16, "INTERNAL_EXCEPTION", c"AMDSMI_STATUS_INTERNAL_EXCEPTION: An internal exception was caught"),
    (17, "INPUT_OUT_OF_BOUNDS", c"AMDSMI_STATUS_INPUT_OUT_OF_BOUNDS: The provided input is out of allowable or safe range"),
    (18, "INIT_ERROR", c"AMDSMI_STATUS_INIT_ERROR: An error occurred when initializing internal data structures"),
    (19, "REFCOUNT_OVERFLOW", c"AMDSMI_STATUS_REFCOUNT_OVERFLOW: An internal reference counter exceeded INT32_MAX"),
    (20, "DIRECTORY_NOT_FOUND", c"AMDSMI_STATUS_DIRECTORY_NOT_FOUND: Error when a directory is not found"),
    (21, "IPC_ERROR", c"AMDSMI_STATUS_IPC_ERROR: Inter-process communication error"),
    (30, "BUSY", c"AMDSMI_STATUS_BUSY: Processor busy"),
    (31, "NOT_FOUND", c"AMDSMI_STATUS_NOT_FOUND: Processor Not found"),
    (32, "NOT_INIT", c"AMDSMI_STATUS_NOT_INIT: Processor not initialized"),
    (33, "NO_SLOT", c"AMDSMI_STATUS_NO_SLOT: No more free slot"),
    (34, "DRIVER_NOT_LOADED", c"AMDSMI_STATUS_DRIVER_NOT_LOADED: Processor driver not loaded"),
    (MORE_DATA_7X, "MORE_DATA", c"AMDSMI_STATUS_MORE_DATA: There is more data than the buffer size the user passed"),
    (40, "NO_DATA", c"AMDSMI_STATUS_NO_DATA: No data was found for a given input"),
    (41, "INSUFFICIENT_SIZE", c"AMDSMI_STATUS_INSUFFICIENT_SIZE: Not enough resources were available for the operation"),
    (42, "UNEXPECTED_SIZE", c"AMDSMI_STATUS_UNEXPECTED_SIZE: An unexpected amount of data was read"),
    (43, "UNEXPECTED_DATA", c"AMDSMI_STATUS_UNEXPECTED_DATA: The data read or provided to function is not what was expected"),
    (54, "AMDGPU_RESTART_ERR", c"AMDSMI_STATUS_AMDGPU_RESTART_ERR: AMDGPU restart failed"),
    (55, "SETTING_UNAVAILABLE", c"AMDSMI_STATUS_SETTING_UNAVAILABLE: Setting is not available"),
    (56, "CORRUPTED_EEPROM", c"AMDSMI_STATUS_CORRUPTED_EEPROM: EEPROM is corrupted"),
    (MORE_DATA_6X, "MORE_DATA", c"AMDSMI_STATUS_MORE_DATA: There is more data than the buffer size the user passed"),
    (0xFFFF_FFFE, "MAP_ERROR", c"AMDSMI_STATUS_MAP_ERROR: The internal library error did not map to a status code"),
    (UNKNOWN_ERROR, "UNKNOWN_ERROR", c"AMDSMI_STATUS_UNKNOWN_ERROR: An unknown error occurred"),
];

/// The string `amdsmi_status_code_to_string` answers for a code it does not know.
pub(crate) const UNKNOWN_CODE_STRING: &CStr = c"An unknown error occurred";

/// The static description of a known status code.
pub(crate) fn describe(code: u32) -> Option<&'static CStr> {
    TABLE
        .iter()
        .find(|(value, _, _)| *value == code)
        .map(|(_, _, text)| *text)
}

/// Parses a status given by name (`"BUSY"`, also `"AMDSMI_STATUS_BUSY"`) or
/// as a decimal / `0x` hex number. `MORE_DATA` follows the ABI's numbering.
pub(crate) fn parse(text: &str, abi: Abi) -> Option<u32> {
    let name = text.trim();
    let name = name.strip_prefix("AMDSMI_STATUS_").unwrap_or(name);
    if name == "MORE_DATA" {
        return Some(if abi >= Abi::V7_0 {
            MORE_DATA_7X
        } else {
            MORE_DATA_6X
        });
    }
    if let Some((value, _, _)) = TABLE.iter().find(|(_, n, _)| *n == name) {
        return Some(*value);
    }
    if let Some(hex) = name.strip_prefix("0x").or_else(|| name.strip_prefix("0X")) {
        return u32::from_str_radix(hex, 16).ok();
    }
    name.parse::<u32>().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_numbers_and_prefixes() {
        assert_eq!(parse("BUSY", Abi::V7_0), Some(BUSY));
        assert_eq!(parse("AMDSMI_STATUS_NO_PERM", Abi::V6_2), Some(NO_PERM));
        assert_eq!(parse("NOT_SUPPORTED", Abi::V6_4), Some(NOT_SUPPORTED));
        assert_eq!(parse("INIT_ERROR", Abi::V6_4), Some(INIT_ERROR));
        assert_eq!(
            parse("SETTING_UNAVAILABLE", Abi::V6_4),
            Some(SETTING_UNAVAILABLE)
        );
        assert_eq!(parse("30", Abi::V6_4), Some(30));
        assert_eq!(parse("0xFFFFFFFF", Abi::V6_4), Some(UNKNOWN_ERROR));
        assert_eq!(parse("hang", Abi::V6_4), None);
        assert_eq!(parse("BUSYX", Abi::V6_4), None);
    }

    #[test]
    fn more_data_follows_the_abi() {
        assert_eq!(parse("MORE_DATA", Abi::V6_4), Some(57));
        assert_eq!(parse("MORE_DATA", Abi::V7_0), Some(39));
        assert_eq!(parse("MORE_DATA", Abi::V7_13), Some(39));
    }

    #[test]
    fn describes_known_codes_only() {
        assert_eq!(describe(BUSY), Some(c"AMDSMI_STATUS_BUSY: Processor busy"));
        assert!(describe(SUCCESS).is_some());
        assert!(describe(UNKNOWN_ERROR).is_some());
        assert_eq!(describe(12345), None);
        // Every name in the table round-trips through `parse`.
        for (value, name, _) in TABLE {
            if *name != "MORE_DATA" {
                assert_eq!(parse(name, Abi::V7_0), Some(*value), "{name}");
            }
        }
    }
}
