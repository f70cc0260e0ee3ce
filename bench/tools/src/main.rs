//! `recovea-bench`: the helpers `bench/run` needs that no packaged tool provides.
//!
//! - `snapshot --keys N`: builds an N-key snapshot in this process and reports its memory (VmRSS
//!   before and after, VmHWM during a rebuild) and the time to build, swap and drop one.
//! - `load --url U --body B ...`: a closed-loop HTTP/1.1 keep-alive load generator that records, per
//!   request, the time to the first response byte (the head), to the first body chunk and to the
//!   end, for SSE streams (wrk reports only the whole response).
//! - `keys --admin U --token T --org O --count N`: creates N keys through the admin API.
//! - `cpu-watch --root PID`: every 500 ms, prints the CPU time used so far by processes that are
//!   not descendants of PID, so that `bench/run` can say whether the machine was busy.
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
use recovea_core::snapshot::{ProviderCredential, ProviderKind, Snapshot, SnapshotBuilder};
use recovea_core::window::Window;
use recovea_core::{Credential, CredentialHeader, Decision, Timestamp, admit};

type Error = Box<dyn std::error::Error + Send + Sync>;

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(command) = args.next() else {
        usage();
    };
    let flags = Flags::parse(args);
    let result = match command.as_str() {
        "snapshot" => snapshot(&flags),
        "load" => runtime().and_then(|rt| rt.block_on(load(&flags))),
        "keys" => runtime().and_then(|rt| rt.block_on(keys(&flags))),
        "cpu-watch" => cpu_watch(&flags),
        _ => usage(),
    };
    if let Err(e) = result {
        eprintln!("recovea-bench {command}: {e}");
        std::process::exit(1);
    }
}

fn usage() -> ! {
    eprintln!("usage: recovea-bench snapshot|load|keys|cpu-watch --flag value ...");
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
    let (rss_start, _) = memory_kib();
    let rows: Vec<Row> = (0..n)
        .map(|i| Row { hash: hash_secret(&secret(i)), key_id: format!("key_{i:020}"), org: i / per_org })
        .collect();
    // The rows stand for the store's answer; the snapshot's own memory is what comes on top.
    let (rss_rows, _) = memory_kib();

    let t = Instant::now();
    let first = build(1, orgs, &rows);
    let build1 = t.elapsed();
    let (rss_snapshot, _) = memory_kib();
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
         \"peak_during_rebuild_mib\":{:.1},\"build_ms\":{:.1},\"rebuild_ms\":{:.1},\"swap_us\":{:.2},\
         \"drop_old_ms\":{:.1}}}",
        mib(rss_start),
        mib(rss_rows),
        mib(rss_snapshot),
        mib(delta),
        (delta * 1024) as f64 / n.max(1) as f64,
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

    let start = Instant::now();
    let measure_from = start + warmup;
    let end = measure_from + duration;
    let mut tasks = Vec::with_capacity(concurrency);
    for _ in 0..concurrency {
        let (authority, path, body, key) = (authority.clone(), path.clone(), body.clone(), key.clone());
        tasks.push(tokio::spawn(async move {
            let mut result = WorkerResult::default();
            while Instant::now() < end {
                if let Err(_e) =
                    connection(&authority, &path, &body, key.as_deref(), measure_from, end, &mut result).await
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

/// One keep-alive connection, reused until `end` or until it fails.
async fn connection(
    authority: &http::uri::Authority,
    path: &str,
    body: &Bytes,
    key: Option<&str>,
    measure_from: Instant,
    end: Instant,
    result: &mut WorkerResult,
) -> Result<(), Error> {
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
