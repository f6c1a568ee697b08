//! Process-global state: the loaded fixture, the init refcount and handles.

use std::{
    ffi::{CStr, CString, c_void},
    fmt, ptr,
    sync::{Mutex, MutexGuard, PoisonError},
};

use crate::{
    fixture::{Abi, Fault, Loaded, Processor},
    status,
};

/// The environment variable naming the fixture file.
pub(crate) const FIXTURE_ENV: &str = "FAKE_AMDSMI_FIXTURE";

/// Why the fixture could not be loaded.
#[derive(Debug)]
pub(crate) struct LoadError {
    path: Option<String>,
    problem: String,
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.path {
            Some(path) => write!(f, "fake-amdsmi: fixture {path}: {}", self.problem),
            None => write!(f, "fake-amdsmi: {FIXTURE_ENV}: {}", self.problem),
        }
    }
}

struct Current {
    /// The file content `loaded` was parsed from.
    raw: Vec<u8>,
    loaded: Loaded,
}

pub(crate) struct State {
    current: Option<Current>,
    /// Number of outstanding `amdsmi_init` calls; 0 = not initialized.
    init_count: u32,
    /// Bumped by every teardown; part of every handle.
    generation: u32,
}

static STATE: Mutex<State> = Mutex::new(State {
    current: None,
    init_count: 0,
    generation: 1,
});

/// Locks the global state (a panic while it was held does not poison it).
pub(crate) fn lock() -> MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(PoisonError::into_inner)
}

fn read_fixture() -> Result<Vec<u8>, LoadError> {
    let Some(path) = std::env::var_os(FIXTURE_ENV) else {
        return Err(LoadError {
            path: None,
            problem: "not set".into(),
        });
    };
    let shown = Some(path.to_string_lossy().into_owned());
    std::fs::read(&path).map_err(|e| LoadError {
        path: shown,
        problem: e.to_string(),
    })
}

fn parse_fixture(raw: Vec<u8>) -> Result<Current, LoadError> {
    match Loaded::parse(&raw) {
        Ok(loaded) => Ok(Current { raw, loaded }),
        Err(problem) => {
            let path = std::env::var_os(FIXTURE_ENV).map(|p| p.to_string_lossy().into_owned());
            Err(LoadError { path, problem })
        }
    }
}

/// A processor's position in the fixture.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ProcRef {
    pub socket: usize,
    pub index: usize,
}

const KIND_SOCKET: u64 = 1;
const KIND_PROCESSOR: u64 = 2;

/// Handle bits: generation 63:32, kind 31:30, socket 29:15, processor 14:0.
fn encode(generation: u32, kind: u64, socket: usize, index: usize) -> *mut c_void {
    let socket = u64::try_from(socket).unwrap_or(0) & 0x7FFF;
    let index = u64::try_from(index).unwrap_or(0) & 0x7FFF;
    let bits = (u64::from(generation) << 32) | (kind << 30) | (socket << 15) | index;
    ptr::without_provenance_mut(usize::try_from(bits).unwrap_or(0))
}

fn decode(handle: *mut c_void) -> Option<(u32, u64, usize, usize)> {
    let bits = u64::try_from(handle.addr()).ok()?;
    let generation = u32::try_from(bits >> 32).ok()?;
    let socket = usize::try_from((bits >> 15) & 0x7FFF).ok()?;
    let index = usize::try_from(bits & 0x7FFF).ok()?;
    Some((generation, (bits >> 30) & 3, socket, index))
}

impl State {
    /// Re-reads the fixture file while not initialized (at `amdsmi_init` and
    /// lazily by every other call), so the next init sees the current file.
    /// If its content did not change, the in-memory state (including
    /// partition modes set through the API) is kept; otherwise it is replaced.
    /// While initialized the loaded fixture stays as it is.
    pub(crate) fn refresh(&mut self) -> Result<(), LoadError> {
        if self.is_initialized() && self.current.is_some() {
            return Ok(());
        }
        let raw = read_fixture()?;
        if self.current.as_ref().is_some_and(|c| c.raw == raw) {
            return Ok(());
        }
        self.current = Some(parse_fixture(raw)?);
        Ok(())
    }

    /// The loaded fixture (`INIT_ERROR` if none).
    pub(crate) fn loaded(&self) -> Result<&Loaded, u32> {
        self.current
            .as_ref()
            .map(|c| &c.loaded)
            .ok_or(status::INIT_ERROR)
    }

    fn loaded_mut(&mut self) -> Result<&mut Loaded, u32> {
        self.current
            .as_mut()
            .map(|c| &mut c.loaded)
            .ok_or(status::INIT_ERROR)
    }

    pub(crate) fn abi(&self) -> Result<Abi, u32> {
        Ok(self.loaded()?.abi)
    }

    pub(crate) fn fault(&self, symbol: &str) -> Option<Fault> {
        self.current.as_ref()?.loaded.faults.get(symbol).copied()
    }

    pub(crate) fn is_initialized(&self) -> bool {
        self.init_count > 0
    }

    pub(crate) fn require_init(&self) -> Result<(), u32> {
        if self.is_initialized() {
            Ok(())
        } else {
            Err(status::NOT_INIT)
        }
    }

