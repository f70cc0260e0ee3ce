//! `realtime`: N concurrent Realtime (WebSocket) sessions held open at once, as voice clients hold
//! them, each on a connection of its own (plain HTTP/1.1 upgraded; the handshake is written by
//! hand, tungstenite only frames), opened R a second.
//!
//! The run has three parts. The ramp: session i connects at i / R seconds, upgrades `GET --url`
//! (with `Authorization: Bearer --key`) and waits for its first event (`session.created`); the
//! time from connecting to that event is its open time. Once every session is open (or failed)
//! and `--settle-ms` (default 1000) has passed, a sample is taken (the peak: every session open and
//! idle). The traffic: from a common start, session i sends a `conversation.item.create` text event
//! every `--period-ms` P (its first at i·P/N ms after the start, so that the sends are spread
//! evenly) for `--seconds` D, and times each round trip, from the send to the arrival of
//! `conversation.item.added`; every `--response-every` K-th round (0: never) it sends a
//! `response.create` instead and times the round trip to `response.done` (the whole response), so
//! that the hop meters. Frames that arrive between rounds (`conversation.item.done`) are read as
//! they come. The close: every session sends a close frame and waits for the server's.
//!
//! A sampler reads, every `--sample-ms`, how many sessions are open, the frames the client has sent
//! and received so far, and the CPU time and RSS of the processes under test (`--proxy-pids`,
//! summed: the gateway, or nginx's workers) and of the mock (`--mock-pid`). From these it reports
//! the hop's RSS at the peak less its RSS before the first session (per open session, and the same
//! at the most it reached during the traffic), and its CPU time per frame relayed over the steady
//! window: from P after the start (every session sending) to D after it (the first sessions stop),
//! frames counted both ways as the client sent and received them.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::Utf8Bytes;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};

use crate::streams::{CpuMeter, percentiles, rss_kib};
use crate::{Error, Flags};

/// The client events: an item added to the conversation, and a response asked for.
const ITEM_CREATE: &str = r#"{"type":"conversation.item.create","item":{"type":"message","role":"user","content":[{"type":"input_text","text":"Hello from the benchmark, one more line of the conversation."}]}}"#;
const RESPONSE_CREATE: &str = r#"{"type":"response.create"}"#;
/// The server events that end a round (the server writes JSON compactly: `"type":"..."` as is).
const ITEM_ADDED: &str = r#""type":"conversation.item.added""#;
const RESPONSE_DONE: &str = r#""type":"response.done""#;
const ERROR_EVENT: &str = r#""type":"error""#;
/// The handshake's `Sec-WebSocket-Key` (any 16 bytes, base64; RFC 6455's sample).
const WS_KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";
/// The most of a handshake answer read.
const MAX_HEAD: usize = 16 << 10;

/// What the session tasks share: counters the sampler reads, and the run's epoch.
struct Shared {
    epoch: Instant,
    /// Sessions whose first event came, and not closed yet.
    open: AtomicI64,
    peak_open: AtomicI64,
    /// Sessions done opening, well or not: the ramp is over when all are.
    settled: AtomicUsize,
    /// Sessions ended, well or not.
    done: AtomicUsize,
    failed: AtomicUsize,
    /// WebSocket messages sent and received (every kind), all sessions.
    sent: AtomicU64,
    received: AtomicU64,
}

impl Shared {
    fn ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }
}

