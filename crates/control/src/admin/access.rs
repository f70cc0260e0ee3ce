//! Who may call what: the admin API's one authorization decision, pure, and the scope check that
//! carries it out.
//!
//! Every operation says what it touches ([`Route::access`]: one exhaustive match, so that no route
//! can be added without a decision), and [`decide`] holds a caller's [`Reach`] against it:
//!
//! - the operator reaches everything;
//! - a caller within one organization (an organization token, or a person the sign-on maps to an
//!   organization's role) is refused `403 permission_denied` on what is the operator's alone
//!   (prices, fallback prices, nodes, node credentials, creating organizations, the whole audit
//!   log), and, as a viewer, on every change;
//! - otherwise it is held to its organization: whatever the path names (an organization, a key, a
//!   cap, a token) must be its organization's, or the answer is the `404` an unknown id gets, byte
//!   for byte ([`Control::check_target`]), so that no answer tells whether another organization's
//!   id exists.
//!
//! The `403`s are decided from the route and the role alone, before any id is looked up, so they
//! say nothing of any id either. Two changes are the organization's only in part, decided by
//! [`org_patch`] and [`credential_settings`]: the organization's limit of requests in flight, and a
//! credential's kind, base URL and prices, are the operator's.

use recovea_core::ids::{CapId, KeyId, OrgId, OrgTokenId};
use recovea_core::money::Nanos;
use recovea_core::snapshot::ProviderKind;

use crate::admin::routes::Route;
use crate::principal::Reach;
use crate::{ApiError, Control};

/// What an operation touches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access<'a> {
    /// The operator's alone: refused to every caller within an organization.
    Operator,
    /// Reads what `target` names, or changes it (`write`).
    Of { target: Target<'a>, write: bool },
}

/// What an operation's path names, by which a caller within an organization is held to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target<'a> {
    /// The organizations: a caller within one sees its own alone.
    Orgs,
    Org(&'a str),
    Key(&'a str),
    Cap(&'a str),
    OrgToken(&'a str),
}

/// What a caller may reach in an operation [`decide`] let through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Scope {
    Everything,
    Org(OrgId),
}

/// Why a caller may not: each a `403 permission_denied`, whose message says why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Denied {
    /// The operation is the operator's alone.
    OperatorOnly,
    /// A viewer's change.
    ReadOnly,
    /// A change of the organization's limit of requests in flight.
    OrgConcurrency,
    /// A credential the organization does not have: adding one chooses its kind and base URL.
    NewCredential,
    CredentialKind,
    CredentialBaseUrl,
    CredentialPriceNamespace,
    CredentialFallbackPrice,
}

impl Denied {
    pub(crate) fn message(self) -> &'static str {
        match self {
            Self::OperatorOnly => "Only the operator may do this.",
            Self::ReadOnly => "This token's role (viewer) may only read.",
            Self::OrgConcurrency => {
                "max_concurrent_requests: the organization's limit of requests in flight is the operator's to set"
            }
            Self::NewCredential => {
                "name: only the operator adds a credential; this one may only have its api_key replaced"
            }
            Self::CredentialKind => "kind: a credential's kind is the operator's to change",
            Self::CredentialBaseUrl => "base_url: a credential's base URL is the operator's to change",
            Self::CredentialPriceNamespace => {
                "price_namespace: a credential's prices are the operator's to change"
            }
            Self::CredentialFallbackPrice => {
                "fallback_input_per_mtok_usd: a credential's prices are the operator's to change"
            }
        }
    }
}

impl From<Denied> for ApiError {
    fn from(denied: Denied) -> Self {
        ApiError::PermissionDenied(denied.message())
    }
}

