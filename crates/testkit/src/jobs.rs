//! Deferred jobs, kept the way the providers keep them: OpenAI's files, batches and background
//! responses, Anthropic's message batches and Gemini's batches.
//!
//! A job advances one step per retrieval of its object by anyone, so that a test sees the gateway's
//! poller drive it: it ends on retrieval number [`JobSettings::retrievals_to_finish`] (counted at
//! the job's creation), or when a test ends it ([`JobEnd`]). What it produced (output files,
//! results, inlined responses, a response's output) is computed when it ends, from the
//! [`JobSettings`] then in force.

mod background;
mod batches;
mod gemini_batches;
mod lines;
mod message_batches;

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Mutex, MutexGuard, PoisonError};

use bytes::Bytes;
use http::{Method, StatusCode};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

use crate::clock;
use crate::request::{Answer, Ctx};

use background::Remembered;
use lines::{LineApi, answer_line, line_body_problem};

/// Which provider's job this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum JobKind {
    /// `POST /v1/batches`.
    #[serde(rename = "openai.batch")]
    OpenAiBatch,
    /// `POST /v1/responses` with `"background": true`.
    #[serde(rename = "openai.response")]
    BackgroundResponse,
    /// `POST /v1/messages/batches`.
    #[serde(rename = "anthropic.message_batch")]
    AnthropicBatch,
    /// `POST /v1beta/models/{model}:batchGenerateContent`.
    #[serde(rename = "gemini.batch")]
    GeminiBatch,
}

/// A job as `GET /__mock/jobs` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobInfo {
    pub id: String,
    pub kind: JobKind,
    /// The status as the provider's own object spells it now (`in_progress`, `ended`,
    /// `BATCH_STATE_RUNNING`, ...).
    pub status: String,
    /// How many times its object was retrieved.
    pub retrievals: u32,
}

/// How a test ends a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EndStatus {
    Completed,
    Failed,
    /// Batches only: a response cannot expire.
    Expired,
    Cancelled,
}

/// The body of `POST /__mock/jobs/{id}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobEnd {
    pub status: EndStatus,
    /// For a batch, how many of its lines (the first ones) ran; for a response, how many output
    /// tokens it had produced. Default: every line when completed, else the cut-short default
    /// ([`JobSettings::cancel_ran`]; for a response, [`JobSettings::partial_usage`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ran: Option<usize>,
}

impl JobEnd {
    pub fn new(status: EndStatus) -> Self {
        Self { status, ran: None }
    }

    pub fn ran(mut self, ran: usize) -> Self {
        self.ran = Some(ran);
        self
    }
}

/// Token counts to report instead of the mock's rules, in each endpoint's own usage shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobUsage {
    pub input_tokens: u64,
    pub output_tokens: u64,
}

impl JobUsage {
    pub fn new(input_tokens: u64, output_tokens: u64) -> Self {
        Self { input_tokens, output_tokens }
    }
}

/// The per-mock settings of jobs; [`Default`] is what a new or reset mock has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct JobSettings {
    /// The retrieval that answers a job ended (2: the first shows it running, the second ended).
    /// 0: jobs never end by being retrieved, only when cancelled or ended by a test.
    pub retrievals_to_finish: u32,
    /// The usage of every batch line and background response, instead of the rules.
    pub usage: Option<JobUsage>,
    /// How many lines ran in a batch cut short without a given `ran`: by default the first half,
    /// rounded down.
    pub cancel_ran: Option<usize>,
    /// The usage of a background response cut short without a given `ran`: by default its input
    /// tokens and no output.
    pub partial_usage: Option<JobUsage>,
}

impl Default for JobSettings {
    fn default() -> Self {
        Self { retrievals_to_finish: 2, usage: None, cancel_ran: None, partial_usage: None }
    }
}

/// `POST /__mock/jobs/settings`: the fields given replace theirs (`null` restores the default),
/// the others are left as they are.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SettingsPatch {
    #[serde(default, deserialize_with = "present")]
    retrievals_to_finish: Option<Option<u32>>,
    #[serde(default, deserialize_with = "present")]
    usage: Option<Option<JobUsage>>,
    #[serde(default, deserialize_with = "present")]
    cancel_ran: Option<Option<usize>>,
    #[serde(default, deserialize_with = "present")]
    partial_usage: Option<Option<JobUsage>>,
}

