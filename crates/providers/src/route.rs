//! Routing by path: which named credential serves a request, and the path the provider sees.

use std::borrow::Cow;

use recovea_core::answer;
use recovea_core::snapshot::ProviderKind;

/// Where a request goes: a credential of the organization, chosen by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route<'p> {
    /// The name of the organization's credential that serves this route.
    pub credential: &'p str,
    /// The kind to assume when the organization has no such credential (a client bringing its own
    /// key, or a fail-open pass): known only for the default names `openai`, `anthropic`, `gemini`
    /// and `azure`.
    pub fallback_kind: Option<ProviderKind>,
    /// The path (and query) as the provider sees it: from `/v1/`, `/v1beta/` (Gemini) or `/openai/`
    /// (Azure OpenAI) on.
    pub upstream_path: &'p str,
}

/// The name of the credential the Azure OpenAI paths (`/openai/deployments/...`) go to by default.
pub const AZURE_CREDENTIAL: &str = "azure";

/// Routes a path and query: `/v1/messages...` to `anthropic`, any other `/v1/...` to `openai`,
/// `/v1beta/...` to `gemini`, `/openai/deployments/...` to `azure`; `/{name}/v1/...`,
/// `/{name}/v1beta/...` and `/{name}/openai/...` to the credential called `name`. Anything else is
/// not ours to proxy. (`/openai/v1/...` is the named route to `openai`, as it always was: Azure's
/// v1 paths are reached by name, `/azure/openai/v1/...`.)
pub fn route(path_and_query: &str) -> Option<Route<'_>> {
    route_for(path_and_query, false)
}

/// Routes a request: as [`route`], except that a request carrying `anthropic-version` (every
/// Anthropic SDK sends it) goes to `anthropic` whatever its `/v1/...` path, `/v1/models`
/// included: an Anthropic client pointed at the gateway speaks to Anthropic throughout.
pub fn route_for(path_and_query: &str, carries_anthropic_version: bool) -> Option<Route<'_>> {
    if escapes_its_root(path_and_query) || !is_bounded(path_and_query) {
        return None;
    }
    if is_versioned(path_and_query) && !is_gemini_model_call(path_and_query) {
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
    if is_gemini_versioned(path_and_query)
        || is_gemini_model_call(path_and_query)
        || is_gemini_transfer(path_and_query)
    {
        return Some(Route {
            credential: ProviderKind::Gemini.as_str(),
            fallback_kind: Some(ProviderKind::Gemini),
            upstream_path: path_and_query,
        });
    }
    if is_azure(path_and_query) && !path_and_query.starts_with("/openai/v1/") {
        return Some(Route {
            credential: AZURE_CREDENTIAL,
            fallback_kind: Some(ProviderKind::AzureOpenAi),
            upstream_path: path_and_query,
        });
    }
    let named = path_and_query.strip_prefix('/')?;
    let (name, rest) = named.split_at(named.find('/')?);
    let routed =
        is_versioned(rest) || is_gemini_versioned(rest) || is_gemini_transfer(rest) || is_azure(rest);
    if !is_credential_name(name) || !routed {
        return None;
    }
    let fallback_kind = match name {
        AZURE_CREDENTIAL => Some(ProviderKind::AzureOpenAi),
        name => ProviderKind::parse(name),
    };
    Some(Route { credential: name, fallback_kind, upstream_path: rest })
}

/// The model the provider runs for a request to `upstream_path` whose body names `body_model`:
/// the one a model allowlist must allow. Azure OpenAI runs the deployment its path names
/// (`/openai/deployments/{deployment}/...`) and Gemini the model of `models/{model}:{method}`,
/// whatever the body names; any other path runs the body's.
pub fn model_the_provider_runs<'a>(upstream_path: &'a str, body_model: Option<&'a str>) -> Option<&'a str> {
    azure_deployment(upstream_path).or_else(|| crate::usage::model_in_path(upstream_path)).or(body_model)
}

/// The deployment of an Azure OpenAI path, `/openai/deployments/{deployment}/...`, as the path
/// spells it. (Compared undecoded: a pattern without `%` matches an encoded name only where it
/// matches the decoded one.)
fn azure_deployment(upstream_path: &str) -> Option<&str> {
    // The prefix first: every other request's path is not searched.
    let rest = upstream_path.strip_prefix("/openai/deployments/")?;
    let rest = rest.split_once('?').map_or(rest, |(path, _)| path);
    let deployment = rest.split_once('/').map_or(rest, |(deployment, _)| deployment);
    (!deployment.is_empty()).then_some(deployment)
}

