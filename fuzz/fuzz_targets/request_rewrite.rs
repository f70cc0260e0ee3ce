//! Fuzzes the request rewrite: any body never panics, and a rewritten body is JSON that asks for usage and differs only there.
#![no_main]

use libfuzzer_sys::fuzz_target;
use recovea_providers::rewrite::{force_include_usage, inspect};
use recovea_providers::usage::estimate_input_tokens;
use serde_json::Value;

fuzz_target!(|body: &[u8]| {
    let _ = estimate_input_tokens(body);
    let facts = inspect(body);
    let Some(rewritten) = force_include_usage(body) else { return };
    assert!(facts.stream && !facts.client_asked_usage);
    let after_facts = inspect(&rewritten);
    assert!(after_facts.stream && after_facts.client_asked_usage);
    assert_eq!(after_facts.model, facts.model);
    // serde_json skips unread strings without checking their UTF-8, so `inspect` accepts some bodies
    // a full parse refuses; those are edited all the same, and compared only when they parse.
    let Ok(Value::Object(mut before)) = serde_json::from_slice::<Value>(body) else { return };
    let Ok(Value::Object(mut after)) = serde_json::from_slice::<Value>(&rewritten) else {
        panic!("a rewritten body must stay a JSON object");
    };
    let before_options = before.remove("stream_options");
    let mut after_options = after.remove("stream_options");
    assert_eq!(before, after);
    if let (Some(Value::Object(before_options)), Some(Value::Object(after_options))) =
        (&before_options, &mut after_options)
    {
        after_options.remove("include_usage");
        let mut before_options = before_options.clone();
        before_options.remove("include_usage");
        assert_eq!(&before_options, after_options);
    }
});
