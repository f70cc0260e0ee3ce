//! Which API answered, told from the path it was called at, and what Gemini's paths name.

use recovea_core::snapshot::ProviderKind;

/// Which API answered, and so which usage shape to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Surface {
    ChatCompletions,
    Completions,
    Responses,
    Embeddings,
    Messages,
    /// Gemini's `models/{model}:generateContent` and `:streamGenerateContent` (a JSON array, or
    /// events with `alt=sse`).
    GenerateContent,
    /// The Images API (`images/generations`, `images/edits`, `images/variations`): gpt-image
    /// models' token usage, or the images an answer holds (DALL-E's carry no usage).
    Images,
    /// Text to speech (`audio/speech`): raw audio, whose usage is the request's (its characters);
    /// a stream (`stream_format: "sse"`) reports tokens in `speech.audio.done`.
    Speech,
    /// Transcription and translation (`audio/transcriptions`, `audio/translations`): `usage` in
    /// seconds or tokens, or a verbose answer's `duration`.
    Transcription,
    /// Anything else (models, files, `messages/count_tokens`, batches): not tapped.
    Other,
}

impl Surface {
    /// The surface of an upstream path (a query is ignored).
    pub fn of(kind: ProviderKind, upstream_path: &str) -> Surface {
        // The path alone decides: the answer's shape follows the API called, not the vendor, and
        // each kind's compatible endpoints answer in that API's shape (Anthropic's
        // `/v1/chat/completions` answers like OpenAI; third parties serve `/v1/messages` too).
        let _ = kind;
        let path = upstream_path.split_once('?').map_or(upstream_path, |(path, _)| path);
        if let Some(method) = gemini_method(path) {
            return match method {
                "generateContent" | "streamGenerateContent" => Surface::GenerateContent,
                _ => Surface::Other,
            };
        }
        // Azure's and Gemini's OpenAI-compatible paths answer in OpenAI's shapes.
        let api = if let Some(rest) = path.strip_prefix("/openai/deployments/") {
            rest.split_once('/').map_or("", |(_deployment, api)| api)
        } else {
            ["/openai/v1/", "/v1beta/openai/", "/openai/", "/v1/"]
                .iter()
                .find_map(|root| path.strip_prefix(root))
                .unwrap_or("")
        };
        match api {
            "chat/completions" => Surface::ChatCompletions,
            "completions" => Surface::Completions,
            "responses" => Surface::Responses,
            "embeddings" => Surface::Embeddings,
            "messages" if path == "/v1/messages" => Surface::Messages,
            "images/generations" | "images/edits" | "images/variations" => Surface::Images,
            "audio/speech" => Surface::Speech,
            "audio/transcriptions" | "audio/translations" => Surface::Transcription,
            _ => Surface::Other,
        }
    }
}

/// Gemini's `models/{model}:{method}` under `/v1beta/` or `/v1/`: the method.
fn gemini_method(path: &str) -> Option<&str> {
    gemini_call(path).map(|(_, method)| method)
}

/// Gemini's `/v1beta/models/{model}:{method}` (or `/v1/`, or `tunedModels/`), one of its methods:
/// the model and method. (An OpenAI fine-tuned model's id, `ft:...`, is none.)
fn gemini_call(path: &str) -> Option<(&str, &str)> {
    let rest = path.strip_prefix("/v1beta/").or_else(|| path.strip_prefix("/v1/"))?;
    let rest = rest.strip_prefix("models/").or_else(|| rest.strip_prefix("tunedModels/"))?;
    let (model, method) = rest.rsplit_once(':')?;
    let known = recovea_core::answer::GEMINI_MODEL_METHODS.contains(&method);
    (known && !model.is_empty() && !model.contains(['/', ':'])).then_some((model, method))
}

/// The model a request names in its path rather than its body (Gemini's `models/{model}:...`).
pub fn model_in_path(upstream_path: &str) -> Option<&str> {
    let path = upstream_path.split_once('?').map_or(upstream_path, |(path, _)| path);
    gemini_call(path).map(|(model, _)| model)
}