/// Whether a request's body is a file rather than a request the provider reads: Gemini's upload
/// of a file, `/upload/v1beta/files` (the file's own bytes with `uploadType=media`). Such a body is
/// the client's document, repeated names and byte-order mark included.
pub fn body_is_a_file(upstream_path: &str) -> bool {
    let path = upstream_path.split_once('?').map_or(upstream_path, |(path, _)| path);
    path == "/upload/v1beta/files"
}

/// The longest path a route has: providers' paths are short (a file's or a deployment's id at
/// most), and the path is the client's text that reaches a receipt, the log and a span.
pub const MAX_PATH_BYTES: usize = 2048;
/// The longest path and query together.
pub const MAX_PATH_AND_QUERY_BYTES: usize = 8192;

/// Whether a path and query fit [`MAX_PATH_BYTES`] and [`MAX_PATH_AND_QUERY_BYTES`].
fn is_bounded(path_and_query: &str) -> bool {
    let path = path_and_query.split_once('?').map_or(path_and_query, |(path, _)| path);
    path.len() <= MAX_PATH_BYTES && path_and_query.len() <= MAX_PATH_AND_QUERY_BYTES
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

/// The path and query without any `key` query parameter, which is how Gemini's API also takes a
/// key: the provider is never sent a key the client put in the URL (the credential's own key goes in
/// its header), and a Recovea key there never leaves the gateway. The name is compared as a server
/// may read it: percent-decoded, in any case (`KEY`, `%6Bey`).
pub fn without_key_param(path_and_query: &str) -> Cow<'_, str> {
    let Some((path, query)) = path_and_query.split_once('?') else { return Cow::Borrowed(path_and_query) };
    let is_key = |pair: &&str| names_the_key(pair.split_once('=').map_or(*pair, |(name, _)| name));
    if !query.split('&').any(|pair| is_key(&pair)) {
        return Cow::Borrowed(path_and_query);
    }
    let kept: Vec<&str> = query.split('&').filter(|pair| !is_key(pair)).collect();
    if kept.is_empty() {
        return Cow::Owned(path.to_owned());
    }
    Cow::Owned(format!("{path}?{}", kept.join("&")))
}

/// Whether a query parameter's name, percent-decoded and in any case, is `key`.
fn names_the_key(name: &str) -> bool {
    if !name.contains('%') {
        return name.eq_ignore_ascii_case("key");
    }
    let mut decoded = Vec::with_capacity(3);
    let mut bytes = name.bytes();
    while let Some(b) = bytes.next() {
        if decoded.len() > 3 {
            return false;
        }
        let byte = match b {
            b'%' => {
                let hex = [bytes.next().unwrap_or(0), bytes.next().unwrap_or(0)];
                match std::str::from_utf8(&hex).ok().and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(byte) => byte,
                    None => return false,
                }
            }
            b => b,
        };
        decoded.push(byte);
    }
    decoded.eq_ignore_ascii_case(b"key")
}

/// `/v1/models/{model}:{method}` with one of Gemini's methods: Gemini's stable API version, which
/// its newer SDKs call by default.
fn is_gemini_model_call(path_and_query: &str) -> bool {
    let path = path_and_query.split_once('?').map_or(path_and_query, |(path, _)| path);
    path.strip_prefix("/v1/").is_some_and(answer::is_gemini_model_call)
}

/// `/v1beta/` followed by something: Gemini's API version.
fn is_gemini_versioned(path: &str) -> bool {
    path.strip_prefix("/v1beta/").is_some_and(|rest| !rest.is_empty())
}

/// Azure OpenAI's paths: `/openai/deployments/{deployment}/...`, `/openai/v1/...`, and the
/// resource's own APIs beside its deployments (Realtime, batches and their files).
fn is_azure(path: &str) -> bool {
    let Some(rest) = path.strip_prefix("/openai/") else { return false };
    let below = |root: &str| rest.strip_prefix(root).is_some_and(|rest| !rest.is_empty());
    below("deployments/")
        || below("v1/")
        || AZURE_RESOURCE_APIS.iter().any(|api| {
            rest.strip_prefix(api).is_some_and(|tail| tail.is_empty() || tail.starts_with(['/', '?']))
        })
}

