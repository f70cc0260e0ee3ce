//! Identifiers and random tokens: their alphabet and how random bytes become one.

use std::fmt;
use std::sync::Arc;

/// The characters of every token we mint: URL-safe, copy-paste safe, no punctuation.
pub const BASE62: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// Appends `len` base62 characters drawn without bias from `next_byte`.
///
/// Bytes at or above 248 (the largest multiple of 62 that fits in a byte) are rejected so that
/// every character is equally likely.
pub fn push_base62(out: &mut String, len: usize, mut next_byte: impl FnMut() -> u8) {
    let mut pushed = 0;
    while pushed < len {
        if let Some(c) = base62_char(next_byte()) {
            out.push(c);
            pushed += 1;
        }
    }
}

/// The base62 character a random byte stands for, or `None` for the 8 values that would bias the draw.
pub fn base62_char(byte: u8) -> Option<char> {
    (byte < 248).then(|| BASE62[usize::from(byte % 62)] as char)
}

/// The inverse of [`BASE62`]: the digit a base62 character stands for.
pub fn base62_value(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'A'..=b'Z' => Some(c - b'A' + 10),
        b'a'..=b'z' => Some(c - b'a' + 36),
        _ => None,
    }
}

/// `prefix` followed by `len` random base62 characters.
pub fn mint(prefix: &str, len: usize, next_byte: impl FnMut() -> u8) -> String {
    let mut out = String::with_capacity(prefix.len() + len);
    out.push_str(prefix);
    push_base62(&mut out, len, next_byte);
    out
}

/// How many base62 characters a time-ordered token spends on its millisecond clock: 62^8 ms is
/// about 6,900 years.
pub const TIME_LEN: usize = 8;

/// Appends `unix_ms` as [`TIME_LEN`] base62 digits, most significant first, then `random_len` random
/// characters. [`BASE62`] is in ASCII order, so tokens minted later sort after earlier ones: a ledger's
/// index on them grows at its end instead of dirtying a random page per insert.
pub fn push_time_ordered(out: &mut String, unix_ms: u64, random_len: usize, next_byte: impl FnMut() -> u8) {
    let mut digits = [0u8; TIME_LEN];
    let mut rest = unix_ms;
    for digit in digits.iter_mut().rev() {
        *digit = BASE62[(rest % 62) as usize];
        rest /= 62;
    }
    out.extend(digits.iter().map(|&b| char::from(b)));
    push_base62(out, random_len, next_byte);
}

pub fn is_base62(s: &str) -> bool {
    s.bytes().all(|b| b.is_ascii_alphanumeric())
}

/// Whether `token` has the shape of a secret minted as `prefix` and `random_len` base62
/// characters: only such a token is worth looking up in a store, so that a wrong token of any
/// other shape costs no database read.
pub fn has_minted_shape(token: &str, prefix: &str, random_len: usize) -> bool {
    token.strip_prefix(prefix).is_some_and(|rest| rest.len() == random_len && is_base62(rest))
}

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident, $prefix:literal) => {
        $(#[$doc])*
        #[derive(Clone, Eq, PartialOrd, Ord)]
        pub struct $name(Arc<str>);

        // By the text, as equality is.
        impl std::hash::Hash for $name {
            fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
                self.0.hash(state);
            }
        }

        /// Clones of one id share its text: those compare without reading it.
        impl PartialEq for $name {
            fn eq(&self, other: &Self) -> bool {
                Arc::ptr_eq(&self.0, &other.0) || self.0 == other.0
            }
        }

        impl $name {
            pub const PREFIX: &'static str = $prefix;

            /// How many random characters follow the prefix in ids we mint.
            pub const RANDOM_LEN: usize = 20;

            /// Accepts any string that has the right prefix; ids are opaque beyond that.
            pub fn parse(s: &str) -> Option<Self> {
                (s.starts_with(Self::PREFIX) && s.len() > Self::PREFIX.len() && is_base62(&s[Self::PREFIX.len()..]))
                    .then(|| Self(s.into()))
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }

            /// The base62 characters after the prefix.
            pub fn suffix(&self) -> &str {
                &self.0[Self::PREFIX.len()..]
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }

        /// Validating: text that [`Self::parse`] refuses does not deserialize.
        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct Visitor;

                impl serde::de::Visitor<'_> for Visitor {
                    type Value = $name;

                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        write!(f, "an id starting with {:?}", $prefix)
                    }

                    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<$name, E> {
                        $name::parse(s).ok_or_else(|| E::invalid_value(serde::de::Unexpected::Str(s), &self))
                    }
                }

                d.deserialize_str(Visitor)
            }
        }
    };
}

