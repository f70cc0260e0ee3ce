//! The `/__mock/` control endpoints: the log, the script, reset, jobs and Realtime sessions.

use http::header::{CONTENT_TYPE, HeaderValue};
use http::{Method, Response, StatusCode};

use super::Shared;
use crate::body::MockBody;
use crate::jobs::{JobEnd, JobUsage, SettingsPatch};
use crate::realtime;
use crate::request::json_string;
use crate::script::{Behaviour, RecordedRequest};

/// `/__mock/<action>`: what black-box tests use instead of the in-process methods.
pub(super) fn control(shared: &Shared, method: &Method, action: &str, body: &[u8]) -> Response<MockBody> {
    let reply = |status: StatusCode, body: MockBody| {
        let mut r = Response::new(body);
        *r.status_mut() = status;
        if status != StatusCode::NO_CONTENT {
            r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        }
        r
    };
    let problem = |status: StatusCode, message: &str| {
        let json = format!(r#"{{"error":{}}}"#, json_string(message));
        reply(status, MockBody::json(json.into()))
    };
    let json = |value: Result<Vec<u8>, serde_json::Error>| match value {
        Ok(json) => reply(StatusCode::OK, MockBody::json(json.into())),
        Err(e) => problem(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    };
    match (method.as_str(), action) {
        ("GET", "requests") => {
            let requests = shared.log.snapshot();
            let wire: Vec<_> = requests.iter().map(RecordedRequest::wire).collect();
            match serde_json::to_vec(&wire) {
                Ok(json) => reply(StatusCode::OK, MockBody::json(json.into())),
                Err(e) => problem(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
            }
        }
        ("POST", "script") => {
            let prepared = serde_json::from_slice::<Behaviour>(body)
                .map_err(|e| e.to_string())
                .and_then(|b| b.prepare().map_err(|e| e.to_string()));
            match prepared {
                Ok((plan, times)) => {
                    shared.script.push(plan, times);
                    reply(StatusCode::NO_CONTENT, MockBody::empty())
                }
                Err(message) => problem(StatusCode::BAD_REQUEST, &message),
            }
        }
        ("POST", "reset") => {
            shared.reset();
            reply(StatusCode::NO_CONTENT, MockBody::empty())
        }
        ("GET", "jobs") => json(serde_json::to_vec(&shared.jobs.list())),
        ("GET", "jobs/settings") => json(serde_json::to_vec(&shared.jobs.settings())),
        ("POST", "jobs/settings") => match serde_json::from_slice::<SettingsPatch>(body) {
            Ok(patch) => json(serde_json::to_vec(&shared.jobs.patch_settings(patch))),
            Err(e) => problem(StatusCode::BAD_REQUEST, &e.to_string()),
        },
        ("POST", "jobs/usage") => match serde_json::from_slice::<Option<JobUsage>>(body) {
            Ok(usage) => {
                shared.jobs.update_settings(|s| s.usage = usage);
                reply(StatusCode::NO_CONTENT, MockBody::empty())
            }
            Err(e) => problem(StatusCode::BAD_REQUEST, &e.to_string()),
        },
        ("POST", action) if action.starts_with("jobs/") => {
            let id = action.strip_prefix("jobs/").unwrap_or_default();
            match serde_json::from_slice::<JobEnd>(body) {
                Ok(end) => match shared.jobs.end(id, end) {
                    Ok(info) => json(serde_json::to_vec(&info)),
                    Err(e) => problem(e.status(), &e.to_string()),
                },
                Err(e) => problem(StatusCode::BAD_REQUEST, &e.to_string()),
            }
        }
        ("GET", "realtime") => json(serde_json::to_vec(&serde_json::json!({
            "open_sessions": shared.realtime.open_sessions(),
            "queued_usages": shared.realtime.queued_usages(),
        }))),
        ("POST", "realtime/usage") => match serde_json::from_slice::<Vec<serde_json::Value>>(body) {
            Ok(usages) => {
                shared.realtime.queue_usages(usages);
                reply(StatusCode::NO_CONTENT, MockBody::empty())
            }
            Err(e) => problem(StatusCode::BAD_REQUEST, &e.to_string()),
        },
        ("POST", "realtime/close") => match serde_json::from_slice::<CloseRequest>(body) {
            Ok(close) => {
                if let Some(why) = realtime::close_problem(close.code, &close.reason) {
                    return problem(StatusCode::BAD_REQUEST, &why);
                }
                let closed = shared.realtime.close_all(close.code, &close.reason);
                json(serde_json::to_vec(&serde_json::json!({"closed": closed})))
            }
            Err(e) => problem(StatusCode::BAD_REQUEST, &e.to_string()),
        },
        _ => problem(StatusCode::NOT_FOUND, "unknown control endpoint"),
    }
}

/// The body of `POST /__mock/realtime/close`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct CloseRequest {
    code: u16,
    #[serde(default)]
    reason: String,
}