/// The APIs an Azure OpenAI resource serves at its root rather than under a deployment.
const AZURE_RESOURCE_APIS: [&str; 3] = ["realtime", "batches", "files"];

/// Gemini's file transfers: `/upload/v1beta/...` (uploads) and `/download/v1beta/...` (a batch's
/// results file).
fn is_gemini_transfer(path: &str) -> bool {
    ["/upload", "/download"].iter().any(|root| path.strip_prefix(root).is_some_and(is_gemini_versioned))
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
    fn paths_past_their_bound_are_not_routed() {
        let file = |len: usize| format!("/v1/files/{}", "f".repeat(len - "/v1/files/".len()));
        assert!(route(&file(MAX_PATH_BYTES)).is_some());
        assert_eq!(route(&file(MAX_PATH_BYTES + 1)), None);
        let query = |len: usize| format!("/v1/models?{}", "q".repeat(len - "/v1/models?".len()));
        assert!(route(&query(MAX_PATH_AND_QUERY_BYTES)).is_some());
        assert_eq!(route(&query(MAX_PATH_AND_QUERY_BYTES + 1)), None);
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
    fn azure_routes() {
        use ProviderKind::AzureOpenAi;
        let chat = "/openai/deployments/my-gpt/chat/completions?api-version=2024-10-21";
        assert_eq!(route(chat), r("azure", Some(AzureOpenAi), chat));
        assert_eq!(route(&format!("/azure{chat}")), r("azure", Some(AzureOpenAi), chat));
        assert_eq!(route(&format!("/eu-azure{chat}")), r("eu-azure", None, chat));
        assert_eq!(
            route("/azure/openai/v1/chat/completions"),
            r("azure", Some(AzureOpenAi), "/openai/v1/chat/completions")
        );
        // The named route to `openai` keeps its meaning.
        assert_eq!(
            route("/openai/v1/chat/completions"),
            r("openai", Some(ProviderKind::OpenAi), "/v1/chat/completions")
        );
        for api in [
            "/openai/realtime?api-version=2025-04-01-preview&deployment=rt",
            "/openai/batches",
            "/openai/files/f1",
        ] {
            assert_eq!(route(api), r("azure", Some(AzureOpenAi), api));
            assert_eq!(route(&format!("/azure{api}")), r("azure", Some(AzureOpenAi), api));
        }
        for path in [
            "/openai/deployments/",
            "/azure/openai/",
            "/azure/openai/models",
            "/openai/models",
            "/openai/filesx",
        ] {
            assert_eq!(route(path), None, "{path}");
        }
    }

    #[test]
    fn gemini_routes() {
        use ProviderKind::Gemini;
        let native = "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse";
        assert_eq!(route(native), r("gemini", Some(Gemini), native));
        assert_eq!(route(&format!("/gemini{native}")), r("gemini", Some(Gemini), native));
        assert_eq!(route(&format!("/vertex{native}")), r("vertex", None, native));
        let compat = "/v1beta/openai/chat/completions";
        assert_eq!(route(compat), r("gemini", Some(Gemini), compat));
        // An Anthropic client's header does not move Gemini's paths.
        assert_eq!(route_for(compat, true), r("gemini", Some(Gemini), compat));
        let stable = "/v1/models/gemini-2.5-flash:streamGenerateContent?alt=sse";
        assert_eq!(route(stable), r("gemini", Some(Gemini), stable));
        assert_eq!(route_for(stable, true), r("gemini", Some(Gemini), stable));
        let fine_tuned = "/v1/models/ft:gpt-4o-mini:acme::abc123";
        assert_eq!(route(fine_tuned), r("openai", Some(ProviderKind::OpenAi), fine_tuned));
        for transfer in
            ["/upload/v1beta/files?uploadType=multipart", "/download/v1beta/files/f:download?alt=media"]
        {
            assert_eq!(route(transfer), r("gemini", Some(Gemini), transfer));
            assert_eq!(route(&format!("/gemini{transfer}")), r("gemini", Some(Gemini), transfer));
        }
        assert_eq!(route("/v1beta/"), None);
        assert_eq!(route("/gemini/v1beta/../v1/x"), None);
    }

    #[test]
    fn the_model_the_provider_runs_is_the_paths_where_the_path_names_one() {
        for (path, body, runs) in [
            ("/v1/chat/completions", Some("gpt-4o"), Some("gpt-4o")),
            ("/v1/chat/completions", None, None),
            ("/v1/messages", Some("claude-sonnet-4-5"), Some("claude-sonnet-4-5")),
            // Azure runs the deployment: the body's model is not read there.
            (
                "/openai/deployments/o3-deploy/chat/completions?api-version=2024-10-21",
                Some("gpt-4o"),
                Some("o3-deploy"),
            ),
            ("/openai/deployments/o3-deploy/chat/completions", None, Some("o3-deploy")),
            ("/openai/deployments/emb/embeddings", Some("emb"), Some("emb")),
            ("/openai/deployments/only", Some("gpt-4o"), Some("only")),
            ("/openai/deployments/only?api-version=1", None, Some("only")),
            ("/openai/deployments//chat/completions", Some("gpt-4o"), Some("gpt-4o")),
            // Azure's v1 API and its resource APIs take the model in the body.
            ("/openai/v1/chat/completions", Some("gpt-4o"), Some("gpt-4o")),
            ("/openai/batches", None, None),
            // Gemini runs the path's model, whatever the body names.
            (
                "/v1beta/models/gemini-2.5-pro:generateContent",
                Some("gemini-2.5-flash"),
                Some("gemini-2.5-pro"),
            ),
            ("/v1/models/gemini-2.5-pro:streamGenerateContent?alt=sse", None, Some("gemini-2.5-pro")),
            ("/v1beta/tunedModels/mine:generateContent", Some("x"), Some("mine")),
            // Gemini's OpenAI-compatible endpoint, and a model listing, do not name one in the path.
            ("/v1beta/openai/chat/completions", Some("gemini-2.5-flash"), Some("gemini-2.5-flash")),
            ("/v1beta/models", None, None),
            ("/v1/models/ft:gpt-4o-mini:acme::abc", None, None),
        ] {
            assert_eq!(model_the_provider_runs(path, body), runs, "{path} {body:?}");
        }
    }

    #[test]
    fn only_geminis_file_uploads_carry_a_file() {
        assert!(body_is_a_file("/upload/v1beta/files?uploadType=media"));
        assert!(body_is_a_file("/upload/v1beta/files"));
        for path in [
            "/v1beta/files",
            "/upload/v1beta/files/f1",
            "/upload/v1beta/models/m:generateContent",
            "/v1/files",
            "/v1/chat/completions",
        ] {
            assert!(!body_is_a_file(path), "{path}");
        }
    }

    #[test]
    fn key_params_never_reach_the_provider() {
        let path = "/v1beta/models/m:generateContent";
        assert_eq!(without_key_param(&format!("{path}?key=AIza")), path);
        assert_eq!(without_key_param(&format!("{path}?alt=sse&key=rk_x&k=1")), format!("{path}?alt=sse&k=1"));
        assert_eq!(without_key_param(&format!("{path}?key&alt=sse")), format!("{path}?alt=sse"));
        assert!(matches!(without_key_param(&format!("{path}?alt=sse&keys=1")), Cow::Borrowed(_)));
        // However a server may read the name: any case, percent-encoded.
        for name in ["KEY", "Key", "%6Bey", "k%65y", "%4B%45%59", "%6b%65%79"] {
            assert_eq!(
                without_key_param(&format!("{path}?{name}=AIza&alt=sse")),
                format!("{path}?alt=sse"),
                "{name}"
            );
        }
        for name in ["%6Beys", "k%6", "k%zzy", "ke%79s"] {
            assert!(matches!(without_key_param(&format!("{path}?{name}=1")), Cow::Borrowed(_)), "{name}");
        }
        assert!(matches!(without_key_param(path), Cow::Borrowed(_)));
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
        fn upstream_path_is_always_versioned(
            path in "(/azure|/gemini)?(/openai/deployments|/openai|/v1beta)?/[a-z0-9/_?=.-]{0,40}",
        ) {
            if let Some(route) = route(&path) {
                prop_assert!(
                    ["/v1/", "/v1beta/", "/openai/", "/upload/v1beta/", "/download/v1beta/"]
                        .iter()
                        .any(|root| route.upstream_path.starts_with(root))
                );
                prop_assert!(path.ends_with(route.upstream_path));
            }
        }
    }
}
