//! The operations of the admin API, read once from a request's method and path: `Control::route`
//! dispatches on a [`Route`] and `access` decides on the same value, so that what is authorized
//! and what runs cannot disagree.

use http::Method;

use crate::ApiError;

/// One operation of the admin API, with the ids its path names as given (unparsed: a malformed id
/// is answered as an unknown one, by the handler or the scope check alike).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Route<'a> {
    Audit,
    OrgAudit {
        org: &'a str,
    },
    ListReceipts {
        org: &'a str,
    },
    ReceiptSummary {
        org: &'a str,
    },
    GetReceipt {
        org: &'a str,
        receipt: &'a str,
    },
    ListPrices,
    /// A model's name may hold `/`: the segments after `/prices/`, joined.
    GetPrice {
        model: String,
    },
    PutPrice {
        model: String,
    },
    DeletePrice {
        model: String,
    },
    ImportPrices,
    PutFallbackPrice {
        kind: &'a str,
    },
    DeleteFallbackPrice {
        kind: &'a str,
    },
    ListNodes,
    CreateNodeCredential,
    ListNodeCredentials,
    RevokeNodeCredential {
        credential: &'a str,
    },
    CreateCap {
        org: &'a str,
    },
    ListCaps {
        org: &'a str,
    },
    GetCap {
        cap: &'a str,
    },
    UpdateCap {
        cap: &'a str,
    },
    DeleteCap {
        cap: &'a str,
    },
    Spend {
        org: &'a str,
    },
    ListAlerts {
        org: &'a str,
    },
    CreateOrg,
    ListOrgs,
    GetOrg {
        org: &'a str,
    },
    UpdateOrg {
        org: &'a str,
    },
    CreateKey {
        org: &'a str,
    },
    ListKeys {
        org: &'a str,
    },
    RevokeKey {
        key: &'a str,
    },
    GetKey {
        key: &'a str,
    },
    UpdateKey {
        key: &'a str,
    },
    ListProviders {
        org: &'a str,
    },
    PutProvider {
        org: &'a str,
        name: &'a str,
    },
    CreateOrgToken {
        org: &'a str,
    },
    ListOrgTokens {
        org: &'a str,
    },
    RevokeOrgToken {
        token: &'a str,
    },
}