impl<'a> Route<'a> {
    /// What the operation touches: the table every authorization is decided from.
    pub(crate) fn access(&self) -> Access<'a> {
        let read = |target| Access::Of { target, write: false };
        let write = |target| Access::Of { target, write: true };
        match *self {
            Route::Audit
            | Route::ListPrices
            | Route::GetPrice { .. }
            | Route::PutPrice { .. }
            | Route::DeletePrice { .. }
            | Route::ImportPrices
            | Route::PutFallbackPrice { .. }
            | Route::DeleteFallbackPrice { .. }
            | Route::ListNodes
            | Route::CreateNodeCredential
            | Route::ListNodeCredentials
            | Route::RevokeNodeCredential { .. }
            | Route::CreateOrg => Access::Operator,
            Route::ListOrgs => read(Target::Orgs),
            Route::GetOrg { org }
            | Route::OrgAudit { org }
            | Route::ListReceipts { org }
            | Route::ReceiptSummary { org }
            | Route::GetReceipt { org, .. }
            | Route::ListCaps { org }
            | Route::Spend { org }
            | Route::ListAlerts { org }
            | Route::ListKeys { org }
            | Route::ListProviders { org }
            | Route::ListOrgTokens { org } => read(Target::Org(org)),
            Route::UpdateOrg { org }
            | Route::CreateCap { org }
            | Route::CreateKey { org }
            | Route::PutProvider { org, .. }
            | Route::CreateOrgToken { org } => write(Target::Org(org)),
            Route::GetKey { key } => read(Target::Key(key)),
            Route::RevokeKey { key } | Route::UpdateKey { key } => write(Target::Key(key)),
            Route::GetCap { cap } => read(Target::Cap(cap)),
            Route::UpdateCap { cap } | Route::DeleteCap { cap } => write(Target::Cap(cap)),
            Route::RevokeOrgToken { token } => write(Target::OrgToken(token)),
        }
    }
}

/// Whether a caller that reaches `reach` may do what `access` says, and within what.
pub(crate) fn decide(reach: &Reach, access: Access<'_>) -> Result<Scope, Denied> {
    match (reach, access) {
        (Reach::Everything, _) => Ok(Scope::Everything),
        (Reach::Org { .. }, Access::Operator) => Err(Denied::OperatorOnly),
        (Reach::Org { role, .. }, Access::Of { write: true, .. }) if !role.may_write() => {
            Err(Denied::ReadOnly)
        }
        (Reach::Org { org, .. }, Access::Of { .. }) => Ok(Scope::Org(org.clone())),
    }
}

/// `PATCH /orgs/{org}` within `scope`: the organization's allowlists are its own to set; its limit
/// of requests in flight is the operator's, as it shares every node's capacity among customers.
pub(crate) fn org_patch(scope: &Scope, sets_max_concurrent_requests: bool) -> Result<(), Denied> {
    match scope {
        Scope::Org(_) if sets_max_concurrent_requests => Err(Denied::OrgConcurrency),
        Scope::Everything | Scope::Org(_) => Ok(()),
    }
}

/// What of a provider credential is the operator's: where its requests go and how they are priced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CredentialSettings {
    pub(crate) kind: ProviderKind,
    pub(crate) base_url: Option<String>,
    pub(crate) price_namespace: Option<String>,
    pub(crate) fallback_price: Option<(Nanos, Nanos)>,
}

/// The settings a credential `PUT` leaves, given what it `asked` (validated; each left out `None`)
/// and the credential as it is (`current`, `None` when there is none of that name).
///
/// The operator's `PUT` replaces the credential: what it leaves out takes its default. Within an
/// organization a `PUT` replaces the API key alone: it may repeat the operator's settings as they
/// are, and leaving one out keeps it; changing one, or adding a credential, is refused.
pub(crate) fn credential_settings(
    scope: &Scope,
    current: Option<CredentialSettings>,
    asked: CredentialSettings,
) -> Result<CredentialSettings, Denied> {
    if sets_whole_credentials(scope) {
        return Ok(asked);
    }
    let current = current.ok_or(Denied::NewCredential)?;
    if asked.kind != current.kind {
        Err(Denied::CredentialKind)
    } else if !keeps(&asked.base_url, &current.base_url) {
        Err(Denied::CredentialBaseUrl)
    } else if !keeps(&asked.price_namespace, &current.price_namespace) {
        Err(Denied::CredentialPriceNamespace)
    } else if !keeps(&asked.fallback_price, &current.fallback_price) {
        Err(Denied::CredentialFallbackPrice)
    } else {
        Ok(current)
    }
}

