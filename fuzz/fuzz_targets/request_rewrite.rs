//! Fuzzes the request rewrite: any body never panics, and a rewritten body is JSON that asks for usage and differs only there.
//! Fuzzes the one reading of a body too: a repeat or a byte-order mark is told from the bytes alone,
//! its path is bounded and its answer safe to print, and a body the gateway does not refuse reads as its provider reads it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use recovea_core::Answer;
use recovea_providers::media;
use recovea_providers::request_body::{self, Ambiguity, MAX_NAME_CHARS};
use recovea_providers::rewrite::force_include_usage;
use recovea_providers::usage::{Surface, estimate_input_tokens};
use serde_json::Value;

/// The longest path a repeat can have beyond its name: `tools[{index}].function.`.
const PATH_PREFIX_CHARS: usize = "tools[18446744073709551615].function.".len();

fuzz_target!(|body: &[u8]| {
    one_reading(body);
    let _ = estimate_input_tokens(body);
    // An images or audio request's facts, from JSON or a form, whatever the bytes.
    for surface in [Surface::Images, Surface::Speech, Surface::Transcription] {
        for content_type in [None, Some("multipart/form-data; boundary=b")] {
            let read = media::read(surface, || content_type, body).expect("a media surface");
            let _ = read.request.audio_seconds();
        }
    }
    let facts = request_body::facts(body);
    let Some(rewritten) = force_include_usage(body) else { return };
    assert!(facts.stream && !facts.client_asked_usage);
    let after_facts = request_body::facts(&rewritten);
    assert!(after_facts.stream && after_facts.client_asked_usage);
    assert_eq!(after_facts.model, facts.model);
    // serde_json skips unread strings without checking their UTF-8, so `request_body::facts` accepts some bodies
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

/// `request_body::read` on any body: the ambiguity it finds, and what it reads beside it.
fn one_reading(body: &[u8]) {
    let read = request_body::read(body);
    // The facts are `request_body::facts`'s, ambiguous or not: only the refusal is new.
    assert_eq!(read.facts, request_body::facts(body));
    let marked = [&b"\xEF\xBB\xBF"[..], b"\xFE\xFF", b"\xFF\xFE", b"\x00\x00\xFE\xFF"]
        .iter()
        .any(|mark| body.trim_ascii_start().starts_with(mark));
    assert_eq!(read.ambiguity == Some(Ambiguity::ByteOrderMark), marked);
    let answer = match &read.ambiguity {
        None => None,
        Some(Ambiguity::ByteOrderMark) => Some(Answer::byte_order_mark()),
        Some(Ambiguity::RepeatedMember(path)) => {
            assert!(path.chars().count() <= PATH_PREFIX_CHARS + MAX_NAME_CHARS, "{path:?}");
            // A member is named twice: the body has at least two names, four quotes.
            assert!(body.iter().filter(|&&b| b == b'"').count() >= 4);
            Some(Answer::repeated_member(path))
        }
    };
    if let Some(answer) = answer {
        // The client's text goes into the answer as printable ASCII, in valid JSON.
        assert!(answer.body.iter().all(|&b| b == b'\n' || (b' '..=b'~').contains(&b)));
        assert!(serde_json::from_slice::<Value>(&answer.body).is_ok());
    }
    let Ok(Value::Object(object)) = serde_json::from_slice::<Value>(body) else { return };
    // The same request with every name once, as a provider reading last-wins sees it.
    let once = serde_json::to_vec(&Value::Object(object)).expect("a value serialises");
    let once_read = request_body::read(&once);
    assert_eq!(once_read.ambiguity, None, "{}", String::from_utf8_lossy(&once));
    if read.ambiguity.is_none() {
        // Not refused: the gateway reads what the provider runs.
        assert_eq!(read.facts, once_read.facts, "{}", String::from_utf8_lossy(body));
        assert_eq!(read.input_tokens, once_read.input_tokens, "{}", String::from_utf8_lossy(body));
    }
}
