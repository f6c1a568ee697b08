//! The only code that calls into `libamd_smi.so` (docs/amd-hardware.md §4).
//!
//! Symbols are resolved once with `libloading`; the library is never unloaded (§12.7), so the
//! copied function pointers stay valid for the life of the (child) process. Every out-struct is
//! a zeroed, 8-byte-aligned heap buffer far larger than any known layout (§12.1) and is handed
//! back as plain bytes for `decode.rs` to read by offset. C enums travel as `u32`, the BDF as
//! `u64`, handles as `*mut c_void`.
#![allow(unsafe_code)]

use std::{
    ffi::{CStr, OsStr, c_char, c_uint, c_void},
    marker::PhantomData,
    ptr,
};

use super::{
    layout::{cstr_at, u32_at, u64_at},
    status,
};

/// Bytes given to every single out-struct (the largest known one is 896 bytes).
const STRUCT_BUF: usize = 4096;
/// Bytes given to the profile config (39168 bytes at 6.4/7.0).
const PROFILE_CONFIG_BUF: usize = 48 * 1024;
/// Bytes for `amdsmi_get_gpu_device_uuid` (needs at least 38).
const UUID_BUF: usize = 64;
/// Length passed to the partition-mode string getters.
const MODE_STRING_LEN: u32 = 32;
/// Entries of the accelerator profile's `partition_id` out-array we allocate (8 are used).
const PARTITION_IDS_BUF: usize = 64;
/// Extra, uncounted entries behind every handle array.
const HANDLE_SLACK: usize = 8;
const PROFILE: &str = "amdsmi_get_gpu_accelerator_partition_profile";
const PROFILE_CONFIG: &str = "amdsmi_get_gpu_accelerator_partition_profile_config";
pub const SET_PROFILE: &str = "amdsmi_set_gpu_accelerator_partition_profile";

type GetLibVersion = unsafe extern "C" fn(*mut u8) -> u32;
type Init = unsafe extern "C" fn(u64) -> u32;
type ShutDown = unsafe extern "C" fn() -> u32;
type StatusToString = unsafe extern "C" fn(u32, *mut *const c_char) -> u32;
type GetSocketHandles = unsafe extern "C" fn(*mut u32, *mut *mut c_void) -> u32;
type GetProcessorHandles = unsafe extern "C" fn(*mut c_void, *mut u32, *mut *mut c_void) -> u32;
type GetU32 = unsafe extern "C" fn(*mut c_void, *mut u32) -> u32;
type GetU64 = unsafe extern "C" fn(*mut c_void, *mut u64) -> u32;
type GetUuid = unsafe extern "C" fn(*mut c_void, *mut c_uint, *mut c_char) -> u32;
type GetStruct = unsafe extern "C" fn(*mut c_void, *mut u8) -> u32;
type GetMemoryTotal = unsafe extern "C" fn(*mut c_void, u32, *mut u64) -> u32;
type GetString = unsafe extern "C" fn(*mut c_void, *mut c_char, u32) -> u32;
type GetProfile = unsafe extern "C" fn(*mut c_void, *mut u8, *mut u32) -> u32;
type GetProcessList = unsafe extern "C" fn(*mut c_void, *mut u32, *mut u8) -> u32;
type SetU32 = unsafe extern "C" fn(*mut c_void, u32) -> u32;

/// Why a call produced no value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallFail {
    /// The library returned this non-SUCCESS status.
    Status(u32),
    /// The library does not export this (optional) symbol.
    Missing(&'static str),
}

/// Why [`Library::open`] failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpenError {
    /// `dlopen` failed; its message, verbatim.
    Load(String),
    /// A required symbol is absent.
    MissingSymbol(&'static str),
}

/// Result of a count-then-fill call: the status, the count the library wrote back, and the
/// entries that fit in the buffer.
#[derive(Debug)]
pub struct Filled<T> {
    pub status: u32,
    pub count: u32,
    pub items: T,
}

/// `amdsmi_get_lib_version` output: status, the raw struct bytes, and the copied build string.
#[derive(Debug)]
pub struct VersionRaw {
    pub status: u32,
    pub bytes: Vec<u8>,
    pub build: Option<String>,
}

