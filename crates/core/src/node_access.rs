//! What a node presents to the control plane, and what it may deliver there: the shape of a node
//! credential's token, and the rule that a receipt counts only against the organization its key
//! belongs to.
//!
//! A node is trusted to meter the requests it served, not to say whose they were: a node token
//! that writes receipts for any key into any organization lets whoever holds it spend another
//! tenant's caps. The organization a key belongs to is the store's, never the receipt's word.

use crate::ids::{self, KeyId, OrgId};
use crate::receipt::Receipt;

/// Every node credential's token starts with this ("recovea node token").
pub const TOKEN_PREFIX: &str = "rnt_";
/// 43 base62 characters carry just over 256 bits of randomness, as a key secret does.
pub const TOKEN_RANDOM_LEN: usize = 43;

/// Whether `token` has the shape of a node credential's token, as minted: only such a token is
/// looked up in the store, so that a wrong token of any other shape costs no database read.
pub fn is_credential_token(token: &str) -> bool {
    ids::has_minted_shape(token, TOKEN_PREFIX, TOKEN_RANDOM_LEN)
}

/// Why a node may not deliver a receipt. Sent again, it would be refused again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Undeliverable {
    /// It names an organization but no key the control plane knows.
    UnknownKey { key_id: String },
    /// Its key belongs to another organization than the one it names (or it names none).
    ForeignKey { key_id: String, org_id: String },
}

impl std::fmt::Display for Undeliverable {
    /// Never names the organization the key does belong to.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::UnknownKey { key_id } => write!(f, "no key {key_id:?} is known"),
            Self::ForeignKey { key_id, org_id } => {
                write!(f, "key {key_id:?} is not a key of organization {org_id:?}")
            }
        }
    }
}

/// The key whose owner decides whether `receipt` may be delivered: `None` when it names no key
/// (or names one that cannot be an id, which no owner is found for).
pub fn key_to_look_up(receipt: &Receipt) -> Option<KeyId> {
    KeyId::parse(&receipt.key_id)
}

/// Whether a node may deliver `receipt`, given the organization its key belongs to (`key_owner`,
/// `None` when no key of that id is known; a revoked key still belongs to its organization, and
/// the receipts it made before its revocation reached the node are still its organization's).
///
/// A receipt counts against the organization it names, so it must name a key of that
/// organization. One that names neither key nor organization counts against no one and is taken
/// as before (a node writes none today: a fail-open pass has no receipt).
pub fn may_deliver(receipt: &Receipt, key_owner: Option<&OrgId>) -> Result<(), Undeliverable> {
    if receipt.key_id.is_empty() && receipt.org_id.is_empty() {
        return Ok(());
    }
    match key_owner {
        Some(owner) if owner.as_str() == receipt.org_id => Ok(()),
        Some(_) => {
            Err(Undeliverable::ForeignKey { key_id: receipt.key_id.clone(), org_id: receipt.org_id.clone() })
        }
        None => Err(Undeliverable::UnknownKey { key_id: receipt.key_id.clone() }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn receipt(org_id: &str, key_id: &str) -> Receipt {
        Receipt { org_id: org_id.into(), key_id: key_id.into(), ..Receipt::example("rcpt_a") }
    }

    fn org(id: &str) -> OrgId {
        OrgId::parse(id).expect("org id")
    }

    #[test]
    fn a_receipt_of_a_key_of_its_own_organization_is_delivered() {
        assert_eq!(may_deliver(&receipt("org_a", "key_a"), Some(&org("org_a"))), Ok(()));
    }

    #[test]
    fn a_receipt_naming_another_organization_than_its_keys_is_refused() {
        let forged = receipt("org_victim", "key_a");
        assert_eq!(
            may_deliver(&forged, Some(&org("org_a"))),
            Err(Undeliverable::ForeignKey { key_id: "key_a".into(), org_id: "org_victim".into() })
        );
        let why = may_deliver(&forged, Some(&org("org_a"))).expect_err("refused").to_string();
        assert_eq!(why, r#"key "key_a" is not a key of organization "org_victim""#);
        assert!(!why.contains("org_a\""), "the key's own organization is not told");
    }

    #[test]
    fn a_receipt_of_an_unknown_key_is_refused() {
        assert_eq!(
            may_deliver(&receipt("org_a", "key_nobody"), None),
            Err(Undeliverable::UnknownKey { key_id: "key_nobody".into() })
        );
        // Not a key id at all: nothing is looked up for it, so no owner is found.
        let odd = receipt("org_a", "not-a-key");
        assert_eq!(key_to_look_up(&odd), None);
        assert!(may_deliver(&odd, None).is_err());
    }

    #[test]
    fn a_receipt_naming_an_organization_without_a_key_or_a_key_without_one_is_refused() {
        assert!(may_deliver(&receipt("org_a", ""), None).is_err());
        assert!(may_deliver(&receipt("", "key_a"), Some(&org("org_a"))).is_err());
    }

    #[test]
    fn a_receipt_naming_no_key_and_no_organization_counts_against_no_one() {
        assert_eq!(may_deliver(&receipt("", ""), None), Ok(()));
    }

    #[test]
    fn the_key_looked_up_is_the_receipts() {
        assert_eq!(key_to_look_up(&receipt("org_a", "key_a")), KeyId::parse("key_a"));
        assert_eq!(key_to_look_up(&receipt("", "")), None);
    }

    #[test]
    fn only_minted_shapes_are_credential_tokens() {
        let minted = ids::mint(TOKEN_PREFIX, TOKEN_RANDOM_LEN, || 7);
        assert!(is_credential_token(&minted));
        assert!(!is_credential_token("rnt_short"));
        assert!(!is_credential_token(&minted.replacen("rnt_", "rat_", 1)));
        assert!(!is_credential_token(&format!("{minted}x")));
        assert!(!is_credential_token(&format!("{}-", &minted[..minted.len() - 1])));
        assert!(!is_credential_token("split-node-token-0123456789abcdef0123456"));
    }
}
