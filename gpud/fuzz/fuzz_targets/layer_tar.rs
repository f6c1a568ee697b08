//! Fuzz target: the loader check's layer reader (tar, gzip or zstd by the
//! input's magic) must never panic on a hostile layer, nor the classifier
//! on the tree it builds (its symlinks may loop or point anywhere).
#![no_main]

use gpud::testing::loader_check::analyze::read_layer_for_fuzz;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match read_layer_for_fuzz(data) {
        Ok((entries, _loader)) => assert!(entries <= 100_000),
        Err(err) => assert!(!err.reason().is_empty()),
    }
});