/// Tells a field given as `null` (`Some(None)`) from one not given (`None`, by `default`).
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(de: D) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(de).map(Some)
}

/// Why a test's request about a job cannot be done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobError {
    Unknown(String),
    AlreadyEnded(String),
    Invalid(String),
}

impl fmt::Display for JobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unknown(id) => write!(f, "no job {id:?}"),
            Self::AlreadyEnded(id) => write!(f, "job {id:?} has already ended"),
            Self::Invalid(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for JobError {}

impl JobError {
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            Self::Unknown(_) => StatusCode::NOT_FOUND,
            Self::AlreadyEnded(_) => StatusCode::CONFLICT,
            Self::Invalid(_) => StatusCode::BAD_REQUEST,
        }
    }
}

/// A provider request on a job path, as the job handlers need it.
pub(crate) struct JobRequest<'a> {
    pub(crate) method: &'a Method,
    /// The path as the `/v1/...` path it is answered as.
    pub(crate) path: &'a str,
    pub(crate) content_type: Option<&'a str>,
    pub(crate) body: &'a [u8],
    /// `http://host:port` of the mock, for the URLs it hands out.
    pub(crate) base_url: &'a str,
}

/// All jobs of one mock.
#[derive(Default)]
pub(crate) struct Jobs {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    settings: JobSettings,
    /// In creation order.
    jobs: Vec<Job>,
    files: batches::Files,
    /// The last foreground responses, so that `GET /v1/responses/{id}` finds them too.
    remembered: VecDeque<Remembered>,
    ids: Ids,
}

/// Per-kind counters behind the ids, so that ids are predictable within a test.
#[derive(Default)]
struct Ids {
    file: u64,
    batch: u64,
    message_batch: u64,
    gemini_batch: u64,
    /// Numbers the answers generated for batch lines (`batch_req_…`, `chatcmpl-mock…`).
    line: u64,
}

fn next(counter: &mut u64) -> u64 {
    *counter += 1;
    *counter
}

/// One job: what all kinds share, and its kind's own data.
struct Job {
    id: String,
    /// Microseconds since the epoch, like every time below.
    created: u64,
    retrievals: u32,
    /// [`JobSettings::retrievals_to_finish`] when it was created.
    to_finish: u32,
    phase: Phase,
    in_progress_at: Option<u64>,
    cancelling_at: Option<u64>,
    ended_at: Option<u64>,
    data: Data,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Created, never retrieved.
    Waiting,
    Running,
    /// Cancel asked; the next retrieval ends it.
    Cancelling,
    Ended(EndStatus),
}

enum Data {
    OpenAiBatch(batches::Batch),
    Response(background::Background),
    AnthropicBatch(message_batches::Batch),
    GeminiBatch(gemini_batches::Batch),
}

impl Job {
    fn new(id: String, to_finish: u32, data: Data) -> Self {
        Self {
            id,
            created: clock::now_micros(),
            retrievals: 0,
            to_finish,
            phase: Phase::Waiting,
            in_progress_at: None,
            cancelling_at: None,
            ended_at: None,
            data,
        }
    }

    fn kind(&self) -> JobKind {
        match self.data {
            Data::OpenAiBatch(_) => JobKind::OpenAiBatch,
            Data::Response(_) => JobKind::BackgroundResponse,
            Data::AnthropicBatch(_) => JobKind::AnthropicBatch,
            Data::GeminiBatch(_) => JobKind::GeminiBatch,
        }
    }

    /// Lines (requests) of a batch; 0 for a response.
    fn lines(&self) -> usize {
        match &self.data {
            Data::OpenAiBatch(b) => b.lines.len(),
            Data::Response(_) => 0,
            Data::AnthropicBatch(b) => b.requests.len(),
            Data::GeminiBatch(b) => b.requests.len(),
        }
    }

    fn status(&self) -> &'static str {
        match &self.data {
            Data::OpenAiBatch(_) => batches::status(self.phase),
            Data::Response(_) => background::status(self.phase),
            Data::AnthropicBatch(_) => message_batches::status(self.phase),
            Data::GeminiBatch(_) => gemini_batches::state(self.phase),
        }
    }

    fn info(&self) -> JobInfo {
        JobInfo {
            id: self.id.clone(),
            kind: self.kind(),
            status: self.status().to_owned(),
            retrievals: self.retrievals,
        }
    }

    fn ended(&self) -> bool {
        matches!(self.phase, Phase::Ended(_))
    }

    fn start_running(&mut self, now: u64) {
        if self.phase == Phase::Waiting {
            self.phase = Phase::Running;
        }
        self.in_progress_at.get_or_insert(now);
    }
}

