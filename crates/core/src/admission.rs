//! The admission decision: a pure function of the snapshot, the presented credential and the time.

use std::sync::Arc;

use crate::answer::Answer;
use crate::credential::{Credential, CredentialHeader};
use crate::endpoints::EndpointAllowlist;
use crate::ids::KeyId;
use crate::keys;
use crate::models::ModelAllowlist;
use crate::ratelimit::KeyLimits;
use crate::snapshot::{Org, Snapshot};
use crate::timestamp::Timestamp;

/// Why a request was passed through without being admitted. Each is counted under its label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailOpenReason {
    /// The node has not received (or loaded) any snapshot yet.
    NoSnapshot,
    /// Looking up the snapshot (or a cache in front of it) failed.
    SnapshotError,
    /// The rate limiter failed to answer for the key.
    RateLimiterError,
    /// A panic inside admission, caught there.
    AdmissionPanic,
}

impl FailOpenReason {
    pub fn label(self) -> &'static str {
        match self {
            Self::NoSnapshot => "no_snapshot",
            Self::SnapshotError => "snapshot_error",
            Self::RateLimiterError => "rate_limiter_error",
            Self::AdmissionPanic => "admission_panic",
        }
    }
}

/// A request that may go on, and what it learned about its caller.
#[derive(Debug, Clone)]
pub struct Admitted {
    pub key_id: KeyId,
    pub org: Arc<Org>,
    pub credential_header: CredentialHeader,
    pub limits: KeyLimits,
    /// The key's own model allowlist (its organization's is on `org`).
    pub allowed_models: Option<Arc<ModelAllowlist>>,
    /// The key's own endpoint allowlist (its organization's is on `org`).
    pub allowed_endpoints: Option<Arc<EndpointAllowlist>>,
    /// The key's own limit of requests in flight on a node (its organization's is on `org`).
    pub max_concurrent_requests: Option<u32>,
}

impl Admitted {
    /// Whether the key and its organization both allow `model` (see [`crate::models::model_allowed`]).
    pub fn allows_model(&self, model: Option<&str>) -> bool {
        crate::models::model_allowed(self.allowed_models.as_deref(), self.org.allowed_models.as_ref(), model)
    }

    /// Whether the key and its organization both allow `endpoint`, the provider's path without
    /// its query (see [`crate::endpoints::endpoint_allowed`]).
    pub fn allows_endpoint(&self, endpoint: &str) -> bool {
        crate::endpoints::endpoint_allowed(
            self.allowed_endpoints.as_deref(),
            self.org.allowed_endpoints.as_ref(),
            endpoint,
        )
    }

    /// Whether an armed cap (one that refuses at its line) covers the request's key: the request
    /// then reserves its worst case, since only a reservation that large keeps the line exact.
    pub fn under_armed_cap(&self) -> bool {
        let (org, key) = (&self.org.id, &self.key_id);
        self.org.caps.iter().any(|cap| cap.hard_stop && cap.covers(org, key))
    }
}

#[derive(Debug, Clone)]
pub enum Decision {
    Admit(Admitted),
    Refuse(Answer),
    FailOpen(FailOpenReason),
}

