//! Which answer a provider request gets: its path read as OpenAI's, Azure's or Gemini's, and the
//! generated answer or a provider-shaped error.

use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{Method, StatusCode};

use super::{Shared, base_url};
use crate::jobs::JobRequest;
use crate::request::{Answer, Ctx, Fields, json_string};
use crate::script::Plan;
use crate::usage::{REPLY_PIECES, input_tokens};
use crate::{anthropic, gemini, media, openai};

/// A path of OpenAI's API as answered.
struct OpenAiPath<'a> {
    /// The `/v1/...` path it is answered as.
    path: String,
    /// An Azure deployment's name.
    deployment: Option<&'a str>,
    /// Azure's legacy paths answer 404 without an `api-version` query parameter.
    needs_version: bool,
}

/// A path of Azure OpenAI (`/openai/deployments/{deployment}/...`, `/openai/v1/...`, the legacy
/// `/openai/files...` and `/openai/batches...`) or of Gemini's OpenAI-compatible endpoint
/// (`/v1beta/openai/...`) as the `/v1/...` path it is answered as; any other path as it is.
fn as_openai_path(path: &str) -> OpenAiPath<'_> {
    if let Some(rest) = path.strip_prefix("/openai/deployments/")
        && let Some((deployment, api)) = rest.split_once('/')
    {
        return OpenAiPath { path: format!("/v1/{api}"), deployment: Some(deployment), needs_version: true };
    }
    for root in ["/openai/v1/", "/v1beta/openai/"] {
        if let Some(api) = path.strip_prefix(root) {
            return OpenAiPath { path: format!("/v1/{api}"), deployment: None, needs_version: false };
        }
    }
    if let Some(api) = path.strip_prefix("/openai/")
        && ["files", "batches"].iter().any(|root| api == *root || api.starts_with(&format!("{root}/")))
    {
        return OpenAiPath { path: format!("/v1/{api}"), deployment: None, needs_version: true };
    }
    OpenAiPath { path: path.to_owned(), deployment: None, needs_version: false }
}

/// Gemini's `/v1beta/models/{model}:{method}`, or its `/v1/` twin with a Gemini method: the model and
/// the method.
fn gemini_call(path: &str) -> Option<(&str, &str)> {
    if let Some(rest) = path.strip_prefix("/v1beta/models/") {
        return rest.split_once(':').filter(|(model, _)| !model.is_empty());
    }
    let (model, method) = path.strip_prefix("/v1/models/")?.split_once(':')?;
    let gemini = ["generateContent", "streamGenerateContent", "batchGenerateContent"].contains(&method);
    (gemini && !model.is_empty()).then_some((model, method))
}

