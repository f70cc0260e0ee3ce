//! Phase check spend: what an admitted request may spend, by its channel. A request whose answer
//! carries its usage is checked against every cap covering it and reserves its estimate; a free
//! one reserves nothing; a deferred job reserves its whole estimate (a batch must fit below the
//! line) and holds it until it settles; one billed where the gateway cannot see it is refused
//! while an armed cap covers the key.

use std::time::Duration;

use http::HeaderMap;
use recovea_core::admission::Admitted;
use recovea_core::caps;
use recovea_core::channel::{Channel, JobKind, Unseen};
use recovea_core::estimate;
use recovea_core::ids::CapId;
use recovea_core::jobs::book_key;
use recovea_core::money::Nanos;
use recovea_core::pricing::PriceScope;
use recovea_core::snapshot::Prices;
use recovea_core::timestamp::Timestamp;
use recovea_counters::Reservation;
use recovea_providers::jobs as provider_jobs;
use recovea_providers::request_body::RequestFacts;

use crate::line::{self, Ask};
use crate::metering::{Charge, Creating};
use crate::node::Shared;
use crate::refusal::Refusal;

/// How long a batch naming an input file the node has not seen waits for the book to bring it
/// (uploaded through another node a moment ago) before it is taken for a file never seen.
const FILE_WAIT: Duration = Duration::from_secs(2);

/// What the phase needs to know of an admitted request.
pub(crate) struct Request<'r> {
    pub(crate) channel: Channel,
    /// The method and endpoint, `POST /v1/fine_tuning/jobs`, for a refusal's message.
    pub(crate) line: String,
    pub(crate) headers: &'r HeaderMap,
    pub(crate) body: &'r [u8],
    pub(crate) facts: &'r RequestFacts,
    pub(crate) input_tokens: u64,
    pub(crate) prices: &'r Prices,
    /// Where the credential prices its models.
    pub(crate) scope: &'r PriceScope,
    /// The organization, and the credential the request goes through, whose account runs what
    /// it creates: where the book keeps its jobs and files.
    pub(crate) org_id: &'r str,
    pub(crate) credential: &'r str,
    /// The organization's managed key is used: the gateway can poll what the request creates.
    pub(crate) managed: bool,
    pub(crate) now: Timestamp,
}

/// What the phase decided: how the receipt is charged, the reservation on the caps covering the
/// request (with the caps it was made on), and what the request creates.
#[derive(Default)]
pub(crate) struct Spend {
    pub(crate) charge: Charge,
    pub(crate) reservation: Option<(Reservation, Vec<CapId>)>,
    pub(crate) creating: Option<Creating>,
    /// A Realtime session, admitted: the relay meters its responses.
    pub(crate) session: bool,
}

/// The phase for an admitted request.
pub(crate) async fn decide(
    shared: &Shared,
    admitted: &Admitted,
    request: Request<'_>,
) -> Result<Spend, Refusal> {
    match request.channel {
        Channel::Immediate => {
            let ask = Ask { estimate: request_estimate(&request, admitted.under_armed_cap()), fit: false };
            Ok(Spend {
                reservation: line::check_caps(shared, admitted, ask, request.now).await?,
                ..Spend::default()
            })
        }
        // Admitted at an armed cap's line and while spend cannot be confirmed: it reserves
        // nothing, and its receipt costs nothing. A batch's input file is estimated as it goes.
        Channel::Free => Ok(Spend {
            charge: Charge::Free,
            creating: uploaded_batch(&request).map(Creating::BatchFile),
            ..Spend::default()
        }),
        Channel::Deferred(kind) => match job_estimate(shared, admitted, kind, &request).await {
            Some(held) => {
                let ask = Ask { estimate: held, fit: kind.is_batch() };
                let reservation = line::check_caps(shared, admitted, ask, request.now).await?;
                // A background response is metered as any answer when it comes back done; a
                // batch's creation itself costs nothing.
                let charge = if kind.is_batch() { Charge::Free } else { Charge::Metered };
                Ok(Spend {
                    charge,
                    reservation,
                    creating: Some(Creating::Job { kind, held }),
                    session: false,
                })
            }
            // Not estimable, but the gateway holds the credential it runs under: without an
            // armed cap it is forwarded, holds nothing, and is settled when it ends.
            // (Only a batch: a background response is always estimable.)
            None if request.managed => {
                caps::check_unmeterable(
                    admitted.org.caps.iter(),
                    &admitted.org.id,
                    &admitted.key_id,
                    &request.line,
                )
                .map_err(Refusal::Budget)?;
                Ok(Spend {
                    charge: Charge::Free,
                    creating: Some(Creating::Job { kind, held: Nanos::ZERO }),
                    ..Spend::default()
                })
            }
            None => unmeterable(shared, admitted, &request, Unseen::UnmeterableJob(kind)),
        },
        // The upgrade is refused at the line like any request; each response then asks again.
        Channel::Session => {
            let (org, key) = (&admitted.org.id, &admitted.key_id);
            let max_age_ms = i64::try_from(shared.config.counter_max_age.as_millis()).unwrap_or(i64::MAX);
            let counters = shared.counters.as_ref();
            caps::check_caps_counting(
                admitted.org.caps.iter(),
                org,
                key,
                counters,
                request.now,
                max_age_ms,
                counters.counting(),
            )
            .map_err(Refusal::Budget)?;
            Ok(Spend { session: true, ..Spend::default() })
        }
        Channel::OutsideSight(unseen) => unmeterable(shared, admitted, &request, unseen),
    }
}