/// One session's outcome.
#[derive(Default)]
struct Outcome {
    /// From connecting to the first event, µs.
    open_us: Option<u32>,
    /// Every round trip: (when it ended, ms since the epoch; µs).
    items: Vec<(u32, u32)>,
    responses: Vec<u32>,
    /// Rounds sent more than 10 ms after their time (the client fell behind), and the worst delay.
    late: usize,
    late_max_us: u32,
    error: Option<(&'static str, String)>,
}

/// One sample of the sampler.
#[derive(Clone, Copy, Default)]
struct Sample {
    ms: u64,
    open: i64,
    sent: u64,
    received: u64,
    proxy_cpu_ns: u64,
    proxy_rss_kib: u64,
    mock_cpu_ns: u64,
    self_cpu_ns: u64,
}

/// The run's shape, as every session needs it.
struct Plan {
    host: String,
    request: Bytes,
    count: usize,
    period: Duration,
    rounds: usize,
    response_every: usize,
    round_timeout: Duration,
    config: WebSocketConfig,
}

pub(crate) async fn realtime(flags: &Flags) -> Result<(), Error> {
    let url: http::Uri = flags.str("url")?.parse()?;
    if url.scheme_str() != Some("http") {
        return Err("--url: ws over plain http:// expected".into());
    }
    let authority = url.authority().ok_or("--url needs host:port")?.clone();
    let path = url.path_and_query().map_or("/", |p| p.as_str());
    let count: usize = flags.num("sessions", 100)?;
    let rate: f64 = flags.num("rate", 200.0)?;
    let period = Duration::from_millis(flags.num("period-ms", 100)?);
    let seconds: f64 = flags.num("seconds", 20.0)?;
    let response_every: usize = flags.num("response-every", 20)?;
    let round_timeout = Duration::from_secs_f64(flags.num("round-timeout", 10.0)?);
    let open_timeout = Duration::from_secs_f64(flags.num("open-timeout", 30.0)?);
    let sample_every = Duration::from_millis(flags.num("sample-ms", 200)?);
    let settle = Duration::from_millis(flags.num("settle-ms", 1000)?);
    let pids = |name: &str| -> Result<Vec<u32>, Error> {
        flags
            .opt(name)
            .unwrap_or("")
            .split(',')
            .filter(|s| !s.is_empty())
            .map(|s| s.parse::<u32>().map_err(|_| format!("--{name}: not a pid list").into()))
            .collect()
    };
    let proxy_pids = pids("proxy-pids")?;
    let mock_pids = pids("mock-pid")?;
    if period.is_zero() || count == 0 {
        return Err("--period-ms and --sessions must be above 0".into());
    }
    let rounds = ((seconds * 1000.0) / period.as_millis() as f64).round() as usize;

    let mut request = format!(
        "GET {path} HTTP/1.1\r\nHost: {authority}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {WS_KEY}\r\n"
    );
    if let Some(key) = flags.opt("key") {
        request.push_str(&format!("Authorization: Bearer {key}\r\n"));
    }
    request.push_str("\r\n");
    // The client's buffers: small reads (events are a few hundred bytes), writes sent at once.
    let config = WebSocketConfig::default().read_buffer_size(8 << 10).write_buffer_size(0);
    let plan = Arc::new(Plan {
        host: authority.as_str().to_owned(),
        request: Bytes::from(request),
        count,
        period,
        rounds,
        response_every,
        round_timeout,
        config,
    });

    let shared = Arc::new(Shared {
        epoch: Instant::now(),
        open: AtomicI64::new(0),
        peak_open: AtomicI64::new(0),
        settled: AtomicUsize::new(0),
        done: AtomicUsize::new(0),
        failed: AtomicUsize::new(0),
        sent: AtomicU64::new(0),
        received: AtomicU64::new(0),
    });
    let take = {
        let (shared, proxy_pids, mock_pids) = (Arc::clone(&shared), proxy_pids.clone(), mock_pids.clone());
        let meter = Arc::new(CpuMeter::default());
        move || Sample {
            ms: shared.ms(),
            open: shared.open.load(Relaxed),
            sent: shared.sent.load(Relaxed),
            received: shared.received.load(Relaxed),
            proxy_cpu_ns: meter.ns(&proxy_pids),
            proxy_rss_kib: proxy_pids.iter().map(|&p| rss_kib(p)).sum(),
            mock_cpu_ns: meter.ns(&mock_pids),
            self_cpu_ns: meter.ns(&[std::process::id()]),
        }
    };
    let idle = take();
    let sampler = {
        let (take, shared) = (take.clone(), Arc::clone(&shared));
        tokio::spawn(async move {
            let mut samples = Vec::new();
            let mut tick = tokio::time::interval(sample_every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                samples.push(take());
                if shared.done.load(Relaxed) >= count {
                    return samples;
                }
            }
        })
    };

    // The ramp: session i connects at i / rate seconds, then waits for the common start.
    let (start_tx, start_rx) = tokio::sync::watch::channel(None::<Instant>);
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(count);
    for i in 0..count {
        let at = started + Duration::from_secs_f64(i as f64 / rate);
        tokio::time::sleep_until(at.into()).await;
        let (plan, shared, start) = (Arc::clone(&plan), Arc::clone(&shared), start_rx.clone());
        tasks.push(tokio::spawn(async move {
            let mut outcome = Outcome {
                items: Vec::with_capacity(plan.rounds),
                responses: Vec::with_capacity(plan.rounds / plan.response_every.max(1) + 1),
                ..Outcome::default()
            };
            session(i, &plan, &shared, start, open_timeout, &mut outcome).await;
            if outcome.error.is_some() {
                shared.failed.fetch_add(1, Relaxed);
            }
            shared.done.fetch_add(1, Relaxed);
            outcome
        }));
    }
    // Every session open (or failed), then settled: the peak.
    let deadline = Instant::now() + open_timeout + Duration::from_secs(1);
    while shared.settled.load(Relaxed) < count && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let ramp_s = started.elapsed().as_secs_f64();
    tokio::time::sleep(settle).await;
    let peak = take();
    // The traffic, from a common start a little ahead.
    let start = Instant::now() + Duration::from_millis(100);
    let start_ms = start.duration_since(shared.epoch).as_millis() as u64;
    start_tx.send_replace(Some(start));
    let mut outcomes = Vec::with_capacity(count);
    for task in tasks {
        outcomes.push(task.await?);
    }
    let total_s = started.elapsed().as_secs_f64();
    let mut samples = sampler.await?;
    samples.push(take());

    let window = (start_ms + period.as_millis() as u64, start_ms + (seconds * 1000.0) as u64);
    report(
        &shared,
        &plan,
        &idle,
        &peak,
        &samples,
        &outcomes,
        window,
        ramp_s,
        total_s,
        &proxy_pids,
        &mock_pids,
    );
    Ok(())
}

/// One session, from connecting to its close.
async fn session(
    i: usize,
    plan: &Plan,
    shared: &Shared,
    mut start: tokio::sync::watch::Receiver<Option<Instant>>,
    open_timeout: Duration,
    outcome: &mut Outcome,
) {
    let t0 = Instant::now();
    let opened = tokio::time::timeout(open_timeout, open(plan, shared, outcome)).await;
    shared.settled.fetch_add(1, Relaxed);
    let mut ws = match opened {
        Ok(Some(ws)) => ws,
        Ok(None) => return,
        Err(_) => {
            outcome.error = Some(("open", format!("not open within {open_timeout:?}")));
            return;
        }
    };
    outcome.open_us = Some(us(t0.elapsed()));
    let open = shared.open.fetch_add(1, Relaxed) + 1;
    shared.peak_open.fetch_max(open, Relaxed);

    // Anything the server sends while the others open is read (none is expected).
    let begin = loop {
        tokio::select! {
            biased;
            at = start.wait_for(Option::is_some) => match at {
                Ok(at) => break (*at).unwrap_or_else(Instant::now),
                Err(_) => {
                    shared.open.fetch_sub(1, Relaxed);
                    return;
                }
            },
            message = ws.next() => {
                if let Err(e) = stray(message, shared) {
                    outcome.error = Some(e);
                    shared.open.fetch_sub(1, Relaxed);
                    return;
                }
            }
        }
    };
    let result = rounds(i, plan, shared, &mut ws, begin, outcome).await;
    if let Err(e) = result {
        outcome.error = Some(e);
    } else {
        // The closing handshake: the server's close frame ends the stream.
        let close = async {
            ws.close(None).await?;
            shared.sent.fetch_add(1, Relaxed);
            while let Some(message) = ws.next().await {
                message?;
                shared.received.fetch_add(1, Relaxed);
            }
            Ok::<(), tokio_tungstenite::tungstenite::Error>(())
        };
        match tokio::time::timeout(plan.round_timeout, close).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => outcome.error = Some(("close", e.to_string())),
            Err(_) => outcome.error = Some(("close", "no close frame back".to_owned())),
        }
    }
    shared.open.fetch_sub(1, Relaxed);
}

