//! Routing by path: which named credential serves a request, and the path the provider sees.

use recovea_core::snapshot::ProviderKind;

/// Where a request goes: a credential of the organization, chosen by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route<'p> {
    /// The name of the organization's credential that serves this route.
    pub credential: &'p str,
    /// The kind to assume when the organization has no such credential (a client bringing its own
    /// key, or a fail-open pass): known only for the default names `openai` and `anthropic`.
    pub fallback_kind: Option<ProviderKind>,
    /// The path (and query) as the provider sees it, always starting with `/v1/`.
    pub upstream_path: &'p str,
}

/// Routes a path and query: `/v1/messages...` to `anthropic`, any other `/v1/...` to `openai`,
/// `/{name}/v1/...` to the credential called `name`. Anything else is not ours to proxy.
pub fn route(path_and_query: &str) -> Option<Route<'_>> {
    route_for(path_and_query, false)
}

/// Routes a request: as [`route`], except that a request carrying `anthropic-version` (every
/// Anthropic SDK sends it) goes to `anthropic` whatever its `/v1/...` path, `/v1/models`
/// included: an Anthropic client pointed at the gateway speaks to Anthropic throughout.
pub fn route_for(path_and_query: &str, carries_anthropic_version: bool) -> Option<Route<'_>> {
    if escapes_its_root(path_and_query) {
        return None;
    }
    if is_versioned(path_and_query) {
        let rest = &path_and_query[3..];
        let is_messages = rest
            .strip_prefix("/messages")
            .is_some_and(|tail| tail.is_empty() || tail.starts_with(['/', '?']));
        let kind = if is_messages || carries_anthropic_version {
            ProviderKind::Anthropic
        } else {
            ProviderKind::OpenAi
        };
        return Some(Route {
            credential: kind.as_str(),
            fallback_kind: Some(kind),
            upstream_path: path_and_query,
        });
    }
    let named = path_and_query.strip_prefix('/')?;
    let (name, rest) = named.split_at(named.find('/')?);
    if !is_credential_name(name) || !is_versioned(rest) {
        return None;
    }
    Some(Route { credential: name, fallback_kind: ProviderKind::parse(name), upstream_path: rest })
}

/// Whether the path could climb out of a credential's base URL once a server normalises it: a `.` or
/// `..` segment, literal or percent-encoded, or an encoded slash or backslash.
fn escapes_its_root(path_and_query: &str) -> bool {
    let path = path_and_query.split_once('?').map_or(path_and_query, |(path, _)| path);
    // Nearly every path has no dot, escape or backslash, and then nothing below can be true.
    if !path.bytes().any(|b| matches!(b, b'.' | b'%' | b'\\')) {
        return false;
    }
    let lower = path.to_ascii_lowercase();
    if lower.contains("%2f") || lower.contains("%5c") || lower.contains('\\') {
        return true;
    }
    lower.split('/').any(|segment| {
        let dots = segment.replace("%2e", ".");
        dots == "." || dots == ".."
    })
}

/// `/v1/` followed by something.
fn is_versioned(path: &str) -> bool {
    path.strip_prefix("/v1/").is_some_and(|rest| !rest.is_empty())
}

/// Credential names are short slugs, so they can sit in a path without escaping.
pub fn is_credential_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn r(credential: &str, kind: Option<ProviderKind>, upstream_path: &str) -> Option<Route<'static>> {
        let leak = |s: &str| -> &'static str { Box::leak(s.to_owned().into_boxed_str()) };
        Some(Route { credential: leak(credential), fallback_kind: kind, upstream_path: leak(upstream_path) })
    }

    #[test]
    fn default_routes() {
        use ProviderKind::*;
        assert_eq!(route("/v1/messages"), r("anthropic", Some(Anthropic), "/v1/messages"));
        assert_eq!(
            route("/v1/messages?beta=true"),
            r("anthropic", Some(Anthropic), "/v1/messages?beta=true")
        );
        assert_eq!(
            route("/v1/messages/count_tokens"),
            r("anthropic", Some(Anthropic), "/v1/messages/count_tokens")
        );
        assert_eq!(route("/v1/chat/completions"), r("openai", Some(OpenAi), "/v1/chat/completions"));
        assert_eq!(route("/v1/messagesx"), r("openai", Some(OpenAi), "/v1/messagesx"));
        assert_eq!(route("/v1/responses?x=1"), r("openai", Some(OpenAi), "/v1/responses?x=1"));
    }

    #[test]
    fn anthropic_version_routes_every_default_path_to_anthropic() {
        use ProviderKind::*;
        for path in ["/v1/models", "/v1/models/claude-sonnet-4-5", "/v1/messages", "/v1/chat/completions"] {
            assert_eq!(route_for(path, true), r("anthropic", Some(Anthropic), path), "{path}");
        }
        assert_eq!(route_for("/v1/models", false), r("openai", Some(OpenAi), "/v1/models"));
        // A named route keeps its credential: the client chose it.
        assert_eq!(route_for("/groq/v1/models", true), r("groq", None, "/v1/models"));
        assert_eq!(route_for("/v2/models", true), None);
    }

    #[test]
    fn named_routes() {
        assert_eq!(route("/groq/v1/chat/completions"), r("groq", None, "/v1/chat/completions"));
        assert_eq!(
            route("/anthropic/v1/messages"),
            r("anthropic", Some(ProviderKind::Anthropic), "/v1/messages")
        );
        assert_eq!(route("/openai/v1/models"), r("openai", Some(ProviderKind::OpenAi), "/v1/models"));
    }

    #[test]
    fn not_ours() {
        for path in
            ["/", "/v1", "/v1/", "/v2/chat", "/healthz", "/Groq/v1/x", "/a/b/v1/x", "//v1/x", "/groq/v1/"]
        {
            assert_eq!(route(path), None, "{path}");
        }
    }

    #[test]
    fn paths_that_climb_out_are_not_routed() {
        for path in [
            "/groq/v1/../../secret",
            "/v1/../admin",
            "/v1/./chat",
            "/v1/chat/..",
            "/groq/v1/%2e%2e/x",
            "/groq/v1/%2E./x",
            "/v1/a%2fb",
            "/v1/a%5Cb",
        ] {
            assert_eq!(route(path), None, "{path}");
        }
        assert!(route("/v1/chat/completions?next=../x").is_some(), "queries are not paths");
        assert!(route("/v1/files/file-abc.jsonl").is_some());
    }

    proptest! {
        #[test]
        fn upstream_path_is_always_versioned(path in "/[a-z0-9/_?=.-]{0,40}") {
            if let Some(route) = route(&path) {
                prop_assert!(route.upstream_path.starts_with("/v1/"));
                prop_assert!(path.ends_with(route.upstream_path));
            }
        }
    }
}