id_type!(
    /// An organization: the customer that owns keys, caps and provider credentials.
    OrgId,
    "org_"
);
id_type!(
    /// A Recovea key's public id (never its secret).
    KeyId,
    "key_"
);
id_type!(
    /// A spend cap.
    CapId,
    "cap_"
);
id_type!(
    /// A node credential's public id (never its token).
    NodeCredentialId,
    "ncr_"
);
id_type!(
    /// An organization token's public id (never its secret).
    OrgTokenId,
    "tok_"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejection_sampling_skips_biased_bytes() {
        let mut bytes = [255u8, 248, 0, 61, 62].into_iter();
        let mut out = String::new();
        push_base62(&mut out, 3, || bytes.next().expect("enough bytes"));
        assert_eq!(out, "0z0");
    }

    #[test]
    fn base62_values_invert_the_alphabet() {
        for (digit, &c) in BASE62.iter().enumerate() {
            assert_eq!(base62_value(c), u8::try_from(digit).ok());
        }
        assert_eq!(base62_value(b'_'), None);
    }

    #[test]
    fn time_ordered_tokens_start_with_the_clock_in_fixed_width() {
        let token = |ms| {
            let mut out = String::new();
            push_time_ordered(&mut out, ms, 2, || 0);
            out
        };
        assert_eq!(token(0), "0000000000");
        assert_eq!(token(61), "0000000z00");
        assert_eq!(token(62), "0000001000");
        // 2026-12-01T00:00:00Z
        assert_eq!(token(1_796_083_200_000).len(), TIME_LEN + 2);
    }

    proptest::proptest! {
        #[test]
        fn time_ordered_tokens_sort_as_their_clocks(a in 0u64..62u64.pow(8), b in 0u64..62u64.pow(8), seed: u64) {
            // Any byte source will do: the random part must not matter to the order.
            let mut state = seed;
            let mut next_byte = || {
                state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                (state >> 56) as u8
            };
            let mut ta = String::new();
            let mut tb = String::new();
            push_time_ordered(&mut ta, a, 12, &mut next_byte);
            push_time_ordered(&mut tb, b, 12, &mut next_byte);
            if a < b {
                proptest::prop_assert!(ta < tb);
            }
            proptest::prop_assert!(is_base62(&ta));
        }
    }

    #[test]
    fn ids_parse_only_their_own_prefix() {
        let minted = mint(OrgId::PREFIX, OrgId::RANDOM_LEN, || 7);
        let org = OrgId::parse(&minted).expect("a minted id parses");
        assert_eq!(org.as_str().len(), 24);
        assert_eq!(KeyId::parse(org.as_str()), None);
        assert_eq!(OrgId::parse("org_"), None);
        assert_eq!(OrgId::parse("org_a/b"), None);
    }

    #[test]
    fn ids_deserialize_only_when_they_parse() {
        let org: OrgId = serde_json::from_str(r#""org_a1""#).expect("a valid id");
        assert_eq!(org.as_str(), "org_a1");
        assert_eq!(org.suffix(), "a1");
        assert!(serde_json::from_str::<OrgId>(r#""key_a1""#).is_err());
        assert!(serde_json::from_str::<KeyId>(r#""key_""#).is_err());
        let map: std::collections::BTreeMap<OrgId, u8> =
            serde_json::from_str(r#"{"org_b":2,"org_a":1}"#).expect("ids as map keys");
        assert_eq!(serde_json::to_string(&map).expect("serializes"), r#"{"org_a":1,"org_b":2}"#);
    }
}
