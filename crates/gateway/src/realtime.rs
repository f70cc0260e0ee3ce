//! The Realtime relay: a WebSocket session proxied both ways byte for byte, each `response.done`
//! metered as it arrives (one receipt a response, text, audio and cached tokens each at its
//! price), and the session cut at an armed cap's line: the client's next `response.create` is not
//! forwarded, the client gets the contract's `error` event and a close (1008). A session whose
//! server answers by itself (turn detection) is cut as soon as a response takes it to the line.
//! A session therefore passes the line by at most one response.
//!
//! The client's text messages are held until whole (a `response.create` must be seen before it is
//! forwarded); everything else passes as it comes. The provider's messages pass at once; those
//! that may matter (`response.done`, `session.*`, `error`) are read beside.

mod frames;
mod sides;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use recovea_core::admission::Admitted;
use recovea_core::caps::{self, CapRefusal};
use recovea_core::ids::CapId;
use recovea_core::money::Nanos;
use recovea_core::pricing::{self, PriceScope};
use recovea_core::snapshot::{Prices, ProviderKind};
use recovea_core::tags::Tags;
use recovea_core::timestamp::Timestamp;
use recovea_core::usage::Usage;
use recovea_counters::Reservation;
use recovea_providers::realtime::{ServerEvent, asks_for_response};
use recovea_providers::usage::{Surface, Tapped};
use recovea_upstream::{BoxError, ResponseBody, Switched, UpgradedIo, UpstreamError};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;
use tungstenite::protocol::CloseFrame;
use tungstenite::protocol::frame::Frame as WireFrame;
use tungstenite::protocol::frame::coding::CloseCode;

use self::frames::{Data, OpCode};
use self::sides::{ClientSide, ClientStep, ProviderSide};
use crate::line::{self, Ask};
use crate::metering::{Charge, Metered, Timing};
use crate::node::Shared;
use crate::refusal::Refusal;

/// Each read of either side takes at most this much.
const READ_BYTES: usize = 8 << 10;
/// A response's output is estimated at this many tokens when the table does not know the model's
/// limit.
const UNKNOWN_MAX_OUTPUT: u64 = 4096;

/// What the proxy learned of the upgrade request, for the session's receipts.
pub(crate) struct SessionFacts {
    pub(crate) request_id: String,
    pub(crate) provider: String,
    pub(crate) provider_key: recovea_core::receipt::ProviderKey,
    pub(crate) kind: ProviderKind,
    pub(crate) scope: PriceScope,
    pub(crate) endpoint: String,
    pub(crate) model: Option<String>,
    pub(crate) prices: Prices,
    pub(crate) tags: Tags,
    /// The session's place among the key's requests in flight, held until it closes.
    pub(crate) _in_flight: Option<crate::inflight::Slot>,
}

/// Asks the provider to upgrade `request` and, when it does, answers the client's upgrade with
/// the provider's `101` and relays the session; any other answer goes back as it came.
pub(crate) async fn open(
    shared: &Arc<Shared>,
    admitted: Admitted,
    facts: SessionFacts,
    on_upgrade: OnUpgrade,
    request: Request<Bytes>,
) -> Result<Response<ResponseBody>, Refusal> {
    // An upgrade the provider does not switch (it refuses it, or never answers) is a request like
    // any other: its receipt, free, at the status the client gets.
    let unswitched = |status: u16| {
        let held = Held { reservation: None, at: shared.now() };
        shared.meter.record(
            &shared.metrics,
            metered(shared, &admitted, &facts, None, held),
            status,
            Tapped::default(),
        );
    };
    let switched = shared.upstream.upgrade(request, shared.config.upstream_timeout).await.map_err(|e| {
        let refusal = match e {
            UpstreamError::Unreachable(e) => {
                tracing::warn!(request_id = %facts.request_id, error = %e, "provider unreachable for a Realtime session");
                Refusal::UpstreamUnreachable
            }
            UpstreamError::Timeout => Refusal::UpstreamTimeout,
        };
        unswitched(refusal.answer().status);
        refusal
    })?;
    match switched {
        Switched::Answered(answer) => {
            unswitched(answer.status().as_u16());
            let (mut parts, body) = answer.into_parts();
            recovea_providers::headers::for_client(&mut parts.headers);
            Ok(Response::from_parts(parts, Full::new(body).map_err(BoxError::from).boxed_unsync()))
        }
        Switched::Upgraded { mut head, io, read } => {
            recovea_providers::headers::remove_account(&mut head.headers);
            let session = Session::new(Arc::clone(shared), admitted, facts);
            let stop = shared.sessions.subscribe();
            tokio::spawn(async move {
                match on_upgrade.await {
                    Ok(client) => session.relay(TokioIo::new(client), io, read, stop).await,
                    Err(e) => tracing::debug!(error = %e, "the client left before its upgrade"),
                }
            });
            Ok(Response::from_parts(head, Full::new(Bytes::new()).map_err(BoxError::from).boxed_unsync()))
        }
    }
}

