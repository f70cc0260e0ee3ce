//! What tests control and observe: scripted behaviours (FIFO) and the request log.

use std::borrow::Cow;
use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// How the mock treats the next request(s); every field is optional.
///
/// Queue one with [`MockProvider::script`](crate::MockProvider::script) or by POSTing its JSON to
/// `/__mock/script`. Behaviours apply in FIFO order, each to `times` consecutive requests
/// (default 1; 0 counts as 1), whatever their path.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Behaviour {
    /// Answer this status instead of the generated answer, with [`Self::body`] or, by default, a
    /// provider-shaped error body (OpenAI's or Anthropic's, chosen by the path).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// Answer this JSON instead of the generated answer (status 200 unless [`Self::status`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<Value>,
    /// Extra response headers; they replace generated headers of the same name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers: Option<BTreeMap<String, String>>,
    /// Wait this long before sending the response head (or before dropping the connection).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
    /// Wait this long between SSE events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunk_delay_ms: Option<u64>,
    /// Send this many SSE events (at most all of them), then abort the connection mid-body so
    /// the client sees an incomplete body. Ignored by non-streamed answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cut_after_events: Option<usize>,
    /// Send this many SSE events (at most all of them), then nothing more, the connection left
    /// open: a provider stalled mid-stream. Ignored by non-streamed answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stall_after_events: Option<usize>,
    /// Read the request, then drop the connection without answering.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub close_without_response: bool,
    /// Replace the usage object of the generated answer, verbatim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Value>,
    /// Make the generated answer's text this many pieces long (at most
    /// [`MAX_PIECES`](crate::MAX_PIECES)): [`REPLY_PIECES`](crate::REPLY_PIECES) repeated in turn,
    /// one streamed delta per piece, and its output tokens this number wherever usage is reported.
    /// Default 5 (one [`REPLY_TEXT`](crate::REPLY_TEXT)). With [`Self::chunk_delay_ms`], a stream as
    /// long as a model's: 600 pieces at 33 ms last 20 s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pieces: Option<usize>,
    /// List this many `web_search_call` items in a Responses answer, before its message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub web_search_calls: Option<u64>,
    /// How many consecutive requests this behaviour applies to (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub times: Option<u32>,
}

impl Behaviour {
    /// A behaviour that answers `status` with the provider-shaped error body.
    pub fn error(status: u16) -> Self {
        Self { status: Some(status), ..Self::default() }
    }

    pub fn status(mut self, status: u16) -> Self {
        self.status = Some(status);
        self
    }

    pub fn body(mut self, body: Value) -> Self {
        self.body = Some(body);
        self
    }

    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.get_or_insert_with(BTreeMap::new).insert(name.into(), value.into());
        self
    }

    pub fn delay_ms(mut self, ms: u64) -> Self {
        self.delay_ms = Some(ms);
        self
    }

    pub fn chunk_delay_ms(mut self, ms: u64) -> Self {
        self.chunk_delay_ms = Some(ms);
        self
    }

    pub fn cut_after_events(mut self, events: usize) -> Self {
        self.cut_after_events = Some(events);
        self
    }

    pub fn stall_after_events(mut self, events: usize) -> Self {
        self.stall_after_events = Some(events);
        self
    }

    pub fn close_without_response(mut self) -> Self {
        self.close_without_response = true;
        self
    }

    pub fn usage(mut self, usage: Value) -> Self {
        self.usage = Some(usage);
        self
    }

    pub fn web_search_calls(mut self, calls: u64) -> Self {
        self.web_search_calls = Some(calls);
        self
    }

    pub fn pieces(mut self, pieces: usize) -> Self {
        self.pieces = Some(pieces);
        self
    }

    pub fn times(mut self, times: u32) -> Self {
        self.times = Some(times);
        self
    }

    /// Checks the behaviour and converts it once into what the request path needs.
    pub(crate) fn prepare(&self) -> Result<(Plan, u32), InvalidBehaviour> {
        let status = self
            .status
            .map(|s| StatusCode::from_u16(s).map_err(|_| InvalidBehaviour(format!("bad status {s}"))))
            .transpose()?;
        let mut headers = HeaderMap::new();
        for (name, value) in self.headers.iter().flatten() {
            let name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| InvalidBehaviour(format!("bad header name {name:?}")))?;
            let value = HeaderValue::from_str(value)
                .map_err(|_| InvalidBehaviour(format!("bad value for header {name}")))?;
            headers.insert(name, value);
        }
        if let Some(pieces) = self.pieces.filter(|&p| p > crate::usage::MAX_PIECES) {
            return Err(InvalidBehaviour(format!("{pieces} pieces: at most {}", crate::usage::MAX_PIECES)));
        }
        let plan = Plan {
            status,
            body: self.body.as_ref().map(|b| Bytes::from(b.to_string())),
            headers,
            delay: Duration::from_millis(self.delay_ms.unwrap_or(0)),
            chunk_delay: Duration::from_millis(self.chunk_delay_ms.unwrap_or(0)),
            cut_after: self.cut_after_events,
            stall_after: self.stall_after_events,
            close: self.close_without_response,
            usage: self.usage.as_ref().map(Value::to_string),
            pieces: self.pieces,
            web_search_calls: self.web_search_calls,
        };
        Ok((plan, self.times.unwrap_or(1).max(1)))
    }
}

