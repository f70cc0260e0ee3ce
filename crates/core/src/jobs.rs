//! Deferred jobs (batches, background responses): what a job is estimated at when it is created,
//! the book of jobs that the control plane keeps and every node follows, and the spend the book
//! puts on each cap's window: a job's estimate is *held* there until it ends, then its cost counts
//! there as settled spend.
//!
//! Spend counters hold what nodes meter from answers; the book holds what jobs hold and cost. The
//! line of an armed cap counts both, on every node, so that a job cannot pass it while the
//! provider runs it. A job's hold and its settled cost fall in the windows of the moment it was
//! created (as its creating request's receipt does), so that settling swaps one for the other in
//! the same windows.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::caps::Cap;
use crate::channel::JobKind;
use crate::ids::{CapId, KeyId, OrgId};
use crate::money::Nanos;
use crate::pricing::{self, Price, PriceTable};
use crate::receipt::{Receipt, receipt_id};
use crate::timestamp::MS_PER_DAY;
use crate::timestamp::Timestamp;
use crate::usage::Usage;

pub mod schedule;

/// The longest id of a provider's job or file the gateway keeps.
pub const MAX_ID_LEN: usize = 128;
/// The most models a batch's estimate names; the lines of any further model are estimated
/// together under [`OTHER_MODELS`], at the provider kind's fallback price.
pub const MAX_MODELS: usize = 16;
/// Where the lines of a batch's models past [`MAX_MODELS`] (or of a model name too long to keep)
/// are counted.
pub const OTHER_MODELS: &str = "";
/// The longest model name an estimate keeps.
const MAX_MODEL_LEN: usize = 256;
/// The output a request that sets no limit is estimated at when the table does not know its
/// model's own limit.
pub const UNKNOWN_MAX_OUTPUT: u64 = 32_768;

/// Whether `id` can name a job or file: what a provider answered, bounded and plain (it becomes
/// part of a path the gateway polls, and of stored keys).
pub fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_ID_LEN
        && !id.contains("..")
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'/' | b':'))
}

/// The book's key of a job or file: its organization, the credential it went through, and the
/// provider's id. Organization ids and credential names hold no `/`.
pub fn book_key(org: &str, provider: &str, id: &str) -> String {
    let mut key = String::with_capacity(org.len() + provider.len() + id.len() + 2);
    push_book_key(&mut key, org, provider, id);
    key
}

/// [`book_key`], appended to `out`: where many keys are only looked up, one buffer serves them all.
pub fn push_book_key(out: &mut String, org: &str, provider: &str, id: &str) {
    for (n, part) in [org, provider, id].into_iter().enumerate() {
        if n > 0 {
            out.push('/');
        }
        out.push_str(part);
    }
}

/// The book's key of one day's settled job spend of one key.
pub fn spend_key(org: &OrgId, key: &KeyId, day: i64) -> String {
    format!("{org}/{key}/{day}")
}

/// The UTC day number (days since 1970-01-01) of an instant.
pub fn day_of(at: Timestamp) -> i64 {
    at.0.div_euclid(MS_PER_DAY)
}

/// A batch's requests summed by model: what its estimate is made of.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchInput {
    /// By model name; [`OTHER_MODELS`] for lines past [`MAX_MODELS`] models, or naming none.
    pub models: BTreeMap<String, ModelLines>,
}

/// The requests of one model in a batch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelLines {
    pub requests: u64,
    /// Estimated input tokens, summed.
    pub input_tokens: u64,
    /// The output limits of the requests that set one, summed.
    pub output_tokens: u64,
    /// Requests that set no output limit: each may write the model's maximum.
    pub uncapped: u64,
}

impl BatchInput {
    /// Counts one request of the batch.
    pub fn add(&mut self, model: Option<&str>, input_tokens: u64, max_output: Option<u64>) {
        let name = model.filter(|m| m.len() <= MAX_MODEL_LEN).unwrap_or(OTHER_MODELS);
        let name = if self.models.contains_key(name) || self.models.len() < MAX_MODELS {
            name
        } else {
            OTHER_MODELS
        };
        let lines = self.models.entry(name.to_owned()).or_default();
        lines.requests = lines.requests.saturating_add(1);
        lines.input_tokens = lines.input_tokens.saturating_add(input_tokens);
        match max_output {
            Some(limit) => lines.output_tokens = lines.output_tokens.saturating_add(limit),
            None => lines.uncapped = lines.uncapped.saturating_add(1),
        }
    }