/// One session's account: its responses, their reservations, and what the next one may cost.
struct Session {
    shared: Arc<Shared>,
    admitted: Admitted,
    facts: SessionFacts,
    /// Responses metered so far.
    responses: u64,
    /// Reservations of responses asked for and not begun yet, then of those begun, oldest first.
    asked: VecDeque<Held>,
    begun: VecDeque<Held>,
    /// The last response's input: the conversation the next one reads again.
    last_input: Usage,
    /// The server starts responses by itself (turn detection).
    auto_responses: bool,
    _connection: OpenConnection,
}

/// The client's connection, counted among the node's open ones (toward `--max-connections`) for
/// as long as its session lasts: the HTTP server let go of it at the upgrade.
struct OpenConnection(Arc<Shared>);

impl OpenConnection {
    fn count(shared: &Arc<Shared>) -> Self {
        shared.metrics.connections.open.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Self(Arc::clone(shared))
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.metrics.connections.open.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Why a session ended.
enum Ended {
    /// Either side closed or failed.
    Closed,
    /// An armed cap reached its line.
    Cut(CapRefusal),
    /// The node is stopping.
    Stopping,
}

/// A response's reservation on the caps covering the session, and when it was asked for.
struct Held {
    reservation: Option<(Reservation, Vec<CapId>)>,
    at: Timestamp,
}

impl Session {
    fn new(shared: Arc<Shared>, admitted: Admitted, facts: SessionFacts) -> Self {
        shared.metrics.realtime_opened();
        Self {
            _connection: OpenConnection::count(&shared),
            shared,
            admitted,
            facts,
            responses: 0,
            asked: VecDeque::new(),
            begun: VecDeque::new(),
            last_input: Usage::default(),
            auto_responses: false,
        }
    }

    /// Relays until either side ends, an armed cap cuts the session, or the node stops.
    async fn relay<C>(
        mut self,
        client: C,
        provider: UpgradedIo,
        early: Bytes,
        mut stop: watch::Receiver<bool>,
    ) where
        C: AsyncRead + AsyncWrite + Unpin,
    {
        let (mut client_read, mut client_write) = tokio::io::split(client);
        let (mut provider_read, mut provider_write) = tokio::io::split(provider);
        let mut from_client = ClientSide::default();
        let mut from_provider = ProviderSide::default();
        let mut client_buf = vec![0u8; READ_BYTES];
        let mut provider_buf = vec![0u8; READ_BYTES];
        let mut ended = self.provider_bytes(&mut from_provider, &early, &mut client_write).await;
        // What came with the provider's switch is a slice of the buffer its head was read into:
        // not kept for the session's life.
        drop(early);
        while ended.is_none() {
            ended = tokio::select! {
                read = client_read.read(&mut client_buf) => match read {
                    Ok(0) | Err(_) => Some(Ended::Closed),
                    Ok(n) => self.client_bytes(&mut from_client, &client_buf[..n], &mut provider_write).await,
                },
                read = provider_read.read(&mut provider_buf) => match read {
                    Ok(0) | Err(_) => Some(Ended::Closed),
                    Ok(n) => self.provider_bytes(&mut from_provider, &provider_buf[..n], &mut client_write).await,
                },
                () = async { drop(stop.wait_for(|stopping| *stopping).await) } => Some(Ended::Stopping),
            };
        }
        match ended {
            Some(Ended::Cut(refusal)) => self.cut(&mut client_write, &refusal).await,
            Some(Ended::Stopping) => {
                let away =
                    CloseFrame { code: CloseCode::Away, reason: "the gateway node is stopping".into() };
                send_frames(&mut client_write, None, away).await;
            }
            _ => {}
        }
        let _ = client_write.shutdown().await;
        let _ = provider_write.shutdown().await;
        self.close();
    }

    /// The client's bytes: passed on, but for its text messages, held until whole and then passed
    /// on or, a `response.create` at the line, not. `Some` ends the session (with the refusal that
    /// cuts it, if one does).
    async fn client_bytes<W: AsyncWrite + Unpin>(
        &mut self,
        side: &mut ClientSide,
        bytes: &[u8],
        provider: &mut W,
    ) -> Option<Ended> {
        let mut steps = Vec::new();
        if side.read(bytes, &mut steps).is_err() {
            return Some(Ended::Closed);
        }
        for step in steps {
            let forward = match step {
                ClientStep::Forward(bytes) => bytes,
                ClientStep::Message { raw, text, whole } => {
                    // A message too long to hold whole is decided as a `response.create`: its type
                    // could be anywhere in it.
                    if (!whole || asks_for_response(&text))
                        && let Err(refusal) = self.ask().await
                    {
                        return Some(Ended::Cut(refusal));
                    }
                    raw
                }
            };
            if provider.write_all(&forward).await.is_err() {
                return Some(Ended::Closed);
            }
        }
        None
    }

    /// The provider's bytes: passed on as they come, its events read beside. A response's
    /// receipt is on disk before the bytes that end its `response.done` reach the client, as an
    /// answer's is before its last bytes.
    async fn provider_bytes<W: AsyncWrite + Unpin>(
        &mut self,
        side: &mut ProviderSide,
        bytes: &[u8],
        client: &mut W,
    ) -> Option<Ended> {
        if bytes.is_empty() {
            return None;
        }
        let mut events = Vec::new();
        if side.read(bytes, &mut events).is_err() {
            return Some(Ended::Closed);
        }
        let mut done = false;
        for event in events {
            match event {
                ServerEvent::ResponseCreated => {
                    let held =
                        self.asked.pop_front().unwrap_or(Held { reservation: None, at: self.shared.now() });
                    self.begun.push_back(held);
                }
                ServerEvent::ResponseDone { usage } => {
                    self.response_done(usage).await;
                    done = true;
                }
                // A refused `response.create` makes no response: its reservation goes.
                ServerEvent::Error => drop(self.asked.pop_front()),
                ServerEvent::Session { model, auto_responses } => {
                    if model.is_some() {
                        self.facts.model = model;
                    }
                    self.auto_responses = auto_responses;
                }
                ServerEvent::Other => {}
            }
        }
        if client.write_all(bytes).await.is_err() {
            return Some(Ended::Closed);
        }
        // A server that answers by itself is cut once a response took its cap to the line.
        if done
            && self.auto_responses
            && let Some(refusal) = self.at_line()
        {
            return Some(Ended::Cut(refusal));
        }
        None
    }

    /// A response is asked for: checked at the caps covering the session, its estimate reserved.
    async fn ask(&mut self) -> Result<(), CapRefusal> {
        let at = self.shared.now();
        let estimate = self.estimate();
        match line::check_caps(&self.shared, &self.admitted, Ask { estimate, fit: false }, at).await {
            Ok(reservation) => {
                self.asked.push_back(Held { reservation, at });
                Ok(())
            }
            Err(Refusal::Budget(refusal)) => Err(refusal),
            Err(_) => Ok(()),
        }
    }

    /// What the next response may cost: the conversation read again (the last response's input),
    /// and the model's longest output, all of it audio.
    fn estimate(&self) -> Nanos {
        let price = self.facts.prices.table.price_in(self.facts.model.as_deref(), &self.facts.scope).price;
        let output = price.max_output_tokens.unwrap_or(UNKNOWN_MAX_OUTPUT);
        let usage = Usage { output_tokens: output, audio_output_tokens: output, ..self.last_input };
        pricing::cost(&usage, &price)
    }

    /// Whether an armed cap covering the session is at its line now, in this node's view.
    fn at_line(&self) -> Option<CapRefusal> {
        let (org, key) = (&self.admitted.org.id, &self.admitted.key_id);
        let max_age_ms = i64::try_from(self.shared.config.counter_max_age.as_millis()).unwrap_or(i64::MAX);
        let counters = self.shared.counters.as_ref();
        caps::check_caps_counting(
            self.admitted.org.caps.iter(),
            org,
            key,
            counters,
            self.shared.now(),
            max_age_ms,
            counters.counting(),
        )
        .err()
        .filter(|refusal| matches!(refusal, CapRefusal::Exceeded { .. }))
    }

    /// A response ended: its receipt, which settles its reservation, written.
    async fn response_done(&mut self, usage: Option<Usage>) {
        let held = self
            .begun
            .pop_front()
            .or_else(|| self.asked.pop_front())
            .unwrap_or(Held { reservation: None, at: self.shared.now() });
        if let Some(usage) = usage {
            self.last_input = Usage {
                input_tokens: usage.input_tokens,
                cached_input_tokens: usage.cached_input_tokens,
                audio_input_tokens: usage.audio_input_tokens,
                cached_audio_input_tokens: usage.cached_audio_input_tokens,
                ..Usage::default()
            };
        }
        self.responses += 1;
        let tapped = Tapped { usage, model: self.facts.model.clone(), ..Tapped::default() };
        let metered = self.metered(Some(self.responses), held);
        self.shared.meter.record_grouped(&self.shared.metrics, metered, 200, tapped).await;
    }

    /// The receipt of response `n` (`None`: of a session that made none).
    fn metered(&self, n: Option<u64>, held: Held) -> Metered {
        metered(&self.shared, &self.admitted, &self.facts, n, held)
    }

    /// Tells the client why its session ends, and closes it: the contract's `error` event, then a
    /// close frame (1008, policy; 1013, try again later, for spend that cannot be confirmed).
    async fn cut<W: AsyncWrite + Unpin>(&self, client: &mut W, refusal: &CapRefusal) {
        self.shared.metrics.realtime_cut();
        let code = match refusal {
            CapRefusal::Unverifiable { .. } => CloseCode::Again,
            _ => CloseCode::Policy,
        };
        let close = CloseFrame { code, reason: "spend cap".into() };
        send_frames(client, Some(refusal.answer().error_event()), close).await;
    }

    /// The session is over: a response the provider had begun but not finished is billed for what
    /// it had read, so it gets a receipt of that estimate (its input: the conversation as the last
    /// response read it); a session that made no response has a receipt of its own.
    fn close(mut self) {
        self.shared.metrics.realtime_closed();
        self.asked.clear();
        while let Some(held) = self.begun.pop_front() {
            self.responses += 1;
            let tapped = Tapped {
                usage: Some(self.last_input),
                partial: true,
                model: self.facts.model.clone(),
                ..Tapped::default()
            };
            let metered = self.metered(Some(self.responses), held);
            self.shared.meter.record(&self.shared.metrics, metered, 200, tapped);
        }
        if self.responses == 0 {
            let held = Held { reservation: None, at: self.shared.now() };
            let metered = self.metered(None, held);
            self.shared.meter.record(
                &self.shared.metrics,
                metered,
                StatusCode::SWITCHING_PROTOCOLS.as_u16(),
                Tapped::default(),
            );
        }
    }
}

/// The receipt of a session's response `n`, or (`None`) of a session, or an upgrade, that made
/// none: free.
fn metered(
    shared: &Arc<Shared>,
    admitted: &Admitted,
    facts: &SessionFacts,
    n: Option<u64>,
    held: Held,
) -> Metered {
    let mut request_id = facts.request_id.clone();
    if let Some(n) = n {
        request_id.push_str(&format!(".r{n}"));
    }
    Metered {
        request_id,
        org_id: admitted.org.id.to_string(),
        key_id: admitted.key_id.to_string(),
        provider: facts.provider.clone(),
        provider_key: facts.provider_key,
        endpoint: facts.endpoint.clone(),
        request_model: facts.model.clone(),
        kind: facts.kind,
        scope: facts.scope.clone(),
        stream: true,
        surface: Surface::Other,
        input_tokens: 0,
        media: None,
        started_at: held.at,
        prices: facts.prices.clone(),
        tags: facts.tags.clone(),
        charge: if n.is_some() { Charge::Metered } else { Charge::Free },
        creating: None,
        settle: Some(line::settle(shared, admitted, held.reservation)),
        timing: Timing::since(Instant::now()),
        trace: None,
    }
}

/// Sends the client a last text message, if any, and a close frame (unmasked: the node is the
/// server of the client's socket).
async fn send_frames<W: AsyncWrite + Unpin>(client: &mut W, last: Option<String>, close: CloseFrame) {
    let mut out = Vec::new();
    let message = last.map_or(Ok(()), |text| {
        WireFrame::message(text.into_bytes(), OpCode::Data(Data::Text), true).format(&mut out)
    });
    if message.and_then(|()| WireFrame::close(Some(close)).format(&mut out)).is_ok() {
        let _ = client.write_all(&out).await;
        let _ = client.flush().await;
    }
}
