//! `streams`: N concurrent streaming chat requests held open at once, as clients of a model hold
//! them, each on a connection of its own (HTTP/1.1, TLS for an `https` URL), opened at a given rate;
//! or, `--http2 M`, M on each HTTP/2 connection (over TLS), as a multiplexing client holds them.
//!
//! For every stream it records the time to the answer's head and to its first SSE event, and the
//! arrival of every further event (the gap since the one before). A sampler reads, every
//! `--sample-ms`, how many streams are open and the CPU time and RSS of the processes under test
//! (`--proxy-pids`, summed: the gateway, or nginx's workers) and of the mock (`--mock-pid`). From
//! these it reports the peak of open streams, the proxy's RSS at that peak less its RSS before the
//! first stream (per open stream), and its CPU time per event over the steady window: from
//! `--settle-ms` (default 1000) after the last stream's head to half a second before the first
//! stream's end, when every stream is open and only events flow (none if that is under 0.5 s).

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use tokio::io::{AsyncRead, AsyncWrite};

use crate::{Error, Flags};

/// What the client-side tasks share: counters the sampler reads, and the run's epoch.
struct Shared {
    epoch: Instant,
    /// Streams launched (their task spawned).
    launched: AtomicUsize,
    /// Streams whose answer's head came (200) and whose body has not ended.
    open: AtomicI64,
    peak_open: AtomicI64,
    /// Streams ended, well or not.
    done: AtomicUsize,
    failed: AtomicUsize,
    /// When the last stream's head came, and when the first stream ended: ms since the epoch, +1
    /// (0 while it has not happened).
    last_head_ms: AtomicU64,
    first_done_ms: AtomicU64,
}

impl Shared {
    fn ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }
}

