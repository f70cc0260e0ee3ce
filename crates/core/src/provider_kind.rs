//! Which provider API a credential speaks: the one thing both the snapshot (a credential's kind)
//! and the price table (prices by kind) need, so that neither reads the other for it.

/// The wire dialect a credential speaks, which decides its auth header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProviderKind {
    OpenAi,
    Anthropic,
    /// Azure OpenAI: OpenAI's shapes under `/openai/...` on a resource endpoint, the key in `api-key`.
    AzureOpenAi,
    /// Google Gemini: `generateContent` and an OpenAI-compatible endpoint, the key in `x-goog-api-key`.
    Gemini,
}

impl ProviderKind {
    /// Every kind, in the order the admin API lists them.
    pub const ALL: [ProviderKind; 4] =
        [ProviderKind::OpenAi, ProviderKind::Anthropic, ProviderKind::AzureOpenAi, ProviderKind::Gemini];

    /// The kind's place in [`Self::ALL`]: an index for tables kept per kind.
    pub fn index(self) -> usize {
        match self {
            Self::OpenAi => 0,
            Self::Anthropic => 1,
            Self::AzureOpenAi => 2,
            Self::Gemini => 3,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::OpenAi => "openai",
            Self::Anthropic => "anthropic",
            Self::AzureOpenAi => "azure_openai",
            Self::Gemini => "gemini",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "openai" => Some(Self::OpenAi),
            "anthropic" => Some(Self::Anthropic),
            "azure_openai" => Some(Self::AzureOpenAi),
            "gemini" => Some(Self::Gemini),
            _ => None,
        }
    }

    /// The kind whose price table entries price this kind's models: Azure serves OpenAI's models
    /// under OpenAI's names (its answers name the model, whatever the deployment is called).
    pub fn priced_like(self) -> Self {
        match self {
            Self::AzureOpenAi => Self::OpenAi,
            kind => kind,
        }
    }
}