/// Why a [`Behaviour`] cannot be applied (a bad status code or header).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidBehaviour(String);

impl fmt::Display for InvalidBehaviour {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid behaviour: {}", self.0)
    }
}

impl std::error::Error for InvalidBehaviour {}

/// A [`Behaviour`] converted for use on the request path.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    pub(crate) status: Option<StatusCode>,
    pub(crate) body: Option<Bytes>,
    pub(crate) headers: HeaderMap,
    pub(crate) delay: Duration,
    pub(crate) chunk_delay: Duration,
    pub(crate) cut_after: Option<usize>,
    pub(crate) stall_after: Option<usize>,
    pub(crate) close: bool,
    pub(crate) usage: Option<String>,
    pub(crate) pieces: Option<usize>,
    pub(crate) web_search_calls: Option<u64>,
}

/// The FIFO of scripted behaviours with their remaining uses.
#[derive(Default)]
pub(crate) struct Script {
    queue: Mutex<VecDeque<(Arc<Plan>, u32)>>,
}

impl Script {
    pub(crate) fn push(&self, plan: Plan, times: u32) {
        lock(&self.queue).push_back((Arc::new(plan), times));
    }

    /// The behaviour for the request being answered, if any, using one of its uses up.
    pub(crate) fn next(&self) -> Option<Arc<Plan>> {
        let mut queue = lock(&self.queue);
        let (plan, remaining) = queue.front_mut()?;
        let plan = Arc::clone(plan);
        *remaining -= 1;
        if *remaining == 0 {
            queue.pop_front();
        }
        Some(plan)
    }

    pub(crate) fn clear(&self) {
        lock(&self.queue).clear();
    }
}

/// One request the mock received (control calls under `/__mock/` excluded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedRequest {
    pub method: String,
    /// The path with its query, if any.
    pub path: String,
    /// Every header, names in lower case, in the order received (repeated names grouped).
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
    /// When its head was read, in milliseconds since the Unix epoch.
    pub at_ms: u64,
}

impl RecordedRequest {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    /// The body parsed as JSON, if it is JSON.
    pub fn body_json(&self) -> Option<Value> {
        serde_json::from_slice(&self.body).ok()
    }

    /// The shape `/__mock/requests` serves.
    pub(crate) fn wire(&self) -> WireRequest<'_> {
        WireRequest {
            method: &self.method,
            path: &self.path,
            headers: &self.headers,
            body: String::from_utf8_lossy(&self.body),
            at_ms: self.at_ms,
        }
    }
}

#[derive(Serialize)]
pub(crate) struct WireRequest<'a> {
    method: &'a str,
    path: &'a str,
    headers: &'a [(String, String)],
    body: Cow<'a, str>,
    at_ms: u64,
}

/// A request as stored, in owned copies: hyper's header values and body chunks are slices of its
/// read buffers, and keeping them would pin whole buffers per request.
struct Entry {
    method: Method,
    path: String,
    /// `name:value\n` per header; neither part can hold a newline, nor a name a colon.
    headers: String,
    body: Bytes,
    at_ms: u64,
}

impl Entry {
    fn new(method: &Method, path: &str, headers: &HeaderMap, body: &[u8]) -> Self {
        let size = headers.iter().map(|(n, v)| n.as_str().len() + v.len() + 2).sum();
        let mut packed = String::with_capacity(size);
        for (name, value) in headers {
            packed.push_str(name.as_str());
            packed.push(':');
            packed.push_str(&String::from_utf8_lossy(value.as_bytes()));
            packed.push('\n');
        }
        Self {
            method: method.clone(),
            path: path.to_owned(),
            headers: packed,
            body: Bytes::copy_from_slice(body),
            at_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |since| u64::try_from(since.as_millis()).unwrap_or(u64::MAX)),
        }
    }

    fn to_recorded(&self) -> RecordedRequest {
        let headers = self
            .headers
            .lines()
            .filter_map(|line| line.split_once(':'))
            .map(|(n, v)| (n.to_owned(), v.to_owned()))
            .collect();
        RecordedRequest {
            method: self.method.as_str().to_owned(),
            path: self.path.clone(),
            headers,
            body: self.body.clone(),
            at_ms: self.at_ms,
        }
    }
}