/// One stream's outcome.
#[derive(Default)]
struct Outcome {
    /// To the response head, and to the first SSE event, µs from the request's send.
    head_us: Option<u32>,
    first_event_us: Option<u32>,
    /// Every event after the first: (arrival, ms since the epoch; gap since the event before, µs).
    gaps: Vec<(u32, u32)>,
    events: usize,
    error: Option<(&'static str, String)>,
}

/// One sample of the sampler.
#[derive(Clone, Copy, Default)]
struct Sample {
    ms: u64,
    open: i64,
    proxy_cpu_ns: u64,
    proxy_rss_kib: u64,
    mock_cpu_ns: u64,
    self_cpu_ns: u64,
}

pub(crate) async fn streams(flags: &Flags) -> Result<(), Error> {
    let url: http::Uri = flags.str("url")?.parse()?;
    // `--http2 M`: the streams share HTTP/2 connections over TLS, M on each (a client that
    // multiplexes, as the gateway does towards providers); by default one HTTP/1.1 connection each.
    let http2: usize = flags.num("http2", 0)?;
    let alpn: &[u8] = if http2 > 0 { b"h2" } else { b"http/1.1" };
    let tls = match url.scheme_str() {
        Some("http") if http2 == 0 => None,
        Some("https") => Some(tls_connector(flags.opt("ca"), alpn)?),
        _ => return Err("--url: http:// or (and with --http2) https:// expected".into()),
    };
    let authority = url.authority().ok_or("--url needs host:port")?.clone();
    let path = url.path_and_query().map_or("/", |p| p.as_str()).to_owned();
    let body = Bytes::from(flags.str("body")?.to_owned());
    let key = flags.opt("key").map(str::to_owned);
    let count: usize = flags.num("streams", 100)?;
    let rate: f64 = flags.num("rate", 1000.0)?;
    let expect_events: usize = flags.num("expect-events", 0)?;
    let stream_timeout = Duration::from_secs_f64(flags.num("stream-timeout", 120.0)?);
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

    let shared = Arc::new(Shared {
        epoch: Instant::now(),
        launched: AtomicUsize::new(0),
        open: AtomicI64::new(0),
        peak_open: AtomicI64::new(0),
        done: AtomicUsize::new(0),
        failed: AtomicUsize::new(0),
        last_head_ms: AtomicU64::new(0),
        first_done_ms: AtomicU64::new(0),
    });
    let take = {
        let (shared, proxy_pids, mock_pids) = (Arc::clone(&shared), proxy_pids.clone(), mock_pids.clone());
        let meter = Arc::new(CpuMeter::default());
        move || Sample {
            ms: shared.ms(),
            open: shared.open.load(Relaxed),
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

    // The ramp: stream i starts at i / rate seconds.
    let pool = Arc::new(Http2Pool {
        connections: (0..count.div_ceil(http2.max(1))).map(|_| tokio::sync::OnceCell::new()).collect(),
        per_connection: http2.max(1),
    });
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(count);
    for i in 0..count {
        let at = started + Duration::from_secs_f64(i as f64 / rate);
        tokio::time::sleep_until(at.into()).await;
        let (authority, path, body, key, tls, shared, pool, url) = (
            authority.clone(),
            path.clone(),
            body.clone(),
            key.clone(),
            tls.clone(),
            Arc::clone(&shared),
            Arc::clone(&pool),
            url.clone(),
        );
        shared.launched.fetch_add(1, Relaxed);
        tasks.push(tokio::spawn(async move {
            let mut outcome = Outcome { gaps: Vec::with_capacity(expect_events), ..Outcome::default() };
            let run = async {
                match (http2 > 0, tls) {
                    (true, Some(tls)) => {
                        one_stream_h2(i, &pool, &url, &body, key.as_deref(), tls, &shared, &mut outcome).await
                    }
                    (_, tls) => {
                        one_stream(&authority, &path, &body, key.as_deref(), tls, &shared, &mut outcome).await
                    }
                }
            };
            match tokio::time::timeout(stream_timeout, run).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    outcome.error.get_or_insert(("io", e.to_string()));
                }
                Err(_) => outcome.error = Some(("timeout", format!("not done within {stream_timeout:?}"))),
            }
            if outcome.error.is_none() && expect_events > 0 && outcome.events != expect_events {
                outcome.error =
                    Some(("incomplete", format!("{} events, {expect_events} expected", outcome.events)));
            }
            if outcome.error.is_some() {
                shared.failed.fetch_add(1, Relaxed);
            }
            let _ = shared.first_done_ms.compare_exchange(0, shared.ms() + 1, Relaxed, Relaxed);
            shared.done.fetch_add(1, Relaxed);
            outcome
        }));
    }
    let ramp_s = started.elapsed().as_secs_f64();
    let mut outcomes = Vec::with_capacity(count);
    for task in tasks {
        outcomes.push(task.await?);
    }
    let total_s = started.elapsed().as_secs_f64();
    let mut samples = sampler.await?;
    samples.push(take());

    report(&shared, &idle, &samples, &outcomes, count, ramp_s, total_s, settle, &proxy_pids, &mock_pids);
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn report(
    shared: &Shared,
    idle: &Sample,
    samples: &[Sample],
    outcomes: &[Outcome],
    count: usize,
    ramp_s: f64,
    total_s: f64,
    settle: Duration,
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
    let events: usize = outcomes.iter().map(|o| o.events).sum();
    let heads: Vec<u32> = outcomes.iter().filter_map(|o| o.head_us).collect();
    let firsts: Vec<u32> = outcomes.iter().filter_map(|o| o.first_event_us).collect();

    // The steady window: every stream open, none ended yet.
    let last_head = shared.last_head_ms.load(Relaxed).saturating_sub(1);
    let first_done = shared.first_done_ms.load(Relaxed).saturating_sub(1);
    let (from, to) = (last_head + settle.as_millis() as u64, first_done.saturating_sub(500));
    let a = samples.iter().find(|s| s.ms >= from);
    let b = samples.iter().rev().find(|s| s.ms <= to);
    let steady = match (a, b) {
        (Some(a), Some(b)) if b.ms >= a.ms + 500 => Some((*a, *b)),
        _ => None,
    };
    // Per second of the run: the gaps of the events that arrived in it.
    let seconds =
        outcomes.iter().flat_map(|o| o.gaps.last()).map(|&(at, _)| at / 1000 + 1).max().unwrap_or(0);
    let mut by_second: Vec<Vec<u32>> = vec![Vec::new(); seconds as usize];
    for outcome in outcomes {
        for &(at, gap) in &outcome.gaps {
            by_second[(at / 1000) as usize].push(gap);
        }
    }
    let timeline: Vec<serde_json::Value> = by_second
        .iter_mut()
        .enumerate()
        .filter(|(_, gaps)| !gaps.is_empty())
        .map(|(second, gaps)| {
            let p = percentiles(gaps);
            serde_json::json!([second, p["n"], p["p50"], p["p99"], p["max"]])
        })
        .collect();
    drop(by_second);
    let mut gaps_all: Vec<u32> = Vec::with_capacity(events);
    let mut gaps_steady: Vec<u32> = Vec::new();
    let mut steady_events = 0usize;
    for outcome in outcomes {
        for &(at, gap) in &outcome.gaps {
            gaps_all.push(gap);
            if let Some((a, b)) = steady
                && u64::from(at) >= a.ms
                && u64::from(at) < b.ms
            {
                gaps_steady.push(gap);
                steady_events += 1;
            }
        }
    }
    // First events arriving inside the window (a stream is open there only after it): none, by
    // the window's definition.
    let steady_json = match steady {
        Some((a, b)) => {
            let secs = (b.ms - a.ms) as f64 / 1000.0;
            let per_event =
                |ns: u64| if steady_events == 0 { 0.0 } else { ns as f64 / 1000.0 / steady_events as f64 };
            serde_json::json!({
                "from_s": a.ms as f64 / 1000.0,
                "to_s": b.ms as f64 / 1000.0,
                "seconds": secs,
                "open_min": a.open.min(b.open),
                "events": steady_events,
                "events_per_s": steady_events as f64 / secs,
                "proxy_cpu_s": b.proxy_cpu_ns.saturating_sub(a.proxy_cpu_ns) as f64 / 1e9,
                "proxy_cpu_us_per_event": per_event(b.proxy_cpu_ns.saturating_sub(a.proxy_cpu_ns)),
                "proxy_cores": b.proxy_cpu_ns.saturating_sub(a.proxy_cpu_ns) as f64 / 1e9 / secs,
                "mock_cores": b.mock_cpu_ns.saturating_sub(a.mock_cpu_ns) as f64 / 1e9 / secs,
                "client_cores": b.self_cpu_ns.saturating_sub(a.self_cpu_ns) as f64 / 1e9 / secs,
                "mock_cpu_us_per_event": per_event(b.mock_cpu_ns.saturating_sub(a.mock_cpu_ns)),
                "client_cpu_us_per_event": per_event(b.self_cpu_ns.saturating_sub(a.self_cpu_ns)),
                "gap_us": percentiles(&mut gaps_steady),
            })
        }
        None => serde_json::Value::Null,
    };
    // The peak: the last sample with the most streams open before any ended.
    let peak = samples
        .iter()
        .filter(|s| first_done == 0 || s.ms < first_done)
        .fold(None::<&Sample>, |best, s| match best {
            Some(b) if b.open > s.open => Some(b),
            _ => Some(s),
        })
        .copied()
        .unwrap_or_default();
    let rss_max = samples.iter().map(|s| s.proxy_rss_kib).max().unwrap_or(0);
    let per_stream_kib = if peak.open > 0 {
        (peak.proxy_rss_kib as f64 - idle.proxy_rss_kib as f64) / peak.open as f64
    } else {
        0.0
    };
    let out = serde_json::json!({
        "streams": count,
        "completed": outcomes.iter().filter(|o| o.error.is_none()).count(),
        "failed": shared.failed.load(Relaxed),
        "errors": errors,
        "error_samples": error_samples,
        "peak_open": shared.peak_open.load(Relaxed),
        "ramp_s": ramp_s,
        "total_s": total_s,
        "events": events,
        "head_us": percentiles(&mut heads.clone()),
        "ttfb_us": percentiles(&mut firsts.clone()),
        "gap_us": percentiles(&mut gaps_all),
        "steady": steady_json,
        // [second, events, gap p50, p99, max] for each second of the run with events.
        "timeline": timeline,
        "proxy_pids": proxy_pids,
        "mock_pids": mock_pids,
        "rss": {
            "idle_kib": idle.proxy_rss_kib,
            "peak_kib": peak.proxy_rss_kib,
            "peak_open": peak.open,
            "peak_at_s": peak.ms as f64 / 1000.0,
            "max_kib": rss_max,
            "per_stream_kib": per_stream_kib,
        },
        "cpu_total_s": {
            "proxy": samples.last().map_or(0, |s| s.proxy_cpu_ns.saturating_sub(idle.proxy_cpu_ns)) as f64 / 1e9,
            "mock": samples.last().map_or(0, |s| s.mock_cpu_ns.saturating_sub(idle.mock_cpu_ns)) as f64 / 1e9,
            "client": samples.last().map_or(0, |s| s.self_cpu_ns.saturating_sub(idle.self_cpu_ns)) as f64 / 1e9,
        },
        // [second, streams open, the hop's RSS in KiB] at each second of the run.
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

/// p50, p90, p99, p99.9 and max of `v` (sorted in place), and how many.
pub(crate) fn percentiles(v: &mut [u32]) -> serde_json::Value {
    v.sort_unstable();
    let at = |p: f64| -> u32 {
        if v.is_empty() {
            return 0;
        }
        let i = ((p / 100.0) * v.len() as f64).ceil() as usize;
        v[i.clamp(1, v.len()) - 1]
    };
    serde_json::json!({
        "n": v.len(),
        "p50": at(50.0),
        "p90": at(90.0),
        "p99": at(99.0),
        "p999": at(99.9),
        "max": v.last().copied().unwrap_or(0),
    })
}

/// One stream on a connection of its own.
async fn one_stream(
    authority: &http::uri::Authority,
    path: &str,
    body: &Bytes,
    key: Option<&str>,
    tls: Option<tokio_rustls::TlsConnector>,
    shared: &Shared,
    outcome: &mut Outcome,
) -> Result<(), Error> {
    let tcp = match tokio::net::TcpStream::connect(authority.as_str()).await {
        Ok(tcp) => tcp,
        Err(e) => {
            outcome.error = Some(("connect", e.to_string()));
            return Ok(());
        }
    };
    tcp.set_nodelay(true)?;
    match tls {
        None => exchange(tcp, authority, path, body, key, shared, outcome).await,
        Some(tls) => {
            let host = authority.host();
            let name = rustls::pki_types::ServerName::try_from(host.to_owned())?;
            match tls.connect(name, tcp).await {
                Ok(stream) => exchange(stream, authority, path, body, key, shared, outcome).await,
                Err(e) => {
                    outcome.error = Some(("connect", format!("TLS: {e}")));
                    Ok(())
                }
            }
        }
    }
}

async fn exchange<T>(
    io: T,
    authority: &http::uri::Authority,
    path: &str,
    body: &Bytes,
    key: Option<&str>,
    shared: &Shared,
    outcome: &mut Outcome,
) -> Result<(), Error>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake::<_, Full<Bytes>>(hyper_util::rt::TokioIo::new(io)).await?;
    let conn = tokio::spawn(conn);
    let req = request(path.parse()?, Some(authority), body, key)?;
    sender.ready().await?;
    let t0 = Instant::now();
    let response = sender.send_request(req).await;
    let result = read_answer(response, t0, shared, outcome).await;
    drop(sender);
    conn.abort();
    result
}

/// The streaming request: to `uri` (absolute over HTTP/2, where it gives `:authority`), with a
/// `Host` over HTTP/1.1.
fn request(
    uri: http::Uri,
    host: Option<&http::uri::Authority>,
    body: &Bytes,
    key: Option<&str>,
) -> Result<http::Request<Full<Bytes>>, Error> {
    let mut req = http::Request::post(uri)
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(http::header::ACCEPT, "text/event-stream");
    if let Some(host) = host {
        req = req.header(http::header::HOST, host.as_str());
    }
    if let Some(key) = key {
        req = req.header(http::header::AUTHORIZATION, format!("Bearer {key}"));
    }
    Ok(req.body(Full::new(body.clone()))?)
}

/// Reads an answer's head and its events into `outcome`.
async fn read_answer(
    response: Result<http::Response<hyper::body::Incoming>, hyper::Error>,
    t0: Instant,
    shared: &Shared,
    outcome: &mut Outcome,
) -> Result<(), Error> {
    let us = |d: Duration| u32::try_from(d.as_micros()).unwrap_or(u32::MAX);
    async {
        let response = response?;
        outcome.head_us = Some(us(t0.elapsed()));
        if response.status() != http::StatusCode::OK {
            let status = response.status();
            let text = response.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
            outcome.error = Some(("status", format!("{status}: {}", String::from_utf8_lossy(&text))));
            return Ok(());
        }
        let open = shared.open.fetch_add(1, Relaxed) + 1;
        shared.peak_open.fetch_max(open, Relaxed);
        shared.last_head_ms.fetch_max(shared.ms() + 1, Relaxed);
        let mut body = response.into_body();
        let mut last: Option<Instant> = None;
        // Whether the bytes so far end with a newline: an event ends at a blank line, "\n\n",
        // which may straddle two frames.
        let mut newline = false;
        let read = async {
            while let Some(frame) = body.frame().await {
                let frame = frame?;
                let Some(data) = frame.data_ref() else { continue };
                let now = Instant::now();
                for &byte in data.iter() {
                    if byte != b'\n' {
                        newline = false;
                        continue;
                    }
                    if !newline {
                        newline = true;
                        continue;
                    }
                    newline = false;
                    outcome.events += 1;
                    match last {
                        None => outcome.first_event_us = Some(us(now - t0)),
                        Some(before) => {
                            let at = u32::try_from(now.duration_since(shared.epoch).as_millis())
                                .unwrap_or(u32::MAX);
                            outcome.gaps.push((at, us(now - before)));
                        }
                    }
                    last = Some(now);
                }
            }
            Ok::<(), Error>(())
        }
        .await;
        shared.open.fetch_sub(1, Relaxed);
        if let Err(e) = read {
            outcome.error = Some(("body", e.to_string()));
        }
        Ok::<(), Error>(())
    }
    .await
}

/// HTTP/2 connections shared by the streams (`--http2 M`: M streams on each, in launch order),
/// each opened by the first stream that needs it.
struct Http2Pool {
    connections: Vec<tokio::sync::OnceCell<hyper::client::conn::http2::SendRequest<Full<Bytes>>>>,
    per_connection: usize,
}

/// One stream on a shared HTTP/2 connection (over TLS, `h2` by ALPN).
#[allow(clippy::too_many_arguments)]
async fn one_stream_h2(
    i: usize,
    pool: &Http2Pool,
    uri: &http::Uri,
    body: &Bytes,
    key: Option<&str>,
    tls: tokio_rustls::TlsConnector,
    shared: &Shared,
    outcome: &mut Outcome,
) -> Result<(), Error> {
    let authority = uri.authority().ok_or("--url needs host:port")?;
    let cell = &pool.connections[i / pool.per_connection];
    let sender = cell
        .get_or_try_init(|| async {
            let tcp = tokio::net::TcpStream::connect(authority.as_str()).await?;
            tcp.set_nodelay(true)?;
            let name = rustls::pki_types::ServerName::try_from(authority.host().to_owned())?;
            let stream = tls.connect(name, tcp).await?;
            let (sender, conn) =
                hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                    .initial_stream_window_size(1 << 20)
                    .initial_connection_window_size(16 << 20)
                    .handshake::<_, Full<Bytes>>(hyper_util::rt::TokioIo::new(stream))
                    .await?;
            tokio::spawn(conn);
            Ok::<_, Error>(sender)
        })
        .await;
    let mut sender = match sender {
        Ok(sender) => sender.clone(),
        Err(e) => {
            outcome.error = Some(("connect", e.to_string()));
            return Ok(());
        }
    };
    let req = request(uri.clone(), None, body, key)?;
    sender.ready().await?;
    let t0 = Instant::now();
    let response = sender.send_request(req).await;
    read_answer(response, t0, shared, outcome).await
}

/// A TLS client for HTTP/1.1 (or, `alpn` `h2`, HTTP/2) that trusts the PEM certificates of `ca` (the mock's, by default
/// none: then `--ca` is required).
fn tls_connector(ca: Option<&str>, alpn: &[u8]) -> Result<tokio_rustls::TlsConnector, Error> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let ca = ca.ok_or("--ca FILE is required for an https URL")?;
    let mut roots = rustls::RootCertStore::empty();
    for certificate in CertificateDer::pem_file_iter(ca)? {
        roots.add(certificate?)?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![alpn.to_vec()];
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// CPU time of processes, all their threads, in ns: the sum of their threads' schedstat run times
/// (exact, where ticks are 10 ms), each thread's last reading kept once it has exited (so that a
/// total never goes back). Where schedstat cannot be read, user and system ticks.
#[derive(Default)]
pub(crate) struct CpuMeter {
    threads: std::sync::Mutex<std::collections::HashMap<(u32, u32), u64>>,
}

impl CpuMeter {
    pub(crate) fn ns(&self, pids: &[u32]) -> u64 {
        let mut threads = self.threads.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut total = 0;
        for &pid in pids {
            let mut any = false;
            if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
                for task in tasks.flatten() {
                    let Some(tid) = task.file_name().to_str().and_then(|t| t.parse::<u32>().ok()) else {
                        continue;
                    };
                    let Ok(stat) = std::fs::read_to_string(task.path().join("schedstat")) else { continue };
                    if let Some(ns) = stat.split_whitespace().next().and_then(|v| v.parse::<u64>().ok()) {
                        let seen = threads.entry((pid, tid)).or_default();
                        *seen = (*seen).max(ns);
                        any = true;
                    }
                }
            }
            if any {
                total += threads.iter().filter(|((p, _), _)| *p == pid).map(|(_, ns)| ns).sum::<u64>();
            } else {
                total += ticks_ns(pid);
            }
        }
        total
    }
}

fn ticks_ns(pid: u32) -> u64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return 0 };
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) else { return 0 };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let num = |field: usize| f.get(field - 3).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    (num(14) + num(15)) * 10_000_000
}

/// VmRSS of a process, KiB.
pub(crate) fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}