    pub fn requests(&self) -> u64 {
        self.models.values().fold(0, |sum, lines| sum.saturating_add(lines.requests))
    }

    /// The batch's worst case at the provider's batch prices: every request's estimated input,
    /// and its output limit or else its model's maximum output, each model at its own batch
    /// price (a model the table does not price at the credential's fallback price).
    pub fn estimate(&self, table: &PriceTable, scope: &crate::pricing::PriceScope) -> Nanos {
        self.models.iter().fold(Nanos::ZERO, |sum, (model, lines)| {
            let model = (model != OTHER_MODELS).then_some(model.as_str());
            let price = table.price_in(model, scope).price;
            sum.saturating_add(lines_cost(lines, &price.batch(), price.max_output_tokens))
        })
    }
}

/// What `lines` can cost at `price`, a request without an output limit at `max_output`.
fn lines_cost(lines: &ModelLines, price: &Price, max_output: Option<u64>) -> Nanos {
    let uncapped = lines.uncapped.saturating_mul(max_output.unwrap_or(UNKNOWN_MAX_OUTPUT));
    let usage = Usage {
        input_tokens: lines.input_tokens,
        output_tokens: lines.output_tokens.saturating_add(uncapped),
        ..Usage::default()
    };
    pricing::cost(&usage, price)
}

/// A job in the book: pending (its estimate held) or settled a moment ago (kept so that the node
/// that created it knows the book has it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobWire {
    pub org_id: OrgId,
    pub key_id: KeyId,
    /// When its creating request started: the windows it counts in.
    pub started_at_ms: i64,
    /// The estimate held while it is pending.
    pub held_nanos: i64,
    /// Ended and settled: its cost is in the day's settled spend, its hold is gone.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub settled: bool,
}

/// A batch input file uploaded through the gateway, and the estimate of its lines.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileWire {
    pub org_id: OrgId,
    pub created_at_ms: i64,
    pub input: BatchInput,
}

/// The control plane's book of deferred jobs, as nodes follow it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobBook {
    /// Which control plane's book this is (each process numbers its changes its own way): a node
    /// asking another one for changes gets its whole book.
    #[serde(default)]
    pub epoch: u64,
    /// Grows with every change; a node asks for the changes after the one it holds.
    pub seq: u64,
    /// By [`book_key`]: the jobs pending, and those settled a short while ago.
    pub jobs: BTreeMap<String, JobWire>,
    /// By [`book_key`]: the batch input files seen recently.
    pub files: BTreeMap<String, FileWire>,
    /// Settled job spend by organization, key and UTC day of the jobs' creation, in nano-dollars,
    /// for the days any cap's current window can hold.
    pub spend: BTreeMap<String, i64>,
}

/// What changed in a [`JobBook`] between two sequence numbers: entries replaced whole, `None`
/// for removed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BookChanges {
    #[serde(default)]
    pub epoch: u64,
    pub from: u64,
    pub seq: u64,
    #[serde(default)]
    pub jobs: BTreeMap<String, Option<JobWire>>,
    #[serde(default)]
    pub files: BTreeMap<String, Option<FileWire>>,
    #[serde(default)]
    pub spend: BTreeMap<String, Option<i64>>,
}

/// One answer of the book's feed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum BookMessage {
    Book(JobBook),
    Changes(BookChanges),
}

/// A node's poll of the book: the book it holds (`seq` `None`: none yet), and how long the
/// control plane may wait for a change before it answers that there is none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BookPoll {
    pub epoch: u64,
    pub seq: Option<u64>,
    pub wait_ms: u64,
}

/// Changes made for another sequence than the one held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqMismatch {
    pub held: u64,
    pub from: u64,
}

impl JobBook {
    /// Applies changes made for exactly this sequence.
    pub fn apply(&mut self, changes: BookChanges) -> Result<(), SeqMismatch> {
        if changes.from != self.seq || changes.epoch != self.epoch {
            return Err(SeqMismatch { held: self.seq, from: changes.from });
        }
        replace(&mut self.jobs, changes.jobs);
        replace(&mut self.files, changes.files);
        replace(&mut self.spend, changes.spend);
        self.seq = changes.seq;
        Ok(())
    }