/// Whether `scope` sets a credential whole (its kind, base URL and prices), or adds one: the
/// operator's alone. Within an organization only a credential's API key is replaced.
pub(crate) fn sets_whole_credentials(scope: &Scope) -> bool {
    match scope {
        Scope::Everything => true,
        Scope::Org(_) => false,
    }
}

/// Whether an optional member of a request keeps `current`: left out, or given as it is.
fn keeps<T: PartialEq>(asked: &Option<T>, current: &Option<T>) -> bool {
    asked.is_none() || asked == current
}

impl Control {
    /// Holds a caller within one organization to it: what `target` names must be that
    /// organization's, or the answer is the `404` of an unknown id (the same bytes: whether
    /// another organization has such an id is never told).
    pub(crate) async fn check_target(&self, scope: &Scope, target: Target<'_>) -> Result<(), ApiError> {
        let Scope::Org(org) = scope else { return Ok(()) };
        let owner = match target {
            Target::Orgs => return Ok(()),
            Target::Org(id) => OrgId::parse(id),
            Target::Key(id) => match KeyId::parse(id) {
                Some(key) => self.store(move |s| s.key(&key)).await?.map(|key| key.org_id),
                None => None,
            },
            Target::Cap(id) => match CapId::parse(id) {
                Some(cap) => self.store(move |s| s.cap(&cap)).await?.map(|cap| cap.cap.org_id),
                None => None,
            },
            Target::OrgToken(id) => match OrgTokenId::parse(id) {
                Some(token) => self.store(move |s| s.org_token(&token)).await?.map(|token| token.org_id),
                None => None,
            },
        };
        if owner.as_ref() == Some(org) { Ok(()) } else { Err(target.not_found()) }
    }
}

