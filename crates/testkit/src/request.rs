//! The few request fields the mock's answers depend on, and the context every answer is built from.

use serde::Deserialize;

/// Model named in answers when the request names none.
const DEFAULT_MODEL: &str = "mock-model";

/// The request fields that shape an answer; everything else is ignored, as a lenient server would.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct Fields {
    model: Option<String>,
    stream: Option<bool>,
    background: Option<bool>,
    stream_options: Option<StreamOptions>,
    pub(crate) encoding_format: Option<String>,
    service_tier: Option<String>,
    pub(crate) dimensions: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct StreamOptions {
    include_usage: Option<bool>,
}

impl Fields {
    pub(crate) fn model(&self) -> &str {
        self.model.as_deref().unwrap_or(DEFAULT_MODEL)
    }

    /// The model the request names, if it names one.
    pub(crate) fn named_model(&self) -> Option<&str> {
        self.model.as_deref()
    }

    pub(crate) fn stream(&self) -> bool {
        self.stream.unwrap_or(false)
    }

    /// A Responses API request to run in the background (see [`crate::jobs`]).
    pub(crate) fn background(&self) -> bool {
        self.background.unwrap_or(false)
    }

    /// The tier the answer says it served: the one asked for when it is `flex` or `priority`
    /// (OpenAI's `fast` is reported as `priority`), else `default`.
    pub(crate) fn service_tier(&self) -> &'static str {
        match self.service_tier.as_deref() {
            Some("flex") => "flex",
            Some("priority" | "fast") => "priority",
            _ => "default",
        }
    }

    pub(crate) fn include_usage(&self) -> bool {
        self.stream_options.as_ref().and_then(|o| o.include_usage).unwrap_or(false)
    }
}

/// Everything an answer builder needs besides the body.
pub(crate) struct Ctx<'a> {
    /// The request's number, used in ids.
    pub(crate) n: u64,
    /// Unix seconds.
    pub(crate) created: u64,
    /// The model, already a JSON string literal.
    pub(crate) model: String,
    pub(crate) fields: &'a Fields,
    pub(crate) input_tokens: u64,
    /// A scripted usage object, already JSON text.
    pub(crate) usage: Option<&'a str>,
    /// How many pieces the answer's text has (see [`crate::usage::reply_piece`]).
    pub(crate) pieces: usize,
    /// How many `web_search_call` items a Responses answer lists before its message.
    pub(crate) web_search_calls: u64,
}

/// Renders `s` as a JSON string literal.
pub(crate) fn json_string(s: &str) -> String {
    serde_json::to_string(s).expect("serialising a str cannot fail")
}

/// A generated answer, before the script's headers and pacing are applied.
pub(crate) enum Answer {
    Json(http::StatusCode, bytes::Bytes),
    Events(Vec<bytes::Bytes>),
    /// A 200 body that is not JSON (a file's bytes, JSONL results), with its content type.
    Raw(&'static str, bytes::Bytes),
}

impl Answer {
    pub(crate) fn ok(json: String) -> Self {
        Self::Json(http::StatusCode::OK, json.into())
    }
}

impl Ctx<'_> {
    /// Output tokens: one per piece.
    pub(crate) fn output_tokens(&self) -> u64 {
        self.pieces as u64
    }

    /// The answer's whole text.
    pub(crate) fn reply_text(&self) -> String {
        crate::usage::reply_text(self.pieces)
    }

    /// The scripted usage object, or `default` computed.
    pub(crate) fn usage_or(&self, default: impl FnOnce(u64) -> String) -> std::borrow::Cow<'_, str> {
        match self.usage {
            Some(u) => std::borrow::Cow::Borrowed(u),
            None => std::borrow::Cow::Owned(default(self.input_tokens)),
        }
    }
}
