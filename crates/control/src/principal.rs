//! Who calls the admin API, resolved once per request from what it presented: the operator, an
//! organization token, or a person signed in through single sign-on; and what each reaches.
//!
//! What a caller may do is decided from its [`Reach`] alone (`admin::access`), so that a person
//! the sign-on maps to an organization's role is held to exactly what a token of that role is.

use std::net::SocketAddr;
use std::time::Instant;

use recovea_core::ids::{OrgId, OrgTokenId};
use recovea_core::keys;
use recovea_core::org_tokens::{self, OrgRole};
use recovea_core::timestamp::Timestamp;
use recovea_store::{AuditActor, AuditAuth, OrgTokenRecord};

use crate::{ApiError, Control};

/// The author of an admin request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    /// The operator: the admin token, or a console session opened with it.
    Operator,
    /// An organization token: its organization alone, with its role.
    OrgToken { id: OrgTokenId, name: String, org: OrgId, role: OrgRole },
    /// A person signed in through single sign-on: the identity provider's subject and email, and
    /// what its claims map the person to (the operator, or one organization's role).
    Person { subject: String, email: Option<String>, reach: Reach },
}

/// What a caller reaches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reach {
    /// Everything: the operator's.
    Everything,
    /// One organization, with a role in it.
    Org { org: OrgId, role: OrgRole },
}

impl Principal {
    /// The principal an organization token stands for at `now`; `None` when it is revoked or
    /// expired, which is refused exactly as a wrong token.
    pub fn of_org_token(token: OrgTokenRecord, now: Timestamp) -> Option<Self> {
        org_tokens::is_usable(token.expires_at, token.revoked_at, now).then_some(Self::OrgToken {
            id: token.id,
            name: token.name,
            org: token.org_id,
            role: token.role,
        })
    }

    pub fn reach(&self) -> Reach {
        match self {
            Self::Operator => Reach::Everything,
            Self::OrgToken { org, role, .. } => Reach::Org { org: org.clone(), role: *role },
            Self::Person { reach, .. } => reach.clone(),
        }
    }

    /// How the audit log names this caller.
    pub fn actor(&self) -> AuditActor {
        match self {
            Self::Operator => AuditActor::Operator,
            Self::OrgToken { id, name, .. } => AuditActor::OrgToken { id: id.clone(), name: name.clone() },
            Self::Person { subject, email, .. } => {
                AuditActor::Person { subject: subject.clone(), email: email.clone() }
            }
        }
    }
}

/// The bearer token of an `Authorization` header, without surrounding blanks; `""` when none.
fn bearer(authorization: Option<&str>) -> &str {
    authorization.and_then(|v| v.strip_prefix("Bearer ")).map_or("", str::trim)
}

impl Control {
    /// Who presents `authorization` from `client` (on `path`), and with what: the operator for the
    /// admin token, an organization token's principal for a token that is neither revoked nor
    /// expired. The
    /// right token is always let in; any other (an expired or revoked organization token
    /// included) is logged (the address, never the token), counted against the address, and
    /// answered `401`, or `429` once the address has used its allowance.
    ///
    /// Only a token of an organization token's shape is looked up in the store, at each call, so
    /// that a revocation made through any replica is refused at once by all.
    pub(crate) async fn authenticate(
        &self,
        authorization: Option<&str>,
        client: Option<SocketAddr>,
        path: &str,
        now: Instant,
    ) -> Result<(Principal, AuditAuth), ApiError> {
        let presented = bearer(authorization);
        if !presented.is_empty() {
            // Comparing digests keeps the comparison's timing independent of the token's characters.
            let hash = keys::hash_secret(presented);
            if hash == self.inner.admin_token_hash {
                return Ok((Principal::Operator, AuditAuth::AdminToken));
            }
            if org_tokens::is_org_token(presented) {
                let found = self.store(move |s| s.org_token_by_hash(hash)).await?;
                if let Some(principal) =
                    found.and_then(|token| Principal::of_org_token(token, crate::admin::now()))
                {
                    return Ok((principal, AuditAuth::OrgToken));
                }
            }
        }
        Err(self.wrong_token(client, path, now).map_or(ApiError::Unauthorized, ApiError::TooManyWrongTokens))
    }

