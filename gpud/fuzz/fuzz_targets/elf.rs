//! Fuzz target: the ELF readers of the loader check must be total over any
//! bytes, and what they accept must be self-consistent.
#![no_main]

use gpud::testing::loader_check::analyze::{Interp, elf_summary, glibc_versions, shebang};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = elf_summary(data) {
        if let Interp::Path(p) = &s.interp {
            assert!(!p.is_empty() && p.len() <= 4096);
        }
    }
    if let Ok(versions) = glibc_versions(data) {
        assert!(versions.windows(2).all(|w| w[0] < w[1]));
    }
    if let Some(s) = shebang(data) {
        assert!(!s.interpreter.is_empty());
    }
});
