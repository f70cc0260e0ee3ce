//! Organization tokens: the bearer secrets with which a customer reaches its own organization in
//! the admin API. Their shape, the roles they carry, and when one still opens the API.
//!
//! A token is stored only as its hash ([`crate::keys::hash_secret`], as Recovea keys and node
//! credentials are) and shown once, when it is created.

use crate::timestamp::Timestamp;
use crate::{ids, keys};

/// Every organization token starts with this ("recovea organization token").
pub const TOKEN_PREFIX: &str = "rot_";
/// 43 base62 characters carry just over 256 bits of randomness, as a key secret does.
pub const TOKEN_RANDOM_LEN: usize = 43;

/// Whether `token` has the shape of an organization token, as minted: only such a token is looked
/// up in the store, so that a wrong admin token of any other shape costs no database read.
pub fn is_org_token(token: &str) -> bool {
    ids::has_minted_shape(token, TOKEN_PREFIX, TOKEN_RANDOM_LEN)
}

/// The first characters of a token, safe to show in listings (`rot_` and six more).
pub fn shown_prefix(secret: &str) -> &str {
    keys::shown_start(secret, TOKEN_PREFIX)
}

/// What an organization token may do inside its organization.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OrgRole {
    /// Everything of its organization that is not the operator's.
    Admin,
    /// Reads only.
    Viewer,
}

impl OrgRole {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Admin => "admin",
            Self::Viewer => "viewer",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "admin" => Some(Self::Admin),
            "viewer" => Some(Self::Viewer),
            _ => None,
        }
    }

    /// Whether the role may change anything at all.
    pub fn may_write(self) -> bool {
        match self {
            Self::Admin => true,
            Self::Viewer => false,
        }
    }
}

/// Whether a token opens the API at `now`: not revoked, and not past its expiry (an expiry is the
/// first instant it no longer does, as a key's is). A token that does not is refused exactly as a
/// wrong one.
pub fn is_usable(expires_at: Option<Timestamp>, revoked_at: Option<Timestamp>, now: Timestamp) -> bool {
    revoked_at.is_none() && expires_at.is_none_or(|at| now < at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minted_tokens_have_the_shape_looked_up() {
        let token = ids::mint(TOKEN_PREFIX, TOKEN_RANDOM_LEN, || 9);
        assert!(is_org_token(&token));
        assert_eq!(token.len(), 4 + 43);
        assert!(!is_org_token(&token[..token.len() - 1]), "one character short");
        assert!(!is_org_token(&format!("{token}x")), "one character long");
        assert!(!is_org_token(&token.replace("rot_", "rnt_")), "a node credential's prefix");
        assert!(!is_org_token(&format!("rot_{}-", &token[5..])), "not base62");
        assert!(!is_org_token(""));
        assert_eq!(shown_prefix(&token), &token[..10]);
    }

    #[test]
    fn roles_read_back_and_only_admins_write() {
        for role in [OrgRole::Admin, OrgRole::Viewer] {
            assert_eq!(OrgRole::parse(role.as_str()), Some(role));
        }
        assert_eq!(OrgRole::parse("Admin"), None, "exactly as the API spells them");
        assert_eq!(OrgRole::parse("operator"), None, "no token is the operator");
        assert!(OrgRole::Admin.may_write());
        assert!(!OrgRole::Viewer.may_write());
    }

    #[test]
    fn a_token_opens_until_it_expires_or_is_revoked() {
        let now = Timestamp(1_000);
        assert!(is_usable(None, None, now));
        assert!(is_usable(Some(Timestamp(1_001)), None, now));
        assert!(!is_usable(Some(Timestamp(1_000)), None, now), "expired at its expiry");
        assert!(!is_usable(Some(Timestamp(999)), None, now));
        assert!(!is_usable(None, Some(Timestamp(2_000)), now), "a revocation holds whatever its time");
        assert!(!is_usable(Some(Timestamp(5_000)), Some(Timestamp(500)), now));
    }
}
