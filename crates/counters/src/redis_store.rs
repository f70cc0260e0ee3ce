//! The shared store in Redis: one atomic Lua script per window, all windows in one pipeline (on a
//! cluster, one command per window, all at once).
//!
//! Key layout for a window (cap `cap_x`, start `S` in unix ms), under the prefix `P`; the braces are
//! a hash tag. On one server (or through Sentinel) the tag is the window, `P:{cap_x:S}`; on a Redis
//! Cluster it is the cap's organization, `P:{org_y}:cap_x:S`, so that every window one request is
//! checked against at the line (its organization's caps and its key's) shares a slot and
//! `admit.lua` stays one atomic step. A cluster spreads organizations, not windows, over its
//! shards:
//!
//! | key | type | holds |
//! | --- | --- | --- |
//! | `P:{cap_x:S}:t` | hash | `total` (nano-dollars), `seeded` (`1` once rebuilt from the ledger), `i` (the window's incarnation), the seed (`sa` its amount, `sn` the nodes it left out, `sc` no receipt in it started this late), and per writer `q:<writer>` (last sequence applied) and `c:<writer>` (last cumulative applied) |
//! | `P:{cap_x:S}:c` | hash | per writer: `<since> <node id>`, from when it holds every receipt of its node in the window |
//! | `P:{cap_x:S}:r` | hash | per writer (`<node>/<entry>`): its live reservations, and as `s:<writer>` their spare part; per request reserved at the line (`<node>#<record>`): its estimate |
//! | `P:{cap_x:S}:x` | zset | per writer and request reserved at the line: its reservation's deadline (unix ms) |
//!
//! All four expire `key_margin` after the window's end (`PEXPIREAT`, refreshed on every write).
//! The scripts are `redis_store/sync.lua` (a node's sync) and `redis_store/admit.lua` (a request
//! at the line), each with `redis_store/money.lua` in front.

use std::future::Future;
use std::pin::Pin;

use recovea_core::caps::LineAnswer;
use recovea_core::ids::{CapId, OrgId};
use recovea_core::money::Nanos;
use recovea_core::timestamp::Timestamp;
use redis::{ErrorKind, RedisError, Script};

use crate::redis_target::{Connection, Link, RedisTls};

use crate::shared::{
    Counted, CounterError, LineAsk, Seed, SharedCounters, StoreOptions, SyncPush, SyncRead, WindowRead,
    counted_per_node, expire_at, line_member, line_members, millis,
};

const SYNC_SCRIPT: &str =
    concat!(include_str!("redis_store/money.lua"), include_str!("redis_store/sync.lua"));
const ADMIT_SCRIPT: &str =
    concat!(include_str!("redis_store/money.lua"), include_str!("redis_store/admit.lua"));
const CLOCK_SCRIPT: &str = include_str!("redis_store/clock.lua");

/// Spend counters shared through Redis (or Valkey). Connects lazily and reconnects after any
/// failure, so a node starts and serves while Redis is down (its counters are then unconfirmed).
pub struct Redis {
    link: Link,
    options: StoreOptions,
    script: Script,
    admit: Script,
}

impl std::fmt::Debug for Redis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL may carry a password: only the options are shown.
        f.debug_struct("Redis").field("options", &self.options).finish_non_exhaustive()
    }
}

impl Redis {
    /// Checks the URL (`redis://host:port/db`, or a cluster's or sentinels', see
    /// `redis_target.rs`) and the options; does not connect.
    pub fn new(url: &str, options: StoreOptions) -> Result<Self, CounterError> {
        Self::with_tls(url, &RedisTls::default(), options)
    }

    /// As [`Self::new`], `rediss://` URLs with `tls`'s certificates.
    pub fn with_tls(url: &str, tls: &RedisTls, options: StoreOptions) -> Result<Self, CounterError> {
        if options.prefix.contains(['{', '}']) {
            return Err(CounterError::Config("the key prefix must not contain '{' or '}'".to_owned()));
        }
        Ok(Self {
            link: Link::new(url, tls)?,
            options,
            script: Script::new(SYNC_SCRIPT),
            admit: Script::new(ADMIT_SCRIPT),
        })
    }

    /// The window's keys: its total hash, its reservations hash, its reservation deadlines zset.
    pub fn window_keys(&self, org: &OrgId, cap: &CapId, start: Timestamp) -> [String; 3] {
        let base = self.window_base(org, cap, start);
        [format!("{base}:t"), format!("{base}:r"), format!("{base}:x")]
    }

