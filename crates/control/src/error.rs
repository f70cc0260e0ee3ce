//! The admin API's errors, and the one place they become HTTP answers.

use recovea_core::Answer;
use recovea_store::StoreError;

#[derive(Debug)]
pub enum ApiError {
    /// The request body (or a parameter) is invalid; the text names the field.
    BadRequest(String),
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

    pub fn answer(&self) -> Answer {
        match self {
            Self::BadRequest(message) => {
                Answer::error(400, "invalid_request_error", "invalid_request", message)
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

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound => Self::NotFound("Not found.".into()),
            StoreError::Backend(cause) => Self::Internal(cause),
            StoreError::Unavailable(cause) => Self::Unavailable(cause),
        }
    }
}
