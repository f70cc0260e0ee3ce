//! A request at the caps covering it: checked against each (armed caps refuse, soft caps never
//! do) and, admitted, its estimate reserved; then, when it ends, its reservation settled at its
//! cost. The proxy's spend phase asks it once per request, the Realtime relay once per response.

use std::sync::Arc;

use recovea_core::admission::Admitted;
use recovea_core::caps::{self, Cap};
use recovea_core::ids::CapId;
use recovea_core::money::Nanos;
use recovea_core::timestamp::Timestamp;
use recovea_counters::{CapWindow, Covered, Reservation};

use crate::metering::{Settle, Settled};
use crate::node::{Shared, cap_window};
use crate::refusal::Refusal;

/// What a request asks of the caps: the estimate it reserves (its worst case while an armed cap
/// covers it, [`Admitted::under_armed_cap`]; its typical estimate otherwise), and whether the estimate must
/// fit below each armed line (a batch) rather than find the line not yet reached (a request).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ask {
    pub(crate) estimate: Nanos,
    pub(crate) fit: bool,
}

/// Phase check caps: every cap covering the caller, read against the node's counters (armed caps
/// refuse, soft caps never do); an admitted request then reserves its estimated cost on each
/// covering cap's window. On counters no other node shares, the check and the reservation are one
/// step in memory (no await between them). On shared counters, an armed cap the node's spare
/// room does not cover is within reach of its line: there the request waits for the shared
/// store, which checks and reserves in one atomic step (`Counters::ask_at_line`); without a sure
/// answer in time its spend cannot be confirmed (`caps::decide_at_line`). A batch must fit: its whole
/// estimate below each armed line.
pub(crate) async fn check_caps(
    shared: &Shared,
    admitted: &Admitted,
    ask: Ask,
    now: Timestamp,
) -> Result<Option<(Reservation, Vec<CapId>)>, Refusal> {
    let (org, key) = (&admitted.org.id, &admitted.key_id);
    let covering: Vec<&Cap> = admitted.org.caps.iter().filter(|cap| cap.covers(org, key)).collect();
    if covering.is_empty() {
        return Ok(None);
    }
    let counters = &shared.counters;
    let max_age_ms = i64::try_from(shared.config.counter_max_age.as_millis()).unwrap_or(i64::MAX);
    let counting = counters.counting();
    caps::check_caps_counting(
        covering.iter().copied(),
        org,
        key,
        counters.as_ref(),
        now,
        max_age_ms,
        counting,
    )
    .map_err(Refusal::Budget)?;
    if ask.fit {
        caps::check_fit(covering.iter().copied(), org, key, counters.as_ref(), now, ask.estimate, counting)
            .map_err(Refusal::Budget)?;
    }
    let covered: Vec<Covered> = covering
        .iter()
        .map(|cap| Covered { window: cap_window(cap, now), line: cap.hard_stop.then_some(cap.limit) })
        .collect();
    let mut reservation = if ask.fit {
        counters.reserve_to_fit(&covered, ask.estimate, now)
    } else {
        counters.reserve(&covered, ask.estimate, now)
    };
    if reservation.is_pending() {
        let answer = counters.ask_at_line(&mut reservation, now).await;
        shared.metrics.line_ask(answer);
        let asked: Vec<(&Cap, caps::CapSpend)> = reservation
            .pending()
            .into_iter()
            .filter_map(|(id, start)| {
                let cap = covering.iter().find(|cap| cap.id == id)?;
                Some((*cap, caps::spend_at_line(counters.as_ref(), cap, start, ask.estimate)))
            })
            .collect();
        // Refused: the reservation is dropped, and with it the request's pending estimate.
        let decided = if ask.fit {
            caps::decide_fit_at_line(&asked, answer, ask.estimate)
        } else {
            caps::decide_at_line(&asked, answer)
        };
        shared.metrics.line_decided(decided.is_ok());
        decided.map_err(Refusal::Budget)?;
        reservation.hold_at_line();
    }
    let reserved = covering.iter().map(|cap| cap.id.clone()).collect();
    Ok(Some((reservation, reserved)))
}

/// What a finished request's receipt settles: its cap reservation; the caps that cover it but
/// were created after it was admitted (their windows were seeded from a ledger that lacked it);
/// and its key's token lane.
pub(crate) fn settle(
    shared: &Arc<Shared>,
    admitted: &Admitted,
    reservation: Option<(Reservation, Vec<CapId>)>,
) -> Settle {
    let (org, key, limits) = (admitted.org.id.clone(), admitted.key_id.clone(), admitted.limits);
    let shared = Arc::clone(shared);
    Box::new(move |settled: Settled| {
        let Settled { cost, tokens, started_at, job } = settled;
        let reserved = match (reservation, job) {
            // The job it created holds the reservation until the book of jobs does.
            (Some((reservation, caps)), Some(job)) => {
                shared.jobs.hold(job, reservation);
                caps
            }
            (Some((reservation, caps)), None) => {
                reservation.settle(cost);
                caps
            }
            (None, _) => Vec::new(),
        };
        if let Some(snapshot) = shared.snapshot.load().as_deref()
            && let Some(current) = snapshot.org(&org)
        {
            let unreserved: Vec<CapWindow> = current
                .caps
                .iter()
                .filter(|cap| cap.covers(&org, &key) && !reserved.contains(&cap.id))
                .map(|cap| cap_window(cap, started_at))
                .collect();
            if !unreserved.is_empty() {
                shared.counters.add(&unreserved, cost, started_at);
            }
        }
        shared.limiter.charge_tokens(&key, limits, tokens);
    })
}