/// Whether the path asks for a stream whatever the body says (Gemini's `:streamGenerateContent`).
pub fn streams_by_path(upstream_path: &str) -> bool {
    let path = upstream_path.split_once('?').map_or(upstream_path, |(path, _)| path);
    gemini_method(path) == Some("streamGenerateContent")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn surfaces_follow_the_path() {
        use ProviderKind::{Anthropic, OpenAi};
        assert_eq!(Surface::of(OpenAi, "/v1/chat/completions"), Surface::ChatCompletions);
        assert_eq!(Surface::of(OpenAi, "/v1/chat/completions?x=1"), Surface::ChatCompletions);
        assert_eq!(Surface::of(OpenAi, "/v1/completions"), Surface::Completions);
        assert_eq!(Surface::of(OpenAi, "/v1/responses"), Surface::Responses);
        assert_eq!(Surface::of(OpenAi, "/v1/embeddings"), Surface::Embeddings);
        assert_eq!(Surface::of(Anthropic, "/v1/messages"), Surface::Messages);
        assert_eq!(Surface::of(Anthropic, "/v1/messages?beta=true"), Surface::Messages);
        assert_eq!(Surface::of(Anthropic, "/v1/chat/completions"), Surface::ChatCompletions);
        for other in
            ["/v1/messages/count_tokens", "/v1/messages/batches", "/v1/models", "/v1/responses/resp_1", ""]
        {
            assert_eq!(Surface::of(Anthropic, other), Surface::Other, "{other}");
            assert_eq!(Surface::of(OpenAi, other), Surface::Other, "{other}");
        }
    }

    #[test]
    fn azure_and_gemini_paths_have_openai_and_gemini_surfaces() {
        use ProviderKind::{AzureOpenAi, Gemini};
        for (path, surface) in [
            ("/openai/deployments/my-gpt/chat/completions?api-version=2024-10-21", Surface::ChatCompletions),
            ("/openai/deployments/my-gpt/completions", Surface::Completions),
            ("/openai/deployments/emb/embeddings?api-version=1", Surface::Embeddings),
            ("/openai/v1/chat/completions", Surface::ChatCompletions),
            ("/openai/v1/responses", Surface::Responses),
            ("/openai/responses?api-version=2025-04-01-preview", Surface::Responses),
            ("/openai/deployments/my-gpt/chat/completions/extra", Surface::Other),
            ("/openai/v1/messages", Surface::Other),
        ] {
            assert_eq!(Surface::of(AzureOpenAi, path), surface, "{path}");
        }
        for (path, surface) in [
            ("/v1beta/openai/chat/completions", Surface::ChatCompletions),
            ("/v1beta/openai/embeddings", Surface::Embeddings),
            ("/v1beta/models/gemini-2.5-flash:generateContent", Surface::GenerateContent),
            ("/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse", Surface::GenerateContent),
            ("/v1/models/gemini-2.5-flash:generateContent", Surface::GenerateContent),
            ("/v1beta/models/gemini-2.5-flash:countTokens", Surface::Other),
            ("/v1beta/models/gemini-2.5-flash:embedContent", Surface::Other),
            ("/v1beta/models", Surface::Other),
        ] {
            assert_eq!(Surface::of(Gemini, path), surface, "{path}");
        }
    }

    #[test]
    fn gemini_names_its_model_in_the_path() {
        assert_eq!(model_in_path("/v1beta/models/gemini-2.5-pro:generateContent"), Some("gemini-2.5-pro"));
        assert_eq!(
            model_in_path("/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse"),
            Some("gemini-2.5-pro")
        );
        assert_eq!(model_in_path("/v1beta/tunedModels/mine:generateContent"), Some("mine"));
        assert_eq!(model_in_path("/v1/models/ft:gpt-4o-mini:acme::abc"), None);
        assert!(streams_by_path("/v1beta/models/m:streamGenerateContent?alt=sse"));
        assert!(!streams_by_path("/v1beta/models/m:generateContent"));
        for path in [
            "/v1/chat/completions",
            "/v1beta/models/:generateContent",
            "/v1beta/models/a/b:x",
            "/v1/models/gpt-4o",
        ] {
            assert_eq!(model_in_path(path), None, "{path}");
        }
    }
}
