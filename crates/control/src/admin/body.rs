//! A request body read into its type (`admin::requests`).

use serde::de::DeserializeOwned;

use crate::ApiError;

/// Parses a JSON body; the error names the offending field, never echoes a value.
pub(crate) fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let de = &mut serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if inner.is_syntax() || inner.is_eof() {
            ApiError::bad_request("body: expected a JSON object")
        } else if path == "." {
            ApiError::bad_request(format!("body: {}", strip_position(&inner.to_string())))
        } else {
            ApiError::bad_field(path, strip_position(&inner.to_string()))
        }
    })
}

/// serde_json appends " at line L column C", which helps nobody reading an API error.
fn strip_position(message: &str) -> &str {
    message.find(" at line ").map_or(message, |i| &message[..i])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    use crate::admin::requests::{KeyPatch, ProviderBody};

    #[test]
    fn body_errors_name_the_field() {
        let refused = |body: &str| match parse::<ProviderBody>(body.as_bytes()) {
            Err(ApiError::BadRequest { field, message }) => (field, message),
            _ => panic!("expected a bad request"),
        };
        assert_eq!(refused(r#"{"kind":"openai"}"#), (None, "body: missing field `api_key`".into()));
        assert_eq!(
            refused(r#"{"kind":1,"api_key":"x"}"#),
            (Some("kind".into()), "kind: invalid type: integer `1`, expected a string".into())
        );
        let (field, message) = refused(r#"{"kind":"openai","api_key":"x","extra":1}"#);
        assert_eq!(field.as_deref(), Some("extra"));
        assert!(message.starts_with("extra: unknown field `extra`"));
        assert_eq!(refused("not json"), (None, "body: expected a JSON object".into()));
    }

    /// A patch's members, read as JSON where the API checks them by hand, are still named as the
    /// API has always named them.
    #[test]
    fn an_unknown_member_of_a_patch_lists_the_members() {
        let Err(ApiError::BadRequest { field, message }) = parse::<KeyPatch<Value, Value>>(br#"{"rpm":1}"#)
        else {
            panic!("expected a bad request")
        };
        assert_eq!(field.as_deref(), Some("rpm"));
        assert_eq!(
            message,
            "rpm: unknown field `rpm`, expected one of `requests_per_minute`, `tokens_per_minute`, \
             `allowed_models`, `allowed_endpoints`, `max_concurrent_requests`"
        );
    }
}
