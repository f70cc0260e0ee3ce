//! `recovea-bench`: the helpers `bench/run` needs that no packaged tool provides.
//!
//! - `snapshot --keys N`: builds an N-key snapshot in this process and reports its memory (the heap
//!   bytes it holds, counted by this tool's allocator; VmRSS before and after, which also counts
//!   what the allocator keeps of the builder's freed memory; VmHWM during a rebuild) and the time to
//!   build, swap and drop one.
//! - `load --url U --body B ...`: a closed-loop HTTP/1.1 keep-alive load generator that records, per
//!   request, the time to the first response byte (the head), to the first body chunk and to the
//!   end, for SSE streams (wrk reports only the whole response); with `--rate R`, an open loop at
//!   R requests a second in all, for comparing proxies' CPU a request at the same load.
//! - `keys --admin U --token T --org O --count N`: creates N keys through the admin API.
//! - `cpu-watch --root PID`: every 500 ms, prints the CPU time used so far by processes that are
//!   not descendants of PID, so that `bench/run` can say whether the machine was busy.
//! - `ingest --control U --node-token T --receipts N ...`: POSTs synthetic receipts in batches to a
//!   control plane's `/ingest/v1/receipts` from C concurrent senders, as fast as it answers, into
//!   organizations it creates (or is given), optionally each with armed caps whose alerts ingest
//!   evaluates; reports receipts/s, batch latency and the CPU time the control plane (`--control-pid`),
//!   PostgreSQL (for the database of `--database-url`) and itself used meanwhile.
//! - `streams --url U --body B --streams N --rate R ...`: N concurrent streaming requests held open at
//!   once, each on its own connection (HTTP/1.1, over TLS for an `https` URL; or `--http2 M`, M on
//!   each HTTP/2 connection), opened R a second;
//!   time to first byte, every inter-event gap, errors, the peak of open streams, and the RSS and
//!   CPU time of the processes under test (`--proxy-pids`) at that peak and per event (see
//!   `streams.rs`).
//! - `realtime --url U --sessions N --rate R --period-ms P --seconds D ...`: N concurrent Realtime
//!   (WebSocket) sessions opened R a second, each sending an event every P ms for D s; the round
//!   trip of each (item added, or every K-th a whole response), errors, the peak of open sessions,
//!   and the RSS per open session and CPU time per frame of the processes under test (see
//!   `realtime.rs`).
//! - `pg-create --server URL --db NAME`, `pg-drop --server URL --db NAME`: a fresh PostgreSQL
//!   database for a run of `recovea control`, and its removal.
//!
//! Every subcommand prints one line of JSON (`cpu-watch`: one line per sample) on stdout.

use std::collections::HashMap;
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use recovea_core::caps::{Cap, Scope};
use recovea_core::ids::{CapId, KeyId, OrgId};
use recovea_core::keys::{KeyHash, hash_secret};
use recovea_core::money::Nanos;
use recovea_core::receipt::{Receipt, receipt_id};
use recovea_core::snapshot::{ProviderCredential, ProviderKind, Snapshot, SnapshotBuilder};
use recovea_core::usage::UsageSource;
use recovea_core::window::Window;
use recovea_core::{Credential, CredentialHeader, Decision, Timestamp, admit};

mod realtime;
mod streams;

type Error = Box<dyn std::error::Error + Send + Sync>;

/// The system allocator, counting the bytes held live while `COUNTING` is on (only `snapshot`
/// turns it on: the load generator's threads should not share a counter).
struct Counting;

static COUNTING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static LIVE_BYTES: std::sync::atomic::AtomicIsize = std::sync::atomic::AtomicIsize::new(0);

fn count(bytes: usize, sign: isize) {
    if COUNTING.load(std::sync::atomic::Ordering::Relaxed) {
        LIVE_BYTES.fetch_add(sign * bytes as isize, std::sync::atomic::Ordering::Relaxed);
    }
}

