//! Recovea keys: their format, the hash they are stored and looked up by, the prefix shown to people.

use ring::digest;

use crate::ids;

/// Every Recovea key secret starts with this.
pub const SECRET_PREFIX: &str = "rk_";
/// 43 base62 characters carry just over 256 bits of randomness.
pub const SECRET_RANDOM_LEN: usize = 43;
/// The shortest random part accepted from clients; keys are never shorter than this.
const MIN_RANDOM_LEN: usize = 40;
/// How many random characters a listing shows after a secret's prefix, so people can tell their
/// keys (and tokens) apart: too few to help a guesser.
const SHOWN_RANDOM_LEN: usize = 6;

/// SHA-256 of a key secret: the only form in which a key is stored or looked up.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyHash(pub [u8; 32]);

impl std::fmt::Debug for KeyHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeyHash({:02x}{:02x}{:02x}{:02x}..)", self.0[0], self.0[1], self.0[2], self.0[3])
    }
}

/// In hex: how a hash travels in the feed and is written in a saved state.
impl serde::Serialize for KeyHash {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&crate::hex::encode(&self.0))
    }
}

impl<'de> serde::Deserialize<'de> for KeyHash {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        crate::hex::decode(&text)
            .and_then(|bytes| <[u8; 32]>::try_from(bytes).ok())
            .map(KeyHash)
            .ok_or_else(|| serde::de::Error::custom("a key hash is 64 hex digits"))
    }
}

/// Whether `s` has the shape of a Recovea key. A malformed key is refused like an unknown one.
pub fn is_well_formed(s: &str) -> bool {
    s.strip_prefix(SECRET_PREFIX)
        .is_some_and(|rest| rest.len() >= MIN_RANDOM_LEN && rest.len() <= 128 && ids::is_base62(rest))
}

pub fn hash_secret(secret: &str) -> KeyHash {
    let digest = digest::digest(&digest::SHA256, secret.as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(digest.as_ref());
    KeyHash(out)
}

/// The fewest characters an operator's bearer token (admin, node, metrics) may have: 32 random
/// characters put guessing out of reach, which is what lets a wrong token be limited without ever
/// refusing the right one.
pub const MIN_TOKEN_CHARS: usize = 32;

/// An operator's bearer token as configured, without surrounding blanks; why not when it is too
/// short to be trusted.
pub fn operator_token(token: &str) -> Result<&str, String> {
    let token = token.trim();
    match token.chars().count() {
        0 => Err("must not be empty".to_owned()),
        n if n < MIN_TOKEN_CHARS => Err(format!(
            "must be at least {MIN_TOKEN_CHARS} characters, not {n} (for one: openssl rand -hex 32)"
        )),
        _ => Ok(token),
    }
}

/// The first characters of a key's secret, safe to show in listings.
pub fn shown_prefix(secret: &str) -> &str {
    shown_start(secret, SECRET_PREFIX)
}

/// The first characters of a secret minted with `prefix`: the prefix and a few random characters.
pub fn shown_start<'a>(secret: &'a str, prefix: &'a str) -> &'a str {
    secret.get(..prefix.len() + SHOWN_RANDOM_LEN).unwrap_or(prefix)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn operator_tokens_are_long_enough() {
        assert_eq!(operator_token("  "), Err("must not be empty".to_owned()));
        let short = "a".repeat(MIN_TOKEN_CHARS - 1);
        assert_eq!(
            operator_token(&short),
            Err("must be at least 32 characters, not 31 (for one: openssl rand -hex 32)".to_owned())
        );
        let long = "é".repeat(MIN_TOKEN_CHARS);
        assert_eq!(
            operator_token(&format!(" {long}\n")),
            Ok(long.as_str()),
            "characters, not bytes; trimmed"
        );
    }

    #[test]
    fn minted_secrets_are_well_formed() {
        let mut n = 0u8;
        let secret = ids::mint(SECRET_PREFIX, SECRET_RANDOM_LEN, || {
            n = n.wrapping_add(37);
            n
        });
        assert!(secret.starts_with("rk_"));
        assert_eq!(secret.len(), 3 + 43);
        assert!(is_well_formed(&secret));
        assert_eq!(shown_prefix(&secret).len(), 9);
    }

    #[test]
    fn malformed_secrets_are_recognised() {
        assert!(!is_well_formed(""));
        assert!(!is_well_formed("rk_short"));
        assert!(!is_well_formed("sk-0123456789012345678901234567890123456789abc"));
        assert!(!is_well_formed("rk_0123456789012345678901234567890123456789-bc"));
        assert!(is_well_formed("rk_0123456789012345678901234567890123456789"));
    }

    #[test]
    fn hash_is_sha256() {
        // FIPS 180-2's vectors: one block, and two (a key's length can reach either).
        assert_eq!(
            crate::hex::encode(&hash_secret("abc").0),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            crate::hex::encode(&hash_secret("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq").0),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
        );
    }

    proptest! {
        #[test]
        fn any_minted_secret_is_well_formed(bytes in proptest::collection::vec(any::<u8>(), 64..256)) {
            let mut it = bytes.into_iter().cycle().chain(std::iter::repeat(0));
            let secret = ids::mint(SECRET_PREFIX, SECRET_RANDOM_LEN, || it.next().unwrap_or(0));
            prop_assert!(is_well_formed(&secret));
        }
    }
}