    /// Whether a console session opened as `principal` still stands: an organization token
    /// revoked or expired since the sign-in ends its sessions at their next request, as the API
    /// refuses the token at once. The operator's session and a person's stand until they end (a
    /// person's claims are read again at their next sign-in).
    pub(crate) async fn still_stands(&self, principal: &Principal) -> Result<bool, ApiError> {
        let Principal::OrgToken { id, .. } = principal else { return Ok(true) };
        let id = id.clone();
        let token = self.store(move |s| s.org_token(&id)).await?;
        Ok(token.and_then(|token| Principal::of_org_token(token, crate::admin::now())).is_some())
    }

    /// Counts a wrong token from `client` (on `path`) and logs it: `Some(wait)` once the address
    /// has used its allowance (`429`), else `None` (`401`).
    pub(crate) fn wrong_token(
        &self,
        client: Option<SocketAddr>,
        path: &str,
        now: Instant,
    ) -> Option<std::time::Duration> {
        let address = client.map(|c| c.ip());
        let shown = address.map_or_else(|| "-".to_owned(), |a| a.to_string());
        let wrong_tokens = &self.inner.wrong_tokens;
        match wrong_tokens.may_try(address, now) {
            Ok(()) => {
                wrong_tokens.count(address, now);
                tracing::warn!(client = shown, path = %path.escape_debug(), "a wrong admin token was refused");
                None
            }
            Err(wait) => {
                tracing::warn!(
                    client = shown,
                    path = %path.escape_debug(),
                    "a wrong admin token was refused: too many from this address"
                );
                Some(wait)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(expires_at: Option<i64>, revoked_at: Option<i64>) -> OrgTokenRecord {
        OrgTokenRecord {
            id: OrgTokenId::parse("tok_a").expect("id"),
            org_id: OrgId::parse("org_a").expect("id"),
            name: "ci".into(),
            role: OrgRole::Viewer,
            prefix: "rot_abcdef".into(),
            created_at: Timestamp(0),
            expires_at: expires_at.map(Timestamp),
            revoked_at: revoked_at.map(Timestamp),
        }
    }

    #[test]
    fn an_org_token_reaches_its_organization_with_its_role_until_it_lapses() {
        let now = Timestamp(100);
        let principal = Principal::of_org_token(token(Some(101), None), now).expect("usable");
        assert_eq!(
            principal.reach(),
            Reach::Org { org: OrgId::parse("org_a").expect("id"), role: OrgRole::Viewer }
        );
        assert_eq!(
            principal.actor(),
            AuditActor::OrgToken { id: OrgTokenId::parse("tok_a").expect("id"), name: "ci".into() }
        );
        assert_eq!(Principal::of_org_token(token(Some(100), None), now), None, "expired");
        assert_eq!(Principal::of_org_token(token(None, Some(50)), now), None, "revoked");
    }

    #[test]
    fn the_operator_and_people_reach_what_they_are_mapped_to() {
        assert_eq!(Principal::Operator.reach(), Reach::Everything);
        assert_eq!(Principal::Operator.actor(), AuditActor::Operator);
        let org = Reach::Org { org: OrgId::parse("org_a").expect("id"), role: OrgRole::Admin };
        let person = Principal::Person {
            subject: "s1".into(),
            email: Some("a@example.com".into()),
            reach: org.clone(),
        };
        assert_eq!(person.reach(), org);
        assert_eq!(
            person.actor(),
            AuditActor::Person { subject: "s1".into(), email: Some("a@example.com".into()) }
        );
    }

    #[test]
    fn the_bearer_is_read_from_the_header() {
        assert_eq!(bearer(Some("Bearer  rot_x ")), "rot_x");
        assert_eq!(bearer(Some("Basic abc")), "");
        assert_eq!(bearer(None), "");
    }
}
