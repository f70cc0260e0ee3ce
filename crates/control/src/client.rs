//! A small client of the admin API, for `recovea admin`.

use bytes::Bytes;
use http::{Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

pub struct AdminClient {
    base_url: String,
    token: String,
    client: Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
}

#[derive(Debug)]
pub enum ClientError {
    BadUrl(String),
    /// No answer from the admin API at `url`; why, with every cause.
    Unreachable {
        url: String,
        why: String,
    },
    /// The API answered with an error: its status and body.
    Api(StatusCode, Value),
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::BadUrl(url) => write!(f, "--admin-url {url:?} is not an http:// URL"),
            Self::Unreachable { url, why } => write!(
                f,
                "the admin API at {url} could not be reached: {why} (is --admin-url right? `recovea serve` and `recovea control` print theirs as they start)"
            ),
            Self::Api(status, body) => {
                write!(f, "{status}: {}", serde_json::to_string_pretty(body).unwrap_or_default())
            }
        }
    }
}

impl std::error::Error for ClientError {}

impl AdminClient {
    pub fn new(base_url: &str, token: &str) -> Self {
        Self {
            base_url: base_url.trim_end_matches('/').to_owned(),
            token: token.to_owned(),
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    /// Sends one request to `/admin/v1{path}` with `body` (JSON, or nothing) and returns the answer
    /// of a 2xx as it came: JSON, or the CSV of an export.
    pub async fn call(&self, method: Method, path: &str, body: Vec<u8>) -> Result<Bytes, ClientError> {
        let url = format!("{}/admin/v1{path}", self.base_url);
        let request = Request::builder()
            .method(method)
            .uri(&url)
            .header(header::AUTHORIZATION, format!("Bearer {}", self.token))
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|_| ClientError::BadUrl(self.base_url.clone()))?;
        let unreachable =
            |e: &dyn std::error::Error| ClientError::Unreachable { url: url.clone(), why: causes(e) };
        let response = self.client.request(request).await.map_err(|e| unreachable(&e))?;
        let status = response.status();
        let bytes = response.into_body().collect().await.map_err(|e| unreachable(&e))?.to_bytes();
        if status.is_success() {
            Ok(bytes)
        } else {
            Err(ClientError::Api(status, serde_json::from_slice(&bytes).unwrap_or(Value::Null)))
        }
    }
}

/// An error and each of its causes, `: `-separated (hyper's own says only "client error (Connect)").
fn causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
