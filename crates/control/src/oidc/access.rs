//! Who a signed-in person is to Recovea, decided from their ID token's claims alone: the operator,
//! an organization's admin or viewer, or no one.

use std::fmt;

use recovea_core::ids::OrgId;
use serde_json::{Map, Value};

/// Which claims say what (`--oidc-org-claim`, `--oidc-role-claim`, `--oidc-groups-claim`,
/// `--oidc-operator-group`). Claim names are taken whole: a provider's namespaced claim
/// (`https://example.com/org`) holds dots that are not a path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccessRules {
    pub org_claim: Option<String>,
    pub role_claim: Option<String>,
    pub groups_claim: String,
    pub operator_group: Option<String>,
}

/// What a person may do inside their organization.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Admin,
    Viewer,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Viewer => "viewer",
        }
    }
}

/// The decision for one person.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Access {
    /// In the operator group: everything the admin token reaches.
    Operator,
    /// One organization, in one role. The caller still checks that the organization exists.
    Org {
        org_id: OrgId,
        role: Role,
    },
    Refused(Refusal),
}

/// Why a person signed in at the provider gets nothing here. Its text names the claim, never a
/// value, and may be shown to the person.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Only operators sign in, and the person is not in the operator group.
    NotAnOperator,
    NoOrganization {
        claim: String,
    },
    /// The claim holds something that is not an organization id (`org_...`).
    MalformedOrganization {
        claim: String,
    },
    /// The claim names more than one organization: a session belongs to one.
    SeveralOrganizations {
        claim: String,
    },
    NoRole {
        claim: String,
    },
    /// The claim holds neither `admin` nor `viewer`.
    UnknownRole {
        claim: String,
    },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::NotAnOperator => f.write_str("your account is not in the operator group"),
            Refusal::NoOrganization { claim } => {
                write!(f, "your account carries no organization (claim {claim:?})")
            }
            Refusal::MalformedOrganization { claim } => {
                write!(f, "your account's organization (claim {claim:?}) is not an organization id")
            }
            Refusal::SeveralOrganizations { claim } => {
                write!(f, "your account names several organizations (claim {claim:?}); a sign-in is for one")
            }
            Refusal::NoRole { claim } => write!(f, "your account carries no role (claim {claim:?})"),
            Refusal::UnknownRole { claim } => {
                write!(f, "your account's role (claim {claim:?}) is neither admin nor viewer")
            }
        }
    }
}

/// Decides from `claims` (a verified ID token's) under `rules`. The operator group comes first:
/// an operator is the operator whatever organization their account also names. Without a role
/// claim, everyone an organization claim lets in is a viewer: more is given only when said.
pub fn decide(claims: &Map<String, Value>, rules: &AccessRules) -> Access {
    if let Some(group) = &rules.operator_group
        && strings(claims.get(&rules.groups_claim)).any(|member_of| member_of == group)
    {
        return Access::Operator;
    }
    let Some(org_claim) = &rules.org_claim else { return Access::Refused(Refusal::NotAnOperator) };
    let org_id = match organization(claims.get(org_claim)) {
        Ok(org_id) => org_id,
        Err(refusal) => return Access::Refused(refusal(org_claim.clone())),
    };
    let role = match &rules.role_claim {
        None => Role::Viewer,
        Some(role_claim) => match role(claims.get(role_claim)) {
            Ok(role) => role,
            Err(refusal) => return Access::Refused(refusal(role_claim.clone())),
        },
    };
    Access::Org { org_id, role }
}

type RefusalOf = fn(String) -> Refusal;

/// One organization id: a string, or a list holding one (some providers give every attribute as
/// a list).
fn organization(value: Option<&Value>) -> Result<OrgId, RefusalOf> {
    let mut named: Vec<&str> = match value {
        None | Some(Value::Null) => return Err(|claim| Refusal::NoOrganization { claim }),
        Some(Value::String(one)) => vec![one],
        Some(Value::Array(items)) => {
            let mut named = Vec::with_capacity(items.len());
            for item in items {
                let Value::String(text) = item else {
                    return Err(|claim| Refusal::MalformedOrganization { claim });
                };
                named.push(text.as_str());
            }
            named
        }
        Some(_) => return Err(|claim| Refusal::MalformedOrganization { claim }),
    };
    named.sort_unstable();
    named.dedup();
    match named.as_slice() {
        [] => Err(|claim| Refusal::NoOrganization { claim }),
        [one] => OrgId::parse(one).ok_or(|claim| Refusal::MalformedOrganization { claim }),
        _ => Err(|claim| Refusal::SeveralOrganizations { claim }),
    }
}

