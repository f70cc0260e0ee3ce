//! The admin API's request bodies, defined once: the control plane reads them, `recovea admin` and
//! the console write them, so that a member renamed or added cannot drift between the three.
//!
//! A member the control plane checks by hand, with messages of its own, is a type parameter: the
//! control plane reads it as JSON (`Value`) and says itself what is wrong with it; the CLI writes it
//! typed (the default); the console writes what a person typed in a form, a number where it is one,
//! for the API rather than the console to judge.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Number;

/// The body of `PUT /prices/{model}` and of `PUT /fallback-prices/{kind}` (there without `kind`).
pub use recovea_core::pricing::PriceWire;

/// A member of a patch that is given: `null` removes the setting, a value sets it. A member left
/// out (`None` around it) keeps the setting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change<T> {
    Remove,
    Set(T),
}

impl<T: Serialize> Serialize for Change<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Remove => serializer.serialize_none(),
            Self::Set(value) => value.serialize(serializer),
        }
    }
}

/// A patch member as given: an explicit `null` is `Some(Change::Remove)`, where a plain `Option`
/// would read it as left out.
fn given<'de, D, T>(deserializer: D) -> Result<Option<Change<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Ok(Some(Option::<T>::deserialize(deserializer)?.map_or(Change::Remove, Change::Set)))
}

/// `POST /orgs`.
#[derive(Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewOrg {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allowed_models: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allowed_endpoints: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_concurrent_requests: Option<u32>,
}

/// `PATCH /orgs/{org}`: `N` the limit of requests in flight, `L` each allowlist.
#[derive(Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, bound(deserialize = "N: Deserialize<'de>, L: Deserialize<'de>"))]
pub struct OrgPatch<N = u32, L = Vec<String>> {
    #[serde(default, deserialize_with = "given", skip_serializing_if = "Option::is_none")]
    pub allowed_models: Option<Change<L>>,
    #[serde(default, deserialize_with = "given", skip_serializing_if = "Option::is_none")]
    pub allowed_endpoints: Option<Change<L>>,
    #[serde(default, deserialize_with = "given", skip_serializing_if = "Option::is_none")]
    pub max_concurrent_requests: Option<Change<N>>,
}

/// `POST /orgs/{org}/keys`: `N` its limits.
#[derive(Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewKey<N = u32> {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requests_per_minute: Option<N>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens_per_minute: Option<N>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allowed_models: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allowed_endpoints: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_concurrent_requests: Option<N>,
}

/// `PATCH /keys/{key}`: `N` its limits, `L` each allowlist.
#[derive(Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, bound(deserialize = "N: Deserialize<'de>, L: Deserialize<'de>"))]
pub struct KeyPatch<N = u32, L = Vec<String>> {
    #[serde(default, deserialize_with = "given", skip_serializing_if = "Option::is_none")]
    pub requests_per_minute: Option<Change<N>>,
    #[serde(default, deserialize_with = "given", skip_serializing_if = "Option::is_none")]
    pub tokens_per_minute: Option<Change<N>>,
    #[serde(default, deserialize_with = "given", skip_serializing_if = "Option::is_none")]
    pub allowed_models: Option<Change<L>>,
    #[serde(default, deserialize_with = "given", skip_serializing_if = "Option::is_none")]
    pub allowed_endpoints: Option<Change<L>>,
    #[serde(default, deserialize_with = "given", skip_serializing_if = "Option::is_none")]
    pub max_concurrent_requests: Option<Change<N>>,
}

/// `PUT /orgs/{org}/providers/{name}`. No `Debug`: it carries the provider's API key.
#[derive(Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderBody {
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    pub api_key: String,
    /// The price namespace its models resolve in first (`groq`); left out: its name's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price_namespace: Option<String>,
    /// Its own fallback price for models no entry prices: both, or neither.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback_input_per_mtok_usd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback_output_per_mtok_usd: Option<String>,
}

/// `POST /orgs/{org}/caps`: `A` its alert thresholds.
#[derive(Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewCap<A = Vec<Number>> {
    pub scope: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_id: Option<String>,
    pub window: String,
    pub limit_usd: String,
    pub hard_stop: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alert_at: Option<A>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alert_webhook: Option<String>,
}

/// `PATCH /caps/{cap}`: `W` its webhook.
#[derive(Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, bound(deserialize = "W: Deserialize<'de>"))]
pub struct CapPatch<W = String> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit_usd: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hard_stop: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alert_at: Option<Vec<Number>>,
    #[serde(default, deserialize_with = "given", skip_serializing_if = "Option::is_none")]
    pub alert_webhook: Option<Change<W>>,
}

/// `POST /orgs/{org}/tokens`.
#[derive(Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewOrgToken {
    pub name: String,
    pub role: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
}

/// `POST /node-credentials`.
#[derive(Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewNodeCredential {
    pub name: String,
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    #[test]
    fn a_patch_tells_left_out_from_null() {
        let patch: KeyPatch<Value, Value> =
            serde_json::from_value(json!({ "requests_per_minute": null, "allowed_models": ["a*"] }))
                .expect("parses");
        assert_eq!(patch.requests_per_minute, Some(Change::Remove));
        assert_eq!(patch.tokens_per_minute, None);
        assert_eq!(patch.allowed_models, Some(Change::Set(json!(["a*"]))));
        let written = KeyPatch::<u32> {
            requests_per_minute: Some(Change::Remove),
            tokens_per_minute: Some(Change::Set(10)),
            ..KeyPatch::default()
        };
        assert_eq!(
            serde_json::to_value(&written).expect("serialises"),
            json!({ "requests_per_minute": null, "tokens_per_minute": 10 })
        );
    }

    #[test]
    fn members_left_out_are_not_written() {
        let org = NewOrg { name: "acme".into(), ..NewOrg::default() };
        assert_eq!(serde_json::to_string(&org).expect("serialises"), r#"{"name":"acme"}"#);
    }
}
