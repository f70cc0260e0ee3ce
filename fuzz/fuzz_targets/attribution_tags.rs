//! Fuzzes the `x-recovea-tags` reader: any header lines never panic; what it accepts is within the
//! bounds, and reads back from its own text as itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use recovea_core::tags::{self, MAX_KEY_LEN, MAX_TAGS, MAX_VALUE_LEN};

fuzz_target!(|header: &[u8]| {
    // A newline stands for the boundary between two header lines.
    let Ok(read) = tags::parse(header.split(|&b| b == b'\n')) else { return };
    assert!(read.len() <= MAX_TAGS);
    for (key, value) in &read {
        assert!(!key.is_empty() && key.len() <= MAX_KEY_LEN && key.bytes().all(tags::is_key_char));
        assert!(!value.is_empty() && value.len() <= MAX_VALUE_LEN && value.bytes().all(tags::is_value_char));
    }
    let text = tags::to_text(&read);
    assert_eq!(tags::parse([text.as_bytes()]).expect("its own text reads"), read);
});