type Socket = WebSocketStream<TcpStream>;
type Failure = (&'static str, String);

/// Connects, upgrades and waits for the first event; `None` (the error in `outcome`) when any fails.
async fn open(plan: &Plan, shared: &Shared, outcome: &mut Outcome) -> Option<Socket> {
    let result = async {
        let mut tcp = TcpStream::connect(&plan.host).await.map_err(|e| ("connect", e.to_string()))?;
        tcp.set_nodelay(true).map_err(|e| ("connect", e.to_string()))?;
        tcp.write_all(&plan.request).await.map_err(|e| ("connect", e.to_string()))?;
        let mut head = Vec::with_capacity(1024);
        let end = loop {
            if let Some(at) = head.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            if head.len() > MAX_HEAD {
                return Err(("handshake", "an answer's head longer than 16 KiB".to_owned()));
            }
            if tcp.read_buf(&mut head).await.map_err(|e| ("handshake", e.to_string()))? == 0 {
                return Err(("handshake", "closed before answering".to_owned()));
            }
        };
        if !head.starts_with(b"HTTP/1.1 101") {
            // Its body, what came with the head, is enough to say why.
            let text = String::from_utf8_lossy(&head);
            let line = text.lines().next().unwrap_or_default().to_owned();
            let body =
                text.split_once("\r\n\r\n").map_or("", |(_, b)| b).chars().take(300).collect::<String>();
            return Err(("status", format!("{line}: {body}")));
        }
        let rest = head.split_off(end);
        let mut ws = WebSocketStream::from_partially_read(tcp, rest, Role::Client, Some(plan.config)).await;
        match ws.next().await {
            Some(Ok(Message::Text(text))) if text.contains(r#""type":"session.created""#) => {
                shared.received.fetch_add(1, Relaxed);
                Ok::<Socket, Failure>(ws)
            }
            Some(Ok(other)) => {
                Err(("handshake", format!("a first message other than session.created: {other}")))
            }
            Some(Err(e)) => Err(("handshake", e.to_string())),
            None => Err(("handshake", "closed before session.created".to_owned())),
        }
    }
    .await;
    match result {
        Ok(ws) => Some(ws),
        Err(e) => {
            outcome.error = Some(e);
            None
        }
    }
}

/// A message read between rounds: counted; an error event or the end fails the session.
fn stray(
    message: Option<Result<Message, tokio_tungstenite::tungstenite::Error>>,
    shared: &Shared,
) -> Result<(), Failure> {
    match message {
        Some(Ok(message)) => {
            shared.received.fetch_add(1, Relaxed);
            match message {
                Message::Text(text) if text.contains(ERROR_EVENT) => Err(("error-event", text.to_string())),
                Message::Close(frame) => Err(("closed", format!("by the server: {frame:?}"))),
                _ => Ok(()),
            }
        }
        Some(Err(e)) => Err(("io", e.to_string())),
        None => Err(("closed", "by the server".to_owned())),
    }
}

/// The session's rounds, round j at `begin` + i·P/N + j·P.
async fn rounds(
    i: usize,
    plan: &Plan,
    shared: &Shared,
    ws: &mut Socket,
    begin: Instant,
    outcome: &mut Outcome,
) -> Result<(), Failure> {
    let item = Message::Text(Utf8Bytes::from_static(ITEM_CREATE));
    let response = Message::Text(Utf8Bytes::from_static(RESPONSE_CREATE));
    let offset = plan.period.mul_f64(i as f64 / plan.count as f64);
    for j in 0..plan.rounds {
        let at = begin + offset + plan.period * j as u32;
        // Until the round's time, what arrives is read as it comes (the last round's `.done`).
        loop {
            tokio::select! {
                biased;
                () = tokio::time::sleep_until(at.into()) => break,
                message = ws.next() => stray(message, shared)?,
            }
        }
        let asks_response = plan.response_every > 0 && (j + 1) % plan.response_every == 0;
        let (message, ends) = if asks_response { (&response, RESPONSE_DONE) } else { (&item, ITEM_ADDED) };
        let t0 = Instant::now();
        let late = t0.saturating_duration_since(at);
        if late > Duration::from_millis(10) {
            outcome.late += 1;
        }
        outcome.late_max_us = outcome.late_max_us.max(us(late));
        ws.send(message.clone()).await.map_err(|e| ("io", e.to_string()))?;
        shared.sent.fetch_add(1, Relaxed);
        let deadline = t0 + plan.round_timeout;
        loop {
            let message = match tokio::time::timeout_at(deadline.into(), ws.next()).await {
                Ok(message) => message,
                Err(_) => return Err(("timeout", format!("no answer within {:?}", plan.round_timeout))),
            };
            let ended = matches!(&message, Some(Ok(Message::Text(text))) if text.contains(ends));
            if !ended {
                stray(message, shared)?;
                continue;
            }
            let now = Instant::now();
            shared.received.fetch_add(1, Relaxed);
            let took = us(now - t0);
            if asks_response {
                outcome.responses.push(took);
            } else {
                let at_ms = u32::try_from(now.duration_since(shared.epoch).as_millis()).unwrap_or(u32::MAX);
                outcome.items.push((at_ms, took));
            }
            break;
        }
    }
    Ok(())
}

fn us(d: Duration) -> u32 {
    u32::try_from(d.as_micros()).unwrap_or(u32::MAX)
}

#[allow(clippy::too_many_arguments)]
fn report(
    shared: &Shared,
    plan: &Plan,
    idle: &Sample,
    peak: &Sample,
    samples: &[Sample],
    outcomes: &[Outcome],
    (from, to): (u64, u64),
    ramp_s: f64,
    total_s: f64,
    proxy_pids: &[u32],
    mock_pids: &[u32],
) {
    let mut errors: std::collections::BTreeMap<&str, usize> = std::collections::BTreeMap::new();
    let mut error_samples = Vec::new();
    for (kind, message) in outcomes.iter().filter_map(|o| o.error.as_ref()) {
        *errors.entry(kind).or_default() += 1;
        if error_samples.len() < 5 {
            error_samples.push(format!("{kind}: {message}"));
        }
    }
    let mut opens: Vec<u32> = outcomes.iter().filter_map(|o| o.open_us).collect();
    let mut items: Vec<u32> = outcomes.iter().flat_map(|o| o.items.iter().map(|&(_, us)| us)).collect();
    let mut responses: Vec<u32> = outcomes.iter().flat_map(|o| o.responses.iter().copied()).collect();
    let mut items_steady: Vec<u32> = outcomes
        .iter()
        .flat_map(|o| o.items.iter().filter(|&&(at, _)| u64::from(at) >= from && u64::from(at) < to))
        .map(|&(_, us)| us)
        .collect();

    // The steady window: every session sending.
    let a = samples.iter().find(|s| s.ms >= from);
    let b = samples.iter().rev().find(|s| s.ms <= to);
    let steady = match (a, b) {
        (Some(a), Some(b)) if b.ms >= a.ms + 500 => Some((*a, *b)),
        _ => None,
    };
    let steady_json = match steady {
        Some((a, b)) => {
            let secs = (b.ms - a.ms) as f64 / 1000.0;
            let frames = (b.sent + b.received).saturating_sub(a.sent + a.received);
            let per_frame = |ns: u64| if frames == 0 { 0.0 } else { ns as f64 / 1000.0 / frames as f64 };
            serde_json::json!({
                "from_s": a.ms as f64 / 1000.0,
                "to_s": b.ms as f64 / 1000.0,
                "seconds": secs,
                "open_min": a.open.min(b.open),
                "frames": frames,
                "frames_sent": b.sent.saturating_sub(a.sent),
                "frames_received": b.received.saturating_sub(a.received),
                "frames_per_s": frames as f64 / secs,
                "proxy_cpu_s": b.proxy_cpu_ns.saturating_sub(a.proxy_cpu_ns) as f64 / 1e9,
                "proxy_cpu_us_per_frame": per_frame(b.proxy_cpu_ns.saturating_sub(a.proxy_cpu_ns)),
                "proxy_cores": b.proxy_cpu_ns.saturating_sub(a.proxy_cpu_ns) as f64 / 1e9 / secs,
                "mock_cores": b.mock_cpu_ns.saturating_sub(a.mock_cpu_ns) as f64 / 1e9 / secs,
                "client_cores": b.self_cpu_ns.saturating_sub(a.self_cpu_ns) as f64 / 1e9 / secs,
                "mock_cpu_us_per_frame": per_frame(b.mock_cpu_ns.saturating_sub(a.mock_cpu_ns)),
                "client_cpu_us_per_frame": per_frame(b.self_cpu_ns.saturating_sub(a.self_cpu_ns)),
                "item_us": percentiles(&mut items_steady),
            })
        }
        None => serde_json::Value::Null,
    };
    // Per second of the run: the item round trips that ended in it.
    let seconds =
        outcomes.iter().flat_map(|o| o.items.last()).map(|&(at, _)| at / 1000 + 1).max().unwrap_or(0);
    let mut by_second: Vec<Vec<u32>> = vec![Vec::new(); seconds as usize];
    for outcome in outcomes {
        for &(at, took) in &outcome.items {
            by_second[(at / 1000) as usize].push(took);
        }
    }
    let timeline: Vec<serde_json::Value> = by_second
        .iter_mut()
        .enumerate()
        .filter(|(_, v)| !v.is_empty())
        .map(|(second, v)| {
            let p = percentiles(v);
            serde_json::json!([second, p["n"], p["p50"], p["p99"], p["max"]])
        })
        .collect();
    let per_session = |kib: u64, open: i64| {
        if open > 0 { (kib as f64 - idle.proxy_rss_kib as f64) / open as f64 } else { 0.0 }
    };
    // The most RSS while every session was open (the traffic included).
    let open_max = samples
        .iter()
        .filter(|s| s.ms >= peak.ms && s.open >= peak.open)
        .map(|s| s.proxy_rss_kib)
        .max()
        .unwrap_or(peak.proxy_rss_kib)
        .max(peak.proxy_rss_kib);
    let out = serde_json::json!({
        "sessions": plan.count,
        "opened": opens.len(),
        "failed": shared.failed.load(Relaxed),
        "errors": errors,
        "error_samples": error_samples,
        "peak_open": shared.peak_open.load(Relaxed),
        "period_ms": plan.period.as_millis() as u64,
        "rounds_each": plan.rounds,
        "response_every": plan.response_every,
        "ramp_s": ramp_s,
        // When the traffic started, s since the run's epoch (the timelines' clock).
        "start_s": from.saturating_sub(plan.period.as_millis() as u64) as f64 / 1000.0,
        "total_s": total_s,
        "late_rounds": outcomes.iter().map(|o| o.late).sum::<usize>(),
        "late_max_us": outcomes.iter().map(|o| o.late_max_us).max().unwrap_or(0),
        "frames_sent": shared.sent.load(Relaxed),
        "frames_received": shared.received.load(Relaxed),
        "open_us": percentiles(&mut opens),
        "item_us": percentiles(&mut items),
        "response_us": percentiles(&mut responses),
        "steady": steady_json,
        // [second, round trips, p50, p99, max] for each second of the run with item rounds.
        "timeline": timeline,
        "proxy_pids": proxy_pids,
        "mock_pids": mock_pids,
        "rss": {
            "idle_kib": idle.proxy_rss_kib,
            "peak_kib": peak.proxy_rss_kib,
            "peak_open": peak.open,
            "peak_at_s": peak.ms as f64 / 1000.0,
            "per_session_kib": per_session(peak.proxy_rss_kib, peak.open),
            "open_max_kib": open_max,
            "per_session_max_kib": per_session(open_max, peak.open),
            "max_kib": samples.iter().map(|s| s.proxy_rss_kib).max().unwrap_or(0),
            "end_kib": samples.last().map_or(0, |s| s.proxy_rss_kib),
        },
        "cpu_total_s": {
            "proxy": samples.last().map_or(0, |s| s.proxy_cpu_ns.saturating_sub(idle.proxy_cpu_ns)) as f64 / 1e9,
            "mock": samples.last().map_or(0, |s| s.mock_cpu_ns.saturating_sub(idle.mock_cpu_ns)) as f64 / 1e9,
            "client": samples.last().map_or(0, |s| s.self_cpu_ns.saturating_sub(idle.self_cpu_ns)) as f64 / 1e9,
        },
        // [second, sessions open, the hop's RSS in KiB] at each second of the run.
        "rss_timeline": samples
            .iter()
            .scan(u64::MAX, |last, s| {
                let second = s.ms / 1000;
                let fresh = *last != second;
                *last = second;
                Some(fresh.then(|| serde_json::json!([second, s.open, s.proxy_rss_kib])))
            })
            .flatten()
            .collect::<Vec<_>>(),
    });
    println!("{out}");
}
