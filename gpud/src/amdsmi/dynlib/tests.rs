//! Tests of the loader's own helpers (no AMD SMI library needed).

use super::*;

#[test]
fn out_buffers_are_zeroed_aligned_and_sized() {
    let mut b = OutBuf::zeroed(4093);
    assert_eq!(b.len(), 4096);
    assert_eq!(b.ptr().align_offset(8), 0);
    assert!(b.into_bytes().iter().all(|&x| x == 0));
}

#[test]
fn opening_a_missing_library_reports_dlopen_verbatim() {
    let Err(OpenError::Load(reason)) = Library::open(OsStr::new("/nonexistent/libamd_smi.so"))
    else {
        panic!("expected a load error");
    };
    assert!(reason.contains("/nonexistent/libamd_smi.so"), "{reason}");
}

#[test]
fn a_library_without_the_symbols_is_refused() {
    // libc is always loadable and exports none of the AMD SMI symbols.
    let r = Library::open(OsStr::new("libc.so.6"));
    assert!(matches!(
        r,
        Err(OpenError::MissingSymbol("amdsmi_get_lib_version"))
    ));
}
