//! The admin API's errors, and the one place they become HTTP answers.

use recovea_core::Answer;
use recovea_store::StoreError;

#[derive(Debug)]
pub enum ApiError {
    /// The request body (or a parameter) is invalid. `message` is the whole text the client reads;
    /// `field` is the member or parameter it is about, when one alone is (the answer's `param`),
    /// so that no caller has to read it back out of the text.
    BadRequest {
        field: Option<String>,
        message: String,
    },
    /// A missing or wrong admin token (or an organization token that is wrong, expired or revoked).
    Unauthorized,
    /// A wrong admin token from an address that has presented too many: retry after this long.
    TooManyWrongTokens(std::time::Duration),
    /// A missing or wrong node token, on the node endpoints.
    NodeUnauthorized,
    /// The caller is who it says, but may not do this (an organization's token or role on what is
    /// the operator's, a viewer's change); the text says why, naming the member refused when one
    /// is.
    PermissionDenied(&'static str),
    /// The text names what was not found.
    NotFound(String),
    MethodNotAllowed,
    /// Something of ours failed. The cause goes to the log, never to the client.
    Internal(String),
    /// The database did not answer within its bounds (or could not be reached): the same call may
    /// succeed in a moment. The cause goes to the log.
    Unavailable(String),
}

impl ApiError {
    pub(crate) fn internal(e: impl std::fmt::Display) -> Self {
        Self::Internal(e.to_string())
    }

    /// A refusal of one field: the message `{field}: {why}`, and `param` naming the field.
    pub(crate) fn bad_field(field: impl Into<String>, why: impl std::fmt::Display) -> Self {
        let field = field.into();
        let message = format!("{field}: {why}");
        Self::BadRequest { field: Some(field), message }
    }

    /// A refusal no single field carries (the body as a whole, two fields at once): `param` null.
    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::BadRequest { field: None, message: message.into() }
    }

    /// The field a bad request is about, if one alone is.
    pub fn field(&self) -> Option<&str> {
        match self {
            Self::BadRequest { field, .. } => field.as_deref(),
            _ => None,
        }
    }

    pub fn answer(&self) -> Answer {
        match self {
            Self::BadRequest { field, message } => {
                let answer = Answer::error(400, "invalid_request_error", "invalid_request", message);
                match field {
                    Some(field) => answer.with_param(field),
                    None => answer,
                }
            }
            Self::Unauthorized => {
                Answer::error(401, "invalid_request_error", "invalid_admin_token", "Invalid admin token.")
            }
            Self::TooManyWrongTokens(wait) => {
                let seconds = crate::attempts::whole_seconds(*wait);
                let message = format!("Too many wrong admin tokens from this address. Retry in {seconds} s.");
                Answer::error(429, "invalid_request_error", "too_many_wrong_tokens", &message)
                    .with_header("retry-after", seconds.to_string())
            }
            Self::NodeUnauthorized => {
                Answer::error(401, "invalid_request_error", "invalid_node_token", "Invalid node token.")
            }
            Self::PermissionDenied(message) => {
                Answer::error(403, "permission_error", "permission_denied", message)
            }
            Self::NotFound(message) => Answer::error(404, "invalid_request_error", "not_found", message),
            Self::MethodNotAllowed => Answer::error(
                405,
                "invalid_request_error",
                "method_not_allowed",
                "Method not allowed on this path.",
            ),
            Self::Unavailable(cause) => {
                tracing::warn!(cause = %cause, "admin request failed: the database did not answer in time");
                Answer::error(
                    503,
                    "api_error",
                    "store_unavailable",
                    "The database did not answer in time. Retry in a moment.",
                )
                .with_header("retry-after", "1")
            }
            Self::Internal(cause) => {
                tracing::error!(cause = %cause, "admin request failed");
                Answer::error(
                    500,
                    "api_error",
                    "internal_error",
                    "Internal error; see the control plane's log.",
                )
            }
        }
    }
}

impl From<recovea_core::pricing::PriceError> for ApiError {
    /// Its message names the field already (`input_per_mtok_usd: ...`).
    fn from(e: recovea_core::pricing::PriceError) -> Self {
        Self::BadRequest { field: Some(e.field().to_owned()), message: e.to_string() }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound => Self::NotFound("Not found.".into()),
            StoreError::Backend(cause) => Self::Internal(cause),
            StoreError::Unavailable(cause) => Self::Unavailable(cause),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(error: &ApiError) -> String {
        let answer = error.answer();
        assert_eq!(answer.status, 400);
        String::from_utf8(answer.body).expect("UTF-8")
    }

    #[test]
    fn a_bad_field_is_named_in_param() {
        assert_eq!(
            body(&ApiError::bad_field("limit_usd", "not a decimal amount")),
            "{\n  \"error\": {\n    \"message\": \"limit_usd: not a decimal amount\",\n    \"type\": \"invalid_request_error\",\n    \"param\": \"limit_usd\",\n    \"code\": \"invalid_request\"\n  }\n}"
        );
        assert_eq!(
            body(&ApiError::bad_request("body: expected a JSON object")),
            "{\n  \"error\": {\n    \"message\": \"body: expected a JSON object\",\n    \"type\": \"invalid_request_error\",\n    \"param\": null,\n    \"code\": \"invalid_request\"\n  }\n}"
        );
    }
}
