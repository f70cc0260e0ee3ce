//! The channel of spend a request belongs to, decided by its method and path (and, for the
//! Responses API, its `background` member): when it can cost money, and whether the gateway sees
//! what it costs.
//!
//! A request that nothing here lists, and whose answer the usage tap does not read, is outside the
//! gateway's sight rather than free: a stop that gives way to an unknown endpoint is not a stop.

use http::Method;

/// What a request can spend, and where the gateway reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Channel {
    /// The answer carries its usage (chat, completions, Responses in the foreground, Messages,
    /// embeddings, Gemini `generateContent`, images, audio): metered as it passes.
    Immediate,
    /// It cannot spend (reads, deletions, cancellations, uploads, moderations, token counts):
    /// admitted even at an armed cap's line and while spend cannot be confirmed, it reserves
    /// nothing, and its receipt costs nothing.
    Free,
    /// A job the provider runs later: estimated and held when it is created, settled from the
    /// provider's own usage when it ends.
    Deferred(JobKind),
    /// Realtime over WebSocket: each `response.done` is metered as the session runs.
    Session,
    /// Billed where the gateway cannot see it: refused while an armed cap covers the key,
    /// otherwise forwarded with an unmetered receipt.
    OutsideSight(Unseen),
}

/// The kinds of deferred job, each polled and settled its own way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JobKind {
    /// `POST /v1/batches`: its input is a file uploaded through `POST /v1/files`.
    OpenAiBatch,
    /// `POST /v1/messages/batches`: its requests are inline.
    AnthropicBatch,
    /// Gemini's `models/{model}:batchGenerateContent`: its requests are inline.
    GeminiBatch,
    /// `POST /v1/responses` with `"background": true`.
    BackgroundResponse,
}

impl JobKind {
    pub const ALL: [JobKind; 4] =
        [Self::OpenAiBatch, Self::AnthropicBatch, Self::GeminiBatch, Self::BackgroundResponse];

    /// The name stored with a job and shown by the admin API.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::OpenAiBatch => "openai_batch",
            Self::AnthropicBatch => "anthropic_batch",
            Self::GeminiBatch => "gemini_batch",
            Self::BackgroundResponse => "background_response",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.as_str() == text)
    }

    /// Whether the provider runs it at its batch price.
    pub fn is_batch(self) -> bool {
        !matches!(self, Self::BackgroundResponse)
    }
}

/// The endpoints outside the gateway's sight, as the `endpoint` label of
/// `recovea_unmetered_requests_total` names them: a fixed set, whatever the client's path holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unseen {
    RealtimeClientSecrets,
    RealtimeSessions,
    RealtimeTranscriptionSessions,
    RealtimeCalls,
    FineTuningJobs,
    VectorStores,
    Containers,
    AssistantsRuns,
    Videos,
    GeminiCachedContents,
    GeminiAuthTokens,
    /// A WebSocket upgrade to a path other than Realtime's.
    WebSocket,
    /// A deferred job the gateway cannot estimate or poll (an input file it never saw, the
    /// client's own provider key).
    UnmeterableJob(JobKind),
    /// Any other request that could spend and that the gateway does not understand.
    Other,
}

impl Unseen {
    pub const LABELS: [&'static str; 17] = [
        "/v1/realtime/client_secrets",
        "/v1/realtime/sessions",
        "/v1/realtime/transcription_sessions",
        "/v1/realtime/calls",
        "/v1/fine_tuning/jobs",
        "/v1/vector_stores",
        "/v1/containers",
        "/v1/threads/runs",
        "/v1/videos",
        "cachedContents",
        "auth_tokens",
        "websocket",
        "/v1/batches",
        "/v1/messages/batches",
        ":batchGenerateContent",
        "/v1/responses",
        "other",
    ];

    /// This endpoint's place in [`Self::LABELS`].
    pub fn index(self) -> usize {
        match self {
            Self::RealtimeClientSecrets => 0,
            Self::RealtimeSessions => 1,
            Self::RealtimeTranscriptionSessions => 2,
            Self::RealtimeCalls => 3,
            Self::FineTuningJobs => 4,
            Self::VectorStores => 5,
            Self::Containers => 6,
            Self::AssistantsRuns => 7,
            Self::Videos => 8,
            Self::GeminiCachedContents => 9,
            Self::GeminiAuthTokens => 10,
            Self::WebSocket => 11,
            Self::UnmeterableJob(JobKind::OpenAiBatch) => 12,
            Self::UnmeterableJob(JobKind::AnthropicBatch) => 13,
            Self::UnmeterableJob(JobKind::GeminiBatch) => 14,
            Self::UnmeterableJob(JobKind::BackgroundResponse) => 15,
            Self::Other => 16,
        }
    }

