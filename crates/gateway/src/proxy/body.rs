//! Phase read body, and what the body says: buffered within its limits, in room the node's body
//! budget gives its organization; then read once for its facts, its input estimate and whether
//! the provider could read it otherwise, its model named and held to the allowlists. A refused
//! request's small body is read and dropped ([`discard`]) so that its connection can carry the
//! next request.

use std::task::Poll;

use bytes::Bytes;
use http::HeaderMap;
use http::header;
use http_body::Body as _;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use recovea_core::ids::OrgId;
use recovea_core::models;
use recovea_providers::request_body::{self, BodyReading, RequestFacts};
use recovea_providers::usage::Surface;
use recovea_providers::{Route, headers};
use recovea_upstream::BoxError;

use super::RequestContext;
use crate::node::Shared;
use crate::refusal::Refusal;

/// The most of a refused request's body read just to keep its connection open.
const DISCARD_LIMIT: usize = 64 << 10;
const DISCARD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// Reads a refused request's body to its end when it is small and quick; whether it was.
pub(super) async fn discard<B>(body: B) -> bool
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    if body.is_end_stream() {
        return true;
    }
    if body.size_hint().lower() > DISCARD_LIMIT as u64 {
        return false;
    }
    matches!(
        tokio::time::timeout(DISCARD_TIMEOUT, Limited::new(body, DISCARD_LIMIT).collect()).await,
        Ok(Ok(_))
    )
}

/// Phase read body: buffered, within the size limit and the time limit, in room the node's body
/// budget gives `tenant` ([`crate::body_budget`]).
pub(super) async fn read<B>(
    shared: &Shared,
    tenant: Option<&OrgId>,
    request_headers: &HeaderMap,
    body: B,
) -> Result<Bytes, Refusal>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let limit = shared.config.max_body_bytes;
    let declared =
        request_headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit) || body.size_hint().lower() > limit {
        return Err(Refusal::BodyTooLarge(limit));
    }
    let mut body = std::pin::pin!(Limited::new(body, usize::try_from(limit).unwrap_or(usize::MAX)));
    // Most bodies come whole with the request's head (the gateway's own HTTP/1 server hands them
    // over so): one frame, nothing to collect, no room to hold and no timer. A timer costs more
    // than the read, and one due before the thread's next wake-up costs a system call to set.
    let first = match std::future::poll_fn(|cx| Poll::Ready(body.as_mut().poll_frame(cx))).await {
        Poll::Ready(None) => return Ok(Bytes::new()),
        Poll::Ready(Some(Err(e))) => return Err(body_refusal(&e, limit)),
        Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
            Ok(data) if body.is_end_stream() => return Ok(data),
            Ok(data) => data,
            Err(_) => Bytes::new(),
        },
        Poll::Pending => Bytes::new(),
    };
    let deadline = tokio::time::Instant::now() + shared.config.body_read_timeout;
    let budget = &shared.body_budget;
    let room_for = |bytes: u64| async move {
        tokio::time::timeout_at(deadline, budget.hold(tenant, bytes))
            .await
            .map_err(|_| Refusal::BodyMemoryBusy)
    };
    // Room for the whole body when it says its length; else for what came and a step more.
    let expected = declared.unwrap_or(first.len() as u64 + BODY_STEP).min(limit);
    let mut room = room_for(expected).await?;
    let mut buffer = Vec::with_capacity(usize::try_from(expected).unwrap_or(usize::MAX));
    buffer.extend_from_slice(&first);
    let read = async {
        while let Some(frame) = body.frame().await {
            let Ok(data) = frame.map_err(|e| body_refusal(&e, limit))?.into_data() else { continue };
            let needed = (buffer.len() + data.len()) as u64;
            if needed > room.bytes() {
                // Doubling, as a vector grows: the buffer is allocated to exactly the room held,
                // so what the budget counts is what the body takes, copied O(n) times in all.
                let grown = needed.max(room.bytes().saturating_mul(2)).min(limit.max(needed));
                room.merge(room_for(grown - room.bytes()).await?);
                buffer.reserve_exact(usize::try_from(room.bytes()).unwrap_or(usize::MAX) - buffer.len());
            }
            buffer.extend_from_slice(&data);
        }
        Ok(())
    };
    // Waiting for room counts in the body's time: a body that finds none in it is refused as
    // such (`room_for`'s own timeout is polled first), one that is not sent in it as late.
    tokio::time::timeout_at(deadline, read).await.map_err(|_| Refusal::BodyTimeout)??;
    Ok(room.keep(buffer))
}

