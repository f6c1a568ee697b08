//! A fake `libamd_smi.so` for tests: exports the AMD SMI C symbols the daemon
//! uses and answers from the JSON fixture named by `FAKE_AMDSMI_FIXTURE`,
//! writing out-structs in the layout of the fixture's ABI. See README.md for
//! the fixture format and `docs/amd-hardware.md` §1–5 and §11 for the facts.
//!
//! Every exported function is `unsafe extern "C"`: its pointer arguments are
//! trusted to be null or valid for the documented struct size, as with the
//! real library.
#![allow(unsafe_code)]

mod ffi;
mod fixture;
mod gpu;
mod host;
mod layout;
mod state;
mod status;
mod usage;
mod uuid;

use std::{
    ffi::{c_char, c_uint, c_void},
    io::Write as _,
};

use ffi::{Need, call, get, put, put_slice};
use fixture::{Abi, Loaded};
use layout::Version;

/// `AMDSMI_GPU_UUID_SIZE`.
const UUID_SIZE: u32 = 38;
/// `AMDSMI_PROCESSOR_TYPE_AMD_GPU`.
const PROCESSOR_AMD_GPU: u32 = 1;

/// Initializes the library: (re)loads the fixture and counts the call.
#[unsafe(no_mangle)]
pub extern "C" fn amdsmi_init(init_flags: u64) -> u32 {
    let _ = init_flags;
    ffi::guarded(|| {
        let mut guard = state::lock();
        if let Err(e) = guard.refresh() {
            let _ = writeln!(std::io::stderr(), "{e}");
            return status::INIT_ERROR;
        }
        let mut guard = match ffi::gate(guard, "amdsmi_init") {
            Ok(guard) => guard,
            Err(code) => return code,
        };
        match guard.init() {
            Ok(()) => status::SUCCESS,
            Err(code) => code,
        }
    })
}

/// Tears down (6.x: at once; 7.x: on the last of the counted inits).
#[unsafe(no_mangle)]
pub extern "C" fn amdsmi_shut_down() -> u32 {
    call("amdsmi_shut_down", Need::Nothing, |st| {
        st.shut_down();
        Ok(())
    })
}

/// The `version` of the fixture, with per-ABI defaults, and its build string.
fn lib_version(loaded: &Loaded) -> (Version, String) {
    let abi = loaded.abi;
    let v = &loaded.fixture.version;
    let (year, major, minor) = match abi {
        Abi::V6_2 => (24, 6, 2),
        Abi::V6_3 => (24, 6, 3),
        Abi::V6_4 => (25, 6, 4),
        Abi::V7_0 => (0, 26, 0),
        Abi::V7_13 => (0, 26, 5),
    };
    let version = Version {
        year: v.year.unwrap_or(year),
        major: v.major.unwrap_or(major),
        minor: v.minor.unwrap_or(minor),
        release: v.release.unwrap_or(0),
    };
    let build = v.build.clone().unwrap_or_else(|| match abi {
        Abi::V6_2 | Abi::V6_3 => format!(
            "{}.{}.{}.{}",
            version.year, version.major, version.minor, version.release
        ),
        _ => format!("{}.{}.{}", version.major, version.minor, version.release),
    });
    (version, build)
}

/// Writes `amdsmi_version_t`; needs init on 6.2 and 6.3 only.
///
/// # Safety
/// `version` is null or valid for 24 bytes of writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn amdsmi_get_lib_version(version: *mut u8) -> u32 {
    call("amdsmi_get_lib_version", Need::Nothing, |st| {
        let loaded = st.loaded()?;
        if loaded.abi <= Abi::V6_3 {
            st.require_init()?;
        }
        let (numbers, build) = lib_version(loaded);
        let build = state::intern(&build).as_ptr().expose_provenance();
        let img = layout::version(loaded.abi, numbers, build);
        // SAFETY: the caller passes null or a 24-byte `amdsmi_version_t`.
        unsafe { put_slice(version, img.bytes()) }
    })
}

/// A static description of `status`; `UNKNOWN_ERROR` for unknown codes.
/// Works without init and without a fixture.
///
/// # Safety
/// `out` is null or valid for the write of one pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn amdsmi_status_code_to_string(status: u32, out: *mut *const c_char) -> u32 {
    ffi::guarded(|| {
        let mut guard = state::lock();
        let _ = guard.refresh();
        if let Err(code) = ffi::gate(guard, "amdsmi_status_code_to_string") {
            return code;
        }
        let (text, code) = match status::describe(status) {
            Some(text) => (text, status::SUCCESS),
            None => (status::UNKNOWN_CODE_STRING, status::UNKNOWN_ERROR),
        };
        // SAFETY: the caller passes null or a valid `const char**`.
        match unsafe { put(out, text.as_ptr()) } {
            Ok(()) => code,
            Err(code) => code,
        }
    })
}

