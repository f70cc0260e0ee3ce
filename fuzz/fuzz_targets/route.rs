//! Fuzzes routing by path: any path routes or not without panicking, a route's upstream path is the
//! request's own tail, no `key` query parameter survives on the way to a provider, and the model an
//! allowlist holds is one segment of the path or the body's.
#![no_main]

use libfuzzer_sys::fuzz_target;
use recovea_core::snapshot::ProviderKind;
use recovea_providers::usage::{Surface, model_in_path};
use recovea_providers::{model_the_provider_runs, route_for, without_key_param};

fuzz_target!(|input: &[u8]| {
    let Ok(path) = std::str::from_utf8(input) else { return };
    for anthropic_version in [false, true] {
        let Some(route) = route_for(path, anthropic_version) else { continue };
        assert!(path.ends_with(route.upstream_path));
        let upstream = without_key_param(route.upstream_path);
        if let Some((_, query)) = upstream.split_once('?') {
            assert!(query.split('&').all(|pair| pair.split_once('=').map_or(pair, |(name, _)| name) != "key"));
        }
        let _ = Surface::of(ProviderKind::Gemini, &upstream);
        if let Some(model) = model_in_path(&upstream) {
            assert!(!model.is_empty() && !model.contains('/'));
        }
        match model_the_provider_runs(&upstream, Some("body-model")) {
            Some("body-model") => {}
            Some(model) => {
                assert!(!model.is_empty() && !model.contains(['/', '?']), "{model:?}");
                assert!(upstream.contains(&format!("/{model}")), "{model:?} in {upstream:?}");
            }
            None => panic!("the body's model is never lost"),
        }
    }
});