    /// The key of what a window's writers count (see `redis_store/sync.lua`).
    fn counted_key(&self, org: &OrgId, cap: &CapId, start: Timestamp) -> String {
        format!("{}:c", self.window_base(org, cap, start))
    }

    /// What a window's keys start with (see the module's key layout).
    fn window_base(&self, org: &OrgId, cap: &CapId, start: Timestamp) -> String {
        let prefix = &self.options.prefix;
        if self.link.is_cluster() {
            format!("{prefix}:{{{org}}}:{cap}:{}", start.0)
        } else {
            format!("{prefix}:{{{cap}:{}}}", start.0)
        }
    }

    async fn connection(&self) -> Result<Connection, RedisError> {
        self.link.connection(self.options.timeout, &[&self.script, &self.admit]).await
    }

    /// One script a window, then the store's clock.
    fn pipeline(&self, node_id: &str, push: &SyncPush) -> redis::Pipeline {
        let mut pipe = redis::pipe();
        for p in &push.windows {
            let [total, reservations, deadlines] = self.window_keys(&p.org, &p.cap, p.start);
            let counted = self.counted_key(&p.org, &p.cap, p.start);
            pipe.cmd("EVALSHA")
                .arg(self.script.get_hash())
                .arg(4)
                .arg(total)
                .arg(reservations)
                .arg(deadlines)
                .arg(counted)
                .arg(format!("{node_id}/{}", p.entry))
                .arg(push.seq)
                .arg(p.cumulative.0)
                .arg(p.since.map(|since| format!("{} {}", since.0, push.node_id)).unwrap_or_default())
                .arg(p.seed.as_ref().map(seed_arg).unwrap_or_default())
                .arg(p.end.map(|end| expire_at(end, &self.options).0.to_string()).unwrap_or_default())
                .arg(millis(self.options.reservation_ttl))
                .arg(p.reserved.0)
                .arg(p.spare.0)
                .arg(p.grow.0)
                .arg(p.ceiling.map(|ceiling| ceiling.0.to_string()).unwrap_or_default())
                .arg(line_members(node_id))
                .arg(&p.fold);
        }
        self.clock(&mut pipe);
        pipe
    }

    /// Adds `redis_store/clock.lua` to `pipe`: the store's clock and when its data began.
    fn clock<'p>(&self, pipe: &'p mut redis::Pipeline) -> &'p mut redis::Pipeline {
        pipe.cmd("EVAL").arg(CLOCK_SCRIPT).arg(1).arg(format!("{}:began", self.options.prefix))
    }

    async fn reserve_at_line_once(&self, node_id: &str, ask: &LineAsk) -> Result<LineAnswer, RedisError> {
        let mut connection = self.connection().await?;
        let mut invocation = self.admit.prepare_invoke();
        for w in &ask.windows {
            for key in self.window_keys(&w.org, &w.cap, w.start) {
                invocation.key(key);
            }
        }
        invocation
            .arg(line_member(node_id, ask.record))
            .arg(ask.estimate.0)
            .arg(millis(self.options.reservation_ttl))
            .arg(if ask.fit { "1" } else { "0" });
        for w in &ask.windows {
            invocation.arg(w.limit.0).arg(expire_at(w.end, &self.options).0);
        }
        // EVALSHA, loading the script again if the server lost it.
        let (verdict, window): (String, usize) = invocation.invoke_async(&mut connection).await?;
        let bad = || RedisError::from((ErrorKind::UnexpectedReturnType, "malformed line reply"));
        Ok(match verdict.as_str() {
            "reserved" => LineAnswer::Reserved,
            "line" => LineAnswer::AtLine(window.checked_sub(1).ok_or_else(bad)?),
            "contended" => LineAnswer::Contended,
            "unseeded" => LineAnswer::Unseeded,
            _ => return Err(bad()),
        })
    }

    async fn sync_once(&self, node_id: &str, push: &SyncPush) -> Result<SyncRead, RedisError> {
        let mut connection = self.connection().await?;
        // With no window to push, the clock alone: a node is confirmed only by a store that answers.
        // A window's script that lost the server's copy is sent again: it is idempotent.
        let mut replies: Vec<Vec<String>> =
            connection.each(&self.pipeline(node_id, push), &[&self.script, &self.admit]).await?;
        let (store_time, store_began) = parse_clock(&replies.pop().unwrap_or_default())?;
        Ok(SyncRead {
            windows: replies.iter().map(|reply| parse_reply(reply)).collect::<Result<_, _>>()?,
            store_time: Some(store_time),
            store_began: Some(store_began),
        })
    }
}