/// The room a body that does not say its length asks for first, beyond what came with its head;
/// it doubles from there.
const BODY_STEP: u64 = 64 << 10;

/// The refusal of a body that failed to read: too long, or cut.
fn body_refusal(error: &BoxError, limit: u64) -> Refusal {
    if error.is::<LengthLimitError>() { Refusal::BodyTooLarge(limit) } else { Refusal::BodyUnreadable }
}

/// What the body says that the caps, the provider and the receipt need.
#[derive(Debug)]
pub(super) struct Read {
    pub(super) facts: RequestFacts,
    /// The input tokens estimated from the body.
    pub(super) input_tokens: u64,
}

/// What the body says, read once: its facts and its input estimate; for an admitted request, a
/// body the provider could read otherwise, a model name that is not bounded and printable, and a
/// model its key or organization may not use are refused, before the caps and the provider.
pub(super) fn inspect(
    ctx: &mut RequestContext,
    request_headers: &HeaderMap,
    route: &Route<'_>,
    endpoint: &str,
    surface: Surface,
    body: &Bytes,
) -> Result<Read, Refusal> {
    // One parse gives the facts and the input estimate that the caps and the receipt both need,
    // and whether the provider could read the body otherwise.
    let BodyReading { mut facts, input_tokens, ambiguity } = request_body::read(body);
    if let Some(ambiguity) = ambiguity
        && ctx.admitted.is_some()
        && !recovea_providers::body_is_a_file(endpoint)
    {
        // Before the allowlist, the caps and the provider: what the gateway read (its model, its
        // stream, its limits) may not be what the provider runs. A fail-open pass reads nothing
        // and goes as sent.
        ctx.trace.request(endpoint, None);
        return Err(Refusal::AmbiguousBody(ambiguity));
    }
    let content_type = || request_headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok());
    if let Some(media) = recovea_providers::media::read(surface, content_type, body) {
        // Images and audio: what the answer may not carry (size, quality, `n`, characters, the
        // audio's length), and the model of a multipart form, which the JSON read cannot see.
        if facts.model.is_none() {
            facts.model = media.model;
        }
        facts.media = Some(Box::new(media.request));
    }
    if facts.model.is_none() {
        // Gemini names the model in the path (`models/{model}:generateContent`), a Realtime
        // session in its query (`?model=`, Azure's `deployment=`).
        facts.model = recovea_providers::usage::model_in_path(endpoint)
            .or_else(|| {
                headers::is_websocket_upgrade(request_headers)
                    .then(|| recovea_providers::realtime::model_in_query(route.upstream_path))
                    .flatten()
            })
            .map(str::to_owned);
    }
    if ctx.admitted.is_some() {
        // Whatever names the model, the body or the path, reaches the receipt, the log line and
        // the span: bounded and printable before anything else is done with it.
        let runs = recovea_providers::model_the_provider_runs(endpoint, None);
        if facts.model.iter().map(String::as_str).chain(runs).any(|m| !models::is_well_formed_name(m)) {
            ctx.trace.request(endpoint, None);
            return Err(Refusal::ModelName);
        }
    }
    ctx.trace.request(endpoint, facts.model.as_deref());
    if let Some(admitted) = &ctx.admitted {
        // Phase model allowlist. The model the provider runs: Azure's deployment and Gemini's
        // model in the path outrank whatever the body names.
        let runs = recovea_providers::model_the_provider_runs(endpoint, facts.model.as_deref());
        if !admitted.allows_model(runs) {
            // Before the caps and the provider: nothing is reserved, called or metered.
            let refused = runs.unwrap_or_default().to_owned();
            ctx.refused_model = Some(refused.clone());
            return Err(Refusal::ModelNotAllowed(refused));
        }
    }
    Ok(Read { facts, input_tokens })
}

#[cfg(test)]
mod tests {
    use recovea_core::admission::{Decision, admit};
    use recovea_core::ids::KeyId;
    use recovea_core::keys::hash_secret;
    use recovea_core::models::ModelAllowlist;
    use recovea_core::snapshot::SnapshotBuilder;
    use recovea_core::{Credential, CredentialHeader, Timestamp};
    use recovea_providers::request_body::Ambiguity;