// SAFETY: every call is passed on to `System` unchanged; only the sizes are counted.
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        let ptr = unsafe { std::alloc::System.alloc(layout) };
        if !ptr.is_null() {
            count(layout.size(), 1);
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        let ptr = unsafe { std::alloc::System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            count(layout.size(), 1);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        unsafe { std::alloc::System.dealloc(ptr, layout) };
        count(layout.size(), -1);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        let new = unsafe { std::alloc::System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            count(layout.size(), -1);
            count(new_size, 1);
        }
        new
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn live_bytes() -> i64 {
    LIVE_BYTES.load(std::sync::atomic::Ordering::Relaxed) as i64
}

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(command) = args.next() else {
        usage();
    };
    let flags = Flags::parse(args);
    let result = match command.as_str() {
        "snapshot" => snapshot(&flags),
        "load" => runtime().and_then(|rt| rt.block_on(load(&flags))),
        "streams" => runtime().and_then(|rt| rt.block_on(streams::streams(&flags))),
        "realtime" => runtime().and_then(|rt| rt.block_on(realtime::realtime(&flags))),
        "keys" => runtime().and_then(|rt| rt.block_on(keys(&flags))),
        "cpu-watch" => cpu_watch(&flags),
        "ingest" => runtime().and_then(|rt| rt.block_on(ingest(&flags))),
        "pg-create" => pg_database(&flags, true),
        "pg-drop" => pg_database(&flags, false),
        _ => usage(),
    };
    if let Err(e) = result {
        eprintln!("recovea-bench {command}: {e}");
        std::process::exit(1);
    }
}

fn usage() -> ! {
    eprintln!(
        "usage: recovea-bench snapshot|load|streams|realtime|keys|cpu-watch|ingest|pg-create|pg-drop --flag value ..."
    );
    std::process::exit(2);
}

fn runtime() -> Result<tokio::runtime::Runtime, Error> {
    Ok(tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?)
}

struct Flags(HashMap<String, String>);

impl Flags {
    fn parse(mut args: impl Iterator<Item = String>) -> Self {
        let mut map = HashMap::new();
        while let Some(flag) = args.next() {
            let Some(name) = flag.strip_prefix("--") else {
                eprintln!("unexpected argument {flag:?}");
                usage();
            };
            let Some(value) = args.next() else {
                eprintln!("{flag} needs a value");
                usage();
            };
            map.insert(name.to_owned(), value);
        }
        Self(map)
    }

    fn str(&self, name: &str) -> Result<&str, Error> {
        self.0.get(name).map(String::as_str).ok_or_else(|| format!("--{name} is required").into())
    }

    fn opt(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }

    fn num<T: std::str::FromStr>(&self, name: &str, default: T) -> Result<T, Error> {
        match self.0.get(name) {
            None => Ok(default),
            Some(v) => v.parse().map_err(|_| format!("--{name}: not a number: {v:?}").into()),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// snapshot

/// (VmRSS, VmHWM) of this process, in KiB.
fn memory_kib() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// A key as the control plane reads it from its store: the hash, its id as text, its org.
struct Row {
    hash: KeyHash,
    key_id: String,
    org: usize,
}

fn org_id(j: usize) -> OrgId {
    OrgId::parse(&format!("org_{j:020}")).expect("a valid org id")
}

/// What the control plane does with the rows it read: parse ids, add orgs (each with one provider
/// credential and one armed cap), add keys, build.
fn build(version: u64, orgs: usize, rows: &[Row]) -> Snapshot {
    let mut b = SnapshotBuilder::new(version);
    let org_ids: Vec<OrgId> = (0..orgs).map(org_id).collect();
    for (j, org) in org_ids.iter().enumerate() {
        b.org(org.clone());
        b.provider(
            org,
            ProviderCredential {
                name: "openai".into(),
                kind: ProviderKind::OpenAi,
                base_url: None,
                api_key: format!("sk-proj-{j:048}"),
            },
        );
        b.cap(Cap {
            id: CapId::parse(&format!("cap_{j:020}")).expect("a valid cap id"),
            org_id: org.clone(),
            scope: Scope::Organization,
            key_id: None,
            window: Window::Month,
            limit: Nanos(1_000_000 * 1_000_000_000),
            hard_stop: true,
            alert_at_permille: vec![500, 800, 1000],
            alert_webhook: None,
        });
    }
    for row in rows {
        let id = KeyId::parse(&row.key_id).expect("a valid key id");
        b.key(row.hash, id, org_ids[row.org].clone(), None);
    }
    b.build()
}

fn secret(i: usize) -> String {
    format!("rk_{i:043}")
}

fn snapshot(flags: &Flags) -> Result<(), Error> {
    let n: usize = flags.num("keys", 1_000_000)?;
    let per_org: usize = flags.num("keys-per-org", 10)?.max(1);
    let orgs = n.div_ceil(per_org).max(1);
    COUNTING.store(true, std::sync::atomic::Ordering::Relaxed);
    let (rss_start, _) = memory_kib();
    let rows: Vec<Row> = (0..n)
        .map(|i| Row { hash: hash_secret(&secret(i)), key_id: format!("key_{i:020}"), org: i / per_org })
        .collect();
    // The rows stand for the store's answer; the snapshot's own memory is what comes on top.
    let (rss_rows, _) = memory_kib();
    let live_rows = live_bytes();

    let t = Instant::now();
    let first = build(1, orgs, &rows);
    let build1 = t.elapsed();
    let (rss_snapshot, _) = memory_kib();
    let heap_snapshot = live_bytes() - live_rows;
    let live = ArcSwap::from(Arc::new(first));

    // A rebuild as the node lives it: build the next one while the current one serves, swap, and
    // drop the old one (in the gateway that drop happens in whoever swaps).
    let t = Instant::now();
    let second = Arc::new(build(2, orgs, &rows));
    let build2 = t.elapsed();
    let t = Instant::now();
    let old = live.swap(second);
    let swap = t.elapsed();
    let t = Instant::now();
    drop(old);
    let drop_old = t.elapsed();
    let (_, hwm) = memory_kib();

    // Sanity: a key admits and a lookup through the swapped-in snapshot works.
    let current = live.load();
    let probe = secret(n.saturating_sub(1));
    let admitted = matches!(
        admit(
            Some(&current),
            Some(Credential { secret: &probe, header: CredentialHeader::AuthorizationBearer }),
            Timestamp(0)
        ),
        Decision::Admit(_)
    );
    if !admitted || current.key_count() != n {
        return Err("the built snapshot does not admit its own keys".into());
    }
    let mib = |kib: u64| kib as f64 / 1024.0;
    let delta = rss_snapshot.saturating_sub(rss_rows);
    println!(
        "{{\"keys\":{n},\"orgs\":{orgs},\"rss_start_mib\":{:.1},\"rss_with_rows_mib\":{:.1},\
         \"rss_with_snapshot_mib\":{:.1},\"snapshot_mib\":{:.1},\"bytes_per_key\":{:.0},\
         \"heap_snapshot_mib\":{:.1},\"heap_bytes_per_key\":{:.0},\
         \"peak_during_rebuild_mib\":{:.1},\"build_ms\":{:.1},\"rebuild_ms\":{:.1},\"swap_us\":{:.2},\
         \"drop_old_ms\":{:.1}}}",
        mib(rss_start),
        mib(rss_rows),
        mib(rss_snapshot),
        mib(delta),
        (delta * 1024) as f64 / n.max(1) as f64,
        heap_snapshot as f64 / (1024.0 * 1024.0),
        heap_snapshot as f64 / n.max(1) as f64,
        mib(hwm.saturating_sub(rss_rows)),
        build1.as_secs_f64() * 1e3,
        build2.as_secs_f64() * 1e3,
        swap.as_secs_f64() * 1e6,
        drop_old.as_secs_f64() * 1e3,
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// load

struct Sample {
    head_us: u32,
    first_chunk_us: u32,
    total_us: u32,
}

#[derive(Default)]
struct WorkerResult {
    samples: Vec<Sample>,
    errors: u64,
    bad_status: u64,
}

async fn load(flags: &Flags) -> Result<(), Error> {
    let url: http::Uri = flags.str("url")?.parse()?;
    let authority = url.authority().ok_or("--url needs host:port")?.clone();
    let path = url.path_and_query().map_or("/", |p| p.as_str()).to_owned();
    let body = Bytes::from(flags.str("body")?.to_owned());
    let key = flags.opt("key").map(str::to_owned);
    let concurrency: usize = flags.num("concurrency", 32)?;
    let duration = Duration::from_secs_f64(flags.num("duration", 5.0)?);
    let warmup = Duration::from_secs_f64(flags.num("warmup", 1.0)?);
    // An open loop at `--rate` requests a second in all (each connection paced at its share), so
    // that two proxies can be compared at the same load; without it, a closed loop.
    let rate: f64 = flags.num("rate", 0.0)?;
    let every = (rate > 0.0).then(|| Duration::from_secs_f64(concurrency as f64 / rate));

    let start = Instant::now();
    let measure_from = start + warmup;
    let end = measure_from + duration;
    let mut tasks = Vec::with_capacity(concurrency);
    for i in 0..concurrency {
        let (authority, path, body, key) = (authority.clone(), path.clone(), body.clone(), key.clone());
        // The connections' first requests spread over one interval, so that they do not beat together.
        let pace = every.map(|every| Pacing { every, phase: every.mul_f64(i as f64 / concurrency as f64) });
        tasks.push(tokio::spawn(async move {
            let mut result = WorkerResult::default();
            while Instant::now() < end {
                if let Err(_e) = connection(
                    &authority,
                    &path,
                    &body,
                    key.as_deref(),
                    pace,
                    Measured { measure_from, end },
                    &mut result,
                )
                .await
                {
                    result.errors += 1;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
            result
        }));
    }
    let mut all = WorkerResult::default();
    for task in tasks {
        let r = task.await?;
        all.samples.extend(r.samples);
        all.errors += r.errors;
        all.bad_status += r.bad_status;
    }
    let n = all.samples.len();
    let pct = |mut v: Vec<u32>, p: f64| -> u32 {
        if v.is_empty() {
            return 0;
        }
        v.sort_unstable();
        let i = ((p / 100.0) * v.len() as f64).ceil() as usize;
        v[i.clamp(1, v.len()) - 1]
    };
    let head: Vec<u32> = all.samples.iter().map(|s| s.head_us).collect();
    let first: Vec<u32> = all.samples.iter().map(|s| s.first_chunk_us).collect();
    let total: Vec<u32> = all.samples.iter().map(|s| s.total_us).collect();
    println!(
        "{{\"requests\":{n},\"rps\":{:.1},\"errors\":{},\"bad_status\":{},\"ttfb_p50_us\":{},\"ttfb_p99_us\":{},\
         \"first_chunk_p50_us\":{},\"first_chunk_p99_us\":{},\"p50_us\":{},\"p99_us\":{}}}",
        n as f64 / duration.as_secs_f64(),
        all.errors,
        all.bad_status,
        pct(head.clone(), 50.0),
        pct(head, 99.0),
        pct(first.clone(), 50.0),
        pct(first, 99.0),
        pct(total.clone(), 50.0),
        pct(total, 99.0),
    );
    Ok(())
}

/// When a paced connection sends: every `every`, from `phase` after it opens.
#[derive(Clone, Copy)]
struct Pacing {
    every: Duration,
    phase: Duration,
}

/// The part of a run that is measured, and its end.
#[derive(Clone, Copy)]
struct Measured {
    measure_from: Instant,
    end: Instant,
}

/// One keep-alive connection, reused until the window's end or until it fails.
async fn connection(
    authority: &http::uri::Authority,
    path: &str,
    body: &Bytes,
    key: Option<&str>,
    pace: Option<Pacing>,
    Measured { measure_from, end }: Measured,
    result: &mut WorkerResult,
) -> Result<(), Error> {
    let mut next_at = Instant::now() + pace.map_or(Duration::ZERO, |p| p.phase);
    let stream = tokio::net::TcpStream::connect(authority.as_str()).await?;
    stream.set_nodelay(true)?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake::<_, Full<Bytes>>(hyper_util::rt::TokioIo::new(stream)).await?;
    let conn = tokio::spawn(conn);
    let outcome = async {
        while Instant::now() < end {
            let mut req = http::Request::post(path)
                .header(http::header::HOST, authority.as_str())
                .header(http::header::CONTENT_TYPE, "application/json");
            if let Some(key) = key {
                req = req.header(http::header::AUTHORIZATION, format!("Bearer {key}"));
            }
            let req = req.body(Full::new(body.clone()))?;
            if let Some(pace) = pace {
                tokio::time::sleep_until(next_at.into()).await;
                next_at += pace.every;
            }
            sender.ready().await?;
            let t0 = Instant::now();
            let response = sender.send_request(req).await?;
            let head = t0.elapsed();
            let ok = response.status().is_success();
            let mut body = response.into_body();
            let mut first_chunk = None;
            while let Some(frame) = body.frame().await {
                let frame = frame?;
                if first_chunk.is_none() && frame.data_ref().is_some_and(|d| !d.is_empty()) {
                    first_chunk = Some(t0.elapsed());
                }
            }
            let total = t0.elapsed();
            if t0 < measure_from || Instant::now() > end {
                continue;
            }
            if !ok {
                result.bad_status += 1;
            }
            let us = |d: Duration| u32::try_from(d.as_micros()).unwrap_or(u32::MAX);
            result.samples.push(Sample {
                head_us: us(head),
                first_chunk_us: us(first_chunk.unwrap_or(total)),
                total_us: us(total),
            });
        }
        Ok::<(), Error>(())
    }
    .await;
    drop(sender);
    conn.abort();
    outcome
}

// ---------------------------------------------------------------------------------------------
// keys

async fn keys(flags: &Flags) -> Result<(), Error> {
    let admin: http::Uri = flags.str("admin")?.parse()?;
    let authority = admin.authority().ok_or("--admin needs host:port")?.clone();
    let base = admin.path().trim_end_matches('/').to_owned();
    let token = flags.str("token")?.to_owned();
    let org = flags.str("org")?.to_owned();
    let count: usize = flags.num("count", 1000)?;
    let concurrency: usize = flags.num("concurrency", 8)?.max(1);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let t = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (authority, base, token, org, next) =
            (authority.clone(), base.clone(), token.clone(), org.clone(), Arc::clone(&next));
        tasks.push(tokio::spawn(async move {
            let stream = tokio::net::TcpStream::connect(authority.as_str()).await?;
            let (mut sender, conn) =
                hyper::client::conn::http1::handshake::<_, Full<Bytes>>(hyper_util::rt::TokioIo::new(stream))
                    .await?;
            let conn = tokio::spawn(conn);
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= count {
                    break;
                }
                let req = http::Request::post(format!("{base}/orgs/{org}/keys"))
                    .header(http::header::HOST, authority.as_str())
                    .header(http::header::CONTENT_TYPE, "application/json")
                    .header(http::header::AUTHORIZATION, format!("Bearer {token}"))
                    .body(Full::new(Bytes::from(format!("{{\"name\":\"bulk-{i}\"}}"))))?;
                sender.ready().await?;
                let response = sender.send_request(req).await?;
                let status = response.status();
                let body = response.into_body().collect().await?.to_bytes();
                if !status.is_success() {
                    return Err(
                        format!("creating a key: {status}: {}", String::from_utf8_lossy(&body)).into()
                    );
                }
            }
            conn.abort();
            Ok::<(), Error>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    let secs = t.elapsed().as_secs_f64();
    println!("{{\"created\":{count},\"seconds\":{secs:.2},\"per_second\":{:.0}}}", count as f64 / secs);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// cpu-watch

/// Per process: parent, ticks of CPU (user + system, its own plus its reaped children's), start
/// time in ticks since boot.
fn processes() -> HashMap<u32, (u32, u64, u64)> {
    let mut out = HashMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in dir.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // The command name may hold spaces; the fields after its closing parenthesis do not.
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        // rest[0] is field 3 (state): ppid is field 4, utime..cstime are fields 14..17, starttime 22.
        let num = |field: usize| f.get(field - 3).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        let ppid = u32::try_from(num(4)).unwrap_or(0);
        out.insert(pid, (ppid, num(14) + num(15) + num(16) + num(17), num(22)));
    }
    out
}

/// Ticks since boot, from /proc/uptime.
fn uptime_ticks() -> u64 {
    std::fs::read_to_string("/proc/uptime")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse::<f64>().ok()))
        .map_or(0, |secs| (secs * 100.0) as u64)
}

fn cpu_watch(flags: &Flags) -> Result<(), Error> {
    let root: u32 = flags.num("root", 0)?;
    let interval = Duration::from_millis(flags.num("interval-ms", 500)?);
    // Linux reports CPU time in USER_HZ ticks, 100 a second on every architecture it runs on.
    let tick_ms = 10u64;
    let mut previous: HashMap<u32, u64> = HashMap::new();
    // A process once seen in the benchmark's tree stays ours (its parent may exit before it does).
    let mut ours_ever: std::collections::HashSet<u32> = std::collections::HashSet::new();
    let mut foreign_ms = 0u64;
    let mut last_sample: Option<u64> = None;
    let mut stdout = std::io::stdout();
    loop {
        let sampled_at = uptime_ticks();
        let procs = processes();
        if root != 0 && !procs.contains_key(&root) {
            return Ok(());
        }
        let in_tree = |mut pid: u32| {
            for _ in 0..64 {
                if pid == root {
                    return true;
                }
                match procs.get(&pid) {
                    Some(&(ppid, _, _)) if ppid != 0 => pid = ppid,
                    _ => return false,
                }
            }
            false
        };
        let mut current = HashMap::new();
        let mut delta: i64 = 0;
        for (&pid, &(_, ticks, started)) in &procs {
            if ours_ever.contains(&pid) || in_tree(pid) {
                ours_ever.insert(pid);
                continue;
            }
            current.insert(pid, ticks);
            let Some(last) = last_sample else { continue };
            delta += match previous.get(&pid) {
                Some(&before) => ticks as i64 - before as i64,
                // Born since the last sample: all of its time is recent.
                None if started >= last => ticks as i64,
                // Older but not seen before: its past is not this window's.
                None => 0,
            };
        }
        // A process that ended was reaped by its parent, whose children's time now holds all of
        // it: take back what was already counted of it.
        for (pid, before) in &previous {
            if !current.contains_key(pid) {
                delta -= *before as i64;
            }
        }
        foreign_ms += u64::try_from(delta.max(0)).unwrap_or(0) * tick_ms;
        last_sample = Some(sampled_at);
        previous = current;
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis());
        if writeln!(stdout, "{now} {foreign_ms}").and_then(|()| stdout.flush()).is_err() {
            return Ok(());
        }
        std::thread::sleep(interval);
    }
}

// ---------------------------------------------------------------------------------------------
// ingest

/// One request on a fresh connection (the admin calls and /metrics: few and small); the status
/// and the body.
async fn call(
    authority: &http::uri::Authority,
    method: http::Method,
    path: &str,
    token: Option<&str>,
    body: Option<String>,
) -> Result<(http::StatusCode, Bytes), Error> {
    let stream = tokio::net::TcpStream::connect(authority.as_str()).await?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake::<_, Full<Bytes>>(hyper_util::rt::TokioIo::new(stream)).await?;
    let conn = tokio::spawn(conn);
    let mut req =
        http::Request::builder().method(method).uri(path).header(http::header::HOST, authority.as_str());
    if let Some(token) = token {
        req = req.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
    }
    if body.is_some() {
        req = req.header(http::header::CONTENT_TYPE, "application/json");
    }
    let response = sender.send_request(req.body(Full::new(Bytes::from(body.unwrap_or_default())))?).await?;
    let status = response.status();
    let bytes = response.into_body().collect().await?.to_bytes();
    drop(sender);
    conn.abort();
    Ok((status, bytes))
}

/// An admin API call that must succeed; its JSON answer.
async fn admin_call(
    authority: &http::uri::Authority,
    method: http::Method,
    path: &str,
    token: &str,
    body: Option<String>,
) -> Result<serde_json::Value, Error> {
    let (status, bytes) = call(authority, method.clone(), path, Some(token), body).await?;
    if !status.is_success() {
        return Err(format!("{method} {path}: {status}: {}", String::from_utf8_lossy(&bytes)).into());
    }
    Ok(serde_json::from_slice(&bytes)?)
}

/// `recovea_receipts_ingested_total` on the control plane's /metrics.
async fn ingested_total(authority: &http::uri::Authority) -> Result<u64, Error> {
    let (_, bytes) = call(authority, http::Method::GET, "/metrics", None, None).await?;
    Ok(String::from_utf8_lossy(&bytes)
        .lines()
        .find_map(|l| l.strip_prefix("recovea_receipts_ingested_total "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64))
}

/// CPU ticks (user + system, with those of reaped children) of a process.
fn ticks_of(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let f: Vec<&str> = stat[stat.rfind(')')? + 2..].split_whitespace().collect();
    // f[0] is field 3: utime..cstime are fields 14..17.
    Some((14..=17).filter_map(|field| f.get(field - 3)?.parse::<u64>().ok()).sum())
}

/// CPU ticks (user + system, their own) of the PostgreSQL processes that work for database `db`:
/// its backends (and autovacuum workers), and the server's WAL writer, checkpointer and background
/// writer. Backends of other databases on the same server are left out.
fn postgres_ticks(db: &str) -> HashMap<u32, u64> {
    let mut out = HashMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for pid in dir.flatten().filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok()) {
        if !std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim_end() == "postgres") {
            continue;
        }
        // The title a backend sets: "postgres: 15/main: USER DB HOST(PORT) STATE".
        let title = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let title = String::from_utf8_lossy(&title).replace('\0', " ");
        let ours = title.split_whitespace().any(|w| w == db)
            || ["checkpointer", "background writer", "walwriter"].iter().any(|aux| title.contains(aux));
        let own = || -> Option<u64> {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let f: Vec<&str> = stat[stat.rfind(')')? + 2..].split_whitespace().collect();
            Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
        };
        if let (true, Some(ticks)) = (ours, own()) {
            out.insert(pid, ticks);
        }
    }
    out
}

/// (rows, bytes with indexes) of the receipts table, from a plain thread (the sync client may not
/// run inside the async runtime).
fn receipts_table(url: &str) -> Result<(i64, i64), Error> {
    let url = url.to_owned();
    std::thread::spawn(move || -> Result<(i64, i64), Error> {
        let mut client = postgres::Client::connect(&url, postgres::NoTls)?;
        let row =
            client.query_one("SELECT count(*), pg_total_relation_size('receipts') FROM receipts", &[])?;
        Ok((row.get(0), row.get(1)))
    })
    .join()
    .map_err(|_| "the PostgreSQL thread panicked")?
}

/// A receipt as a node's spool would ship it: a priced, non-streaming chat request.
fn synthetic_receipt(run: &str, i: usize, org: &str, org_index: usize, now_ms: i64) -> Receipt {
    let request_id = format!("req_bench{run}{i:010}");
    Receipt {
        id: receipt_id(&request_id),
        request_id,
        org_id: org.to_owned(),
        key_id: format!("key_bench{org_index:06}"),
        provider: "openai".into(),
        model: Some("gpt-4o-mini".into()),
        endpoint: "/v1/chat/completions".into(),
        status: 200,
        stream: false,
        input_tokens: 900 + (i % 200) as u64,
        output_tokens: 150 + (i % 100) as u64,
        cached_input_tokens: 0,
        cache_write_input_tokens: 0,
        reasoning_tokens: 0,
        audio_input_tokens: 0,
        cached_audio_input_tokens: 0,
        audio_output_tokens: 0,
        // About 0.0002 USD each: far below the caps' limit, so that no alert is raised and every
        // batch pays for the evaluation alone.
        cost_usd: Nanos(200_000 + (i % 1000) as i64),
        usage_source: UsageSource::Provider,
        priced: true,
        price_revision: 1,
        priced_as: Some("gpt-4o-mini".into()),
        started_at: Timestamp(now_ms - 900 - (i % 500) as i64),
        finished_at: Timestamp(now_ms - (i % 500) as i64),
        node_id: "node_bench".into(),
        job_id: None,
        held_usd: None,
        batch_input: None,
        tags: Default::default(),
    }
}

async fn ingest(flags: &Flags) -> Result<(), Error> {
    let control: http::Uri = flags.str("control")?.parse()?;
    let authority = control.authority().ok_or("--control needs host:port")?.clone();
    let node_token = flags.str("node-token")?.to_owned();
    let total: usize = flags.num("receipts", 100_000)?;
    let batch: usize = flags.num("batch", 512)?.max(1);
    let concurrency: usize = flags.num("concurrency", 4)?.max(1);
    let caps_per_org: usize = flags.num("caps-per-org", 0)?;
    let database_url = flags.opt("database-url");

    // The organizations: given (`--org-ids a,b`), or created through the admin API, each with
    // `--caps-per-org` armed caps whose alert thresholds ingest evaluates after every batch.
    let admin_token = flags.opt("admin-token");
    let admin = |path: String| format!("/admin/v1{path}");
    let orgs: Vec<String> = match flags.opt("org-ids") {
        Some(list) => list.split(',').filter(|s| !s.is_empty()).map(str::to_owned).collect(),
        None => {
            let token = admin_token.ok_or("--admin-token is required to create organizations")?;
            let count: usize = flags.num("orgs", 10)?.max(1);
            let mut orgs = Vec::with_capacity(count);
            for j in 0..count {
                let body = serde_json::json!({ "name": format!("bench-ingest-{j}") }).to_string();
                let org =
                    admin_call(&authority, http::Method::POST, &admin("/orgs".into()), token, Some(body))
                        .await?;
                orgs.push(org["id"].as_str().ok_or("POST /orgs: no id")?.to_owned());
            }
            orgs
        }
    };
    if orgs.is_empty() {
        return Err("no organization".into());
    }
    let mut caps = Vec::new();
    if caps_per_org > 0 {
        let token = admin_token.ok_or("--admin-token is required to create caps")?;
        let body = r#"{"scope":"organization","window":"month","limit_usd":"1000000.00","hard_stop":false,"alert_at":[0.5,0.8,1.0]}"#;
        for org in &orgs {
            for _ in 0..caps_per_org {
                let cap = admin_call(
                    &authority,
                    http::Method::POST,
                    &admin(format!("/orgs/{org}/caps")),
                    token,
                    Some(body.to_owned()),
                )
                .await?;
                caps.push(cap["id"].as_str().ok_or("POST /caps: no id")?.to_owned());
            }
        }
    }

    // Every batch is made before the clock starts: what is timed is the control plane.
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?;
    let now_ms = i64::try_from(now.as_millis())?;
    // Ids unique across runs (a receipt id already in the ledger would be skipped, not inserted).
    let run = format!("{:x}", now.as_nanos() % (1 << 48));
    let t = Instant::now();
    let bodies: Vec<(usize, Bytes)> = (0..total)
        .step_by(batch)
        .map(|first| {
            let receipts: Vec<Receipt> = (first..(first + batch).min(total))
                .map(|i| synthetic_receipt(&run, i, &orgs[i % orgs.len()], i % orgs.len(), now_ms))
                .collect();
            let body = serde_json::to_vec(&serde_json::json!({ "receipts": receipts }))?;
            Ok((receipts.len(), Bytes::from(body)))
        })
        .collect::<Result<_, Error>>()?;
    let prepare_secs = t.elapsed().as_secs_f64();
    let body_bytes: usize = bodies.iter().map(|(_, b)| b.len()).sum();

    let rows_before = database_url.map(receipts_table).transpose()?;
    let ingested_before = ingested_total(&authority).await?;
    let control_pid: Option<u32> = flags.opt("control-pid").map(str::parse).transpose()?;
    let db = database_url
        .map(|url| url.parse::<postgres::Config>())
        .transpose()?
        .and_then(|config| config.get_dbname().map(str::to_owned));
    let cpu = || {
        (
            control_pid.and_then(ticks_of).unwrap_or(0),
            db.as_deref().map(postgres_ticks).unwrap_or_default(),
            ticks_of(std::process::id()).unwrap_or(0),
        )
    };
    let cpu_before = cpu();

    let bodies = Arc::new(bodies);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(concurrency);
    for _ in 0..concurrency {
        let (authority, node_token, bodies, next) =
            (authority.clone(), node_token.clone(), Arc::clone(&bodies), Arc::clone(&next));
        tasks.push(tokio::spawn(async move {
            let stream = tokio::net::TcpStream::connect(authority.as_str()).await?;
            stream.set_nodelay(true)?;
            let (mut sender, conn) =
                hyper::client::conn::http1::handshake::<_, Full<Bytes>>(hyper_util::rt::TokioIo::new(stream))
                    .await?;
            let conn = tokio::spawn(conn);
            let mut latencies = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some((count, body)) = bodies.get(i) else { break };
                let req = http::Request::post("/ingest/v1/receipts")
                    .header(http::header::HOST, authority.as_str())
                    .header(http::header::CONTENT_TYPE, "application/json")
                    .header(http::header::AUTHORIZATION, format!("Bearer {node_token}"))
                    .body(Full::new(body.clone()))?;
                sender.ready().await?;
                let t0 = Instant::now();
                let response = sender.send_request(req).await?;
                let status = response.status();
                let answer = response.into_body().collect().await?.to_bytes();
                latencies.push(u32::try_from(t0.elapsed().as_micros()).unwrap_or(u32::MAX));
                let accepted = serde_json::from_slice::<serde_json::Value>(&answer)
                    .ok()
                    .and_then(|v| v["accepted"].as_u64());
                if status != http::StatusCode::OK || accepted != Some(*count as u64) {
                    return Err::<Vec<u32>, Error>(
                        format!("batch {i}: {status}: {}", String::from_utf8_lossy(&answer)).into(),
                    );
                }
            }
            drop(sender);
            conn.abort();
            Ok(latencies)
        }));
    }
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await??);
    }
    let secs = start.elapsed().as_secs_f64();
    let cpu_after = cpu();
    let ingested_after = ingested_total(&authority).await?;
    let rows_after = database_url.map(receipts_table).transpose()?;

    latencies.sort_unstable();
    let pct = |p: f64| -> f64 {
        if latencies.is_empty() {
            return 0.0;
        }
        let i = ((p / 100.0) * latencies.len() as f64).ceil() as usize;
        f64::from(latencies[i.clamp(1, latencies.len()) - 1]) / 1000.0
    };
    // Linux counts CPU time in USER_HZ ticks, 100 a second.
    let cpu_secs = |after: u64, before: u64| after.saturating_sub(before) as f64 / 100.0;
    let round = |v: f64, digits: i32| (v * 10f64.powi(digits)).round() / 10f64.powi(digits);
    let mut out = serde_json::json!({
        "receipts": total,
        "batch": batch,
        "concurrency": concurrency,
        "orgs": orgs.len(),
        "caps": caps.len(),
        "seconds": round(secs, 3),
        "receipts_per_second": round(total as f64 / secs, 1),
        "batches": latencies.len(),
        "p50_ms": round(pct(50.0), 2),
        "p99_ms": round(pct(99.0), 2),
        "max_ms": round(pct(100.0), 2),
        "body_bytes_per_receipt": round(body_bytes as f64 / total.max(1) as f64, 0),
        "prepare_seconds": round(prepare_secs, 2),
        "ingested_metric_delta": ingested_after.saturating_sub(ingested_before),
        "cpu_seconds": {
            "tool": cpu_secs(cpu_after.2, cpu_before.2),
        },
        "org_ids": orgs,
        "cap_ids": caps,
    });
    if control_pid.is_some() {
        out["cpu_seconds"]["control"] = cpu_secs(cpu_after.0, cpu_before.0).into();
    }
    if db.is_some() {
        // A process started during the run counts whole; one that ended during it is lost.
        let postgres: u64 =
            cpu_after.1.iter().map(|(pid, t)| t - cpu_before.1.get(pid).copied().unwrap_or(0).min(*t)).sum();
        out["cpu_seconds"]["postgres"] = cpu_secs(postgres, 0).into();
    }
    if let (Some((before, _)), Some((after, bytes))) = (rows_before, rows_after) {
        out["rows_before"] = before.into();
        out["rows_after"] = after.into();
        out["table_bytes_after"] = bytes.into();
    }
    println!("{out}");
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// pg-create, pg-drop

/// Creates (or drops) database `--db` on the PostgreSQL server `--server` (default: the local one,
/// user postgres, trust authentication).
fn pg_database(flags: &Flags, create: bool) -> Result<(), Error> {
    let server = flags.opt("server").unwrap_or("postgres://postgres@127.0.0.1:5432");
    let db = flags.str("db")?;
    if db.is_empty() || !db.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_') {
        return Err(format!("--db {db:?}: expected [a-z0-9_]+").into());
    }
    let mut client = postgres::Client::connect(server, postgres::NoTls)?;
    if create {
        client.batch_execute(&format!("CREATE DATABASE {db}"))?;
        println!("{{\"created\":\"{db}\"}}");
    } else {
        client.batch_execute(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"))?;
        println!("{{\"dropped\":\"{db}\"}}");
    }
    Ok(())
}