    /// Records a pending job (or replaces it).
    pub fn hold(&mut self, key: String, job: JobWire) {
        self.jobs.insert(key, job);
    }

    /// Settles the pending job at `key` at `cost`: its hold goes, its cost joins its day's spend.
    /// Settling a job twice, or one the book does not hold, changes nothing.
    pub fn settle(&mut self, key: &str, cost: Nanos) -> bool {
        let Some(job) = self.jobs.get_mut(key).filter(|job| !job.settled) else { return false };
        job.settled = true;
        let day = spend_key(&job.org_id, &job.key_id, day_of(Timestamp(job.started_at_ms)));
        let spent = self.spend.entry(day).or_insert(0);
        *spent = spent.saturating_add(cost.0);
        true
    }

    /// The spend the book puts on each of `caps`' windows: the holds of pending jobs and the
    /// settled spend of ended ones, of the keys each cap covers, in the windows they were
    /// created in. Windows with nothing are left out.
    pub fn window_totals<'c>(&self, caps: impl IntoIterator<Item = &'c Cap>) -> Vec<WindowTotal> {
        let mut totals: BTreeMap<(CapId, Timestamp), (Timestamp, Nanos)> = BTreeMap::new();
        for cap in caps {
            let mut add = |at: Timestamp, amount: Nanos| {
                let start = cap.window.start(at);
                let total =
                    totals.entry((cap.id.clone(), start)).or_insert((cap.window.end(at), Nanos::ZERO));
                total.1 = total.1.saturating_add(amount);
            };
            let prefix = format!("{}/", cap.org_id);
            for (_, job) in org_range(&self.jobs, &prefix) {
                if !job.settled && cap.covers(&job.org_id, &job.key_id) {
                    add(Timestamp(job.started_at_ms), Nanos(job.held_nanos));
                }
            }
            for (key, nanos) in org_range(&self.spend, &prefix) {
                let Some((key_id, day)) = parse_spend_key(&key[prefix.len()..]) else { continue };
                if cap.covers(&cap.org_id, &key_id) {
                    add(Timestamp(day.saturating_mul(MS_PER_DAY)), Nanos(*nanos));
                }
            }
        }
        totals
            .into_iter()
            .filter(|(_, (_, total))| *total != Nanos::ZERO)
            .map(|((cap, start), (end, total))| WindowTotal { cap, start, end, total })
            .collect()
    }

    /// What the book holds on the cap's window containing `at` (pending jobs only).
    pub fn held(&self, cap: &Cap, at: Timestamp) -> Nanos {
        let start = cap.window.start(at);
        org_range(&self.jobs, &format!("{}/", cap.org_id))
            .filter(|(_, job)| !job.settled && cap.covers(&job.org_id, &job.key_id))
            .filter(|(_, job)| cap.window.start(Timestamp(job.started_at_ms)) == start)
            .fold(Nanos::ZERO, |sum, (_, job)| sum.saturating_add(Nanos(job.held_nanos)))
    }
}

/// The control plane's copy of the book, which answers each node with the changes since the
/// sequence it holds: every entry remembers the sequence that last changed it, and removals are
/// remembered for a while (a node further behind gets the whole book).
#[derive(Debug, Default)]
pub struct BookLog {
    book: JobBook,
    changed: BTreeMap<(Section, String), u64>,
    /// Removed entries, by the sequence that removed them.
    removed: BTreeMap<u64, Vec<(Section, String)>>,
    removed_count: usize,
    /// Changes since a sequence before this cannot be told.
    horizon: u64,
}

/// The book's three maps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Section {
    Jobs,
    Files,
    Spend,
}

/// How many removals a [`BookLog`] remembers; a node behind by more gets the whole book.
const REMEMBERED_REMOVALS: usize = 50_000;

impl BookLog {
    /// An empty book of its own `epoch` (a random number, new with each control plane process).
    pub fn new(epoch: u64) -> Self {
        Self { book: JobBook { epoch, ..JobBook::default() }, ..Self::default() }
    }

    /// The book as it is now.
    pub fn book(&self) -> &JobBook {
        &self.book
    }