    use super::*;

    const SECRET: &str = "rk_0000000000000000000000000000000000000000body";

    /// A context of a request admitted for a key whose organization may use `allowed` models.
    fn admitted(allowed: Option<&[&str]>) -> RequestContext {
        let org = OrgId::parse("org_a").expect("id");
        let mut snapshot = SnapshotBuilder::new(1);
        snapshot.org(org.clone());
        snapshot.key(hash_secret(SECRET), KeyId::parse("key_a").expect("id"), org.clone(), None);
        if let Some(models) = allowed {
            let list = ModelAllowlist::parse(models.iter().map(|m| (*m).to_owned()).collect()).expect("list");
            snapshot.org_allowed_models(org, list);
        }
        let snapshot = snapshot.build();
        let credential = Credential { secret: SECRET, header: CredentialHeader::AuthorizationBearer };
        let Decision::Admit(admitted) = admit(Some(&snapshot), Some(credential), Timestamp(0)) else {
            panic!("the key is the snapshot's");
        };
        let mut ctx = RequestContext::new(Timestamp(0));
        ctx.admitted = Some(admitted);
        ctx
    }

    /// The body phase on `body` sent to `path`, in `ctx`.
    fn read(ctx: &mut RequestContext, path: &str, surface: Surface, body: &str) -> Result<Read, Refusal> {
        let route = recovea_providers::route_for(path, false).expect("a route");
        let endpoint = recovea_core::endpoints::endpoint_of(route.upstream_path);
        inspect(ctx, &HeaderMap::new(), &route, endpoint, surface, &Bytes::copy_from_slice(body.as_bytes()))
    }

    const CHAT: &str = "/v1/chat/completions";

    #[test]
    fn an_admitted_body_with_two_readings_is_refused_and_a_pass_goes_as_sent() {
        let twice = r#"{"model":"gpt-4o-mini","model":"gpt-4o","messages":[]}"#;
        let refused = read(&mut admitted(None), CHAT, Surface::ChatCompletions, twice);
        assert!(
            matches!(&refused, Err(Refusal::AmbiguousBody(Ambiguity::RepeatedMember(m))) if m == "model"),
            "{refused:?}"
        );
        // A fail-open pass has no key to refuse for: its body goes to the provider as sent.
        let pass = read(&mut RequestContext::new(Timestamp(0)), CHAT, Surface::ChatCompletions, twice);
        assert!(pass.is_ok(), "{pass:?}");
    }

    #[test]
    fn the_model_comes_from_the_body_else_the_path() {
        let body = r#"{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}"#;
        let read_chat = read(&mut admitted(None), CHAT, Surface::ChatCompletions, body).expect("read");
        assert_eq!(read_chat.facts.model.as_deref(), Some("gpt-4o"));
        assert!(read_chat.input_tokens > 0);
        let gemini = "/v1beta/models/gemini-2.0-flash:generateContent";
        let read_gemini =
            read(&mut admitted(None), gemini, Surface::GenerateContent, r#"{"contents":[]}"#).expect("read");
        assert_eq!(read_gemini.facts.model.as_deref(), Some("gemini-2.0-flash"));
    }

    #[test]
    fn a_model_outside_the_allowlist_or_unprintable_is_refused_before_the_caps() {
        let mut ctx = admitted(Some(&["gpt-4o-mini"]));
        let refused = read(&mut ctx, CHAT, Surface::ChatCompletions, r#"{"model":"gpt-4o","messages":[]}"#);
        assert!(matches!(&refused, Err(Refusal::ModelNotAllowed(m)) if m == "gpt-4o"), "{refused:?}");
        assert_eq!(ctx.refused_model.as_deref(), Some("gpt-4o"), "the log line names it");
        let allowed =
            read(&mut ctx, CHAT, Surface::ChatCompletions, r#"{"model":"gpt-4o-mini","messages":[]}"#);
        assert!(allowed.is_ok(), "{allowed:?}");
        let bell = read(
            &mut admitted(None),
            CHAT,
            Surface::ChatCompletions,
            r#"{"model":"gpt\u0007","messages":[]}"#,
        );
        assert!(matches!(bell, Err(Refusal::ModelName)), "{bell:?}");
    }
}
