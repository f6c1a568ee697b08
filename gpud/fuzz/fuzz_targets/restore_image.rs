//! Fuzz target: the CRIU amdgpu-kfd image parser must never panic, and an
//! image it accepts must check against itself without panicking (it may be
//! refused: a fuzzed topology need not be self-consistent).
#![no_main]

use gpud::testing::restore_check::{self, LocalTopology, Mode, Request, image};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let framed = {
        // Also try the input as a payload behind a correct header, so the
        // fuzzer reaches the decoder without guessing the length.
        let mut v = u64::try_from(data.len())
            .unwrap_or(0)
            .to_le_bytes()
            .to_vec();
        v.extend_from_slice(data);
        v
    };
    for bytes in [data, framed.as_slice()] {
        match image::parse(bytes, "fuzz") {
            Ok(img) => {
                assert!(!img.topo.nodes.is_empty());
                if img.topo.nodes.len() <= 16 {
                    let local = LocalTopology {
                        topo: img.topo.clone(),
                        notes: Vec::new(),
                    };
                    for mode in [Mode::Criu, Mode::Explain] {
                        let request = Request {
                            mode,
                            ..Request::default()
                        };
                        if let Ok(verdict) = restore_check::check(&img, &local, &request) {
                            let _ = serde_json::to_string(&verdict);
                        }
                    }
                }
            }
            Err(err) => {
                assert!(err.to_string().starts_with("fuzz: "));
            }
        }
    }
});