/// Count-then-fill of the socket handles (docs/amd-hardware.md §4.1).
///
/// # Safety
/// `count` is null or a valid `u32`; `list` is null or holds `*count` handles.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn amdsmi_get_socket_handles(count: *mut u32, list: *mut *mut c_void) -> u32 {
    call("amdsmi_get_socket_handles", Need::Init, |st| {
        let handles = st.socket_handles()?;
        // SAFETY: forwarded from this function's contract.
        unsafe { ffi::fill_counted(count, list, &handles) }
    })
}

/// Count-then-fill of the processor handles of one socket (docs/amd-hardware.md §4.1).
///
/// # Safety
/// `count` is null or a valid `u32`; `list` is null or holds `*count` handles.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn amdsmi_get_processor_handles(
    socket: *mut c_void,
    count: *mut u32,
    list: *mut *mut c_void,
) -> u32 {
    call("amdsmi_get_processor_handles", Need::Init, |st| {
        let handles = st.processor_handles(socket)?;
        // SAFETY: forwarded from this function's contract.
        unsafe { ffi::fill_counted(count, list, &handles) }
    })
}

/// Always `AMD_GPU` (1) for a valid handle.
///
/// # Safety
/// `processor_type` is null or a valid `u32`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn amdsmi_get_processor_type(
    handle: *mut c_void,
    processor_type: *mut u32,
) -> u32 {
    call("amdsmi_get_processor_type", Need::Init, |st| {
        st.resolve(handle)?;
        // SAFETY: the caller passes null or a valid `processor_type_t*`.
        unsafe { put(processor_type, PROCESSOR_AMD_GPU) }
    })
}

/// The fixture's `uuid`, else the UUID the release derives (`uuid.rs`); a
/// length under 38 answers `INVAL` and sets it to 38.
///
/// # Safety
/// `uuid_length` is null or a valid `unsigned int`; `uuid` is null or valid
/// for `*uuid_length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn amdsmi_get_gpu_device_uuid(
    handle: *mut c_void,
    uuid_length: *mut c_uint,
    uuid: *mut c_char,
) -> u32 {
    call("amdsmi_get_gpu_device_uuid", Need::Init, |st| {
        let p = st.processor(handle)?;
        // SAFETY: the caller passes null or a valid `unsigned int*`.
        let capacity = unsafe { get(uuid_length) }?;
        if capacity < UUID_SIZE {
            // SAFETY: as above.
            unsafe { put(uuid_length, UUID_SIZE) }?;
            return Err(status::INVAL);
        }
        let abi = st.loaded()?.abi;
        let text = match &p.uuid {
            Some(text) => text.clone(),
            None => uuid::derived(abi, p).ok_or(status::NOT_SUPPORTED)?,
        };
        let keep = usize::try_from(capacity - 1).unwrap_or(usize::MAX);
        let mut bytes: Vec<u8> = text.bytes().take(keep).collect();
        bytes.push(0);
        // SAFETY: `bytes.len() <= capacity` and `uuid` holds `capacity` bytes.
        unsafe { put_slice(uuid.cast::<u8>(), &bytes) }
    })
}

/// The plain PCI BDF (docs/amd-hardware.md §3.1), the same for every partition.
///
/// # Safety
/// `bdf` is null or a valid `amdsmi_bdf_t*`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn amdsmi_get_gpu_device_bdf(handle: *mut c_void, bdf: *mut u64) -> u32 {
    call("amdsmi_get_gpu_device_bdf", Need::Init, |st| {
        let value = st.processor(handle)?.pci.as_u64();
        // SAFETY: the caller passes null or a valid `amdsmi_bdf_t*`.
        unsafe { put(bdf, value) }
    })
}

/// The BDF id with the partition id in bits 31:28 (docs/amd-hardware.md §4.5).
///
/// # Safety
/// `bdf_id` is null or a valid `uint64_t*`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn amdsmi_get_gpu_bdf_id(handle: *mut c_void, bdf_id: *mut u64) -> u32 {
    call("amdsmi_get_gpu_bdf_id", Need::Init, |st| {
        let p = st.processor(handle)?;
        let value = p.pci.id_with_partition(p.partition_id);
        // SAFETY: the caller passes null or a valid `uint64_t*`.
        unsafe { put(bdf_id, value) }
    })
}

/// The processor at `bdf` with partition id 0 (or the first one there).
///
/// # Safety
/// `handle` is null or valid for the write of one pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn amdsmi_get_processor_handle_from_bdf(
    bdf: u64,
    handle: *mut *mut c_void,
) -> u32 {
    call("amdsmi_get_processor_handle_from_bdf", Need::Init, |st| {
        let found = st.handle_from_bdf(bdf)?;
        // SAFETY: the caller passes null or a valid `amdsmi_processor_handle*`.
        unsafe { put(handle, found) }
    })
}

#[cfg(test)]
#[path = "lib_tests.rs"]
mod tests;
