//! `recovea admin prices`: the price table, its overrides and imports, and the fallback prices.

use clap::Subcommand;
use http::Method;
use recovea_control::requests::PriceWire;

use super::{Call, encode};

#[derive(Subcommand)]
pub(super) enum Prices {
    /// Lists the table in force, each entry's source, and the fallback price per provider kind.
    List,
    /// Resolves a model name as the gateway prices it, and says where the price came from; given
    /// an organization and one of its credentials (`--org`, `--provider`), as a request through
    /// that credential: its price namespace first, then its fallback.
    Get {
        model: String,
        #[arg(long, env = "RECOVEA_ORG", requires = "provider")]
        org: Option<String>,
        #[arg(long, env = "RECOVEA_PROVIDER_NAME", requires = "org")]
        provider: Option<String>,
    },
    /// Removes a model's override: back to the built-in price, as a new revision.
    Delete { model: String },
    /// Imports a price file (the built-in table's format, or LiteLLM's
    /// model_prices_and_context_window.json) as one revision.
    Import { file: std::path::PathBuf },
    /// Sets a provider kind's (openai, anthropic, gemini) fallback price: what a model without a
    /// price costs.
    SetFallback {
        kind: String,
        #[arg(long, env = "RECOVEA_PRICE_INPUT")]
        input: String,
        #[arg(long, env = "RECOVEA_PRICE_OUTPUT")]
        output: String,
    },
    /// Removes a provider kind's fallback price: computed from the table again.
    DeleteFallback { kind: String },
    /// Sets a model's price per million tokens (USD decimal strings): a new revision of the table.
    Set {
        model: String,
        /// The provider kind (openai, anthropic, azure_openai, gemini) that serves the model.
        #[arg(long, env = "RECOVEA_PRICE_KIND")]
        kind: Option<String>,
        #[arg(long, env = "RECOVEA_PRICE_INPUT")]
        input: String,
        #[arg(long, env = "RECOVEA_PRICE_OUTPUT")]
        output: String,
        #[arg(long, env = "RECOVEA_PRICE_CACHED_INPUT")]
        cached_input: Option<String>,
        #[arg(long, env = "RECOVEA_PRICE_CACHE_WRITE")]
        cache_write: Option<String>,
    },
}

impl Prices {
    pub(super) fn call(self) -> Result<Call, String> {
        Ok(match self {
            Self::List => Call::new(Method::GET, "/prices"),
            Self::Get { model, org, provider } => {
                let query = match (org, provider) {
                    (Some(org), Some(provider)) => {
                        format!("?org={}&provider={}", encode(&org), encode(&provider))
                    }
                    _ => String::new(),
                };
                Call::new(Method::GET, format!("/prices/{}{query}", encode(&model)))
            }
            Self::Delete { model } => Call::new(Method::DELETE, format!("/prices/{}", encode(&model))),
            Self::Import { file } => {
                let text = std::fs::read(&file).map_err(|e| format!("{}: {e}", file.display()))?;
                Call::new(Method::POST, "/price-imports").file(text)
            }
            Self::SetFallback { kind, input, output } => {
                let body = PriceWire {
                    input_per_mtok_usd: input,
                    output_per_mtok_usd: output,
                    ..PriceWire::default()
                };
                Call::new(Method::PUT, format!("/fallback-prices/{}", encode(&kind))).json(&body)?
            }
            Self::DeleteFallback { kind } => {
                Call::new(Method::DELETE, format!("/fallback-prices/{}", encode(&kind)))
            }
            Self::Set { model, kind, input, output, cached_input, cache_write } => {
                let body = PriceWire {
                    kind,
                    input_per_mtok_usd: input,
                    output_per_mtok_usd: output,
                    cached_input_per_mtok_usd: cached_input,
                    cache_write_per_mtok_usd: cache_write,
                    ..PriceWire::default()
                };
                Call::new(Method::PUT, format!("/prices/{}", encode(&model))).json(&body)?
            }
        })
    }
}