impl Jobs {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Every update below leaves the state whole before it can panic, so poison is moot.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn reset(&self) {
        *self.lock() = State::default();
    }

    pub(crate) fn list(&self) -> Vec<JobInfo> {
        self.lock().jobs.iter().map(Job::info).collect()
    }

    pub(crate) fn settings(&self) -> JobSettings {
        self.lock().settings
    }

    pub(crate) fn set_settings(&self, settings: JobSettings) {
        self.lock().settings = settings;
    }

    pub(crate) fn update_settings(&self, update: impl FnOnce(&mut JobSettings)) -> JobSettings {
        let mut state = self.lock();
        update(&mut state.settings);
        state.settings
    }

    pub(crate) fn patch_settings(&self, patch: SettingsPatch) -> JobSettings {
        self.update_settings(|s| {
            if let Some(n) = patch.retrievals_to_finish {
                s.retrievals_to_finish = n.unwrap_or(JobSettings::default().retrievals_to_finish);
            }
            s.usage = patch.usage.unwrap_or(s.usage);
            s.cancel_ran = patch.cancel_ran.unwrap_or(s.cancel_ran);
            s.partial_usage = patch.partial_usage.unwrap_or(s.partial_usage);
        })
    }

    /// Ends job `id` now, as a test asks.
    pub(crate) fn end(&self, id: &str, end: JobEnd) -> Result<JobInfo, JobError> {
        let mut state = self.lock();
        let index = state.index(id).ok_or_else(|| JobError::Unknown(id.to_owned()))?;
        let job = &state.jobs[index];
        if job.ended() {
            return Err(JobError::AlreadyEnded(id.to_owned()));
        }
        match (&job.data, end.status) {
            (Data::Response(_), EndStatus::Expired) => {
                return Err(JobError::Invalid("a background response cannot expire".into()));
            }
            (Data::Response(_), _) => {}
            (_, _) if end.ran.is_some_and(|ran| ran > job.lines()) => {
                return Err(JobError::Invalid(format!("ran {:?} of {} lines", end.ran, job.lines())));
            }
            _ => {}
        }
        state.finish(index, end.status, end.ran);
        Ok(state.jobs[index].info())
    }

    /// The answer to a request on a job path, or `None` when the path is none of theirs.
    pub(crate) fn route(&self, req: &JobRequest) -> Option<Answer> {
        let path = req.path;
        if path == "/v1/files" || path.starts_with("/v1/files/") {
            return Some(batches::files(&mut self.lock(), req));
        }
        if path == "/v1/batches" || path.starts_with("/v1/batches/") {
            return Some(batches::batches(&mut self.lock(), req));
        }
        if path.starts_with("/v1/responses/") {
            return Some(background::route(&mut self.lock(), req));
        }
        if path == "/v1/messages/batches" || path.starts_with("/v1/messages/batches/") {
            return Some(message_batches::route(&mut self.lock(), req));
        }
        if path == "/v1beta/batches" || path.starts_with("/v1beta/batches/") {
            return Some(gemini_batches::route(&mut self.lock(), req));
        }
        None
    }

    /// `POST /v1beta/models/{model}:batchGenerateContent`.
    pub(crate) fn create_gemini_batch(&self, model: &str, body: &[u8]) -> Answer {
        gemini_batches::create(&mut self.lock(), model, body)
    }

    /// `POST /v1/responses` with `"background": true`.
    pub(crate) fn create_response(&self, ctx: &Ctx) -> Answer {
        background::create(&mut self.lock(), ctx)
    }

    /// Keeps a foreground response for `GET /v1/responses/{id}`.
    pub(crate) fn remember_response(&self, ctx: &Ctx) {
        background::remember(&mut self.lock(), ctx);
    }
}

impl State {
    fn index(&self, id: &str) -> Option<usize> {
        self.jobs.iter().position(|j| j.id == id)
    }

    /// The job `id` if it is of `kind`.
    fn find(&self, id: &str, kind: JobKind) -> Option<usize> {
        self.index(id).filter(|&i| self.jobs[i].kind() == kind)
    }

    fn push(&mut self, data: Data, id: String) -> usize {
        let job = Job::new(id, self.settings.retrievals_to_finish, data);
        self.jobs.push(job);
        self.jobs.len() - 1
    }