    /// Makes `next` (its sequence ignored) the book, under a new sequence when anything in it
    /// differs from the book held; whether anything did.
    pub fn replace(&mut self, next: JobBook) -> bool {
        let seq = self.book.seq + 1;
        let mut changed = false;
        changed |= self.diff(Section::Jobs, seq, |b| &b.jobs, &next.jobs);
        changed |= self.diff(Section::Files, seq, |b| &b.files, &next.files);
        changed |= self.diff(Section::Spend, seq, |b| &b.spend, &next.spend);
        if changed {
            self.book = JobBook { epoch: self.book.epoch, seq, ..next };
            while self.removed_count > REMEMBERED_REMOVALS {
                let Some((oldest, keys)) = self.removed.pop_first() else { break };
                self.removed_count -= keys.len();
                self.horizon = oldest;
            }
        }
        changed
    }

    fn diff<V: PartialEq>(
        &mut self,
        section: Section,
        seq: u64,
        of: impl Fn(&JobBook) -> &BTreeMap<String, V>,
        next: &BTreeMap<String, V>,
    ) -> bool {
        let held = of(&self.book);
        let mut changed = false;
        for (key, value) in next {
            if held.get(key) != Some(value) {
                self.changed.insert((section, key.clone()), seq);
                changed = true;
            }
        }
        let gone: Vec<String> = held.keys().filter(|key| !next.contains_key(*key)).cloned().collect();
        for key in gone {
            self.changed.remove(&(section, key.clone()));
            self.removed.entry(seq).or_default().push((section, key));
            self.removed_count += 1;
            changed = true;
        }
        changed
    }

    /// What turns the book at sequence `held` into the book now; `None` when `held` is too old
    /// (or from another control plane's book, newer than this one) to tell.
    pub fn changes_since(&self, epoch: u64, held: u64) -> Option<BookChanges> {
        if epoch != self.book.epoch || held < self.horizon || held > self.book.seq {
            return None;
        }
        let mut changes = BookChanges { epoch, from: held, seq: self.book.seq, ..BookChanges::default() };
        for ((section, key), _) in self.changed.iter().filter(|(_, seq)| **seq > held) {
            match section {
                Section::Jobs => drop(changes.jobs.insert(key.clone(), self.book.jobs.get(key).cloned())),
                Section::Files => drop(changes.files.insert(key.clone(), self.book.files.get(key).cloned())),
                Section::Spend => drop(changes.spend.insert(key.clone(), self.book.spend.get(key).copied())),
            }
        }
        for (section, key) in self.removed.range(held + 1..).flat_map(|(_, keys)| keys) {
            // Removed, unless set again since (then it is among the changed, with its value).
            if self.changed.get(&(*section, key.clone())).is_none_or(|seq| *seq <= held) {
                match section {
                    Section::Jobs => drop(changes.jobs.insert(key.clone(), None)),
                    Section::Files => drop(changes.files.insert(key.clone(), None)),
                    Section::Spend => drop(changes.spend.insert(key.clone(), None)),
                }
            }
        }
        Some(changes)
    }
}

/// The spend the book puts on one cap's window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowTotal {
    pub cap: CapId,
    pub start: Timestamp,
    pub end: Timestamp,
    pub total: Nanos,
}

/// The entries of one organization (keys starting with `prefix`, `{org}/`).
fn org_range<'m, V>(map: &'m BTreeMap<String, V>, prefix: &str) -> impl Iterator<Item = (&'m String, &'m V)> {
    map.range::<str, _>((std::ops::Bound::Included(prefix), std::ops::Bound::Unbounded))
        .take_while(move |(key, _)| key.starts_with(prefix))
}

/// `{key}/{day}` (what follows the organization in a spend key).
fn parse_spend_key(rest: &str) -> Option<(KeyId, i64)> {
    let (key, day) = rest.split_once('/')?;
    Some((KeyId::parse(key)?, day.parse().ok()?))
}

fn replace<V>(map: &mut BTreeMap<String, V>, changes: BTreeMap<String, Option<V>>) {
    for (key, value) in changes {
        match value {
            Some(value) => map.insert(key, value),
            None => map.remove(&key),
        };
    }
}

/// An ended job as its settlement needs it.
#[derive(Debug, Clone)]
pub struct EndedJob<'a> {
    pub kind: JobKind,
    /// Where the credential it ran under prices its models (its kind, price namespace and
    /// fallback): an unpriced model costs the fallback.
    pub scope: &'a crate::pricing::PriceScope,
    pub request_id: &'a str,
    pub org_id: &'a str,
    pub key_id: &'a str,
    /// The credential's name.
    pub provider: &'a str,
    pub endpoint: &'a str,
    pub job_id: &'a str,
    /// The model its creating request named: what a job that ran nothing is recorded under.
    pub model: Option<&'a str>,
    pub started_at: Timestamp,
}