struct Symbols {
    get_lib_version: GetLibVersion,
    init: Init,
    shut_down: ShutDown,
    status_code_to_string: StatusToString,
    get_socket_handles: Option<GetSocketHandles>,
    get_processor_handles: Option<GetProcessorHandles>,
    get_processor_type: Option<GetU32>,
    get_gpu_device_uuid: Option<GetUuid>,
    get_gpu_device_bdf: Option<GetU64>,
    get_gpu_bdf_id: Option<GetU64>,
    get_gpu_asic_info: Option<GetStruct>,
    get_gpu_memory_total: Option<GetMemoryTotal>,
    get_gpu_kfd_info: Option<GetStruct>,
    get_gpu_enumeration_info: Option<GetStruct>,
    get_gpu_compute_partition: Option<GetString>,
    get_gpu_memory_partition: Option<GetString>,
    get_gpu_accelerator_partition_profile: Option<GetProfile>,
    get_gpu_accelerator_partition_profile_config: Option<GetStruct>,
    get_gpu_process_list: Option<GetProcessList>,
    set_gpu_accelerator_partition_profile: Option<SetU32>,
    get_gpu_activity: Option<GetStruct>,
    get_gpu_vram_usage: Option<GetStruct>,
}

/// Resolves `name` as a `T`.
///
/// # Safety
/// `T` must be the fn-pointer type of the C symbol `name`, and the library must never be
/// unloaded (the pointer is copied out of its `Symbol` guard).
unsafe fn symbol<T: Copy>(lib: &libloading::Library, name: &str) -> Option<T> {
    // SAFETY: forwarded from this function's contract.
    unsafe { lib.get::<T>(name.as_bytes()) }.ok().map(|s| *s)
}

impl Symbols {
    /// Resolves every symbol the probe uses. The caller must never unload `lib`.
    fn resolve(lib: &libloading::Library) -> Result<Self, OpenError> {
        let required = |name: &'static str| OpenError::MissingSymbol(name);
        // SAFETY: every symbol is resolved with the fn-pointer type of its C signature in
        // docs/amd-hardware.md §4 (the type aliases above), and `Library::open` forgets
        // `lib`, so it is never unloaded.
        unsafe {
            Ok(Self {
                get_lib_version: symbol(lib, "amdsmi_get_lib_version")
                    .ok_or_else(|| required("amdsmi_get_lib_version"))?,
                init: symbol(lib, "amdsmi_init").ok_or_else(|| required("amdsmi_init"))?,
                shut_down: symbol(lib, "amdsmi_shut_down")
                    .ok_or_else(|| required("amdsmi_shut_down"))?,
                status_code_to_string: symbol(lib, "amdsmi_status_code_to_string")
                    .ok_or_else(|| required("amdsmi_status_code_to_string"))?,
                get_socket_handles: symbol(lib, "amdsmi_get_socket_handles"),
                get_processor_handles: symbol(lib, "amdsmi_get_processor_handles"),
                get_processor_type: symbol(lib, "amdsmi_get_processor_type"),
                get_gpu_device_uuid: symbol(lib, "amdsmi_get_gpu_device_uuid"),
                get_gpu_device_bdf: symbol(lib, "amdsmi_get_gpu_device_bdf"),
                get_gpu_bdf_id: symbol(lib, "amdsmi_get_gpu_bdf_id"),
                get_gpu_asic_info: symbol(lib, "amdsmi_get_gpu_asic_info"),
                get_gpu_memory_total: symbol(lib, "amdsmi_get_gpu_memory_total"),
                get_gpu_kfd_info: symbol(lib, "amdsmi_get_gpu_kfd_info"),
                get_gpu_enumeration_info: symbol(lib, "amdsmi_get_gpu_enumeration_info"),
                get_gpu_compute_partition: symbol(lib, "amdsmi_get_gpu_compute_partition"),
                get_gpu_memory_partition: symbol(lib, "amdsmi_get_gpu_memory_partition"),
                get_gpu_accelerator_partition_profile: symbol(lib, PROFILE),
                get_gpu_accelerator_partition_profile_config: symbol(lib, PROFILE_CONFIG),
                get_gpu_process_list: symbol(lib, "amdsmi_get_gpu_process_list"),
                set_gpu_accelerator_partition_profile: symbol(lib, SET_PROFILE),
                get_gpu_activity: symbol(lib, usage::GPU_ACTIVITY),
                get_gpu_vram_usage: symbol(lib, usage::GPU_VRAM_USAGE),
            })
        }
    }
}