    /// `amdsmi_init` after the fixture is loaded: 6.x is idempotent, 7.x
    /// counts calls.
    pub(crate) fn init(&mut self) -> Result<(), u32> {
        if self.abi()?.is_7x() {
            self.init_count = self
                .init_count
                .checked_add(1)
                .ok_or(status::REFCOUNT_OVERFLOW)?;
        } else {
            self.init_count = 1;
        }
        Ok(())
    }

    /// `amdsmi_shut_down`: 6.x tears down at once, 7.x on the last call.
    pub(crate) fn shut_down(&mut self) {
        if !self.is_initialized() {
            return;
        }
        let seven = self.abi().is_ok_and(Abi::is_7x);
        self.init_count = if seven { self.init_count - 1 } else { 0 };
        if self.init_count == 0 {
            self.generation = self.generation.wrapping_add(1).max(1);
        }
    }

    pub(crate) fn socket_handles(&self) -> Result<Vec<*mut c_void>, u32> {
        self.require_init()?;
        let sockets = self.loaded()?.fixture.sockets.len();
        Ok((0..sockets)
            .map(|s| encode(self.generation, KIND_SOCKET, s, 0))
            .collect())
    }

    pub(crate) fn processor_handles(&self, socket: *mut c_void) -> Result<Vec<*mut c_void>, u32> {
        self.require_init()?;
        let sockets = &self.loaded()?.fixture.sockets;
        let (generation, kind, s, index) = decode(socket).ok_or(status::INVAL)?;
        if generation != self.generation || kind != KIND_SOCKET || index != 0 {
            return Err(status::INVAL);
        }
        let count = sockets.get(s).ok_or(status::INVAL)?.processors.len();
        Ok((0..count)
            .map(|i| encode(self.generation, KIND_PROCESSOR, s, i))
            .collect())
    }

    /// Resolves a processor handle minted since the last teardown.
    pub(crate) fn resolve(&self, handle: *mut c_void) -> Result<ProcRef, u32> {
        self.require_init()?;
        let (generation, kind, socket, index) = decode(handle).ok_or(status::INVAL)?;
        if generation != self.generation || kind != KIND_PROCESSOR {
            return Err(status::INVAL);
        }
        let sockets = &self.loaded()?.fixture.sockets;
        sockets
            .get(socket)
            .and_then(|s| s.processors.get(index))
            .ok_or(status::INVAL)?;
        Ok(ProcRef { socket, index })
    }

    pub(crate) fn processor(&self, handle: *mut c_void) -> Result<&Processor, u32> {
        let r = self.resolve(handle)?;
        self.processor_at(r)
    }

    pub(crate) fn processor_at(&self, r: ProcRef) -> Result<&Processor, u32> {
        let sockets = &self.loaded()?.fixture.sockets;
        sockets
            .get(r.socket)
            .and_then(|s| s.processors.get(r.index))
            .ok_or(status::INVAL)
    }

    /// All processors of a socket, for partition changes.
    pub(crate) fn socket_processors_mut(&mut self, socket: usize) -> Result<&mut [Processor], u32> {
        let sockets = &mut self.loaded_mut()?.fixture.sockets;
        Ok(sockets
            .get_mut(socket)
            .ok_or(status::INVAL)?
            .processors
            .as_mut_slice())
    }

    /// The handle of the processor at `bdf` with partition 0 (or the first).
    pub(crate) fn handle_from_bdf(&self, bdf: u64) -> Result<*mut c_void, u32> {
        self.require_init()?;
        let mut first = None;
        for (s, socket) in self.loaded()?.fixture.sockets.iter().enumerate() {
            for (i, p) in socket.processors.iter().enumerate() {
                if p.pci.as_u64() != bdf {
                    continue;
                }
                if p.partition_id == 0 {
                    return Ok(encode(self.generation, KIND_PROCESSOR, s, i));
                }
                first.get_or_insert((s, i));
            }
        }
        let (s, i) = first.ok_or(status::NOT_FOUND)?;
        Ok(encode(self.generation, KIND_PROCESSOR, s, i))
    }
}

/// Interns a string as a C string that lives until the process exits (the
/// `build` of `amdsmi_version_t` points at static storage).
pub(crate) fn intern(text: &str) -> &'static CStr {
    static INTERNED: Mutex<Vec<&'static CStr>> = Mutex::new(Vec::new());
    let mut interned = INTERNED.lock().unwrap_or_else(PoisonError::into_inner);
    let bytes: Vec<u8> = text.bytes().take_while(|&b| b != 0).collect();
    if let Some(found) = interned.iter().find(|s| s.to_bytes() == bytes.as_slice()) {
        return found;
    }
    let leaked: &'static CStr = match CString::new(bytes) {
        Ok(owned) => Box::leak(owned.into_boxed_c_str()),
        Err(_) => c"",
    };
    interned.push(leaked);
    leaked
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_and_carry_their_kind() {
        let h = encode(7, KIND_PROCESSOR, 3, 9);
        assert!(!h.is_null());
        assert_eq!(decode(h), Some((7, KIND_PROCESSOR, 3, 9)));
        let s = encode(1, KIND_SOCKET, 0, 0);
        assert!(!s.is_null());
        assert_eq!(decode(s), Some((1, KIND_SOCKET, 0, 0)));
    }

    #[test]
    fn interned_strings_are_stable() {
        let a = intern("26.1.0");
        let b = intern("26.1.0");
        assert_eq!(a.as_ptr(), b.as_ptr());
        assert_eq!(a, c"26.1.0");
        assert_eq!(intern("a\0b"), c"a");
    }
}