/// The receipts that settle an ended job, one per model that ran (one of no usage when nothing
/// ran), each priced as the provider bills it (a batch at its batch price), and their total cost.
/// Their ids follow the creating request's receipt id, so that a settlement written twice is
/// inserted once; their windows are those of the job's creation, where its hold was.
pub fn settle(
    job: &EndedJob<'_>,
    ran: &BTreeMap<Option<String>, Usage>,
    prices: &crate::snapshot::Prices,
    node_id: &str,
    finished_at: Timestamp,
) -> (Vec<Receipt>, Nanos) {
    let nothing = BTreeMap::from([(job.model.map(str::to_owned), Usage::default())]);
    let ran = if ran.is_empty() { &nothing } else { ran };
    let base_id = receipt_id(job.request_id);
    let mut total = Nanos::ZERO;
    let receipts = ran
        .iter()
        .enumerate()
        .map(|(n, (model, usage))| {
            let resolution = prices.table.price_in(model.as_deref(), job.scope);
            let price = if job.kind.is_batch() { resolution.price.batch() } else { resolution.price };
            let priced = crate::pricing::Resolution { price, ..resolution };
            let settled = crate::receipt::settle(Some(*usage), Usage::default(), &priced);
            total = total.saturating_add(settled.cost);
            let mut receipt = Receipt {
                id: format!("{base_id}.j{n}"),
                request_id: job.request_id.to_owned(),
                org_id: job.org_id.to_owned(),
                key_id: job.key_id.to_owned(),
                provider: job.provider.to_owned(),
                // Only a job sent with the organization's key is polled: the gateway holds no other.
                provider_key: Some(crate::receipt::ProviderKey::Managed),
                model: model.clone().or_else(|| job.model.map(str::to_owned)),
                endpoint: job.endpoint.to_owned(),
                status: 200,
                stream: false,
                cost_usd: settled.cost,
                usage_source: settled.source,
                priced: settled.priced,
                price_revision: prices.revision,
                priced_as: settled.priced_as,
                started_at: job.started_at,
                finished_at,
                node_id: node_id.to_owned(),
                job_id: Some(job.job_id.to_owned()),
                ..Receipt::default()
            };
            receipt.set_usage(&settled.usage);
            receipt
        })
        .collect();
    (receipts, total)
}

