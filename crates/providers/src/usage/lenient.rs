//! A string member read leniently: the one piece both readers of an answer's usage (`quick`, the
//! fast path, and `wire`, serde's) share, so that neither reads the other for it.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// A JSON value kept only when it is a string (borrowed when it has no escapes), so that an odd
/// `model` or `type` never fails the parse of the usage beside it.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct StrOrNothing<'a>(pub Option<Cow<'a, str>>);

impl<'a> StrOrNothing<'a> {
    pub fn as_str(&self) -> &str {
        self.0.as_deref().unwrap_or("")
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for StrOrNothing<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Keeping<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for Keeping<'a> {
            type Value = StrOrNothing<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_borrowed_str<E>(self, text: &'de str) -> Result<Self::Value, E> {
                Ok(StrOrNothing(Some(Cow::Borrowed(text))))
            }
            fn visit_str<E>(self, text: &str) -> Result<Self::Value, E> {
                Ok(StrOrNothing(Some(Cow::Owned(text.to_owned()))))
            }
            fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
                Ok(StrOrNothing(None))
            }
            fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
                Ok(StrOrNothing(None))
            }
            fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
                Ok(StrOrNothing(None))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
                Ok(StrOrNothing(None))
            }
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(StrOrNothing(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                IgnoredAny.visit_seq(seq).map(|_| StrOrNothing(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                IgnoredAny.visit_map(map).map(|_| StrOrNothing(None))
            }
        }
        deserializer.deserialize_any(Keeping(PhantomData))
    }
}
