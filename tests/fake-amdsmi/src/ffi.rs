//! The raw-pointer boundary: panic guard, fault gate and out-parameter writers.

use std::{
    panic::{AssertUnwindSafe, catch_unwind},
    sync::MutexGuard,
    time::Duration,
};

use crate::{
    fixture::Fault,
    state::{self, State},
    status,
};

/// Runs an exported function body; a panic becomes `INTERNAL_EXCEPTION`
/// instead of unwinding into C.
pub(crate) fn guarded(body: impl FnOnce() -> u32) -> u32 {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or(status::INTERNAL_EXCEPTION)
}

fn hang_forever(guard: MutexGuard<'static, State>) -> ! {
    drop(guard);
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// Applies `faults[symbol]`; returns the status to answer instead, if any.
pub(crate) fn gate(
    guard: MutexGuard<'static, State>,
    symbol: &str,
) -> Result<MutexGuard<'static, State>, u32> {
    match guard.fault(symbol) {
        None => Ok(guard),
        Some(Fault::Hang) => hang_forever(guard),
        Some(Fault::Abort) => std::process::abort(),
        Some(Fault::Status(code)) => Err(code),
    }
}

/// Whether an ordinary call needs `amdsmi_init` to have run.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Need {
    Init,
    Nothing,
}

/// The common path of every symbol but `amdsmi_init`: load the fixture
/// (lazily; without it the answer is `INIT_ERROR`), apply the fault, check
/// init, then run `body`.
pub(crate) fn call(
    symbol: &str,
    need: Need,
    body: impl FnOnce(&mut State) -> Result<(), u32>,
) -> u32 {
    guarded(|| {
        let mut guard = state::lock();
        if guard.refresh().is_err() {
            return status::INIT_ERROR;
        }
        let mut guard = match gate(guard, symbol) {
            Ok(guard) => guard,
            Err(code) => return code,
        };
        if need == Need::Init && !guard.is_initialized() {
            return status::NOT_INIT;
        }
        match body(&mut guard) {
            Ok(()) => status::SUCCESS,
            Err(code) => code,
        }
    })
}

/// Writes one value to a caller pointer.
///
/// # Safety
/// `dst` is null or valid for a write of one `T` (any alignment).
pub(crate) unsafe fn put<T: Copy>(dst: *mut T, value: T) -> Result<(), u32> {
    if dst.is_null() {
        return Err(status::INVAL);
    }
    // SAFETY: non-null and valid for one write per this function's contract;
    // `write_unaligned` needs no alignment.
    unsafe { dst.write_unaligned(value) };
    Ok(())
}

/// Reads one value from a caller pointer.
///
/// # Safety
/// `src` is null or valid for a read of one `T` (any alignment).
pub(crate) unsafe fn get<T: Copy>(src: *const T) -> Result<T, u32> {
    if src.is_null() {
        return Err(status::INVAL);
    }
    // SAFETY: non-null and valid for one read per this function's contract.
    Ok(unsafe { src.read_unaligned() })
}

/// Copies `values` to consecutive elements at `dst`.
///
/// # Safety
/// `dst` is null or valid for writes of `values.len()` elements of `T`.
pub(crate) unsafe fn put_slice<T: Copy>(dst: *mut T, values: &[T]) -> Result<(), u32> {
    if dst.is_null() {
        return Err(status::INVAL);
    }
    // SAFETY: non-null and valid for `values.len()` elements per this
    // function's contract; the caller's buffer cannot overlap our slice.
    // Copying bytes keeps it alignment-free.
    unsafe {
        std::ptr::copy_nonoverlapping(
            values.as_ptr().cast::<u8>(),
            dst.cast::<u8>(),
            std::mem::size_of_val(values),
        );
    }
    Ok(())
}

/// Count-then-fill (docs/amd-hardware.md §4.1): `*count` is the capacity in and the number
/// written out. A NULL `list` or a capacity of 0 asks for the number of
/// items; a capacity below it fills what fits and answers `OUT_OF_RESOURCES`.
///
/// # Safety
/// `count` is null or valid for a read and a write of a `u32`; `list` is null
/// or valid for `*count` writes of `T`.
pub(crate) unsafe fn fill_counted<T: Copy>(
    count: *mut u32,
    list: *mut T,
    items: &[T],
) -> Result<(), u32> {
    // SAFETY: forwarded from this function's contract on `count`.
    let capacity = unsafe { get(count) }?;
    let total = u32::try_from(items.len()).map_err(|_| status::OUT_OF_RESOURCES)?;
    if list.is_null() || capacity == 0 {
        // SAFETY: as above.
        return unsafe { put(count, total) };
    }
    let written = capacity.min(total);
    let fits = items
        .get(..usize::try_from(written).unwrap_or(0))
        .unwrap_or_default();
    // SAFETY: `list` holds `capacity` >= `fits.len()` elements per the contract.
    unsafe { put_slice(list, fits) }?;
    // SAFETY: as for the read of `count`.
    unsafe { put(count, written) }?;
    if written < total {
        Err(status::OUT_OF_RESOURCES)
    } else {
        Ok(())
    }
}

/// Writes a NUL-terminated string into a `char[len]` buffer; answers
/// `INSUFFICIENT_SIZE` when it does not fit (docs/amd-hardware.md §4.7).
///
/// # Safety
/// `buf` is null or valid for writes of `len` bytes.
pub(crate) unsafe fn put_c_string(buf: *mut u8, len: u32, text: &str) -> Result<(), u32> {
    if buf.is_null() {
        return Err(status::INVAL);
    }
    let mut bytes = text.as_bytes().to_vec();
    bytes.push(0);
    if usize::try_from(len).map_or(true, |len| len < bytes.len()) {
        return Err(status::INSUFFICIENT_SIZE);
    }
    // SAFETY: `bytes.len() <= len`, and `buf` is valid for `len` bytes.
    unsafe { put_slice(buf, &bytes) }
}
