//! The job poller: each pending job is polled with its organization's credential, through the
//! same provider client as the nodes (roots, private CA, egress proxy, HTTP/2), until it ends;
//! then its results are read line by line and it is settled once from the provider's own usage.
//!
//! One control plane polls at a time: the holder of a lease in the store (renewed every
//! [`LEASE_RENEW`]), so that a credential's rate holds however many replicas share the store. It
//! schedules in memory ([`PollSchedule`]): each credential is polled at most once per
//! [`PER_CREDENTIAL`], whatever the number of its jobs, and a poll that finds the job still running
//! writes nothing. The store hears of a poll only when it failed, or succeeded after failing,
//! and of the job when it is settled (with its receipts, in one transaction: settling it twice
//! writes nothing the second time).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Uri};
use http_body_util::BodyExt;
use recovea_core::crypto::provider_key_context;
use recovea_core::jobs::EndedJob;
use recovea_core::jobs::schedule::{Due, JobSlot, NewJob, PollSchedule, Polled};
use recovea_core::pricing::PriceScope;
use recovea_core::receipt::SerializedReceipt;
use recovea_core::snapshot::ProviderKind;
use recovea_core::timestamp::Timestamp;
use recovea_core::usage::Usage;
use recovea_providers::headers;
use recovea_providers::jobs::{JobState, LineUsage, Results, job_state, poll_path, result_line};
use recovea_store::{JobPoll, JobRecord};
use recovea_upstream::Upstream;
use tokio::sync::mpsc;

use crate::Control;
use crate::alerts::Alerts;

/// The least time between two polls through one credential: at most five a second.
pub const PER_CREDENTIAL: Duration = Duration::from_millis(200);
/// How many polls run at once.
const IN_FLIGHT: usize = 32;
/// How long a poll waits for the provider's answer head.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);
/// The largest status answer read, and the longest results line kept (a longer one is skipped).
const MAX_ANSWER: usize = 16 << 20;
/// How long the poller's lease runs, and how often its holder renews it: a replica that dies
/// leaves the polling to another within a lease.
const LEASE: Duration = Duration::from_secs(15);
const LEASE_RENEW: Duration = Duration::from_secs(5);
/// How often at most the schedule takes up the book's changes (new jobs, settlements elsewhere).
const SYNC_EVERY: Duration = Duration::from_secs(1);
/// How long an opened credential is kept: a key changed in the admin API is used within this.
const CREDENTIAL_KEPT: Duration = Duration::from_secs(60);
/// The `node_id` of the receipts that settle jobs.
const SETTLER: &str = "jobs";

/// The base URL of a kind's credentials that name none (as nodes default them).
#[derive(Debug, Clone)]
pub struct ProviderDefaults {
    pub openai: String,
    pub anthropic: String,
    pub gemini: String,
}

impl ProviderDefaults {
    fn base_url(&self, kind: ProviderKind) -> Option<&str> {
        match kind {
            ProviderKind::OpenAi => Some(&self.openai),
            ProviderKind::Anthropic => Some(&self.anthropic),
            ProviderKind::Gemini => Some(&self.gemini),
            ProviderKind::AzureOpenAi => None,
        }
    }
}

/// How the poller works.
pub struct PollerSettings {
    /// How long after a poll a running job is polled again (`--job-poll-interval`).
    pub interval: Duration,
    pub upstream: Upstream,
    pub defaults: ProviderDefaults,
    /// The cap alerts the settlements' receipts may cross.
    pub alerts: Option<Arc<Alerts>>,
}

/// Why one poll failed: for the job's `last_error` and the log, never a secret.
type PollError = String;

/// Credentials opened for polls, by organization and name, with when they were opened.
type Credentials = Mutex<HashMap<(String, String), (Instant, Arc<Credential>)>>;

/// What the poller's tasks share.
struct Poller {
    settings: PollerSettings,
    credentials: Credentials,
    /// The poller's own clock, in milliseconds: the schedule's.
    epoch: Instant,
}