impl Target<'_> {
    /// The answer for an id that names nothing the caller reaches: the handlers' own for an id
    /// that names nothing at all.
    pub(crate) fn not_found(self) -> ApiError {
        match self {
            Target::Orgs => ApiError::NotFound("Unknown admin path.".into()),
            Target::Org(id) => crate::admin::no_org(id),
            Target::Key(id) => crate::admin::no_key(id),
            Target::Cap(id) => crate::admin::no_cap(id),
            Target::OrgToken(id) => crate::admin::no_org_token(id),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use recovea_core::org_tokens::OrgRole;

    /// Every role a caller within an organization may hold.
    const ROLES: [OrgRole; 2] = [OrgRole::Admin, OrgRole::Viewer];

    fn org(id: &str) -> OrgId {
        OrgId::parse(id).expect("org id")
    }

    fn within(role: OrgRole) -> Reach {
        Reach::Org { org: org("org_a"), role }
    }

    /// One of every operation, naming ids of org_a where it names any.
    fn every_route() -> Vec<Route<'static>> {
        vec![
            Route::Audit,
            Route::OrgAudit { org: "org_a" },
            Route::ListReceipts { org: "org_a" },
            Route::ReceiptSummary { org: "org_a" },
            Route::GetReceipt { org: "org_a", receipt: "rcpt_a" },
            Route::ListPrices,
            Route::GetPrice { model: "m".into() },
            Route::PutPrice { model: "m".into() },
            Route::DeletePrice { model: "m".into() },
            Route::ImportPrices,
            Route::PutFallbackPrice { kind: "openai" },
            Route::DeleteFallbackPrice { kind: "openai" },
            Route::ListNodes,
            Route::CreateNodeCredential,
            Route::ListNodeCredentials,
            Route::RevokeNodeCredential { credential: "ncr_a" },
            Route::CreateCap { org: "org_a" },
            Route::ListCaps { org: "org_a" },
            Route::GetCap { cap: "cap_a" },
            Route::UpdateCap { cap: "cap_a" },
            Route::DeleteCap { cap: "cap_a" },
            Route::Spend { org: "org_a" },
            Route::ListAlerts { org: "org_a" },
            Route::CreateOrg,
            Route::ListOrgs,
            Route::GetOrg { org: "org_a" },
            Route::UpdateOrg { org: "org_a" },
            Route::CreateKey { org: "org_a" },
            Route::ListKeys { org: "org_a" },
            Route::RevokeKey { key: "key_a" },
            Route::GetKey { key: "key_a" },
            Route::UpdateKey { key: "key_a" },
            Route::ListProviders { org: "org_a" },
            Route::PutProvider { org: "org_a", name: "openai" },
            Route::CreateOrgToken { org: "org_a" },
            Route::ListOrgTokens { org: "org_a" },
            Route::RevokeOrgToken { token: "tok_a" },
        ]
    }

    #[test]
    fn the_operator_reaches_every_operation() {
        for route in every_route() {
            assert_eq!(decide(&Reach::Everything, route.access()), Ok(Scope::Everything), "{route:?}");
        }
    }

    #[test]
    fn the_operators_operations_are_refused_to_every_role() {
        let operators: Vec<Route<'_>> =
            every_route().into_iter().filter(|r| r.access() == Access::Operator).collect();
        assert_eq!(
            operators,
            [
                Route::Audit,
                Route::ListPrices,
                Route::GetPrice { model: "m".into() },
                Route::PutPrice { model: "m".into() },
                Route::DeletePrice { model: "m".into() },
                Route::ImportPrices,
                Route::PutFallbackPrice { kind: "openai" },
                Route::DeleteFallbackPrice { kind: "openai" },
                Route::ListNodes,
                Route::CreateNodeCredential,
                Route::ListNodeCredentials,
                Route::RevokeNodeCredential { credential: "ncr_a" },
                Route::CreateOrg,
            ],
            "prices, fallback prices, nodes, node credentials, creating organizations, the whole audit log"
        );
        for route in &operators {
            for role in ROLES {
                assert_eq!(decide(&within(role), route.access()), Err(Denied::OperatorOnly), "{route:?}");
            }
        }
    }

    #[test]
    fn an_admin_reaches_the_rest_within_its_organization_and_a_viewer_reads_it() {
        for route in every_route().into_iter().filter(|r| r.access() != Access::Operator) {
            let Access::Of { write, .. } = route.access() else { unreachable!() };
            assert_eq!(
                decide(&within(OrgRole::Admin), route.access()),
                Ok(Scope::Org(org("org_a"))),
                "{route:?}"
            );
            let viewer = decide(&within(OrgRole::Viewer), route.access());
            if write {
                assert_eq!(viewer, Err(Denied::ReadOnly), "{route:?}");
            } else {
                assert_eq!(viewer, Ok(Scope::Org(org("org_a"))), "{route:?}");
            }
        }
    }

    #[test]
    fn what_a_path_names_is_what_the_scope_is_checked_against() {
        let target = |route: Route<'static>| match route.access() {
            Access::Of { target, .. } => target,
            Access::Operator => panic!("{route:?} is the operator's"),
        };
        assert_eq!(target(Route::ListOrgs), Target::Orgs);
        assert_eq!(target(Route::GetReceipt { org: "org_b", receipt: "rcpt_a" }), Target::Org("org_b"));
        assert_eq!(target(Route::PutProvider { org: "org_b", name: "openai" }), Target::Org("org_b"));
        assert_eq!(target(Route::UpdateKey { key: "key_b" }), Target::Key("key_b"));
        assert_eq!(target(Route::DeleteCap { cap: "cap_b" }), Target::Cap("cap_b"));
        assert_eq!(target(Route::RevokeOrgToken { token: "tok_b" }), Target::OrgToken("tok_b"));
        assert_eq!(target(Route::OrgAudit { org: "org_b" }), Target::Org("org_b"));
    }

    #[test]
    fn the_organizations_limit_of_requests_in_flight_is_the_operators() {
        assert_eq!(org_patch(&Scope::Everything, true), Ok(()));
        assert_eq!(org_patch(&Scope::Org(org("org_a")), false), Ok(()), "its allowlists are its own");
        assert_eq!(org_patch(&Scope::Org(org("org_a")), true), Err(Denied::OrgConcurrency));
    }

    fn settings(kind: ProviderKind, base_url: Option<&str>) -> CredentialSettings {
        CredentialSettings {
            kind,
            base_url: base_url.map(str::to_owned),
            price_namespace: Some("groq".into()),
            fallback_price: Some((Nanos(1), Nanos(2))),
        }
    }

    #[test]
    fn the_operator_replaces_a_credential_whole() {
        let asked = CredentialSettings {
            price_namespace: None,
            fallback_price: None,
            ..settings(ProviderKind::Anthropic, None)
        };
        let current = Some(settings(ProviderKind::OpenAi, Some("https://api.groq.com/openai")));
        assert_eq!(credential_settings(&Scope::Everything, current, asked.clone()), Ok(asked.clone()));
        assert_eq!(credential_settings(&Scope::Everything, None, asked.clone()), Ok(asked));
    }

    #[test]
    fn within_an_organization_a_credential_keeps_the_operators_settings() {
        let scope = Scope::Org(org("org_a"));
        let current = settings(ProviderKind::OpenAi, Some("https://api.groq.com/openai"));
        let left_out = CredentialSettings {
            base_url: None,
            price_namespace: None,
            fallback_price: None,
            ..current.clone()
        };
        assert_eq!(
            credential_settings(&scope, Some(current.clone()), left_out.clone()),
            Ok(current.clone()),
            "left out: kept"
        );
        assert_eq!(
            credential_settings(&scope, Some(current.clone()), current.clone()),
            Ok(current.clone()),
            "repeated: kept"
        );
        assert_eq!(credential_settings(&scope, None, left_out.clone()), Err(Denied::NewCredential));
        let change = |asked: CredentialSettings| credential_settings(&scope, Some(current.clone()), asked);
        assert_eq!(
            change(CredentialSettings { kind: ProviderKind::Anthropic, ..left_out.clone() }),
            Err(Denied::CredentialKind)
        );
        assert_eq!(
            change(CredentialSettings { base_url: Some("https://evil.example".into()), ..left_out.clone() }),
            Err(Denied::CredentialBaseUrl)
        );
        assert_eq!(
            change(CredentialSettings { price_namespace: Some("openai".into()), ..left_out.clone() }),
            Err(Denied::CredentialPriceNamespace)
        );
        assert_eq!(
            change(CredentialSettings { fallback_price: Some((Nanos(0), Nanos(0))), ..left_out }),
            Err(Denied::CredentialFallbackPrice)
        );
    }

    #[test]
    fn every_refusal_says_why_and_names_the_member_it_refuses() {
        for (denied, opens) in [
            (Denied::OrgConcurrency, "max_concurrent_requests: "),
            (Denied::NewCredential, "name: "),
            (Denied::CredentialKind, "kind: "),
            (Denied::CredentialBaseUrl, "base_url: "),
            (Denied::CredentialPriceNamespace, "price_namespace: "),
            (Denied::CredentialFallbackPrice, "fallback_input_per_mtok_usd: "),
        ] {
            assert!(denied.message().starts_with(opens), "{denied:?}");
        }
        let answer = ApiError::from(Denied::ReadOnly).answer();
        assert_eq!(answer.status, 403);
        let body: serde_json::Value = serde_json::from_slice(&answer.body).expect("JSON");
        assert_eq!(body["error"]["type"], "permission_error");
        assert_eq!(body["error"]["code"], "permission_denied");
        assert_eq!(body["error"]["param"], serde_json::Value::Null);
    }
}
