//! The job poller: each pending job is polled with its organization's credential, through the
//! same provider client as the nodes (roots, private CA, egress proxy, HTTP/2), until it ends;
//! then its results are read line by line and it is settled once from the provider's own usage.
//!
//! Polls are spaced per credential ([`PER_CREDENTIAL`]), whatever the number of jobs it has:
//! many pending jobs of one organization stretch the time between two polls of each, never the
//! rate at which its provider account is asked. A job is claimed (its next poll pushed back)
//! before it is polled, so that replicas sharing the store rarely poll it twice, and settling it
//! twice writes nothing the second time.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Uri};
use http_body_util::BodyExt;
use recovea_core::crypto::provider_key_context;
use recovea_core::jobs::EndedJob;
use recovea_core::receipt::SerializedReceipt;
use recovea_core::snapshot::ProviderKind;
use recovea_core::timestamp::Timestamp;
use recovea_core::usage::Usage;
use recovea_providers::headers;
use recovea_providers::jobs::{JobState, LineUsage, Results, job_state, poll_path, result_line};
use recovea_store::JobRecord;
use recovea_upstream::Upstream;

use crate::Control;
use crate::alerts::Alerts;

/// The least time between two polls through one credential: at most five a second.
pub const PER_CREDENTIAL: Duration = Duration::from_millis(200);
/// How many due jobs one round looks at.
const DUE_BATCH: u32 = 1000;
/// How many polls run at once.
const IN_FLIGHT: usize = 32;
/// How long a poll waits for the provider's answer head.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);
/// The largest status answer read, and the longest results line kept (a longer one is skipped).
const MAX_ANSWER: usize = 16 << 20;
/// After a failed poll, the next waits this much longer each time, up to [`MAX_BACKOFF`].
const MAX_BACKOFF: Duration = Duration::from_secs(15 * 60);
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

impl Control {
    /// Polls the due jobs until `shutdown`: every `interval` (and at least every second) it takes
    /// the jobs whose next poll has come, spaced per credential, and settles those that ended.
    pub async fn poll_jobs(self, settings: PollerSettings, shutdown: impl std::future::Future<Output = ()>) {
        let Some(jobs) = self.inner.jobs.get().cloned() else { return };
        let settings = Arc::new(settings);
        // Jobs a poller with a longer interval scheduled (before a restart) are due within this one's.
        let store = Arc::clone(jobs.store());
        let latest = Timestamp(now().0.saturating_add(millis(settings.interval)));
        if let Err(e) = self.off_thread(move || store.poll_by(latest)).await {
            tracing::warn!(error = ?e, "bringing the jobs' polls forward failed");
        }
        tokio::pin!(shutdown);
        let mut last_poll: HashMap<(String, String), Instant> = HashMap::new();
        let mut round = tokio::time::interval(settings.interval.min(Duration::from_secs(1)));
        round.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let permits = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
        let mut running = tokio::task::JoinSet::new();
        loop {
            tokio::select! {
                _ = round.tick() => {}
                () = &mut shutdown => break,
            }
            while running.try_join_next().is_some() {}
            let store = Arc::clone(jobs.store());
            let due = match self.off_thread(move || store.due_jobs(now(), DUE_BATCH)).await {
                Ok(due) => due,
                Err(e) => {
                    tracing::warn!(error = ?e, "reading the jobs due for a poll failed");
                    continue;
                }
            };
            last_poll.retain(|_, at| at.elapsed() < PER_CREDENTIAL);
            for job in due {
                let credential = (job.org_id.to_string(), job.provider.clone());
                if last_poll.contains_key(&credential) {
                    continue;
                }
                last_poll.insert(credential, Instant::now());
                let Ok(permit) = Arc::clone(&permits).acquire_owned().await else { break };
                let (control, settings) = (self.clone(), Arc::clone(&settings));
                running.spawn(async move {
                    control.poll_one(&settings, job).await;
                    drop(permit);
                });
            }
        }
        running.abort_all();
    }