/// Decides whether a request is admitted.
///
/// Without a snapshot the gateway cannot tell who is calling, so it fails open rather than refuse
/// traffic over its own missing state. Every kind of bad key gets the same refusal.
pub fn admit(snapshot: Option<&Snapshot>, credential: Option<Credential<'_>>, now: Timestamp) -> Decision {
    let Some(snapshot) = snapshot else {
        return Decision::FailOpen(FailOpenReason::NoSnapshot);
    };
    let Some(credential) = credential.filter(|c| keys::is_well_formed(c.secret)) else {
        return Decision::Refuse(Answer::invalid_api_key());
    };
    let Some(entry) = snapshot.key(&keys::hash_secret(credential.secret)) else {
        return Decision::Refuse(Answer::invalid_api_key());
    };
    if entry.expires_at.is_some_and(|at| at <= now) {
        return Decision::Refuse(Answer::invalid_api_key());
    }
    Decision::Admit(Admitted {
        key_id: entry.id(),
        org: Arc::clone(entry.org),
        credential_header: credential.header,
        limits: entry.limits,
        allowed_models: entry.allowed_models.cloned(),
        allowed_endpoints: entry.allowed_endpoints.cloned(),
        max_concurrent_requests: entry.max_concurrent_requests,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::OrgId;
    use crate::snapshot::SnapshotBuilder;
    use proptest::prelude::*;

    const LIVE: &str = "rk_0000000000000000000000000000000000000000live";
    const EXPIRING: &str = "rk_0000000000000000000000000000000000000000expiring";

    fn snapshot() -> Snapshot {
        let org = OrgId::parse("org_a").expect("valid id");
        let mut b = SnapshotBuilder::new(1);
        b.org(org.clone());
        b.key(keys::hash_secret(LIVE), KeyId::parse("key_live").expect("id"), org.clone(), None);
        b.key(keys::hash_secret(EXPIRING), KeyId::parse("key_exp").expect("id"), org, Some(Timestamp(1_000)));
        b.build()
    }

    fn bearer(secret: &str) -> Option<Credential<'_>> {
        Some(Credential { secret, header: CredentialHeader::AuthorizationBearer })
    }

    #[test]
    fn known_key_is_admitted() {
        let snap = snapshot();
        let Decision::Admit(admitted) = admit(Some(&snap), bearer(LIVE), Timestamp(0)) else {
            panic!("expected admission");
        };
        assert_eq!(admitted.key_id.as_str(), "key_live");
        assert_eq!(admitted.org.id.as_str(), "org_a");
    }

    #[test]
    fn only_an_armed_cap_covering_the_key_asks_for_the_worst_case() {
        use crate::caps::{Cap, Scope};
        use crate::ids::CapId;
        use crate::window::Window;
        let org = OrgId::parse("org_a").expect("valid id");
        let cap = |id: &str, scope: Scope, key: Option<&str>, hard_stop: bool| Cap {
            id: CapId::parse(id).expect("id"),
            org_id: org.clone(),
            scope,
            key_id: key.map(|key| KeyId::parse(key).expect("id")),
            window: Window::Month,
            limit: crate::money::Nanos(1_000),
            hard_stop,
            alert_at_permille: Vec::new(),
            alert_webhook: None,
        };
        let admitted_under = |caps: Vec<Cap>| {
            let mut b = SnapshotBuilder::new(1);
            b.org(org.clone());
            b.key(keys::hash_secret(LIVE), KeyId::parse("key_live").expect("id"), org.clone(), None);
            for c in caps {
                b.cap(c);
            }
            let snap = b.build();
            let Decision::Admit(admitted) = admit(Some(&snap), bearer(LIVE), Timestamp(0)) else {
                panic!("expected admission");
            };
            admitted.under_armed_cap()
        };
        assert!(!admitted_under(Vec::new()));
        assert!(!admitted_under(vec![cap("cap_soft", Scope::Organization, None, false)]));
        assert!(!admitted_under(vec![cap("cap_other", Scope::Key, Some("key_other"), true)]));
        assert!(admitted_under(vec![cap("cap_org", Scope::Organization, None, true)]));
        assert!(admitted_under(vec![cap("cap_mine", Scope::Key, Some("key_live"), true)]));
    }

    #[test]
    fn expiry_is_inclusive() {
        let snap = snapshot();
        assert!(matches!(admit(Some(&snap), bearer(EXPIRING), Timestamp(999)), Decision::Admit(_)));
        assert!(matches!(admit(Some(&snap), bearer(EXPIRING), Timestamp(1_000)), Decision::Refuse(_)));
    }

    #[test]
    fn no_snapshot_fails_open() {
        assert!(matches!(
            admit(None, bearer(LIVE), Timestamp(0)),
            Decision::FailOpen(FailOpenReason::NoSnapshot)
        ));
        assert!(matches!(admit(None, None, Timestamp(0)), Decision::FailOpen(FailOpenReason::NoSnapshot)));
    }

    #[test]
    fn every_bad_key_gets_the_same_answer() {
        let snap = snapshot();
        let unknown = "rk_1111111111111111111111111111111111111111";
        for (case, credential) in [
            ("missing", None),
            ("malformed", bearer("rk_short")),
            ("unknown", bearer(unknown)),
            ("expired", bearer(EXPIRING)),
        ] {
            match admit(Some(&snap), credential, Timestamp(5_000)) {
                Decision::Refuse(answer) => assert_eq!(answer, Answer::invalid_api_key(), "{case}"),
                other => panic!("{case}: {other:?}"),
            }
        }
    }

    proptest! {
        #[test]
        fn only_issued_keys_are_admitted(secret in "rk_[0-9A-Za-z]{0,60}") {
            let snap = snapshot();
            let admitted = matches!(admit(Some(&snap), bearer(&secret), Timestamp(0)), Decision::Admit(_));
            prop_assert_eq!(admitted, secret == LIVE || secret == EXPIRING);
        }
    }
}
