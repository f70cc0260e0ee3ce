//! `/orgs/{org}/providers`: an organization's provider credentials, their API keys sealed.

use recovea_core::crypto::{self, MasterKey, provider_key_context};
use recovea_core::ids::OrgId;
use recovea_core::snapshot::ProviderKind;
use recovea_store::ProviderRecord;
use recovea_store::audit::provider_json;
use serde_json::json;

use crate::admin::access::{self, Scope};
use crate::admin::requests::ProviderBody;
use crate::admin::{Caller, Reply, now, ok, outbound_url};
use crate::{ApiError, Control, random};

impl Control {
    pub(crate) async fn list_providers(&self, org_id: OrgId) -> Result<Reply, ApiError> {
        self.require_org(&org_id).await?;
        let providers = self.store(move |s| s.list_providers(&org_id)).await?;
        ok(json!({ "providers": providers.iter().map(provider_json).collect::<Vec<_>>() }))
    }

    /// Creates or replaces a credential: whole by the operator; within an organization, only its
    /// API key (`access::credential_settings`).
    pub(crate) async fn put_provider(
        &self,
        caller: Caller,
        scope: &Scope,
        org_id: OrgId,
        name: &str,
        body: ProviderBody,
    ) -> Result<Reply, ApiError> {
        if !recovea_providers::is_credential_name(name) {
            return Err(ApiError::bad_field(
                "name",
                "a provider name is 1 to 64 characters of a-z, 0-9, '-' and '_'",
            ));
        }
        let kind = ProviderKind::parse(&body.kind).ok_or_else(|| {
            ApiError::bad_field("kind", "expected \"openai\", \"anthropic\", \"azure_openai\" or \"gemini\"")
        })?;
        let base_url = body
            .base_url
            .map(|url| outbound_url(&url))
            .transpose()
            .map_err(|why| ApiError::bad_field("base_url", why))?;
        let api_key = body.api_key.trim();
        if api_key.is_empty() || !api_key.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(ApiError::bad_field("api_key", "expected a non-empty key of printable characters"));
        }
        let price_namespace = body
            .price_namespace
            .map(|namespace| {
                let namespace = namespace.trim().to_owned();
                let plain = namespace
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b));
                if namespace.is_empty() || namespace.len() > 64 || !plain {
                    return Err(ApiError::bad_field(
                        "price_namespace",
                        "1 to 64 characters of a-z, 0-9, '-', '_' and '.'",
                    ));
                }
                Ok(namespace)
            })
            .transpose()?;
        let amount = |field: &str, usd: &str| {
            recovea_core::money::Nanos::parse_usd(usd)
                .ok()
                .filter(|amount| *amount >= recovea_core::money::Nanos::ZERO)
                .ok_or_else(|| ApiError::bad_field(field, "expected dollars per million tokens, 0 or more"))
        };
        let fallback_price = match (&body.fallback_input_per_mtok_usd, &body.fallback_output_per_mtok_usd) {
            (None, None) => None,
            (Some(input), Some(output)) => Some((
                amount("fallback_input_per_mtok_usd", input)?,
                amount("fallback_output_per_mtok_usd", output)?,
            )),
            _ => {
                return Err(ApiError::bad_request(
                    "fallback_input_per_mtok_usd and fallback_output_per_mtok_usd: give both, or neither",
                ));
            }
        };
        self.require_org(&org_id).await?;
        let asked = access::CredentialSettings { kind, base_url, price_namespace, fallback_price };
        let current = match scope {
            Scope::Everything => None,
            Scope::Org(_) => {
                let (org, name) = (org_id.clone(), name.to_owned());
                let providers = self.store(move |s| s.list_providers(&org)).await?;
                providers.into_iter().find(|p| p.name == name).map(|p| access::CredentialSettings {
                    kind: p.kind,
                    base_url: p.base_url,
                    price_namespace: p.price_namespace,
                    fallback_price: p.fallback_price,
                })
            }
        };
        let settings = access::credential_settings(scope, current, asked)?;
        if settings.kind == ProviderKind::AzureOpenAi && settings.base_url.is_none() {
            // Each Azure resource has its own endpoint: there is no default to fall back on.
            return Err(ApiError::bad_field(
                "base_url",
                "an azure_openai credential needs its resource endpoint, such as https://NAME.openai.azure.com",
            ));
        }
        let record = ProviderRecord {
            sealed_key: seal(
                &self.inner.master_key,
                &provider_key_context(org_id.as_str(), name),
                api_key.as_bytes(),
            )?,
            key_hint: crypto::key_hint(api_key),
            org_id,
            name: name.to_owned(),
            kind: settings.kind,
            base_url: settings.base_url,
            updated_at: now(),
            price_namespace: settings.price_namespace,
            fallback_price: settings.fallback_price,
        };
        let (row, audit) = (record.clone(), caller.audit()?);
        self.store(move |s| s.put_provider(&row, &audit)).await?;
        ok(provider_json(&record))
    }
}

fn seal(master_key: &MasterKey, context: &[u8], plaintext: &[u8]) -> Result<Vec<u8>, ApiError> {
    let nonce = random::bytes::<12>().map_err(ApiError::internal)?;
    Ok(master_key.seal(nonce, context, plaintext))
}