impl Poller {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

impl Control {
    /// Polls the pending jobs until `shutdown`, while this control plane holds the poller's lease,
    /// on a thread of its own: a single-threaded runtime, so that a poll's task, its connection
    /// and its wake-ups never cross threads (on the shared runtime they made a third of a poll's
    /// cost).
    pub async fn poll_jobs(
        self,
        settings: PollerSettings,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        let (done, finished) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new().name("job-poller".into()).spawn(move || {
            match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(runtime) => runtime.block_on(self.run_poller(settings, shutdown)),
                Err(e) => tracing::error!(error = %e, "the job poller's runtime could not start; jobs are not polled"),
            }
            drop(done);
        });
        match thread {
            Ok(_) => drop(finished.await),
            Err(e) => {
                tracing::error!(error = %e, "the job poller's thread could not start; jobs are not polled")
            }
        }
    }

    /// Every [`PER_CREDENTIAL`], and as polls come back, starts the polls that are due, one per
    /// credential at most.
    async fn run_poller(self, settings: PollerSettings, shutdown: impl std::future::Future<Output = ()>) {
        let Some(jobs) = self.inner.jobs.get().cloned() else { return };
        let holder =
            crate::random::token("poller_", 16).unwrap_or_else(|_| format!("poller_{}", std::process::id()));
        let poller = Arc::new(Poller { settings, credentials: Mutex::default(), epoch: Instant::now() });
        let interval_ms = u64::try_from(poller.settings.interval.as_millis()).unwrap_or(u64::MAX);
        let spacing_ms = u64::try_from(PER_CREDENTIAL.as_millis()).unwrap_or(200);
        let mut schedule: PollSchedule<Arc<JobRecord>> = PollSchedule::new(spacing_ms);
        let (polled_tx, mut polled_rx) = mpsc::unbounded_channel::<(JobSlot, Polled)>();
        let mut in_flight = 0_usize;
        let mut synced: Option<(Instant, u64)> = None;
        let mut leased: Option<(Instant, bool)> = None;
        tokio::pin!(shutdown);
        let mut ticks = tokio::time::interval(PER_CREDENTIAL);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut running = tokio::task::JoinSet::new();
        loop {
            // A tick renews the lease and takes up the store's changes; a poll coming back frees
            // its place for the next due one at once, so that the polls in flight, not the ticks,
            // bound how many run a second.
            let ticked = tokio::select! {
                _ = ticks.tick() => true,
                Some((slot, polled)) = polled_rx.recv() => {
                    in_flight -= 1;
                    schedule.polled(slot, polled, poller.now_ms(), interval_ms);
                    false
                }
                () = &mut shutdown => break,
            };
            if ticked {
                while running.try_join_next().is_some() {}
                if leased.is_none_or(|(at, _)| at.elapsed() >= LEASE_RENEW) {
                    let holding = self.lease(&holder, LEASE).await;
                    if !holding {
                        // Another replica polls: forget the schedule, take it up again from the
                        // store's records if the lease comes back.
                        schedule = PollSchedule::new(spacing_ms);
                        synced = None;
                    }
                    leased = Some((Instant::now(), holding));
                }
                let (seq, pending) = jobs.pending_jobs();
                // At most once a second: each settlement moves the book, and a sync walks it all.
                let sync_due = synced.is_none_or(|(at, _)| at.elapsed() >= SYNC_EVERY);
                if leased.is_some_and(|(_, holding)| holding)
                    && synced.is_none_or(|(_, synced)| synced != seq)
                    && sync_due
                {
                    let (now_ms, wall) = (poller.now_ms(), now());
                    schedule.sync(
                        pending.iter(),
                        |job, key| {
                            recovea_core::jobs::push_book_key(
                                key,
                                job.org_id.as_str(),
                                &job.provider,
                                &job.job_id,
                            );
                        },
                        |job| {
                            // A job new to this poller is due when its record says, within one
                            // interval.
                            let wait = u64::try_from(job.next_poll_at.0.saturating_sub(wall.0)).unwrap_or(0);
                            NewJob {
                                credential: credential_key(job),
                                due_ms: now_ms.saturating_add(wait.min(interval_ms)),
                                job: Arc::new(job.clone()),
                            }
                        },
                    );
                    synced = Some((Instant::now(), seq));
                }
            }
            if leased.is_none_or(|(_, holding)| !holding) {
                continue;
            }
            for due in schedule.take_due(poller.now_ms(), IN_FLIGHT - in_flight) {
                in_flight += 1;
                let (control, poller, polled_tx) = (self.clone(), Arc::clone(&poller), polled_tx.clone());
                running.spawn(async move {
                    let slot = due.slot;
                    let polled = control.poll_one(&poller, due).await;
                    let _ = polled_tx.send((slot, polled));
                });
            }
        }
        running.abort_all();
        if leased.is_some_and(|(_, holding)| holding) {
            // Stopping: another replica (or this one restarted) may poll at once.
            self.lease(&holder, Duration::ZERO).await;
        }
    }

