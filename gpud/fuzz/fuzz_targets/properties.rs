//! Fuzz target: the KFD `properties` parser must never panic, and every pair
//! it keeps must be a well-formed `key value` line of the input.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut issues = Vec::new();
    let props = gpud::testing::topology::Properties::parse(&text, Path::new("fuzz/properties"), &mut issues);
    for (key, value) in props.iter() {
        assert!(!key.is_empty());
        assert!(text.contains(key));
        assert_eq!(props.get(key).is_some(), true);
        let _ = value;
    }
    for issue in &issues {
        let _ = issue.to_string();
    }
});