/// Whether a batch of `estimate` fits under an armed cap: the window's spend, in-flight
/// reservations and the book's spend on it, plus the estimate, must stay at or below its limit.
/// The room left when it does not.
pub fn fits(limit: Nanos, committed: Nanos, estimate: Nanos) -> Result<(), Nanos> {
    let after = i128::from(committed.0) + i128::from(estimate.0);
    if after <= i128::from(limit.0) {
        Ok(())
    } else {
        let room = i128::from(limit.0) - i128::from(committed.0);
        Err(Nanos(i64::try_from(room.max(0)).unwrap_or(i64::MAX)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::caps::Scope;
    use crate::provider_kind::ProviderKind;
    use crate::window::Window;
    use proptest::prelude::*;

    /// 2026-03-17T12:00:00Z.
    const NOW: Timestamp = Timestamp(1_773_748_800_000);

    fn org() -> OrgId {
        OrgId::parse("org_a").expect("id")
    }

    fn key(id: &str) -> KeyId {
        KeyId::parse(id).expect("id")
    }

    fn cap(id: &str, scope: Scope, window: Window) -> Cap {
        Cap {
            id: CapId::parse(id).expect("id"),
            org_id: org(),
            scope,
            key_id: (scope == Scope::Key).then(|| key("key_a")),
            window,
            limit: Nanos(1_000_000_000),
            hard_stop: true,
            alert_at_permille: Vec::new(),
            alert_webhook: None,
        }
    }

    fn job(key_id: &str, at: Timestamp, held: i64) -> JobWire {
        JobWire { org_id: org(), key_id: key(key_id), started_at_ms: at.0, held_nanos: held, settled: false }
    }

    #[test]
    fn ids_from_providers_are_kept_only_when_plain_and_bounded() {
        for id in [
            "batch_abc123",
            "msgbatch_01HkcTjaV5uDC8jWR4ZsDV8d",
            "resp_67cb",
            "batches/123abc",
            "file-XjGxS3",
        ] {
            assert!(valid_id(id), "{id}");
        }
        for id in ["", "a b", "../x", "x/../y", "batch\n1", "é", &"a".repeat(MAX_ID_LEN + 1)] {
            assert!(!valid_id(id), "{id:?}");
        }
    }

    #[test]
    fn a_batch_is_estimated_at_batch_prices_with_each_lines_output_limit_or_the_models_maximum() {
        let table = PriceTable::builtin();
        let mut input = BatchInput::default();
        // 1,000 gpt-4o requests of 100 input tokens: 500 with max_tokens 50, 500 without.
        for n in 0..1000 {
            input.add(Some("gpt-4o"), 100, (n % 2 == 0).then_some(50));
        }
        assert_eq!(input.requests(), 1000);
        // gpt-4o's batch price is $1.25 in / $5 out per Mtok, its maximum output 16,384 tokens.
        let expected_tokens_out = 500 * 50 + 500 * 16_384;
        let expected = Nanos(100_000 * 1_250 + expected_tokens_out * 5_000);
        assert_eq!(
            input.estimate(table, &crate::pricing::PriceScope::of_kind(ProviderKind::OpenAi)),
            expected
        );
    }

    #[test]
    fn a_batch_names_at_most_sixteen_models_and_counts_the_rest_at_the_fallback_price() {
        let mut input = BatchInput::default();
        for n in 0..40 {
            input.add(Some(&format!("model-{n}")), 10, Some(10));
        }
        input.add(Some(&"m".repeat(1000)), 10, Some(10));
        input.add(None, 10, None);
        assert_eq!(input.models.len(), MAX_MODELS + 1);
        assert_eq!(input.models[OTHER_MODELS].requests, 40 - MAX_MODELS as u64 + 2);
        assert_eq!(input.requests(), 42);
        let table = PriceTable::builtin();
        let fallback = table.fallback(ProviderKind::OpenAi).price.batch();
        let other = input.models[OTHER_MODELS];
        let unknown_output =
            other.output_tokens + other.uncapped * fallback.max_output_tokens.unwrap_or(UNKNOWN_MAX_OUTPUT);
        assert!(
            input.estimate(table, &crate::pricing::PriceScope::of_kind(ProviderKind::OpenAi))
                >= pricing::cost(
                    &Usage {
                        input_tokens: other.input_tokens,
                        output_tokens: unknown_output,
                        ..Usage::default()
                    },
                    &fallback,
                )
        );
    }

    #[test]
    fn holds_and_settled_spend_count_in_the_windows_of_their_creation() {
        let month = cap("cap_m", Scope::Organization, Window::Month);
        let day = cap("cap_d", Scope::Key, Window::Day);
        let mut book = JobBook::default();
        book.hold(book_key(org().as_str(), "openai", "batch_1"), job("key_a", NOW, 600));
        book.hold(book_key(org().as_str(), "openai", "batch_2"), job("key_b", NOW, 50));
        // Yesterday's job counts on the month, not on today's day window.
        let yesterday = Timestamp(NOW.0 - MS_PER_DAY);
        book.hold(book_key(org().as_str(), "openai", "resp_3"), job("key_a", yesterday, 7));
        // Another organization's job never counts.
        let other = JobWire { org_id: OrgId::parse("org_b").expect("id"), ..job("key_a", NOW, 1_000) };
        book.hold(book_key(other.org_id.as_str(), "openai", "batch_9"), other);
        assert_eq!(book.held(&month, NOW), Nanos(657));
        assert_eq!(book.held(&day, NOW), Nanos(600), "a key cap holds its key's jobs only");

        assert!(book.settle(&book_key(org().as_str(), "openai", "batch_1"), Nanos(400)));
        assert!(!book.settle(&book_key(org().as_str(), "openai", "batch_1"), Nanos(400)), "settled once");
        assert!(!book.settle("org_a/openai/unknown", Nanos(1)));
        assert_eq!(book.held(&month, NOW), Nanos(57));
        let totals = book.window_totals([&month, &day]);
        let total = |cap: &Cap, at: Timestamp| {
            totals
                .iter()
                .find(|t| t.cap == cap.id && t.start == cap.window.start(at))
                .map_or(Nanos::ZERO, |t| t.total)
        };
        assert_eq!(total(&month, NOW), Nanos(457), "holds and settled spend together");
        assert_eq!(total(&day, NOW), Nanos(400));
        assert_eq!(total(&day, yesterday), Nanos(7));
        for t in &totals {
            let window = if t.cap == month.id { Window::Month } else { Window::Day };
            assert_eq!(t.end, window.end(t.start), "each total carries its window's end");
        }
    }

    #[test]
    fn changes_apply_to_the_sequence_they_were_made_for() {
        let mut book = JobBook { seq: 3, ..JobBook::default() };
        let mut changes = BookChanges { from: 3, seq: 5, ..BookChanges::default() };
        assert!(
            book.clone().apply(BookChanges { epoch: 1, ..changes.clone() }).is_err(),
            "another book's changes"
        );
        changes.jobs.insert("org_a/openai/batch_1".into(), Some(job("key_a", NOW, 9)));
        changes.spend.insert("org_a/key_a/20000".into(), Some(12));
        assert_eq!(book.apply(changes.clone()), Ok(()));
        assert_eq!((book.seq, book.jobs.len(), book.spend.len()), (5, 1, 1));
        assert_eq!(book.apply(changes), Err(SeqMismatch { held: 5, from: 3 }));
        let removal = BookChanges {
            from: 5,
            seq: 6,
            jobs: BTreeMap::from([("org_a/openai/batch_1".to_owned(), None)]),
            ..BookChanges::default()
        };
        assert_eq!(book.apply(removal), Ok(()));
        assert!(book.jobs.is_empty());
        let wire = serde_json::to_string(&BookMessage::Book(book.clone())).expect("json");
        assert_eq!(serde_json::from_str::<BookMessage>(&wire).expect("parses"), BookMessage::Book(book));
    }

    #[test]
    fn the_log_answers_each_node_with_what_changed_since_it_last_asked() {
        let mut log = BookLog::new(7);
        let mut next = JobBook::default();
        next.hold("org_a/openai/batch_1".into(), job("key_a", NOW, 10));
        next.hold("org_a/openai/batch_2".into(), job("key_a", NOW, 20));
        assert!(log.replace(next.clone()));
        assert!(!log.replace(next.clone()), "the same book is no change");
        assert_eq!((log.book().epoch, log.book().seq), (7, 1));
        let mut node = JobBook { epoch: 7, ..JobBook::default() };
        node.apply(log.changes_since(7, 0).expect("changes")).expect("applies");
        assert_eq!(node, *log.book());

        // Settle one, forget the other, add a file: the node catches up by changes alone.
        assert!(next.settle("org_a/openai/batch_1", Nanos(4)));
        next.jobs.remove("org_a/openai/batch_2");
        next.files.insert(
            "org_a/openai/file-1".into(),
            FileWire { org_id: org(), created_at_ms: NOW.0, input: BatchInput::default() },
        );
        assert!(log.replace(next.clone()));
        let changes = log.changes_since(7, 1).expect("changes");
        assert_eq!(changes.jobs.len(), 2);
        assert_eq!(changes.jobs["org_a/openai/batch_2"], None);
        assert_eq!((changes.files.len(), changes.spend.len()), (1, 1));
        node.apply(changes).expect("applies");
        assert_eq!(node, *log.book());
        // Taken back, then set again: the latest value, not a removal.
        next.jobs.insert("org_a/openai/batch_2".into(), job("key_a", NOW, 30));
        assert!(log.replace(next));
        let mut from_zero = JobBook { epoch: 7, ..JobBook::default() };
        from_zero.apply(log.changes_since(7, 0).expect("changes")).expect("applies");
        assert_eq!(from_zero, *log.book());
        // Another control plane's sequence, or one from the future, cannot be told apart: None.
        assert_eq!(log.changes_since(8, 1), None);
        assert_eq!(log.changes_since(7, 99), None);
    }

    #[test]
    fn a_job_settles_per_model_at_its_price_and_once_by_its_receipt_ids() {
        let prices = crate::snapshot::Prices::default();
        let job = EndedJob {
            kind: JobKind::OpenAiBatch,
            scope: &crate::pricing::PriceScope::of_kind(ProviderKind::OpenAi),
            request_id: "req_abc",
            org_id: "org_a",
            key_id: "key_a",
            provider: "openai",
            endpoint: "/v1/batches",
            job_id: "batch_1",
            model: Some("gpt-4o"),
            started_at: NOW,
        };
        let usage = Usage { input_tokens: 1_000_000, output_tokens: 1_000_000, ..Usage::default() };
        let ran = BTreeMap::from([(Some("gpt-4o-2024-08-06".to_owned()), usage)]);
        let (receipts, total) = settle(&job, &ran, &prices, "control", Timestamp(NOW.0 + 5));
        // gpt-4o's batch price: $1.25 in, $5 out per Mtok.
        assert_eq!(total, Nanos(6_250_000_000));
        assert_eq!(receipts.len(), 1);
        let r = &receipts[0];
        assert_eq!((r.id.as_str(), r.job_id.as_deref(), r.held_usd), ("rcpt_abc.j0", Some("batch_1"), None));
        assert_eq!((r.cost_usd, r.started_at, r.endpoint.as_str()), (total, NOW, "/v1/batches"));
        // A background response is billed at the ordinary price.
        let response =
            EndedJob { kind: JobKind::BackgroundResponse, endpoint: "/v1/responses", ..job.clone() };
        let (_, ordinary) = settle(&response, &ran, &prices, "control", NOW);
        assert_eq!(ordinary, Nanos(12_500_000_000));
        // Nothing ran: one receipt of nothing, under the model it named.
        let (receipts, total) = settle(&job, &BTreeMap::new(), &prices, "control", NOW);
        assert_eq!((receipts.len(), total, receipts[0].model.as_deref()), (1, Nanos::ZERO, Some("gpt-4o")));
    }

    #[test]
    fn a_batch_fits_when_it_ends_at_or_below_the_line() {
        assert_eq!(fits(Nanos(100), Nanos(40), Nanos(60)), Ok(()));
        assert_eq!(fits(Nanos(100), Nanos(40), Nanos(61)), Err(Nanos(60)));
        assert_eq!(fits(Nanos(100), Nanos(140), Nanos(1)), Err(Nanos::ZERO), "room is never negative");
        assert_eq!(fits(Nanos(i64::MAX), Nanos(i64::MAX), Nanos(i64::MAX)), Err(Nanos::ZERO));
    }

    proptest! {
        /// Whatever the jobs and their order of settling, a window's total is its pending holds
        /// plus its settled costs, each job counted once, never negative for non-negative input.
        #[test]
        fn window_totals_add_up(
            jobs in proptest::collection::vec((0_i64..1_000_000, 0_i64..1_000_000, any::<bool>(), 0_u8..3), 1..40),
        ) {
            let month = cap("cap_m", Scope::Organization, Window::Month);
            let mut book = JobBook::default();
            let mut expected = Nanos::ZERO;
            for (n, (held, cost, settle, key_n)) in jobs.iter().enumerate() {
                let k = book_key(org().as_str(), "openai", &format!("batch_{n}"));
                book.hold(k.clone(), job(&format!("key_{key_n}"), NOW, *held));
                if *settle {
                    prop_assert!(book.settle(&k, Nanos(*cost)));
                    prop_assert!(!book.settle(&k, Nanos(*cost)));
                    expected = expected.saturating_add(Nanos(*cost));
                } else {
                    expected = expected.saturating_add(Nanos(*held));
                }
            }
            let totals = book.window_totals([&month]);
            let total = totals.iter().map(|t| t.total).fold(Nanos::ZERO, Nanos::saturating_add);
            prop_assert_eq!(total, expected);
            prop_assert!(total >= Nanos::ZERO);
        }

        /// An estimate grows with every request added, and never passes through a float.
        #[test]
        fn estimates_only_grow(lines in proptest::collection::vec((0_u64..100_000, proptest::option::of(0_u64..100_000)), 1..50)) {
            let table = PriceTable::builtin();
            let mut input = BatchInput::default();
            let mut last = Nanos::ZERO;
            for (tokens, limit) in lines {
                input.add(Some("gpt-4o-mini"), tokens, limit);
                let now = input.estimate(table, &crate::pricing::PriceScope::of_kind(ProviderKind::OpenAi));
                prop_assert!(now >= last);
                last = now;
            }
        }
    }
}