    /// Claims, polls and (when it ended) settles one job; a failure is recorded on it, and its
    /// next poll waits the longer the more it failed.
    async fn poll_one(&self, settings: &PollerSettings, job: JobRecord) {
        let Some(jobs) = self.inner.jobs.get() else { return };
        let claim = Timestamp(now().0.saturating_add(millis(settings.interval)));
        if self.record_poll(&job, claim, None).await.is_err() {
            return;
        }
        self.inner.metrics.job_polls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        match self.poll(settings, &job).await {
            Ok(None) => {}
            Ok(Some(ran)) => match self.settle(settings, &job, &ran).await {
                Ok(true) => {
                    self.inner.metrics.jobs_settled.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if let Err(e) = jobs.refresh().await {
                        tracing::warn!(error = %e, "reading the book of jobs after a settlement failed");
                    }
                }
                Ok(false) => {}
                Err(error) => self.poll_failed(&job, &error).await,
            },
            Err(error) => self.poll_failed(&job, &error).await,
        }
    }

    async fn poll_failed(&self, job: &JobRecord, error: &str) {
        self.inner.metrics.job_poll_errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::warn!(org_id = %job.org_id, provider = %job.provider, job_id = %job.job_id, error, "polling a job failed");
        let backoff = Duration::from_secs(2_u64.saturating_pow(job.polls.min(20))).min(MAX_BACKOFF);
        let next = Timestamp(now().0.saturating_add(millis(backoff)));
        let _ = self.record_poll(job, next, Some(error.to_owned())).await;
    }

    async fn record_poll(&self, job: &JobRecord, next: Timestamp, error: Option<String>) -> Result<(), ()> {
        let Some(jobs) = self.inner.jobs.get() else { return Err(()) };
        let store = Arc::clone(jobs.store());
        let (org, provider, id) = (job.org_id.clone(), job.provider.clone(), job.job_id.clone());
        self.off_thread(move || store.job_polled(&org, &provider, &id, next, error.as_deref()))
            .await
            .map_err(|e| tracing::warn!(error = ?e, "recording a job's poll failed"))
    }

    /// The job's usage by model once it ended; `None` while it runs.
    async fn poll(
        &self,
        settings: &PollerSettings,
        job: &JobRecord,
    ) -> Result<Option<BTreeMap<Option<String>, Usage>>, PollError> {
        let credential = self.credential(settings, job).await?;
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
        Ok(Some(ran))
    }

    /// Writes the job's settlement: its receipts and its cost, once.
    async fn settle(
        &self,
        settings: &PollerSettings,
        job: &JobRecord,
        ran: &BTreeMap<Option<String>, Usage>,
    ) -> Result<bool, PollError> {
        let Some(jobs) = self.inner.jobs.get() else { return Ok(false) };
        let prices = self.inner.prices.lock().unwrap_or_else(std::sync::PoisonError::into_inner).0.clone();
        let provider_kind = self.credential_kind(job).await.unwrap_or(ProviderKind::OpenAi);
        let ended = EndedJob {
            kind: job.kind,
            provider_kind,
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

    async fn credential_kind(&self, job: &JobRecord) -> Option<ProviderKind> {
        let (org, name) = (job.org_id.clone(), job.provider.clone());
        let providers = self.store(move |s| s.list_providers(&org)).await.ok()?;
        providers.into_iter().find(|p| p.name == name).map(|p| p.kind)
    }

    /// The organization's credential the job was created through, opened.
    async fn credential(&self, settings: &PollerSettings, job: &JobRecord) -> Result<Credential, PollError> {
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
        Ok(Credential { kind: record.kind, base_url, key })
    }
}

/// A credential as the poller uses it. Its key never leaves it but in the provider's auth header.
struct Credential {
    kind: ProviderKind,
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