/// `admin` or `viewer`; from a list, the most it grants.
fn role(value: Option<&Value>) -> Result<Role, RefusalOf> {
    let mut found = false;
    let mut best = None;
    for held in strings(value) {
        found = true;
        match held {
            "admin" => best = Some(Role::Admin),
            "viewer" if best.is_none() => best = Some(Role::Viewer),
            _ => {}
        }
    }
    match best {
        Some(role) => Ok(role),
        None if found => Err(|claim| Refusal::UnknownRole { claim }),
        None => Err(|claim| Refusal::NoRole { claim }),
    }
}

/// The strings of a claim that is one string or a list of them; anything else holds none.
fn strings(value: Option<&Value>) -> impl Iterator<Item = &str> {
    let (one, many) = match value {
        Some(Value::String(text)) => (Some(text.as_str()), None),
        Some(Value::Array(items)) => (None, Some(items.iter().filter_map(Value::as_str))),
        _ => (None, None),
    };
    one.into_iter().chain(many.into_iter().flatten())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    fn rules() -> AccessRules {
        AccessRules {
            org_claim: Some("recovea_org".into()),
            role_claim: Some("recovea_role".into()),
            groups_claim: "groups".into(),
            operator_group: Some("recovea-operators".into()),
        }
    }

    fn claims(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            _ => Map::new(),
        }
    }

    fn org(id: &str, role: Role) -> Access {
        Access::Org { org_id: OrgId::parse(id).expect("org id"), role }
    }

    #[test]
    fn an_organization_and_a_role_map_to_that_organization_in_that_role() {
        let person = claims(json!({"recovea_org": "org_acme", "recovea_role": "admin", "groups": ["staff"]}));
        assert_eq!(decide(&person, &rules()), org("org_acme", Role::Admin));
        let person = claims(json!({"recovea_org": ["org_acme"], "recovea_role": ["viewer"]}));
        assert_eq!(decide(&person, &rules()), org("org_acme", Role::Viewer));
    }

    #[test]
    fn the_operator_group_wins_over_an_organization() {
        let person = claims(json!({"recovea_org": "org_acme", "recovea_role": "viewer",
            "groups": ["staff", "recovea-operators"]}));
        assert_eq!(decide(&person, &rules()), Access::Operator);
        let person = claims(json!({"groups": "recovea-operators"}));
        assert_eq!(decide(&person, &rules()), Access::Operator);
        // Group names are compared whole and exactly.
        let person = claims(json!({"groups": ["Recovea-Operators", "recovea-operators-x"]}));
        assert_eq!(
            decide(&person, &rules()),
            Access::Refused(Refusal::NoOrganization { claim: "recovea_org".into() })
        );
    }

    #[test]
    fn without_a_role_claim_everyone_let_in_is_a_viewer() {
        let mut rules = rules();
        rules.role_claim = None;
        let person = claims(json!({"recovea_org": "org_acme", "recovea_role": "admin"}));
        assert_eq!(decide(&person, &rules), org("org_acme", Role::Viewer));
    }

    #[test]
    fn with_operators_only_anyone_else_is_refused() {
        let rules = AccessRules { org_claim: None, role_claim: None, ..rules() };
        let person = claims(json!({"recovea_org": "org_acme", "recovea_role": "admin"}));
        assert_eq!(decide(&person, &rules), Access::Refused(Refusal::NotAnOperator));
    }

    #[test]
    fn an_unusable_organization_is_refused_with_its_reason() {
        let refused = |value: Value| match decide(&claims(value), &rules()) {
            Access::Refused(refusal) => refusal,
            other => panic!("let in: {other:?}"),
        };
        let claim = || "recovea_org".to_owned();
        assert_eq!(refused(json!({"recovea_role": "admin"})), Refusal::NoOrganization { claim: claim() });
        assert_eq!(
            refused(json!({"recovea_org": [], "recovea_role": "admin"})),
            Refusal::NoOrganization { claim: claim() }
        );
        assert_eq!(
            refused(json!({"recovea_org": "acme", "recovea_role": "admin"})),
            Refusal::MalformedOrganization { claim: claim() }
        );
        assert_eq!(
            refused(json!({"recovea_org": 7, "recovea_role": "admin"})),
            Refusal::MalformedOrganization { claim: claim() }
        );
        assert_eq!(
            refused(json!({"recovea_org": ["org_a", "org_b"], "recovea_role": "admin"})),
            Refusal::SeveralOrganizations { claim: claim() }
        );
        assert_eq!(
            decide(&claims(json!({"recovea_org": ["org_a", "org_a"], "recovea_role": "admin"})), &rules()),
            org("org_a", Role::Admin),
            "the same organization twice is one"
        );
    }

    #[test]
    fn an_unusable_role_is_refused_and_a_list_grants_its_most() {
        let decided =
            |role: Value| decide(&claims(json!({"recovea_org": "org_acme", "recovea_role": role})), &rules());
        let claim = || "recovea_role".to_owned();
        assert_eq!(decided(json!("owner")), Access::Refused(Refusal::UnknownRole { claim: claim() }));
        assert_eq!(decided(json!("Admin")), Access::Refused(Refusal::UnknownRole { claim: claim() }));
        assert_eq!(decided(json!(null)), Access::Refused(Refusal::NoRole { claim: claim() }));
        assert_eq!(decided(json!([])), Access::Refused(Refusal::NoRole { claim: claim() }));
        assert_eq!(decided(json!(["viewer", "admin"])), org("org_acme", Role::Admin));
        assert_eq!(decided(json!(["owner", "viewer"])), org("org_acme", Role::Viewer));
    }

    #[test]
    fn refusals_name_the_claim_and_never_its_value() {
        let person = claims(json!({"recovea_org": "<script>", "recovea_role": "admin"}));
        let Access::Refused(refusal) = decide(&person, &rules()) else { panic!("let in") };
        let text = refusal.to_string();
        assert!(text.contains("recovea_org") && !text.contains("<script>"), "{text}");
    }

    fn claim_value() -> impl Strategy<Value = Value> {
        let text = prop_oneof![
            Just("admin".to_owned()),
            Just("viewer".to_owned()),
            Just("org_acme".to_owned()),
            Just("org_other".to_owned()),
            Just("recovea-operators".to_owned()),
            "[a-z_]{0,8}",
        ];
        prop_oneof![
            Just(Value::Null),
            any::<i64>().prop_map(Value::from),
            text.clone().prop_map(Value::String),
            proptest::collection::vec(text.prop_map(Value::String), 0..4).prop_map(Value::Array),
        ]
    }

    proptest! {
        /// Whatever the claims: an operator is in the operator group, an organization is the
        /// single one named, and admin is given only where the role claim says admin.
        #[test]
        fn decisions_never_grant_more_than_the_claims_say(
            org in proptest::option::of(claim_value()),
            role in proptest::option::of(claim_value()),
            groups in proptest::option::of(claim_value()),
        ) {
            let mut person = Map::new();
            for (name, value) in [("recovea_org", org), ("recovea_role", role), ("groups", groups)] {
                if let Some(value) = value {
                    person.insert(name.to_owned(), value);
                }
            }
            match decide(&person, &rules()) {
                Access::Operator => {
                    prop_assert!(strings(person.get("groups")).any(|g| g == "recovea-operators"));
                }
                Access::Org { org_id, role } => {
                    prop_assert!(!strings(person.get("groups")).any(|g| g == "recovea-operators"));
                    let named: std::collections::BTreeSet<&str> = strings(person.get("recovea_org")).collect();
                    prop_assert_eq!(named.into_iter().collect::<Vec<_>>(), vec![org_id.as_str()]);
                    if role == Role::Admin {
                        prop_assert!(strings(person.get("recovea_role")).any(|r| r == "admin"));
                    } else {
                        prop_assert!(strings(person.get("recovea_role")).any(|r| r == "viewer"));
                    }
                }
                Access::Refused(_) => {}
            }
        }
    }
}