/// A request billed where the gateway cannot see it: refused while an armed cap covers the key,
/// otherwise let through, unmetered and counted.
fn unmeterable(
    shared: &Shared,
    admitted: &Admitted,
    request: &Request<'_>,
    unseen: Unseen,
) -> Result<Spend, Refusal> {
    caps::check_unmeterable(admitted.org.caps.iter(), &admitted.org.id, &admitted.key_id, &request.line)
        .map_err(Refusal::Budget)?;
    shared.metrics.unmetered(unseen);
    Ok(Spend { charge: Charge::Unmetered, ..Spend::default() })
}

/// A request's typical estimate and worst case (`core::estimate`): its estimated input, its
/// output limit, the tier it asked and its web search calls, at its model's price.
/// What the request reserves: its worst case under an armed cap, its typical estimate otherwise
/// (`estimate::reserved`'s rule), the other left unpriced.
fn request_estimate(request: &Request<'_>, under_armed_cap: bool) -> Nanos {
    let facts = request.facts;
    let table = &request.prices.table;
    let mut price = table.price_in(facts.model.as_deref(), request.scope).price;
    // An images or audio request reserves what it asks for: its images at their size and
    // quality, the characters it speaks, the seconds it sends.
    let media = match facts.media.as_deref() {
        Some(media) => {
            price = media.price(table, facts.model.as_deref(), request.scope, price);
            media.unreported_usage(&price).0
        }
        None => recovea_core::usage::Usage::default(),
    };
    let ask = estimate::Ask {
        input_tokens: request.input_tokens,
        output_limit: facts.max_output_tokens,
        tier: facts.service_tier,
        web_search: facts.web_search,
        tool_call_limit: facts.tool_call_limit,
        media,
        file_search: facts.file_search,
        code_interpreter: facts.code_interpreter,
        max_tool_calls: facts.max_tool_calls,
    };
    estimate::estimate(&price, &ask, under_armed_cap)
}

/// What a deferred job is held at; `None` when the gateway cannot estimate it (an input file it
/// never saw, a Gemini batch from a file) or poll it (the client's own provider key).
async fn job_estimate(
    shared: &Shared,
    admitted: &Admitted,
    kind: JobKind,
    request: &Request<'_>,
) -> Option<Nanos> {
    if !request.managed {
        return None;
    }
    let table = &request.prices.table;
    let input = match kind {
        // Held at what a request in the foreground reserves.
        JobKind::BackgroundResponse => {
            return Some(request_estimate(request, admitted.under_armed_cap()));
        }
        JobKind::OpenAiBatch => {
            let file = provider_jobs::batch_input_file(request.body)?;
            let key = book_key(request.org_id, request.credential, &file);
            shared.jobs.batch_file(&key, FILE_WAIT).await?
        }
        JobKind::AnthropicBatch | JobKind::GeminiBatch => {
            provider_jobs::inline_batch(kind, request.body, request.facts.model.as_deref())?
        }
    };
    Some(input.estimate(table, request.scope))
}

/// The estimate of a batch input file this request uploads (`POST /v1/files`, purpose `batch`).
fn uploaded_batch(request: &Request<'_>) -> Option<recovea_core::jobs::BatchInput> {
    let path = recovea_core::channel::api_path(request.line.split_once(' ').map_or("", |(_, path)| path));
    if !request.line.starts_with("POST ") || path != "files" {
        return None;
    }
    let content_type = request.headers.get(http::header::CONTENT_TYPE)?.to_str().ok()?;
    provider_jobs::uploaded_batch(content_type, request.body)
}