    /// The `endpoint` label.
    pub fn label(self) -> &'static str {
        Self::LABELS[self.index()]
    }
}

/// What of a request decides its channel.
#[derive(Debug, Clone, Copy)]
pub struct RequestLine<'a> {
    pub method: &'a Method,
    /// The path as the provider sees it (`/v1/...`, `/v1beta/...`, `/openai/...`), its query
    /// ignored.
    pub upstream_path: &'a str,
    /// The request asks to upgrade to a WebSocket (`Upgrade: websocket`).
    pub websocket: bool,
    /// The body says `"background": true`.
    pub background: bool,
}

/// The channel of a request, as the contract lists them ("Every channel of spend").
pub fn classify(request: RequestLine<'_>) -> Channel {
    let api = api_path(request.upstream_path);
    let method = request.method;
    if request.websocket {
        return if api == "realtime" { Channel::Session } else { Channel::OutsideSight(Unseen::WebSocket) };
    }
    if method == Method::GET
        || method == Method::HEAD
        || method == Method::DELETE
        || method == Method::OPTIONS
    {
        return Channel::Free;
    }
    if method == Method::POST {
        classify_post(api, request.background)
    } else {
        // PUT, PATCH and the rest: Gemini updates a cache with PATCH, and an update the gateway
        // does not understand may start spend it cannot see.
        match api.split('/').next() {
            Some("cachedContents") => Channel::OutsideSight(Unseen::GeminiCachedContents),
            _ => Channel::OutsideSight(Unseen::Other),
        }
    }
}

fn classify_post(api: &str, background: bool) -> Channel {
    if api.ends_with("/cancel") || api.ends_with(":cancel") {
        return Channel::Free;
    }
    if let Some(method) = gemini_model_method(api) {
        return match method {
            "generateContent" | "streamGenerateContent" | "embedContent" | "batchEmbedContents" => {
                Channel::Immediate
            }
            "countTokens" => Channel::Free,
            "batchGenerateContent" => Channel::Deferred(JobKind::GeminiBatch),
            _ => Channel::OutsideSight(Unseen::Other),
        };
    }
    let segments: Vec<&str> = api.split('/').collect();
    let unseen = |endpoint| Channel::OutsideSight(endpoint);
    match segments.as_slice() {
        ["chat", "completions"]
        | ["completions"]
        | ["embeddings"]
        | ["messages"]
        | ["images", "generations" | "edits" | "variations"]
        | ["audio", "speech" | "transcriptions" | "translations"] => Channel::Immediate,
        ["responses"] if background => Channel::Deferred(JobKind::BackgroundResponse),
        ["responses"] => Channel::Immediate,
        ["files"] | ["uploads", ..] | ["moderations"] => Channel::Free,
        ["messages", "count_tokens"] | ["responses", "input_tokens"] => Channel::Free,
        ["batches"] => Channel::Deferred(JobKind::OpenAiBatch),
        ["messages", "batches"] => Channel::Deferred(JobKind::AnthropicBatch),
        ["realtime", "client_secrets"] => unseen(Unseen::RealtimeClientSecrets),
        ["realtime", "sessions"] => unseen(Unseen::RealtimeSessions),
        ["realtime", "transcription_sessions"] => unseen(Unseen::RealtimeTranscriptionSessions),
        ["realtime", "calls", ..] => unseen(Unseen::RealtimeCalls),
        ["fine_tuning", "jobs", ..] => unseen(Unseen::FineTuningJobs),
        ["vector_stores", ..] => unseen(Unseen::VectorStores),
        ["containers", ..] => unseen(Unseen::Containers),
        ["threads", "runs"] | ["threads", _, "runs", ..] => unseen(Unseen::AssistantsRuns),
        ["videos", ..] => unseen(Unseen::Videos),
        ["cachedContents", ..] => unseen(Unseen::GeminiCachedContents),
        ["auth_tokens", ..] => unseen(Unseen::GeminiAuthTokens),
        _ => unseen(Unseen::Other),
    }
}