/// A reply of the wrong shape is a protocol fault; anything else means the store is unavailable.
pub(crate) fn counter_error(e: &RedisError) -> CounterError {
    if e.kind() == ErrorKind::UnexpectedReturnType {
        CounterError::Protocol(e.to_string())
    } else {
        CounterError::Unavailable(e.to_string())
    }
}

/// A seed as `sync.lua` reads it: `<total> <covers before> <incarnation>`, then a line
/// `<since> <node id>` per node it left out.
fn seed_arg(seed: &Seed) -> String {
    let mut arg = format!("{} {} {}", seed.total.0, seed.covers_before.0, seed.incarnation);
    for Counted { node_id, since } in &seed.counted {
        arg.push_str(&format!("\n{} {node_id}", since.0));
    }
    arg
}

/// `clock.lua`'s answer: the store's clock (`TIME`'s seconds and microseconds, in unix
/// milliseconds) and when its data began, in unix microseconds.
fn parse_clock(reply: &[String]) -> Result<(Timestamp, i64), RedisError> {
    let bad = || RedisError::from((ErrorKind::UnexpectedReturnType, "malformed clock reply"));
    let [seconds, micros, began] = reply else { return Err(bad()) };
    let seconds: i64 = seconds.parse().map_err(|_| bad())?;
    let micros: i64 = micros.parse().map_err(|_| bad())?;
    let began: i64 = began.parse().map_err(|_| bad())?;
    Ok((Timestamp(seconds.saturating_mul(1000).saturating_add(micros / 1000)), began))
}

fn parse_reply(reply: &[String]) -> Result<WindowRead, RedisError> {
    let bad = || RedisError::from((ErrorKind::UnexpectedReturnType, "malformed counter sync reply"));
    let nanos = |s: &String| s.parse::<i64>().map(Nanos).map_err(|_| bad());
    let [total, seeded, granted, incarnation, listed, rest @ ..] = reply else { return Err(bad()) };
    let listed: usize = listed.parse().map_err(|_| bad())?;
    let (writers, others) = rest.split_at_checked(listed).ok_or_else(bad)?;
    let writers = writers
        .iter()
        .map(|counted| {
            let (since, node_id) = counted.split_once(' ').ok_or_else(bad)?;
            Ok(Counted { node_id: node_id.to_owned(), since: Timestamp(since.parse().map_err(|_| bad())?) })
        })
        .collect::<Result<Vec<_>, RedisError>>()?;
    let others_reserved =
        others.iter().map(nanos).try_fold(Nanos::ZERO, |sum, n| n.map(|n| sum.saturating_add(n)))?;
    Ok(WindowRead {
        total: nanos(total)?,
        others_reserved,
        seeded: seeded == "1",
        granted: nanos(granted)?,
        counted: counted_per_node(writers.into_iter()),
        incarnation: incarnation.parse().map_err(|_| bad())?,
    })
}

impl SharedCounters for Redis {
    fn sync<'a>(
        &'a self,
        node_id: &'a str,
        push: &'a SyncPush,
        // Reservations are dated on Redis's own clock (`TIME` in the scripts), not the node's.
        _now: Timestamp,
    ) -> Pin<Box<dyn Future<Output = Result<SyncRead, CounterError>> + Send + 'a>> {
        Box::pin(async move {
            let result = tokio::time::timeout(self.options.timeout, self.sync_once(node_id, push)).await;
            let error = match result {
                Ok(Ok(read)) => {
                    if read.windows.len() != push.windows.len() {
                        return Err(CounterError::Protocol("one reply per window expected".to_owned()));
                    }
                    return Ok(read);
                }
                Ok(Err(e)) => counter_error(&e),
                Err(_) => CounterError::Timeout,
            };
            // Whatever went wrong, the next sync starts on a fresh connection.
            self.link.forget().await;
            Err(error)
        })
    }

    fn reserve_at_line<'a>(
        &'a self,
        node_id: &'a str,
        ask: &'a LineAsk,
        _now: Timestamp,
    ) -> Pin<Box<dyn Future<Output = Result<LineAnswer, CounterError>> + Send + 'a>> {
        Box::pin(async move {
            // The caller bounds the wait (a request waits on this); the connection's own
            // response timeout bounds a call the caller gave up on.
            self.reserve_at_line_once(node_id, ask).await.map_err(|e| counter_error(&e))
        })
    }
}