/// A loaded, never-unloaded `libamd_smi.so` with its symbols resolved.
pub struct Library {
    syms: Symbols,
}

/// A zeroed, 8-byte-aligned heap buffer for one out-struct.
struct OutBuf(Vec<u64>);

impl OutBuf {
    fn zeroed(bytes: usize) -> Self {
        Self(vec![0; bytes.div_ceil(8)])
    }
    fn ptr(&mut self) -> *mut u8 {
        self.0.as_mut_ptr().cast()
    }
    fn len(&self) -> usize {
        self.0.len() * 8
    }
    fn into_bytes(self) -> Vec<u8> {
        self.0.iter().flat_map(|w| w.to_ne_bytes()).collect()
    }
}

fn check(status: u32) -> Result<(), CallFail> {
    if status == status::SUCCESS {
        Ok(())
    } else {
        Err(CallFail::Status(status))
    }
}

fn present<T>(f: Option<T>, name: &'static str) -> Result<T, CallFail> {
    f.ok_or(CallFail::Missing(name))
}

impl Library {
    /// `dlopen`s `path` (a file path, or a bare soname for the loader to search) and resolves
    /// the symbols. The library is never closed, even when a required symbol is missing.
    pub fn open(path: &OsStr) -> Result<Self, OpenError> {
        // SAFETY: loading runs the library's ELF initialisers, which is the accepted risk of
        // using AMD SMI at all; this only ever runs in the sacrificial probe child (§12.6).
        let lib = unsafe { libloading::Library::new(path) }
            .map_err(|e| OpenError::Load(e.to_string()))?;
        let syms = Symbols::resolve(&lib);
        // Never dlclose: static destructors and library threads (§12.7).
        std::mem::forget(lib);
        Ok(Self { syms: syms? })
    }

    /// Whether the library exports `symbol` (only the optional symbols the probe uses).
    pub fn has(&self, symbol: &str) -> bool {
        let s = &self.syms;
        match symbol {
            "amdsmi_get_gpu_kfd_info" => s.get_gpu_kfd_info.is_some(),
            "amdsmi_get_gpu_enumeration_info" => s.get_gpu_enumeration_info.is_some(),
            PROFILE => s.get_gpu_accelerator_partition_profile.is_some(),
            PROFILE_CONFIG => s.get_gpu_accelerator_partition_profile_config.is_some(),
            _ => false,
        }
    }

    /// `amdsmi_get_lib_version` into a zeroed over-sized buffer. The build string is copied
    /// only on SUCCESS and only when the first word is a known family (24..=27), i.e. when
    /// offset 16 is known to hold a `const char*` in both `amdsmi_version_t` layouts.
    pub fn lib_version(&self) -> VersionRaw {
        let mut buf = OutBuf::zeroed(STRUCT_BUF);
        // SAFETY: the function writes one `amdsmi_version_t` (24 bytes) into the pointer,
        // which points at 4096 zeroed, 8-aligned, writable bytes.
        let status = unsafe { (self.syms.get_lib_version)(buf.ptr()) };
        let bytes = buf.into_bytes();
        let known = (24..=27).contains(&u32_at(&bytes, 0));
        let addr = usize::try_from(u64_at(&bytes, 16)).unwrap_or(0);
        let build = (status == status::SUCCESS && known && addr != 0).then(|| {
            let p = ptr::with_exposed_provenance::<c_char>(addr);
            // SAFETY: for a known version layout, offset 16 is `build`, a pointer to a static
            // NUL-terminated string inside the library (§1.2); it is copied, never freed.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        });
        VersionRaw {
            status,
            bytes,
            build,
        }
    }

    /// `amdsmi_status_code_to_string`: the library's English text for `code`.
    pub fn status_text(&self, code: u32) -> Option<String> {
        let mut out: *const c_char = ptr::null();
        // SAFETY: takes a status by value and writes one pointer into `out`, a valid local.
        unsafe { (self.syms.status_code_to_string)(code, &raw mut out) };
        if out.is_null() {
            return None;
        }
        // SAFETY: a non-null result points to a static NUL-terminated string (§4.11).
        let text = unsafe { CStr::from_ptr(out) };
        Some(text.to_string_lossy().into_owned())
    }

    /// `amdsmi_init(flags)`. On SUCCESS the returned session shuts the library down when it
    /// is finished or dropped.
    pub fn init(&self, flags: u64) -> Result<Session<'_>, u32> {
        // SAFETY: takes a plain integer (§4.3); safe to call at any time (§12.3).
        let status = unsafe { (self.syms.init)(flags) };
        if status == status::SUCCESS {
            Ok(Session {
                lib: self,
                done: false,
            })
        } else {
            Err(status)
        }
    }
}

/// An initialised library. Handles borrow the session, so none can outlive `shut_down`.
pub struct Session<'l> {
    lib: &'l Library,
    done: bool,
}

