//! Token usage of one request, in the receipt's terms, whichever provider reported it.

use crate::pricing::ServiceTier;

/// What a request used, as a receipt records it: tokens, and every other quantity a provider bills.
///
/// `input_tokens` counts every input token: plain, read from the cache, and written to the cache
/// (for Anthropic: `input_tokens + cache_read_input_tokens + cache_creation_input_tokens`).
/// `cached_input_tokens` and `cache_write_input_tokens` are the parts of it read from and written to
/// the provider's cache (`cache_write_1h_input_tokens` the part of the writes kept an hour).
/// `output_tokens` includes reasoning tokens; `reasoning_tokens` is that part. Audio and image
/// tokens are parts too: `audio_input_tokens` and `image_input_tokens` of `input_tokens` (their
/// cached parts of both it and `cached_input_tokens`), `audio_output_tokens` and
/// `image_output_tokens` of `output_tokens`.
///
/// The other quantities are the units of models priced otherwise (`characters` of text to speech,
/// `seconds` of audio transcribed, `images` generated), the built-in tools' calls, and the tier the
/// request was served at.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Usage {
    pub input_tokens: u64,
    pub cached_input_tokens: u64,
    pub cache_write_input_tokens: u64,
    pub cache_write_1h_input_tokens: u64,
    pub output_tokens: u64,
    pub reasoning_tokens: u64,
    pub audio_input_tokens: u64,
    pub cached_audio_input_tokens: u64,
    pub audio_output_tokens: u64,
    pub image_input_tokens: u64,
    pub cached_image_input_tokens: u64,
    pub image_output_tokens: u64,
    pub characters: u64,
    pub seconds: u64,
    pub images: u64,
    pub web_search_calls: u64,
    pub file_search_calls: u64,
    pub code_interpreter_sessions: u64,
    pub service_tier: ServiceTier,
}

impl Usage {
    /// Both usages together, each count saturating: the usage of several requests. The tier is the
    /// first's, unless it is the standard one.
    pub fn saturating_add(self, other: Usage) -> Usage {
        let add = |a: u64, b: u64| a.saturating_add(b);
        Usage {
            input_tokens: add(self.input_tokens, other.input_tokens),
            cached_input_tokens: add(self.cached_input_tokens, other.cached_input_tokens),
            cache_write_input_tokens: add(self.cache_write_input_tokens, other.cache_write_input_tokens),
            cache_write_1h_input_tokens: add(
                self.cache_write_1h_input_tokens,
                other.cache_write_1h_input_tokens,
            ),
            output_tokens: add(self.output_tokens, other.output_tokens),
            reasoning_tokens: add(self.reasoning_tokens, other.reasoning_tokens),
            audio_input_tokens: add(self.audio_input_tokens, other.audio_input_tokens),
            cached_audio_input_tokens: add(self.cached_audio_input_tokens, other.cached_audio_input_tokens),
            audio_output_tokens: add(self.audio_output_tokens, other.audio_output_tokens),
            image_input_tokens: add(self.image_input_tokens, other.image_input_tokens),
            cached_image_input_tokens: add(self.cached_image_input_tokens, other.cached_image_input_tokens),
            image_output_tokens: add(self.image_output_tokens, other.image_output_tokens),
            characters: add(self.characters, other.characters),
            seconds: add(self.seconds, other.seconds),
            images: add(self.images, other.images),
            web_search_calls: add(self.web_search_calls, other.web_search_calls),
            file_search_calls: add(self.file_search_calls, other.file_search_calls),
            code_interpreter_sessions: add(self.code_interpreter_sessions, other.code_interpreter_sessions),
            service_tier: if self.service_tier.is_standard() {
                other.service_tier
            } else {
                self.service_tier
            },
        }
    }

    /// Input tokens billed at the plain input price: text (not audio or image) neither read from
    /// nor written to the cache.
    pub fn plain_input_tokens(&self) -> u64 {
        self.input_tokens
            .saturating_sub(self.cached_input_tokens)
            .saturating_sub(self.cache_write_input_tokens)
            .saturating_sub(self.plain_audio_input_tokens())
            .saturating_sub(self.plain_image_input_tokens())
    }

    /// Audio input not read from the cache, billed at the audio input price.
    pub fn plain_audio_input_tokens(&self) -> u64 {
        self.audio_input_tokens.saturating_sub(self.cached_audio_input_tokens)
    }

    /// Image input not read from the cache, billed at the image input price.
    pub fn plain_image_input_tokens(&self) -> u64 {
        self.image_input_tokens.saturating_sub(self.cached_image_input_tokens)
    }

    /// Text input read from the cache, billed at the cached input price.
    pub fn cached_text_input_tokens(&self) -> u64 {
        self.cached_input_tokens
            .saturating_sub(self.cached_audio_input_tokens)
            .saturating_sub(self.cached_image_input_tokens)
    }

    /// Cache writes kept five minutes (the default), billed at the cache-write price.
    pub fn cache_write_5m_input_tokens(&self) -> u64 {
        self.cache_write_input_tokens.saturating_sub(self.cache_write_1h_input_tokens)
    }

    /// Output that is neither audio nor image, billed at the output price.
    pub fn text_output_tokens(&self) -> u64 {
        self.output_tokens.saturating_sub(self.audio_output_tokens).saturating_sub(self.image_output_tokens)
    }

    /// Whether it holds nothing at all to bill.
    pub fn is_empty(&self) -> bool {
        *self == Usage { service_tier: self.service_tier, ..Usage::default() }
    }
}

/// Where a receipt's usage came from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum UsageSource {
    /// Reported by the provider in its answer.
    #[default]
    Provider,
    /// The provider reported none (a cut stream, an omitted block): estimated from the request and
    /// the content seen.
    Estimated,
    /// Billed where the gateway cannot see it (a request of the outside-sight channel forwarded
    /// while no armed cap covered its key): the receipt says that it happened, not what it cost.
    Unmetered,
}

impl UsageSource {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Provider => "provider",
            Self::Estimated => "estimated",
            Self::Unmetered => "unmetered",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "provider" => Some(Self::Provider),
            "estimated" => Some(Self::Estimated),
            "unmetered" => Some(Self::Unmetered),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_input_excludes_cache_reads_and_writes() {
        let usage = Usage {
            input_tokens: 100,
            cached_input_tokens: 30,
            cache_write_input_tokens: 20,
            ..Usage::default()
        };
        assert_eq!(usage.plain_input_tokens(), 50);
        let inconsistent = Usage { input_tokens: 10, cached_input_tokens: 30, ..Usage::default() };
        assert_eq!(inconsistent.plain_input_tokens(), 0);
    }

    #[test]
    fn a_usage_source_parses_from_its_name_only() {
        for source in [UsageSource::Provider, UsageSource::Estimated, UsageSource::Unmetered] {
            assert_eq!(UsageSource::parse(source.as_str()), Some(source));
        }
        assert_eq!(UsageSource::parse("Provider"), None);
        assert_eq!(UsageSource::parse(""), None);
    }
}
