//! A local OTLP/HTTP collector for tests: it accepts `POST /v1/traces` (protobuf), decodes each
//! `ExportTraceServiceRequest`, keeps its spans, and answers as a collector does.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// One span as received, with the `service.name` of the resource that sent it.
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    pub service_name: Option<String>,
    pub span: Span,
}

impl ReceivedSpan {
    pub fn name(&self) -> &str {
        &self.span.name
    }

    /// The attribute `key` as text (strings as they are, integers in decimal).
    pub fn attribute(&self, key: &str) -> Option<String> {
        let value = self.span.attributes.iter().find(|kv| kv.key == key)?.value.as_ref()?.value.as_ref()?;
        Some(match value {
            Value::StringValue(s) => s.clone(),
            Value::IntValue(n) => n.to_string(),
            Value::BoolValue(b) => b.to_string(),
            Value::DoubleValue(d) => d.to_string(),
            other => format!("{other:?}"),
        })
    }

    /// Every attribute's key and value, as text, for assertions that nothing unexpected is sent.
    pub fn attribute_texts(&self) -> Vec<(String, String)> {
        self.span
            .attributes
            .iter()
            .map(|kv| (kv.key.clone(), self.attribute(&kv.key).unwrap_or_default()))
            .collect()
    }
}

/// A running receiver; it stops when dropped.
pub struct OtlpReceiver {
    addr: SocketAddr,
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
    accept: JoinHandle<()>,
}

impl OtlpReceiver {
    /// Listens on a port of `127.0.0.1` the system picks.
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the OTLP receiver");
        let addr = listener.local_addr().expect("its address");
        let spans = Arc::new(Mutex::new(Vec::new()));
        let kept = Arc::clone(&spans);
        let accept = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let kept = Arc::clone(&kept);
                tokio::spawn(async move {
                    let service = service_fn(move |request| receive(Arc::clone(&kept), request));
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self { addr, spans, accept }
    }

    /// The collector's base URL (`http://127.0.0.1:PORT`); traces go to its `/v1/traces`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.spans.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The spans of the trace whose root span (named `root`) says `attribute` = `value`, once
    /// the root and its children have arrived; polls until `within` has passed, then panics.
    pub async fn trace_where(
        &self,
        root: &str,
        (attribute, value): (&str, &str),
        children: usize,
        within: Duration,
    ) -> (ReceivedSpan, Vec<ReceivedSpan>) {
        let deadline = Instant::now() + within;
        loop {
            let spans = self.spans();
            if let Some(found) =
                spans.iter().find(|s| s.name() == root && s.attribute(attribute).as_deref() == Some(value))
            {
                let kids: Vec<ReceivedSpan> = spans
                    .iter()
                    .filter(|s| {
                        s.span.trace_id == found.span.trace_id && s.span.parent_span_id == found.span.span_id
                    })
                    .cloned()
                    .collect();
                if kids.len() >= children {
                    return (found.clone(), kids);
                }
            }
            assert!(
                Instant::now() < deadline,
                "no {root} span with {attribute}={value} and {children} children; received: {:#?}",
                spans.iter().map(|s| (s.name().to_owned(), s.attribute_texts())).collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn receive(
    kept: Arc<Mutex<Vec<ReceivedSpan>>>,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let answer = |status: StatusCode, body: Vec<u8>| {
        let mut response = Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = status;
        response
            .headers_mut()
            .insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/x-protobuf"));
        Ok(response)
    };
    if request.method() != Method::POST || request.uri().path() != "/v1/traces" {
        return answer(StatusCode::NOT_FOUND, Vec::new());
    }
    let Ok(body) = request.into_body().collect().await.map(|b| b.to_bytes()) else {
        return answer(StatusCode::BAD_REQUEST, Vec::new());
    };
    let Ok(export) = ExportTraceServiceRequest::decode(body) else {
        return answer(StatusCode::BAD_REQUEST, Vec::new());
    };
    let mut spans = kept.lock().unwrap_or_else(|p| p.into_inner());
    for resource_spans in export.resource_spans {
        let service_name = resource_spans.resource.as_ref().and_then(|resource| {
            resource.attributes.iter().find(|kv| kv.key == "service.name").and_then(|kv| {
                match kv.value.as_ref()?.value.as_ref()? {
                    Value::StringValue(s) => Some(s.clone()),
                    _ => None,
                }
            })
        });
        for scope_spans in resource_spans.scope_spans {
            for span in scope_spans.spans {
                spans.push(ReceivedSpan { service_name: service_name.clone(), span });
            }
        }
    }
    answer(StatusCode::OK, ExportTraceServiceResponse::default().encode_to_vec())
}