/// An opaque socket or processor handle, valid while its session lives.
#[derive(Debug, Clone, Copy)]
pub struct Handle<'s> {
    raw: *mut c_void,
    _session: PhantomData<&'s ()>,
}

impl Session<'_> {
    /// The library this session belongs to.
    pub fn library(&self) -> &Library {
        self.lib
    }

    /// `amdsmi_shut_down`; returns its status.
    pub fn shut_down(mut self) -> u32 {
        self.done = true;
        // SAFETY: no arguments; `self` is consumed, so no handle of this session survives.
        unsafe { (self.lib.syms.shut_down)() }
    }

    fn handle(&self, raw: *mut c_void) -> Handle<'_> {
        Handle {
            raw,
            _session: PhantomData,
        }
    }

    /// `amdsmi_get_socket_handles` with room for `capacity` handles (0: NULL list, count only).
    pub fn socket_handles(&self, capacity: u32) -> Result<Filled<Vec<Handle<'_>>>, CallFail> {
        let f = present(
            self.lib.syms.get_socket_handles,
            "amdsmi_get_socket_handles",
        )?;
        // SAFETY: `fill_handles` passes a count pointer and a list of at least `count` entries.
        Ok(self.fill_handles(capacity, |count, list| unsafe { f(count, list) }))
    }

    /// `amdsmi_get_processor_handles` of `socket`, like [`Self::socket_handles`].
    pub fn processor_handles(
        &self,
        socket: Handle<'_>,
        capacity: u32,
    ) -> Result<Filled<Vec<Handle<'_>>>, CallFail> {
        let f = present(
            self.lib.syms.get_processor_handles,
            "amdsmi_get_processor_handles",
        )?;
        // SAFETY: as above; `socket` came from this library and the session is alive.
        Ok(self.fill_handles(capacity, |count, list| unsafe {
            f(socket.raw, count, list)
        }))
    }

    fn fill_handles(
        &self,
        capacity: u32,
        call: impl FnOnce(*mut u32, *mut *mut c_void) -> u32,
    ) -> Filled<Vec<Handle<'_>>> {
        let cap = usize::try_from(capacity).unwrap_or(0);
        let mut list = vec![ptr::null_mut::<c_void>(); cap + HANDLE_SLACK];
        let list_ptr = if cap == 0 {
            ptr::null_mut()
        } else {
            list.as_mut_ptr()
        };
        let mut count = capacity;
        let status = call(&raw mut count, list_ptr);
        let n = usize::try_from(count).unwrap_or(usize::MAX).min(cap);
        let items = list.iter().take(n).map(|&raw| self.handle(raw)).collect();
        Filled {
            status,
            count,
            items,
        }
    }

    fn get_u64(
        &self,
        f: Option<GetU64>,
        name: &'static str,
        h: Handle<'_>,
    ) -> Result<u64, CallFail> {
        let f = present(f, name)?;
        let mut out = 0u64;
        // SAFETY: `h` is a live handle of this session; `out` is a valid u64 (§3.1, §4.5).
        check(unsafe { f(h.raw, &raw mut out) })?;
        Ok(out)
    }

    fn get_struct(
        &self,
        f: Option<GetStruct>,
        name: &'static str,
        h: Handle<'_>,
        size: usize,
    ) -> Result<Vec<u8>, CallFail> {
        let f = present(f, name)?;
        let mut buf = OutBuf::zeroed(size);
        // SAFETY: `h` is live; the buffer is zeroed, 8-aligned and larger than any known
        // layout of the struct this symbol writes (§3, §12.1).
        check(unsafe { f(h.raw, buf.ptr()) })?;
        Ok(buf.into_bytes())
    }

    fn get_mode_string(
        &self,
        f: Option<GetString>,
        name: &'static str,
        h: Handle<'_>,
    ) -> Result<String, CallFail> {
        let f = present(f, name)?;
        let mut buf = OutBuf::zeroed(STRUCT_BUF);
        // SAFETY: `h` is live; the library writes at most `MODE_STRING_LEN` bytes (§4.7) into
        // a buffer of 4096 bytes.
        check(unsafe { f(h.raw, buf.ptr().cast(), MODE_STRING_LEN) })?;
        Ok(cstr_at(&buf.into_bytes(), 0, 32))
    }

    /// `amdsmi_get_processor_type` (§2.2).
    pub fn processor_type(&self, h: Handle<'_>) -> Result<u32, CallFail> {
        let f = present(
            self.lib.syms.get_processor_type,
            "amdsmi_get_processor_type",
        )?;
        let mut out = 0u32;
        // SAFETY: `h` is live; `out` is a valid u32 for the enum.
        check(unsafe { f(h.raw, &raw mut out) })?;
        Ok(out)
    }

    /// `amdsmi_get_gpu_device_bdf` as the raw `u64` union.
    pub fn device_bdf(&self, h: Handle<'_>) -> Result<u64, CallFail> {
        self.get_u64(
            self.lib.syms.get_gpu_device_bdf,
            "amdsmi_get_gpu_device_bdf",
            h,
        )
    }

    /// `amdsmi_get_gpu_bdf_id`.
    pub fn bdf_id(&self, h: Handle<'_>) -> Result<u64, CallFail> {
        self.get_u64(self.lib.syms.get_gpu_bdf_id, "amdsmi_get_gpu_bdf_id", h)
    }

    /// `amdsmi_get_gpu_device_uuid` into a 64-byte buffer.
    pub fn device_uuid(&self, h: Handle<'_>) -> Result<String, CallFail> {
        let f = present(
            self.lib.syms.get_gpu_device_uuid,
            "amdsmi_get_gpu_device_uuid",
        )?;
        let mut buf = OutBuf::zeroed(UUID_BUF);
        let mut len = c_uint::try_from(buf.len()).unwrap_or(0);
        // SAFETY: `h` is live; `len` (in/out) states the buffer size, which is writable.
        check(unsafe { f(h.raw, &raw mut len, buf.ptr().cast()) })?;
        Ok(cstr_at(&buf.into_bytes(), 0, UUID_BUF))
    }

    /// `amdsmi_get_gpu_asic_info` raw bytes.
    pub fn asic_info(&self, h: Handle<'_>) -> Result<Vec<u8>, CallFail> {
        let f = self.lib.syms.get_gpu_asic_info;
        self.get_struct(f, "amdsmi_get_gpu_asic_info", h, STRUCT_BUF)
    }

    /// `amdsmi_get_gpu_kfd_info` raw bytes (6.3+).
    pub fn kfd_info(&self, h: Handle<'_>) -> Result<Vec<u8>, CallFail> {
        let f = self.lib.syms.get_gpu_kfd_info;
        self.get_struct(f, "amdsmi_get_gpu_kfd_info", h, STRUCT_BUF)
    }

    /// `amdsmi_get_gpu_enumeration_info` raw bytes (6.4+).
    pub fn enumeration_info(&self, h: Handle<'_>) -> Result<Vec<u8>, CallFail> {
        let f = self.lib.syms.get_gpu_enumeration_info;
        self.get_struct(f, "amdsmi_get_gpu_enumeration_info", h, STRUCT_BUF)
    }

    /// `amdsmi_get_gpu_accelerator_partition_profile_config` raw bytes (6.4+, root).
    pub fn profile_config(&self, h: Handle<'_>) -> Result<Vec<u8>, CallFail> {
        let f = self.lib.syms.get_gpu_accelerator_partition_profile_config;
        self.get_struct(f, PROFILE_CONFIG, h, PROFILE_CONFIG_BUF)
    }

    /// `amdsmi_get_gpu_memory_total(mem_type)` in bytes.
    pub fn memory_total(&self, h: Handle<'_>, mem_type: u32) -> Result<u64, CallFail> {
        let f = present(
            self.lib.syms.get_gpu_memory_total,
            "amdsmi_get_gpu_memory_total",
        )?;
        let mut out = 0u64;
        // SAFETY: `h` is live; the enum travels as u32; `out` is a valid u64.
        check(unsafe { f(h.raw, mem_type, &raw mut out) })?;
        Ok(out)
    }

    /// `amdsmi_get_gpu_compute_partition`: e.g. `"SPX"`.
    pub fn compute_partition(&self, h: Handle<'_>) -> Result<String, CallFail> {
        let f = self.lib.syms.get_gpu_compute_partition;
        self.get_mode_string(f, "amdsmi_get_gpu_compute_partition", h)
    }

    /// `amdsmi_get_gpu_memory_partition`: e.g. `"NPS1"`.
    pub fn memory_partition(&self, h: Handle<'_>) -> Result<String, CallFail> {
        let f = self.lib.syms.get_gpu_memory_partition;
        self.get_mode_string(f, "amdsmi_get_gpu_memory_partition", h)
    }

    /// `amdsmi_get_gpu_accelerator_partition_profile`: the profile bytes and the
    /// `partition_id` out-array (6.3+).
    pub fn partition_profile(&self, h: Handle<'_>) -> Result<(Vec<u8>, Vec<u32>), CallFail> {
        let f = present(self.lib.syms.get_gpu_accelerator_partition_profile, PROFILE)?;
        let mut buf = OutBuf::zeroed(STRUCT_BUF);
        let mut ids = vec![0u32; PARTITION_IDS_BUF];
        // SAFETY: `h` is live; the profile buffer is 4096 zeroed bytes (struct: 1152) and the
        // id array has 64 entries (the library writes 8).
        check(unsafe { f(h.raw, buf.ptr(), ids.as_mut_ptr()) })?;
        Ok((buf.into_bytes(), ids))
    }

    /// `amdsmi_set_gpu_accelerator_partition_profile(profile_index)` (6.4+, root): selects
    /// the profile with that index in the profile config (§4.8).
    pub fn set_partition_profile(&self, h: Handle<'_>, profile_index: u32) -> Result<(), CallFail> {
        let f = present(
            self.lib.syms.set_gpu_accelerator_partition_profile,
            SET_PROFILE,
        )?;
        // SAFETY: `h` is a live handle of this session; the index travels by value (§4.8).
        check(unsafe { f(h.raw, profile_index) })
    }

    /// `amdsmi_get_gpu_process_list` with room for `capacity` entries of `stride` bytes
    /// (0: NULL list, count only). Any status is returned with the count written back.
    pub fn process_list(
        &self,
        h: Handle<'_>,
        capacity: u32,
        stride: usize,
    ) -> Result<Filled<Vec<u8>>, CallFail> {
        let f = present(
            self.lib.syms.get_gpu_process_list,
            "amdsmi_get_gpu_process_list",
        )?;
        let cap = usize::try_from(capacity).unwrap_or(0);
        let mut buf = OutBuf::zeroed(cap.saturating_mul(stride).saturating_add(STRUCT_BUF));
        let list = if cap == 0 { ptr::null_mut() } else { buf.ptr() };
        let mut count = capacity;
        // SAFETY: `h` is live; `count` states the capacity, and the buffer holds `capacity`
        // entries of the exact stride for this layout plus 4096 spare bytes (§3.10, §4.10).
        let status = unsafe { f(h.raw, &raw mut count, list) };
        Ok(Filled {
            status,
            count,
            items: buf.into_bytes(),
        })
    }
}

impl Drop for Session<'_> {
    fn drop(&mut self) {
        if !self.done {
            // SAFETY: no arguments; the session (and so every handle) is going away.
            unsafe { (self.lib.syms.shut_down)() };
        }
    }
}

pub mod usage;

#[cfg(test)]
mod tests;
