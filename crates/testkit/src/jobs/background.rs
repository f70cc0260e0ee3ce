//! OpenAI's background responses (`POST /v1/responses` with `"background": true`), and the
//! retrieval of foreground ones.

use http::StatusCode;
use serde_json::{Value, json};

use super::{Data, EndStatus, JobKind, JobRequest, JobUsage, Outputs, Phase, State, ok};
use crate::clock;
use crate::request::{Answer, Ctx, Fields};
use crate::usage::shapes;

/// How many foreground responses `GET /v1/responses/{id}` can find: enough for any test, and
/// bounded so that a benchmark's millions of requests cannot exhaust memory.
const REMEMBERED: usize = 1024;

/// What rebuilding a response's object needs.
pub(crate) struct Remembered {
    n: u64,
    /// Unix seconds.
    created: u64,
    /// A JSON string literal.
    model: String,
    input_tokens: u64,
    pieces: usize,
    /// A scripted usage object in force when it was created.
    usage: Option<String>,
}

impl Remembered {
    fn of(ctx: &Ctx) -> Self {
        Self {
            n: ctx.n,
            created: ctx.created,
            model: ctx.model.clone(),
            input_tokens: ctx.input_tokens,
            pieces: ctx.pieces,
            usage: ctx.usage.map(str::to_owned),
        }
    }

    fn id(&self) -> String {
        format!("resp_mock{}", self.n)
    }

    /// The completed response, with `usage` (JSON text) instead of the one it would have.
    fn completed(&self, usage: Option<&str>) -> Value {
        let fields = Fields::default();
        let ctx = Ctx {
            n: self.n,
            created: self.created,
            model: self.model.clone(),
            fields: &fields,
            input_tokens: self.input_tokens,
            usage: usage.or(self.usage.as_deref()),
            pieces: self.pieces,
            web_search_calls: 0,
        };
        match crate::openai::responses(&ctx) {
            Answer::Json(_, body) => serde_json::from_slice(&body).unwrap_or(Value::Null),
            Answer::Events(_) | Answer::Raw(..) => Value::Null,
        }
    }
}

/// A background response's own data.
pub(super) struct Background {
    request: Remembered,
    /// The object once it has ended.
    last: Option<Value>,
}

pub(super) fn status(phase: Phase) -> &'static str {
    match phase {
        Phase::Waiting => "queued",
        Phase::Running | Phase::Cancelling => "in_progress",
        Phase::Ended(EndStatus::Completed) => "completed",
        Phase::Ended(EndStatus::Failed) => "failed",
        Phase::Ended(EndStatus::Cancelled) => "cancelled",
        // Refused by the control endpoint; the nearest status, should it ever happen.
        Phase::Ended(EndStatus::Expired) => "incomplete",
    }
}

/// `POST /v1/responses` with `"background": true`: queued, no output, no usage yet.
pub(super) fn create(state: &mut State, ctx: &Ctx) -> Answer {
    let request = Remembered::of(ctx);
    let id = request.id();
    let index = state.push(Data::Response(Background { request, last: None }), id);
    object(state, index)
}

pub(super) fn remember(state: &mut State, ctx: &Ctx) {
    if state.remembered.len() >= REMEMBERED {
        state.remembered.pop_front();
    }
    state.remembered.push_back(Remembered::of(ctx));
}

fn object(state: &State, index: usize) -> Answer {
    let job = &state.jobs[index];
    let Data::Response(response) = &job.data else {
        return error(StatusCode::INTERNAL_SERVER_ERROR, "not a response");
    };
    if let Some(last) = &response.last {
        return ok(last);
    }
    let mut value = response.request.completed(None);
    value["status"] = json!(status(job.phase));
    value["background"] = json!(true);
    value["output"] = json!([]);
    value["usage"] = Value::Null;
    ok(&value)
}

/// `/v1/responses/{id}` and `/v1/responses/{id}/cancel`.
pub(super) fn route(state: &mut State, req: &JobRequest) -> Answer {
    let rest = req.path.strip_prefix("/v1/responses/").unwrap_or_default();
    let (id, cancel) = match rest.split_once('/') {
        Some((id, "cancel")) => (id, true),
        Some(_) => {
            return error(StatusCode::NOT_FOUND, &format!("Invalid URL ({} {})", req.method, req.path));
        }
        None => (rest, false),
    };
    let expected = if cancel { "POST" } else { "GET" };
    if req.method.as_str() != expected {
        return error(StatusCode::NOT_FOUND, &format!("Invalid URL ({} {})", req.method, req.path));
    }
    if let Some(index) = state.find(id, JobKind::BackgroundResponse) {
        if cancel {
            state.cancel(index);
        } else {
            state.retrieve(index);
        }
        return object(state, index);
    }
    match state.remembered.iter().find(|r| r.id() == id) {
        Some(_) if cancel => {
            error(StatusCode::BAD_REQUEST, "Only responses created with background=true can be cancelled.")
        }
        Some(response) => ok(&response.completed(None)),
        None => error(StatusCode::NOT_FOUND, &format!("Response with id '{id}' not found.")),
    }
}

impl Background {
    /// Completed: the normal output and usage (or the override). Cut short: no output, and the
    /// usage of what ran: `ran_tokens` output tokens if a test said so, else the partial usage.
    pub(super) fn finish(&mut self, out: &Outputs, ran_tokens: Option<u64>) {
        let input = out.settings.usage.map_or(self.request.input_tokens, |u| u.input_tokens);
        let mut value = if out.status == EndStatus::Completed {
            let usage = out.settings.usage.map(|u| shapes::responses(u.input_tokens, u.output_tokens));
            let mut value = self.request.completed(usage.as_deref());
            value["completed_at"] = json!(clock::seconds(out.now));
            value
        } else {
            let partial = match ran_tokens {
                Some(tokens) => JobUsage::new(input, tokens),
                None => out.settings.partial_usage.unwrap_or(JobUsage::new(input, 0)),
            };
            let usage = shapes::responses(partial.input_tokens, partial.output_tokens);
            let mut value = self.request.completed(Some(&usage));
            value["output"] = json!([]);
            value
        };
        value["status"] = json!(status(Phase::Ended(out.status)));
        value["background"] = json!(true);
        if out.status == EndStatus::Failed {
            value["error"] = json!({"code": "server_error", "message": "The response failed (ended so by the mock's control)."});
        }
        self.last = Some(value);
    }
}

fn error(status: StatusCode, message: &str) -> Answer {
    Answer::Json(status, crate::openai::error_body(status, message))
}