/// The path below its API's root, without its query: `chat/completions` for
/// `/v1/chat/completions`, `/openai/deployments/{d}/chat/completions`, `/openai/v1/chat/completions`
/// and `/v1beta/openai/chat/completions` alike; `models/{m}:generateContent` for Gemini's
/// `/v1beta/...` and `/v1/...`; `files` for Gemini's `/upload/v1beta/files`.
pub fn api_path(upstream_path: &str) -> &str {
    let path = upstream_path.split_once('?').map_or(upstream_path, |(path, _)| path);
    if let Some(rest) = path.strip_prefix("/openai/deployments/") {
        return rest.split_once('/').map_or("", |(_deployment, api)| api);
    }
    const ROOTS: [&str; 7] = [
        "/openai/v1/",
        "/v1beta/openai/",
        "/upload/v1beta/",
        "/download/v1beta/",
        "/v1beta/",
        "/openai/",
        "/v1/",
    ];
    let api = ROOTS.iter().find_map(|root| path.strip_prefix(root)).unwrap_or(path);
    api.trim_end_matches('/')
}

/// Gemini's `models/{model}:{method}` (or `tunedModels/`): the method.
fn gemini_model_method(api: &str) -> Option<&str> {
    let rest = api.strip_prefix("models/").or_else(|| api.strip_prefix("tunedModels/"))?;
    let (model, method) = rest.rsplit_once(':')?;
    (!model.is_empty() && !model.contains('/')).then_some(method)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn channel(method: &str, path: &str) -> Channel {
        let method = Method::from_bytes(method.as_bytes()).expect("a method");
        classify(RequestLine { method: &method, upstream_path: path, websocket: false, background: false })
    }

    #[test]
    fn the_contract_lists_each_channel_and_this_is_it() {
        let immediate = [
            "/v1/chat/completions",
            "/v1/completions",
            "/v1/embeddings",
            "/v1/messages",
            "/v1/messages?beta=true",
            "/v1/responses",
            "/v1/images/generations",
            "/v1/images/edits",
            "/v1/audio/speech",
            "/v1/audio/transcriptions",
            "/v1/audio/translations",
            "/v1beta/models/gemini-2.5-pro:generateContent",
            "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse",
            "/v1/models/gemini-2.5-flash:generateContent",
            "/v1beta/models/text-embedding-004:embedContent",
            "/v1beta/openai/chat/completions",
            "/openai/deployments/my-gpt/chat/completions?api-version=2024-10-21",
            "/openai/v1/responses",
        ];
        for path in immediate {
            assert_eq!(channel("POST", path), Channel::Immediate, "{path}");
        }
        let free_posts = [
            "/v1/batches/batch_1/cancel",
            "/v1/responses/resp_1/cancel",
            "/v1/messages/batches/msgbatch_1/cancel",
            "/v1/fine_tuning/jobs/ftjob_1/cancel",
            "/v1beta/batches/abc:cancel",
            "/v1/files",
            "/v1/uploads",
            "/v1/uploads/upload_1/parts",
            "/v1/uploads/upload_1/complete",
            "/upload/v1beta/files",
            "/openai/files?api-version=2024-10-21",
            "/v1/moderations",
            "/v1/messages/count_tokens",
            "/v1/responses/input_tokens",
            "/v1beta/models/gemini-2.5-pro:countTokens",
        ];
        for path in free_posts {
            assert_eq!(channel("POST", path), Channel::Free, "{path}");
        }
        for method in ["GET", "HEAD", "DELETE", "OPTIONS"] {
            for path in
                ["/v1/models", "/v1/batches/batch_1", "/v1/files/file-1/content", "/v1/responses/resp_1"]
            {
                assert_eq!(channel(method, path), Channel::Free, "{method} {path}");
            }
        }
        let deferred = [
            ("/v1/batches", JobKind::OpenAiBatch),
            ("/openai/batches?api-version=2024-10-21", JobKind::OpenAiBatch),
            ("/v1/messages/batches", JobKind::AnthropicBatch),
            ("/v1beta/models/gemini-2.5-flash:batchGenerateContent", JobKind::GeminiBatch),
        ];
        for (path, kind) in deferred {
            assert_eq!(channel("POST", path), Channel::Deferred(kind), "{path}");
        }
        let unseen = [
            ("/v1/realtime/client_secrets", Unseen::RealtimeClientSecrets),
            ("/v1/realtime/sessions", Unseen::RealtimeSessions),
            ("/v1/realtime/transcription_sessions", Unseen::RealtimeTranscriptionSessions),
            ("/v1/realtime/calls", Unseen::RealtimeCalls),
            ("/v1/fine_tuning/jobs", Unseen::FineTuningJobs),
            ("/v1/vector_stores", Unseen::VectorStores),
            ("/v1/vector_stores/vs_1/files", Unseen::VectorStores),
            ("/v1/vector_stores/vs_1/file_batches", Unseen::VectorStores),
            ("/v1/containers", Unseen::Containers),
            ("/v1/threads/runs", Unseen::AssistantsRuns),
            ("/v1/threads/thread_1/runs", Unseen::AssistantsRuns),
            ("/v1/videos", Unseen::Videos),
            ("/v1beta/cachedContents", Unseen::GeminiCachedContents),
            ("/v1beta/auth_tokens", Unseen::GeminiAuthTokens),
            ("/v1/some/new/endpoint", Unseen::Other),
            ("/v1/complete", Unseen::Other),
            ("/v1beta/models/gemini-2.5-pro:asyncBatchEmbedContent", Unseen::Other),
        ];
        for (path, endpoint) in unseen {
            assert_eq!(channel("POST", path), Channel::OutsideSight(endpoint), "{path}");
        }
        assert_eq!(channel("PUT", "/v1/chat/completions"), Channel::OutsideSight(Unseen::Other));
        assert_eq!(
            channel("PATCH", "/v1beta/cachedContents/abc"),
            Channel::OutsideSight(Unseen::GeminiCachedContents)
        );
    }

    #[test]
    fn background_makes_a_response_a_job() {
        let line = |background| RequestLine {
            method: &Method::POST,
            upstream_path: "/v1/responses",
            websocket: false,
            background,
        };
        assert_eq!(classify(line(true)), Channel::Deferred(JobKind::BackgroundResponse));
        assert_eq!(classify(line(false)), Channel::Immediate);
    }

    #[test]
    fn a_websocket_upgrade_is_a_session_only_on_realtime() {
        let upgrade = |path| RequestLine {
            method: &Method::GET,
            upstream_path: path,
            websocket: true,
            background: false,
        };
        assert_eq!(classify(upgrade("/v1/realtime?model=gpt-realtime")), Channel::Session);
        assert_eq!(
            classify(upgrade("/openai/realtime?api-version=2025-04-01-preview&deployment=d")),
            Channel::Session
        );
        assert_eq!(classify(upgrade("/openai/v1/realtime?model=gpt-realtime")), Channel::Session);
        assert_eq!(classify(upgrade("/v1/responses")), Channel::OutsideSight(Unseen::WebSocket));
        // Without the upgrade, a GET of the same path is a read.
        assert_eq!(channel("GET", "/v1/realtime"), Channel::Free);
    }

    #[test]
    fn every_unseen_endpoint_has_its_own_label() {
        let all = [
            Unseen::RealtimeClientSecrets,
            Unseen::RealtimeSessions,
            Unseen::RealtimeTranscriptionSessions,
            Unseen::RealtimeCalls,
            Unseen::FineTuningJobs,
            Unseen::VectorStores,
            Unseen::Containers,
            Unseen::AssistantsRuns,
            Unseen::Videos,
            Unseen::GeminiCachedContents,
            Unseen::GeminiAuthTokens,
            Unseen::WebSocket,
            Unseen::UnmeterableJob(JobKind::OpenAiBatch),
            Unseen::UnmeterableJob(JobKind::AnthropicBatch),
            Unseen::UnmeterableJob(JobKind::GeminiBatch),
            Unseen::UnmeterableJob(JobKind::BackgroundResponse),
            Unseen::Other,
        ];
        let indexes: Vec<usize> = all.iter().map(|u| u.index()).collect();
        assert_eq!(indexes, (0..Unseen::LABELS.len()).collect::<Vec<_>>());
        for kind in JobKind::ALL {
            assert_eq!(JobKind::parse(kind.as_str()), Some(kind));
        }
    }

    proptest! {
        /// Whatever the path, reads and deletions are free, and no POST the lists do not name is:
        /// an unknown path never escapes a cap.
        #[test]
        fn unknown_paths_are_never_free(segments in proptest::collection::vec("[a-z_:]{1,12}", 1..5)) {
            let path = format!("/v1/{}", segments.join("/"));
            prop_assert_eq!(channel("GET", &path), Channel::Free);
            prop_assert_eq!(channel("DELETE", &path), Channel::Free);
            let post = channel("POST", &path);
            if post == Channel::Free {
                let api = api_path(&path);
                let named = api.ends_with("/cancel") || api.ends_with(":cancel")
                    || ["files", "moderations", "messages/count_tokens", "responses/input_tokens"].contains(&api)
                    || api == "uploads" || api.starts_with("uploads/")
                    || api.ends_with(":countTokens");
                prop_assert!(named, "{path} is free without being listed");
            }
        }
    }
}