    /// Counts a retrieval of job `index` and advances it.
    fn retrieve(&mut self, index: usize) {
        let now = clock::now_micros();
        let job = &mut self.jobs[index];
        job.retrievals = job.retrievals.saturating_add(1);
        match job.phase {
            Phase::Ended(_) => {}
            Phase::Cancelling => self.finish(index, EndStatus::Cancelled, None),
            Phase::Waiting | Phase::Running => {
                if job.to_finish != 0 && job.retrievals >= job.to_finish {
                    self.finish(index, EndStatus::Completed, None);
                } else {
                    job.start_running(now);
                }
            }
        }
    }

    /// Asks job `index` to stop: batches go through a cancelling state that the next retrieval
    /// ends (Gemini's have none, so they end at once, as responses do). An ended job is left as
    /// it is, so a repeated cancel answers the final object.
    fn cancel(&mut self, index: usize) {
        let job = &mut self.jobs[index];
        match (job.phase, &job.data) {
            (Phase::Ended(_) | Phase::Cancelling, _) => {}
            (_, Data::OpenAiBatch(_) | Data::AnthropicBatch(_)) => {
                job.phase = Phase::Cancelling;
                job.cancelling_at = Some(clock::now_micros());
            }
            (_, Data::Response(_) | Data::GeminiBatch(_)) => {
                job.cancelling_at = Some(clock::now_micros());
                self.finish(index, EndStatus::Cancelled, None);
            }
        }
    }

    /// Ends job `index` with `status`, `ran` lines (or tokens) having run, and builds its output.
    fn finish(&mut self, index: usize, status: EndStatus, ran: Option<usize>) {
        let now = clock::now_micros();
        let Self { jobs, files, settings, ids, .. } = self;
        let job = &mut jobs[index];
        let lines = job.lines();
        let given = ran;
        let ran = match (status, ran) {
            (_, Some(ran)) => ran.min(lines),
            (EndStatus::Completed, None) => lines,
            (_, None) => settings.cancel_ran.unwrap_or(lines / 2).min(lines),
        };
        // A job that ran anything was in progress at some point, even if never seen so.
        if status == EndStatus::Completed || ran > 0 {
            job.in_progress_at.get_or_insert(now);
        }
        job.ended_at = Some(now);
        job.phase = Phase::Ended(status);
        let out = Outputs { settings: *settings, now, status, ran };
        match &mut job.data {
            Data::OpenAiBatch(batch) => batch.finish(&job.id, &out, files, ids),
            // For a response, a given `ran` is its output tokens so far.
            Data::Response(response) => response.finish(&out, given.map(|t| t as u64)),
            Data::AnthropicBatch(batch) => batch.finish(&out, ids),
            Data::GeminiBatch(batch) => batch.finish(&out, ids),
        }
    }
}

/// What building a job's output needs to know.
struct Outputs {
    settings: JobSettings,
    /// Microseconds since the epoch.
    now: u64,
    status: EndStatus,
    /// Lines that ran (every line when completed).
    ran: usize,
}

fn json_answer(status: StatusCode, value: &Value) -> Answer {
    Answer::Json(status, Bytes::from(value.to_string()))
}

fn ok(value: &Value) -> Answer {
    json_answer(StatusCode::OK, value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_patch_replaces_only_what_it_names() {
        let jobs = Jobs::default();
        let patch = |json: &str| serde_json::from_str::<SettingsPatch>(json).expect("valid patch");
        let s = jobs.patch_settings(patch(r#"{"usage":{"input_tokens":1000,"output_tokens":20000}}"#));
        assert_eq!(s.usage, Some(JobUsage::new(1000, 20_000)));
        assert_eq!(s.retrievals_to_finish, 2);
        let s = jobs.patch_settings(patch(r#"{"retrievals_to_finish":4,"cancel_ran":1}"#));
        assert_eq!((s.retrievals_to_finish, s.cancel_ran), (4, Some(1)));
        assert_eq!(s.usage, Some(JobUsage::new(1000, 20_000)));
        let s = jobs.patch_settings(patch(r#"{"usage":null,"retrievals_to_finish":null}"#));
        assert_eq!((s.usage, s.retrievals_to_finish), (None, 2));
        assert!(serde_json::from_str::<SettingsPatch>(r#"{"retrievals":3}"#).is_err());
    }
}
