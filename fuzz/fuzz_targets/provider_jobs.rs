//! Fuzzes what the gateway reads of deferred jobs and Realtime sessions, all of it written by a
//! client or a provider: a batch file's upload (its multipart form and its JSONL lines), inline
//! batches, creation and poll answers, result lines, and Realtime events. Nothing panics; an id
//! kept is one the gateway may put in a path; a results location is below the credential's base
//! URL or an absolute URL (which the poller fetches only on the base URL's origin); the relay's
//! sniff of an event's first bytes never lets by one it would have metered.
#![no_main]

use libfuzzer_sys::fuzz_target;
use recovea_core::channel::JobKind;
use recovea_core::jobs::valid_id;
use recovea_core::snapshot::ProviderKind;
use recovea_providers::jobs::{
    JobState, Results, created_id, inline_batch, job_state, poll_path, result_line, uploaded_batch,
};
use recovea_providers::multipart;
use recovea_providers::realtime::{ServerEvent, asks_for_response, may_matter, server_event};

fuzz_target!(|input: &[u8]| {
    // The first line is the upload's content type, the rest its body.
    let split = input.iter().position(|&b| b == b'\n').unwrap_or(input.len());
    let (head, body) = (&input[..split], input.get(split + 1..).unwrap_or_default());
    if let Ok(content_type) = std::str::from_utf8(head) {
        if let Some(boundary) = multipart::boundary(content_type)
            && let Some(parts) = multipart::parts(body, boundary)
        {
            let range = body.as_ptr_range();
            for part in parts {
                assert!(range.start <= part.body.as_ptr() && part.body.as_ptr_range().end <= range.end);
            }
        }
        let _ = uploaded_batch(content_type, body);
    }
    for kind in JobKind::ALL {
        let _ = inline_batch(kind, input, Some("gpt-4o"));
        if let Some(id) = created_id(Some(kind), input) {
            assert!(valid_id(&id), "{id:?}");
            for provider in [ProviderKind::OpenAi, ProviderKind::AzureOpenAi, ProviderKind::Gemini] {
                assert!(!poll_path(kind, provider, &id).contains(".."));
            }
        }
        if let Some(JobState::Ended { results: Results::Lines(Some(location)), .. }) = job_state(kind, input) {
            let absolute = location.starts_with("https://") || location.starts_with("http://");
            assert!(absolute || (location.starts_with('/') && !location.contains("..")), "{location:?}");
        }
        let _ = result_line(kind, input);
    }
    let _ = asks_for_response(input);
    let event = server_event(input);
    for sniffed in [input.len().min(64), input.len()] {
        if !may_matter(&input[..sniffed]) {
            assert_eq!(event, ServerEvent::Other, "let by unread");
        }
    }
});