/// The request log, bounded so that a long benchmark cannot exhaust memory.
pub(crate) struct Log {
    entries: Mutex<VecDeque<Entry>>,
    limit: AtomicUsize,
    /// Told of every request recorded, so that a test awaits one instead of polling the log.
    recorded: tokio::sync::watch::Sender<()>,
}

impl Default for Log {
    fn default() -> Self {
        let recorded = tokio::sync::watch::Sender::new(());
        Self { entries: Mutex::default(), limit: AtomicUsize::new(usize::MAX), recorded }
    }
}

impl Log {
    pub(crate) fn record(&self, method: &Method, path: &str, headers: &HeaderMap, body: &[u8]) {
        let limit = self.limit.load(Ordering::Relaxed);
        if limit == 0 {
            return;
        }
        let entry = Entry::new(method, path, headers, body);
        let mut entries = lock(&self.entries);
        while entries.len() >= limit {
            entries.pop_front();
        }
        entries.push_back(entry);
        drop(entries);
        self.recorded.send_replace(());
    }

    /// Changes with every request recorded from now on.
    pub(crate) fn watch(&self) -> tokio::sync::watch::Receiver<()> {
        self.recorded.subscribe()
    }

    pub(crate) fn len(&self) -> usize {
        lock(&self.entries).len()
    }

    pub(crate) fn set_limit(&self, limit: usize) {
        self.limit.store(limit, Ordering::Relaxed);
        let mut entries = lock(&self.entries);
        while entries.len() > limit {
            entries.pop_front();
        }
    }

    pub(crate) fn snapshot(&self) -> Vec<RecordedRequest> {
        lock(&self.entries).iter().map(Entry::to_recorded).collect()
    }

    pub(crate) fn clear(&self) {
        lock(&self.entries).clear();
    }
}

/// Locks `m`; a panic elsewhere cannot leave these structures half-updated, so poison is moot.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn behaviour_json_round_trips_and_rejects_unknown_fields() {
        let b = Behaviour::error(429).header("retry-after", "1").times(2);
        let json = serde_json::to_value(&b).expect("serialises");
        assert_eq!(json, serde_json::json!({"status": 429, "headers": {"retry-after": "1"}, "times": 2}));
        let back: Behaviour = serde_json::from_value(json).expect("deserialises");
        assert_eq!(back, b);
        assert!(serde_json::from_str::<Behaviour>(r#"{"stauts":500}"#).is_err());
        assert_eq!(serde_json::from_str::<Behaviour>("{}").expect("empty is fine"), Behaviour::default());
    }

    #[test]
    fn prepare_rejects_bad_status_and_headers() {
        assert!(Behaviour::error(42).prepare().is_err());
        assert!(Behaviour::default().header("bad name", "x").prepare().is_err());
        assert!(Behaviour::default().header("x-ok", "bad\nvalue").prepare().is_err());
        assert!(Behaviour::default().header("x-ok", "fine").prepare().is_ok());
        assert!(Behaviour::default().pieces(crate::usage::MAX_PIECES + 1).prepare().is_err());
        assert!(Behaviour::default().pieces(600).prepare().is_ok());
    }

    #[test]
    fn script_is_fifo_with_times() {
        let script = Script::default();
        let (a, _) = Behaviour::error(500).prepare().expect("valid");
        let (b, _) = Behaviour::error(503).prepare().expect("valid");
        script.push(a, 2);
        script.push(b, 1);
        let statuses: Vec<_> =
            std::iter::from_fn(|| script.next()).map(|p| p.status.map(|s| s.as_u16())).collect();
        assert_eq!(statuses, [Some(500), Some(500), Some(503)]);
    }

    #[test]
    fn log_keeps_the_most_recent_within_its_limit() {
        let log = Log::default();
        for i in 0..5 {
            log.record(&Method::POST, &format!("/{i}"), &HeaderMap::new(), b"");
        }
        log.set_limit(2);
        let paths: Vec<_> = log.snapshot().into_iter().map(|r| r.path).collect();
        assert_eq!(paths, ["/3", "/4"]);
    }
}