    /// Takes or renews the poller's lease for `lasting` (zero: gives it up); `false` when another
    /// replica holds it, or the store did not answer (then nobody may be polling for a while,
    /// rather than two at once).
    async fn lease(&self, holder: &str, lasting: Duration) -> bool {
        let Some(jobs) = self.inner.jobs.get() else { return false };
        let store = Arc::clone(jobs.store());
        let holder = holder.to_owned();
        let now = now();
        let until = Timestamp(now.0.saturating_add(millis(lasting)));
        match self.off_thread(move || store.poller_lease(&holder, now, until)).await {
            Ok(holding) => holding,
            Err(e) => {
                tracing::warn!(error = ?e, "renewing the job poller's lease failed");
                false
            }
        }
    }

    /// Polls one job and (when it ended) settles it; a failure is recorded on it, for operators.
    async fn poll_one(&self, poller: &Poller, due: Due<Arc<JobRecord>>) -> Polled {
        let Some(jobs) = self.inner.jobs.get() else { return Polled::Failed };
        let job = &due.job;
        self.inner.metrics.job_polls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let outcome = match self.poll(poller, job).await {
            Ok(None) => Ok(Polled::Running),
            Ok(Some((credential, ran))) => {
                self.settle(&poller.settings, job, &credential.scope, &ran).await.map(|settled| {
                    if settled {
                        self.inner.metrics.jobs_settled.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    Polled::Ended
                })
            }
            Err(error) => Err(error),
        };
        let polls = job.polls.saturating_add(due.polls);
        match outcome {
            Ok(Polled::Ended) => {
                if let Err(e) = jobs.refresh().await {
                    tracing::warn!(error = %e, "reading the book of jobs after a settlement failed");
                }
                Polled::Ended
            }
            Ok(polled) => {
                // Recovered: the store's record of the failure goes.
                if due.failures > 0 || job.last_error.is_some() {
                    let next = Timestamp(now().0.saturating_add(millis(poller.settings.interval)));
                    self.record_poll(job, polls, next, None).await;
                }
                polled
            }
            Err(error) => {
                self.inner.metrics.job_poll_errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tracing::warn!(org_id = %job.org_id, provider = %job.provider, job_id = %job.job_id, error, "polling a job failed");
                let backoff = recovea_core::jobs::schedule::backoff_ms(due.failures.saturating_add(1));
                let next = Timestamp(now().0.saturating_add(i64::try_from(backoff).unwrap_or(i64::MAX)));
                self.record_poll(job, polls, next, Some(error)).await;
                Polled::Failed
            }
        }
    }

    async fn record_poll(&self, job: &JobRecord, polls: u32, next: Timestamp, error: Option<String>) {
        let Some(jobs) = self.inner.jobs.get() else { return };
        let store = Arc::clone(jobs.store());
        let (org, provider, id) = (job.org_id.clone(), job.provider.clone(), job.job_id.clone());
        let written = self
            .off_thread(move || {
                let poll = JobPoll {
                    org_id: &org,
                    provider: &provider,
                    job_id: &id,
                    polls,
                    next_poll_at: next,
                    error: error.as_deref(),
                };
                store.job_polled(&poll)
            })
            .await;
        if let Err(e) = written {
            tracing::warn!(error = ?e, "recording a job's poll failed");
        }
    }

    /// The job's usage by model once it ended (with the kind of credential it ran under); `None`
    /// while it runs.
    async fn poll(
        &self,
        poller: &Poller,
        job: &JobRecord,
    ) -> Result<Option<(Arc<Credential>, BTreeMap<Option<String>, Usage>)>, PollError> {
        let settings = &poller.settings;
        let credential = self.credential(poller, job).await?;
        let path = poll_path(job.kind, credential.kind, &job.job_id);
        let answer = credential.get(settings, &path).await?;
        let body = read_whole(answer).await?;
        let state =
            job_state(job.kind, &body).ok_or_else(|| "the provider's answer is not the job".to_owned())?;
        let JobState::Ended { how, results } = state else { return Ok(None) };
        let mut ran: BTreeMap<Option<String>, Usage> = BTreeMap::new();
        let mut add = |line: LineUsage| {
            let sum = ran.entry(line.model).or_default();
            *sum = sum.saturating_add(line.usage);
        };
        match results {
            Results::Inline(lines) => lines.into_iter().for_each(&mut add),
            Results::Lines(None) => {}
            Results::Lines(Some(location)) => {
                let answer = credential.get(settings, &location).await?;
                read_lines(answer, |line| {
                    if let Some(usage) = result_line(job.kind, line) {
                        add(usage);
                    }
                })
                .await?;
            }
        }
        tracing::info!(org_id = %job.org_id, job_id = %job.job_id, ended = %how, models = ran.len(), "a job ended");
        Ok(Some((credential, ran)))
    }

    /// Writes the job's settlement: its receipts and its cost, once.
    async fn settle(
        &self,
        settings: &PollerSettings,
        job: &JobRecord,
        scope: &PriceScope,
        ran: &BTreeMap<Option<String>, Usage>,
    ) -> Result<bool, PollError> {
        let Some(jobs) = self.inner.jobs.get() else { return Ok(false) };
        let prices = self.inner.prices.lock().unwrap_or_else(std::sync::PoisonError::into_inner).0.clone();
        let ended = EndedJob {
            kind: job.kind,
            scope,
            request_id: &job.request_id,
            org_id: job.org_id.as_str(),
            key_id: job.key_id.as_str(),
            provider: &job.provider,
            endpoint: &job.endpoint,
            job_id: &job.job_id,
            model: job.model.as_deref(),
            started_at: job.started_at,
        };
        let at = now();
        let (receipts, cost) = recovea_core::jobs::settle(&ended, ran, &prices, SETTLER, at);
        let receipts: Vec<SerializedReceipt> = receipts.into_iter().map(SerializedReceipt::new).collect();
        let store = Arc::clone(jobs.store());
        let (org, provider, id) = (job.org_id.clone(), job.provider.clone(), job.job_id.clone());
        let written = receipts.clone();
        let settled = self
            .off_thread(move || store.settle_job(&org, &provider, &id, cost, at, &written))
            .await
            .map_err(|e| format!("settling failed: {e:?}"))?;
        if settled && let Some(alerts) = &settings.alerts {
            let alerts = Arc::clone(alerts);
            let _ = self
                .off_thread(move || {
                    alerts.evaluate_batch(&receipts, true, at);
                    Ok(())
                })
                .await;
        }
        Ok(settled)
    }

    /// The organization's credential the job was created through, opened (kept for
    /// [`CREDENTIAL_KEPT`], so that a credential's polls open its key once a minute at most).
    async fn credential(&self, poller: &Poller, job: &JobRecord) -> Result<Arc<Credential>, PollError> {
        let name = (job.org_id.to_string(), job.provider.clone());
        let kept = |credentials: &Credentials| {
            let credentials = credentials.lock().unwrap_or_else(PoisonError::into_inner);
            credentials
                .get(&name)
                .filter(|(at, _)| at.elapsed() < CREDENTIAL_KEPT)
                .map(|(_, c)| Arc::clone(c))
        };
        if let Some(credential) = kept(&poller.credentials) {
            return Ok(credential);
        }
        let credential = Arc::new(self.open_credential(&poller.settings, job).await?);
        let mut credentials = poller.credentials.lock().unwrap_or_else(PoisonError::into_inner);
        credentials.retain(|_, (at, _)| at.elapsed() < CREDENTIAL_KEPT);
        credentials.insert(name, (Instant::now(), Arc::clone(&credential)));
        Ok(credential)
    }

    async fn open_credential(
        &self,
        settings: &PollerSettings,
        job: &JobRecord,
    ) -> Result<Credential, PollError> {
        let (org, name) = (job.org_id.clone(), job.provider.clone());
        let providers = self.store(move |s| s.list_providers(&org)).await.map_err(|e| format!("{e:?}"))?;
        let record = providers
            .into_iter()
            .find(|p| p.name == job.provider)
            .ok_or_else(|| format!("the organization has no credential named {name} any more"))?;
        let context = provider_key_context(job.org_id.as_str(), &record.name);
        let key = self
            .inner
            .master_key
            .open(&context, &record.sealed_key)
            .ok()
            .and_then(|key| String::from_utf8(key).ok())
            .ok_or_else(|| "the credential's key does not open under this master key".to_owned())?;
        let base_url = match record.base_url.as_deref().or_else(|| settings.defaults.base_url(record.kind)) {
            Some(base) => base.trim_end_matches('/').to_owned(),
            None => return Err("the credential has no base URL".to_owned()),
        };
        Ok(Credential { kind: record.kind, scope: record.scope(), base_url, key })
    }
}

/// The schedule's name of the credential a job is polled through.
fn credential_key(job: &JobRecord) -> String {
    format!("{}/{}", job.org_id, job.provider)
}

/// A credential as the poller uses it. Its key never leaves it but in the provider's auth header.
struct Credential {
    kind: ProviderKind,
    /// Where its models are priced, for the job's settlement.
    scope: PriceScope,
    base_url: String,
    key: String,
}

impl Credential {
    /// GETs `location`: a path below the base URL, or an absolute URL on the base URL's own
    /// origin (Anthropic's `results_url`). The key is never sent anywhere else.
    async fn get(
        &self,
        settings: &PollerSettings,
        location: &str,
    ) -> Result<http::Response<recovea_upstream::UpstreamBody>, PollError> {
        let url = if location.starts_with("http://") || location.starts_with("https://") {
            if origin(location) != origin(&self.base_url) {
                return Err(
                    "the provider named results on another host; they are not fetched with this key".into()
                );
            }
            location.to_owned()
        } else {
            format!("{}{location}", self.base_url)
        };
        let uri: Uri = url.parse().map_err(|_| "the job's location is not a URL".to_owned())?;
        let mut headers = headers::for_provider(HeaderMap::new(), Some((self.kind, &self.key)), 0)
            .map_err(|_| "the credential's key is not a valid header".to_owned())?;
        if self.kind == ProviderKind::Anthropic {
            headers.insert(headers::ANTHROPIC_VERSION, HeaderValue::from_static("2023-06-01"));
        }
        let mut request = Request::get(uri).body(Bytes::new()).map_err(|e| e.to_string())?;
        *request.headers_mut() = headers;
        let response = settings.upstream.send(request, ANSWER_TIMEOUT).await.map_err(|e| match e {
            recovea_upstream::UpstreamError::Unreachable(_) => "the provider could not be reached".to_owned(),
            recovea_upstream::UpstreamError::Timeout => "the provider did not answer in time".to_owned(),
        })?;
        if !response.status().is_success() {
            return Err(format!("the provider answered {}", response.status().as_u16()));
        }
        Ok(response)
    }
}

/// `scheme://authority` of a URL.
fn origin(url: &str) -> Option<(String, String)> {
    let uri: Uri = url.parse().ok()?;
    Some((uri.scheme_str()?.to_ascii_lowercase(), uri.authority()?.as_str().to_ascii_lowercase()))
}

/// A whole answer, at most [`MAX_ANSWER`] bytes.
async fn read_whole(answer: http::Response<recovea_upstream::UpstreamBody>) -> Result<Vec<u8>, PollError> {
    let mut body = std::pin::pin!(answer.into_body());
    let mut whole = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|_| "the provider's answer broke off".to_owned())?;
        if let Ok(data) = frame.into_data() {
            if whole.len() + data.len() > MAX_ANSWER {
                return Err("the provider's answer is too large".into());
            }
            whole.extend_from_slice(&data);
        }
    }
    Ok(whole)
}

/// Calls `each` with every line of an answer as it streams; a line longer than [`MAX_ANSWER`] is
/// skipped whole.
async fn read_lines(
    answer: http::Response<recovea_upstream::UpstreamBody>,
    mut each: impl FnMut(&[u8]),
) -> Result<(), PollError> {
    let mut body = std::pin::pin!(answer.into_body());
    let mut line = Vec::new();
    let mut skipping = false;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|_| "the provider's results broke off".to_owned())?;
        let Ok(data) = frame.into_data() else { continue };
        let mut rest = &data[..];
        while let Some(end) = rest.iter().position(|&b| b == b'\n') {
            if !skipping {
                line.extend_from_slice(&rest[..end]);
                each(&line);
            }
            line.clear();
            skipping = false;
            rest = &rest[end + 1..];
        }
        if !skipping {
            line.extend_from_slice(rest);
            if line.len() > MAX_ANSWER {
                line.clear();
                skipping = true;
            }
        }
    }
    if !skipping && !line.is_empty() {
        each(&line);
    }
    Ok(())
}

fn now() -> Timestamp {
    Timestamp::from_system_time(SystemTime::now())
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