/// The generated answer for a provider request.
pub(super) fn route(
    shared: &Shared,
    parts: &http::request::Parts,
    body: &[u8],
    n: u64,
    plan: Option<&Plan>,
) -> Answer {
    let (method, path) = (&parts.method, parts.uri.path());
    let query = parts.uri.query().unwrap_or("");
    let error = |status: StatusCode, message: &str| Answer::Json(status, error_body(path, status, message));
    if let Some((model, call)) = gemini_call(path) {
        let stream = match (method.as_str(), call) {
            ("POST", "generateContent") => false,
            ("POST", "streamGenerateContent") => true,
            ("POST", "batchGenerateContent") => return shared.jobs.create_gemini_batch(model, body),
            _ => return error(StatusCode::NOT_FOUND, &format!("Invalid URL ({method} {path})")),
        };
        let Some(input_tokens) = input_tokens(body) else {
            return error(StatusCode::BAD_REQUEST, "Invalid JSON payload received.");
        };
        let fields = Fields::default();
        let ctx = Ctx {
            n,
            created: 0,
            model: json_string(model),
            fields: &fields,
            input_tokens,
            usage: plan.and_then(|p| p.usage.as_deref()),
            pieces: plan.and_then(|p| p.pieces).unwrap_or(REPLY_PIECES.len()),
            web_search_calls: 0,
        };
        let sse = query.split('&').any(|pair| pair == "alt=sse");
        return gemini::generate_content(&ctx, stream, sse);
    }
    let openai_path = as_openai_path(path);
    if openai_path.needs_version && !query.split('&').any(|pair| pair.starts_with("api-version=")) {
        return error(
            StatusCode::NOT_FOUND,
            "Resource not found: the api-version query parameter is required",
        );
    }
    let (path, deployment) = (openai_path.path.as_str(), openai_path.deployment);
    let header = |name| parts.headers.get(name).and_then(|v| v.to_str().ok());
    let host_url;
    let base_url = match &shared.own_url {
        Some(url) => url.as_str(),
        None => {
            host_url = base_url(shared.transport, header("host").unwrap_or("localhost"));
            host_url.as_str()
        }
    };
    let job = JobRequest { method, path, content_type: header("content-type"), body, base_url };
    if let Some(answer) = shared.jobs.route(&job) {
        return answer;
    }
    if *method == Method::GET {
        if path == "/v1/models" {
            return Answer::Json(StatusCode::OK, shared.models.clone());
        }
        if let Some(id) = path.strip_prefix("/v1/models/").filter(|id| !id.is_empty()) {
            return openai::model(id);
        }
    }
    if *method == Method::POST {
        let usage = plan.and_then(|p| p.usage.as_deref());
        let created = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        match path {
            "/v1/images/generations" | "/v1/images/edits" => {
                return media::images(n, created, header("content-type"), body, usage);
            }
            "/v1/audio/speech" => return media::speech(body, usage),
            "/v1/audio/transcriptions" | "/v1/audio/translations" => {
                return media::transcription(header("content-type"), body, usage);
            }
            _ => {}
        }
    }
    let known = [
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/responses",
        "/v1/embeddings",
        "/v1/messages",
        "/v1/messages/count_tokens",
    ];
    if *method != Method::POST || !known.contains(&path) {
        return error(StatusCode::NOT_FOUND, &format!("Invalid URL ({method} {path})"));
    }
    let (Ok(fields), Some(input_tokens)) = (serde_json::from_slice::<Fields>(body), input_tokens(body))
    else {
        let message = "The request body is not valid JSON or has fields of the wrong type.";
        return error(StatusCode::BAD_REQUEST, message);
    };
    // An Azure deployment answers with the model the body names, else with its own name.
    let model = match (fields.named_model(), deployment) {
        (None, Some(deployment)) => deployment,
        _ => fields.model(),
    };
    let ctx = Ctx {
        n,
        created: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        model: json_string(model),
        fields: &fields,
        input_tokens,
        usage: plan.and_then(|p| p.usage.as_deref()),
        pieces: plan.and_then(|p| p.pieces).unwrap_or(REPLY_PIECES.len()),
        web_search_calls: plan.and_then(|p| p.web_search_calls).unwrap_or(0),
    };
    match path {
        "/v1/chat/completions" => openai::chat(&ctx),
        "/v1/completions" => openai::completions(&ctx),
        "/v1/responses" if fields.background() => shared.jobs.create_response(&ctx),
        "/v1/responses" => {
            shared.jobs.remember_response(&ctx);
            openai::responses(&ctx)
        }
        "/v1/embeddings" => openai::embeddings(&ctx, body),
        "/v1/messages/count_tokens" => anthropic::count_tokens(&ctx),
        _ => anthropic::messages(&ctx),
    }
}

/// An error in the shape of the API the path belongs to.
pub(super) fn error_body(path: &str, status: StatusCode, message: &str) -> Bytes {
    if path.starts_with("/v1/messages") {
        anthropic::error_body(status, message)
    } else if (path.starts_with("/v1beta/") && !path.starts_with("/v1beta/openai/"))
        || gemini_call(path).is_some()
    {
        gemini::error_body(status, message)
    } else {
        openai::error_body(status, message)
    }
}