impl<'a> Route<'a> {
    /// The operation at `segments` (the path after `/admin/v1/`, each segment decoded): `404` for a
    /// path the API does not have, `405` for one it has with other methods.
    pub(crate) fn parse(method: &Method, segments: &[&'a str]) -> Result<Self, ApiError> {
        let route = match (segments, method) {
            (["audit"], &Method::GET) => Self::Audit,
            (["orgs", org, "audit"], &Method::GET) => Self::OrgAudit { org },
            (["orgs", org, "receipts"], &Method::GET) => Self::ListReceipts { org },
            (["orgs", org, "receipts", "summary"], &Method::GET) => Self::ReceiptSummary { org },
            (["orgs", org, "receipts", receipt], &Method::GET) => Self::GetReceipt { org, receipt },
            (["prices"], &Method::GET) => Self::ListPrices,
            (["nodes"], &Method::GET) => Self::ListNodes,
            (["node-credentials"], &Method::POST) => Self::CreateNodeCredential,
            (["node-credentials"], &Method::GET) => Self::ListNodeCredentials,
            (["node-credentials", credential], &Method::DELETE) => Self::RevokeNodeCredential { credential },
            (["orgs", org, "caps"], &Method::POST) => Self::CreateCap { org },
            (["orgs", org, "caps"], &Method::GET) => Self::ListCaps { org },
            (["caps", cap], &Method::GET) => Self::GetCap { cap },
            (["caps", cap], &Method::PATCH) => Self::UpdateCap { cap },
            (["caps", cap], &Method::DELETE) => Self::DeleteCap { cap },
            (["orgs", org, "spend"], &Method::GET) => Self::Spend { org },
            (["orgs", org, "alerts"], &Method::GET) => Self::ListAlerts { org },
            (["prices", model @ ..], &Method::PUT) if !model.is_empty() => {
                Self::PutPrice { model: model.join("/") }
            }
            (["prices", model @ ..], &Method::GET) if !model.is_empty() => {
                Self::GetPrice { model: model.join("/") }
            }
            (["prices", model @ ..], &Method::DELETE) if !model.is_empty() => {
                Self::DeletePrice { model: model.join("/") }
            }
            (["price-imports"], &Method::POST) => Self::ImportPrices,
            (["fallback-prices", kind], &Method::PUT) => Self::PutFallbackPrice { kind },
            (["fallback-prices", kind], &Method::DELETE) => Self::DeleteFallbackPrice { kind },
            (["orgs"], &Method::POST) => Self::CreateOrg,
            (["orgs"], &Method::GET) => Self::ListOrgs,
            (["orgs", org], &Method::GET) => Self::GetOrg { org },
            (["orgs", org], &Method::PATCH) => Self::UpdateOrg { org },
            (["orgs", org, "keys"], &Method::POST) => Self::CreateKey { org },
            (["orgs", org, "keys"], &Method::GET) => Self::ListKeys { org },
            (["keys", key, "revoke"], &Method::POST) => Self::RevokeKey { key },
            (["keys", key], &Method::GET) => Self::GetKey { key },
            (["keys", key], &Method::PATCH) => Self::UpdateKey { key },
            (["orgs", org, "providers"], &Method::GET) => Self::ListProviders { org },
            (["orgs", org, "providers", name], &Method::PUT) => Self::PutProvider { org, name },
            (["orgs", org, "tokens"], &Method::POST) => Self::CreateOrgToken { org },
            (["orgs", org, "tokens"], &Method::GET) => Self::ListOrgTokens { org },
            (["tokens", token, "revoke"], &Method::POST) => Self::RevokeOrgToken { token },
            (["orgs"] | ["orgs", _] | ["orgs", _, "keys"] | ["keys", _, "revoke"] | ["keys", _], _)
            | (["orgs", _, "providers"] | ["orgs", _, "providers", _], _)
            | (["orgs", _, "receipts"] | ["orgs", _, "receipts", "summary"] | ["prices", ..], _)
            | (["orgs", _, "caps"] | ["caps", _] | ["orgs", _, "spend"] | ["orgs", _, "alerts"], _)
            | (
                ["nodes"] | ["price-imports"] | ["fallback-prices", _] | ["audit"] | ["orgs", _, "audit"],
                _,
            )
            | (["node-credentials"] | ["node-credentials", _], _)
            | (["orgs", _, "tokens"] | ["tokens", _, "revoke"], _) => return Err(ApiError::MethodNotAllowed),
            _ => return Err(ApiError::NotFound("Unknown admin path.".into())),
        };
        Ok(route)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_become_operations_with_the_ids_they_name() {
        fn parse(method: Method, path: &'static str) -> Result<Route<'static>, u16> {
            let segments: Vec<&'static str> = path.split('/').collect();
            Route::parse(&method, &segments).map_err(|e| e.answer().status)
        }
        assert_eq!(parse(Method::POST, "orgs/org_a/tokens"), Ok(Route::CreateOrgToken { org: "org_a" }));
        assert_eq!(parse(Method::GET, "orgs/org_a/tokens"), Ok(Route::ListOrgTokens { org: "org_a" }));
        assert_eq!(parse(Method::POST, "tokens/tok_a/revoke"), Ok(Route::RevokeOrgToken { token: "tok_a" }));
        assert_eq!(parse(Method::GET, "orgs/org_a/audit"), Ok(Route::OrgAudit { org: "org_a" }));
        assert_eq!(
            parse(Method::GET, "orgs/org_a/receipts/summary"),
            Ok(Route::ReceiptSummary { org: "org_a" }),
            "summary is not a receipt's id"
        );
        assert_eq!(
            parse(Method::PUT, "prices/openai/gpt-4o"),
            Ok(Route::PutPrice { model: "openai/gpt-4o".into() })
        );
        assert_eq!(parse(Method::DELETE, "orgs/org_a/tokens"), Err(405));
        assert_eq!(parse(Method::GET, "tokens/tok_a/revoke"), Err(405));
        assert_eq!(parse(Method::POST, "orgs/org_a/audit"), Err(405));
        assert_eq!(parse(Method::GET, "tokens/tok_a"), Err(404));
        assert_eq!(parse(Method::GET, "prices"), Ok(Route::ListPrices));
    }
}
