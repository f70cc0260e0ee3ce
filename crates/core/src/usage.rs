//! Token usage of one request, in the receipt's terms, whichever provider reported it.

/// Token counts as a receipt records them.
///
/// `input_tokens` counts every input token: plain, read from the cache, and written to the cache
/// (for Anthropic: `input_tokens + cache_read_input_tokens + cache_creation_input_tokens`).
/// `cached_input_tokens` and `cache_write_input_tokens` are the parts of it read from and written to
/// the provider's cache. `output_tokens` includes reasoning tokens; `reasoning_tokens` is that part.
/// Audio tokens (Realtime, audio chat) are parts too: `audio_input_tokens` of `input_tokens`
/// (`cached_audio_input_tokens` of both it and `cached_input_tokens`), `audio_output_tokens` of
/// `output_tokens`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Usage {
    pub input_tokens: u64,
    pub cached_input_tokens: u64,
    pub cache_write_input_tokens: u64,
    pub output_tokens: u64,
    pub reasoning_tokens: u64,
    pub audio_input_tokens: u64,
    pub cached_audio_input_tokens: u64,
    pub audio_output_tokens: u64,
}

impl Usage {
    /// Both counts together, each saturating: the usage of several requests.
    pub fn saturating_add(self, other: Usage) -> Usage {
        Usage {
            input_tokens: self.input_tokens.saturating_add(other.input_tokens),
            cached_input_tokens: self.cached_input_tokens.saturating_add(other.cached_input_tokens),
            cache_write_input_tokens: self
                .cache_write_input_tokens
                .saturating_add(other.cache_write_input_tokens),
            output_tokens: self.output_tokens.saturating_add(other.output_tokens),
            reasoning_tokens: self.reasoning_tokens.saturating_add(other.reasoning_tokens),
            audio_input_tokens: self.audio_input_tokens.saturating_add(other.audio_input_tokens),
            cached_audio_input_tokens: self
                .cached_audio_input_tokens
                .saturating_add(other.cached_audio_input_tokens),
            audio_output_tokens: self.audio_output_tokens.saturating_add(other.audio_output_tokens),
        }
    }

    /// Input tokens billed at the plain input price: text (not audio) neither read from nor
    /// written to the cache.
    pub fn plain_input_tokens(&self) -> u64 {
        self.input_tokens
            .saturating_sub(self.cached_input_tokens)
            .saturating_sub(self.cache_write_input_tokens)
            .saturating_sub(self.plain_audio_input_tokens())
    }

    /// Audio input not read from the cache, billed at the audio input price.
    pub fn plain_audio_input_tokens(&self) -> u64 {
        self.audio_input_tokens.saturating_sub(self.cached_audio_input_tokens)
    }

    /// Text input read from the cache, billed at the cached input price.
    pub fn cached_text_input_tokens(&self) -> u64 {
        self.cached_input_tokens.saturating_sub(self.cached_audio_input_tokens)
    }

    /// Output that is not audio, billed at the output price.
    pub fn text_output_tokens(&self) -> u64 {
        self.output_tokens.saturating_sub(self.audio_output_tokens)
    }
}

/// Where a receipt's usage came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UsageSource {
    /// Reported by the provider in its answer.
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
