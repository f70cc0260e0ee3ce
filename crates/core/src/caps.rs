//! Spend caps and the admission rules that apply them: 402 at the line, 503 when spend cannot be
//! confirmed, never a refusal from a cap whose hard stop is off.

use crate::answer::Answer;
use crate::ids::{CapId, KeyId, OrgId};
use crate::money::Nanos;
use crate::timestamp::Timestamp;
use crate::window::Window;

/// What a cap covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    /// Every request of the organization.
    Organization,
    /// The requests of one key.
    Key,
}

impl Scope {
    /// The wire name, also the value of `x-recovea-budget-scope`: `organization`, `key`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Organization => "organization",
            Self::Key => "key",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "organization" => Some(Self::Organization),
            "key" => Some(Self::Key),
            _ => None,
        }
    }
}

/// A spend limit over a calendar window. With `hard_stop` on it is *armed*: it refuses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cap {
    pub id: CapId,
    pub org_id: OrgId,
    pub scope: Scope,
    /// Set exactly when `scope` is `Key`.
    pub key_id: Option<KeyId>,
    pub window: Window,
    pub limit: Nanos,
    pub hard_stop: bool,
    /// Alert thresholds as thousandths of the limit (500 = 50 %), ascending.
    pub alert_at_permille: Vec<u32>,
    pub alert_webhook: Option<String>,
}

impl Cap {
    /// Whether a request by `key` of `org` counts against this cap.
    pub fn covers(&self, org: &OrgId, key: &KeyId) -> bool {
        self.org_id == *org
            && match self.scope {
                Scope::Organization => true,
                Scope::Key => self.key_id.as_ref() == Some(key),
            }
    }
}

/// What a node knows of one cap's spend in one window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CapSpend {
    /// Confirmed spend in the window, plus this node's own spend not yet confirmed: a node's own
    /// requests count at once.
    pub spent: Nanos,
    /// In-flight reservations of requests other than the one being decided (this node's and other
    /// nodes').
    pub reserved: Nanos,
    /// When the counters were last confirmed against the shared store; `None`: never.
    pub confirmed_at: Option<Timestamp>,
}

/// The spend a decision reads: implemented by the node's counters.
pub trait SpendView {
    /// The spend of `cap`'s window starting at `window_start`; `org` is the cap's organization
    /// (a shared store keeps an organization's windows together).
    fn spend(&self, org: &OrgId, cap: &CapId, window_start: Timestamp) -> CapSpend;
}

/// The refusal of one armed cap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CapRefusal {
    /// Confirmed spend plus in-flight reservations is at or over the limit: 402.
    Exceeded { scope: Scope, window: Window },
    /// The counters were not confirmed recently enough to trust: 503, retry in a moment.
    Unverifiable { scope: Scope, window: Window },
    /// The request is billed where the gateway cannot see it (`request`: its method and endpoint,
    /// `POST /v1/fine_tuning/jobs`), and an armed cap covers its key: 402.
    Unmeterable { scope: Scope, window: Window, request: Box<str> },
    /// A batch whose estimated cost does not fit in the room the cap has left: 402, as
    /// `Exceeded`, with both figures.
    BatchExceeds { scope: Scope, window: Window, estimate: Nanos, room: Nanos },
}

impl CapRefusal {
    /// The exact answer the gateway gives for this refusal.
    pub fn answer(&self) -> Answer {
        match *self {
            Self::Exceeded { scope, window } => {
                Answer::budget_exceeded(scope.as_str(), window.as_str(), window.adjective())
            }
            Self::Unverifiable { scope, window } => {
                Answer::budget_unverifiable(scope.as_str(), window.as_str(), window.adjective())
            }
            Self::Unmeterable { scope, window, ref request } => {
                Answer::budget_unmeterable(scope.as_str(), window.as_str(), window.adjective(), request)
            }
            Self::BatchExceeds { scope, window, estimate, room } => {
                Answer::batch_exceeds(scope.as_str(), window.as_str(), window.adjective(), estimate, room)
            }
        }
    }

    pub fn cap_scope(&self) -> Scope {
        match *self {
            Self::Exceeded { scope, .. }
            | Self::Unverifiable { scope, .. }
            | Self::Unmeterable { scope, .. }
            | Self::BatchExceeds { scope, .. } => scope,
        }
    }

    pub fn cap_window(&self) -> Window {
        match *self {
            Self::Exceeded { window, .. }
            | Self::Unverifiable { window, .. }
            | Self::Unmeterable { window, .. }
            | Self::BatchExceeds { window, .. } => window,
        }
    }
}

/// Refuses a request billed where the gateway cannot see it (`request`: its method and endpoint)
/// when an armed cap covers the key, naming the first such cap; whatever its spend, since no
/// figure the gateway could count would hold that spend to the line. Without an armed cap it
/// passes, unmetered.
pub fn check_unmeterable<'c>(
    caps: impl IntoIterator<Item = &'c Cap>,
    org: &OrgId,
    key: &KeyId,
    request: &str,
) -> Result<(), CapRefusal> {
    match caps.into_iter().find(|cap| cap.hard_stop && cap.covers(org, key)) {
        Some(cap) => {
            Err(CapRefusal::Unmeterable { scope: cap.scope, window: cap.window, request: request.into() })
        }
        None => Ok(()),
    }
}

/// Checks every cap that covers the request (by `key` of `org`) at `now`.
///
/// A cap with `hard_stop` off never refuses and its spend is not even read. For each covering armed
/// cap, the spend of its current window (`cap.window.start(now)`) is read from `view`:
/// - counters never confirmed, or confirmed more than `max_age_ms` before `now`: `Unverifiable`
///   (exactly `max_age_ms` old is still fresh; a confirmation stamped after `now`, from clock skew
///   between nodes, counts as fresh);
/// - otherwise `spent + reserved >= limit`: `Exceeded`.
///
/// The request's own estimate is not in `reserved` (the caller reserves after admission), so a
/// request is never refused by its own estimate.
///
/// When several caps refuse, `Exceeded` wins over `Unverifiable`: a cap confirmed at its line is a
/// sure answer, and a caller told "retry in a second" would only be refused again by it, while the
/// stale cap may clear any moment. Among refusals of the same kind, the first in `caps` order wins.
pub fn check_caps<'c>(
    caps: impl IntoIterator<Item = &'c Cap>,
    org: &OrgId,
    key: &KeyId,
    view: &dyn SpendView,
    now: Timestamp,
    max_age_ms: i64,
) -> Result<(), CapRefusal> {
    check_caps_counting(caps, org, key, view, now, max_age_ms, Counting::Exact)
}

/// How a node's counters know other nodes' spend, which decides what its memory alone may refuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counting {
    /// No other node spends on these caps (`recovea serve` with in-process counters): the view
    /// is the truth, reservations included, and every check is made in memory.
    Exact,
    /// Other nodes spend on the same caps through a shared store: the reservations a node knows of
    /// other nodes may already have settled, so near the line the store decides (see
    /// [`line_check`] and [`decide_at_line`]). Memory alone refuses only spend that has been made.
    Shared,
}

/// [`check_caps`] for counters counted as `counting` says. With [`Counting::Shared`], a cap whose
/// spend plus reservations reached its limit is not refused here (the shared store decides at
/// the line), but one whose spend alone reached it is: spend in a window never goes down.
pub fn check_caps_counting<'c>(
    caps: impl IntoIterator<Item = &'c Cap>,
    org: &OrgId,
    key: &KeyId,
    view: &dyn SpendView,
    now: Timestamp,
    max_age_ms: i64,
    counting: Counting,
) -> Result<(), CapRefusal> {
    let mut unverifiable = None;
    for cap in caps.into_iter().filter(|cap| cap.hard_stop && cap.covers(org, key)) {
        let (scope, window) = (cap.scope, cap.window);
        let spend = view.spend(&cap.org_id, &cap.id, window.start(now));
        let fresh = spend.confirmed_at.is_some_and(|at| now.0.saturating_sub(at.0) <= max_age_ms);
        let committed = match counting {
            Counting::Exact => spend.spent.saturating_add(spend.reserved),
            Counting::Shared => spend.spent,
        };
        if !fresh {
            unverifiable.get_or_insert(CapRefusal::Unverifiable { scope, window });
        } else if committed >= cap.limit {
            return Err(CapRefusal::Exceeded { scope, window });
        }
    }
    unverifiable.map_or(Ok(()), Err)
}

/// Where one armed cap's check of a request is made when nodes share the cap's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineCheck {
    /// The room this node holds in the shared store for its own next requests (its *spare*,
    /// granted by the store only while far from the line) covers the request's estimate: it is
    /// decided in memory and paid from the spare, and no other node can have used that room.
    InMemory,
    /// The cap is within reach of its line (the node holds no spare that covers the request): the
    /// check and the reservation are one atomic step in the shared store, which the request waits
    /// for.
    AskStore,
}

/// Where an armed cap's check is made for a request of `estimate` on a node holding `spare`.
pub fn line_check(spare: Nanos, estimate: Nanos) -> LineCheck {
    if spare >= estimate { LineCheck::InMemory } else { LineCheck::AskStore }
}

/// What the shared store answered a request that asked it at the line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineAnswer {
    /// Every asked cap had room: the request's reservation is in the store.
    Reserved,
    /// The asked cap at this index is at its line: its spend plus the reservations of other
    /// requests reached its limit. Nothing was reserved.
    AtLine(usize),
    /// The line is reached only when the spare room other nodes hold for requests they have not
    /// received is counted; nothing was reserved. The holders give it back at their next sync,
    /// so the request asks again; still contended, its spend cannot be confirmed.
    Contended,
    /// The store holds no ledger-rebuilt total for a window (a new cap or window, a restart, a
    /// flush), so it cannot vouch for its spend; nothing was reserved. The node rebuilds the
    /// window from the ledger and seeds it, so the request asks again; still unseeded, its spend
    /// cannot be confirmed.
    Unseeded,
}

/// Decides the armed caps a request asked the shared store about, `asked[i]` being each cap with
/// this node's view of its spend (the request's own estimate not in it). The store's answer wins.
///
/// Without one (`None`: the store did not answer in time, or failed), when it stayed contended, or
/// when it still could not vouch for the window (unseeded: its rebuild from the ledger has not
/// landed), the node cannot know what the other nodes admitted meanwhile: deciding from its own
/// view would let every node spend the same room (a store slow by 150 ms left a new window
/// unseeded past the wait, and two nodes admitted twice the limit). It refuses `402` only spend
/// that has been made (a cap whose spend alone reached its limit), and otherwise answers that the
/// spend cannot be confirmed (`503`, retry in a moment): never admitted past the line, never
/// refused below it. Spend a node may make without the store is its spare room, decided in memory
/// before any ask ([`line_check`]).
pub fn decide_at_line(asked: &[(&Cap, CapSpend)], answer: Option<LineAnswer>) -> Result<(), CapRefusal> {
    let exceeded = |cap: &Cap| CapRefusal::Exceeded { scope: cap.scope, window: cap.window };
    match answer {
        Some(LineAnswer::Reserved) => Ok(()),
        Some(LineAnswer::AtLine(i)) => match asked.get(i) {
            Some((cap, _)) => Err(exceeded(cap)),
            // An index the request did not send: the answer is not about this request.
            None => decide_at_line(asked, None),
        },
        Some(LineAnswer::Contended | LineAnswer::Unseeded) | None => {
            match asked.iter().find(|(cap, spend)| spend.spent >= cap.limit) {
                Some((cap, _)) => Err(exceeded(cap)),
                None => Err(unconfirmed(asked)),
            }
        }
    }
}

/// One armed cap's spend as a decision at the line reads it ([`decide_at_line`],
/// [`decide_fit_at_line`]): `view`'s spend of the cap's window starting at `window_start`, its
/// reservations without the asking request's own `estimate`. A request waiting on the store at the
/// line is already pending in the node's view, so the view counts its estimate among the
/// reservations; the rules read the other requests' (a batch is checked against the room the others
/// left, and never finds its own estimate in the way). Reservations never read below zero.
pub fn spend_at_line(view: &dyn SpendView, cap: &Cap, window_start: Timestamp, estimate: Nanos) -> CapSpend {
    let spend = view.spend(&cap.org_id, &cap.id, window_start);
    CapSpend { reserved: Nanos(spend.reserved.0.saturating_sub(estimate.0).max(0)), ..spend }
}

/// The refusal of a request at the line whose spend could not be confirmed: named after the first
/// cap it asked about.
fn unconfirmed(asked: &[(&Cap, CapSpend)]) -> CapRefusal {
    let (scope, window) =
        asked.first().map_or((Scope::Organization, Window::Month), |(cap, _)| (cap.scope, cap.window));
    CapRefusal::Unverifiable { scope, window }
}

/// Whether a batch of `estimate` fits under every armed cap covering it, read from `view` (whose
/// `spent` holds the book's spend: pending jobs' holds and settled ones). With
/// [`Counting::Exact`] spend and reservations count; with [`Counting::Shared`] only spend, since
/// the reservations a node knows of others may have settled (the store decides the rest at the
/// line, [`decide_fit_at_line`]). Refused with the room the first cap that it does not fit has left.
pub fn check_fit<'c>(
    caps: impl IntoIterator<Item = &'c Cap>,
    org: &OrgId,
    key: &KeyId,
    view: &dyn SpendView,
    now: Timestamp,
    estimate: Nanos,
    counting: Counting,
) -> Result<(), CapRefusal> {
    for cap in caps.into_iter().filter(|cap| cap.hard_stop && cap.covers(org, key)) {
        let spend = view.spend(&cap.org_id, &cap.id, cap.window.start(now));
        let committed = match counting {
            Counting::Exact => spend.spent.saturating_add(spend.reserved),
            Counting::Shared => spend.spent,
        };
        batch_fits(cap, committed, estimate)?;
    }
    Ok(())
}

/// A batch's refusal by `cap` unless `committed` plus `estimate` stays at or below its limit.
fn batch_fits(cap: &Cap, committed: Nanos, estimate: Nanos) -> Result<(), CapRefusal> {
    crate::jobs::fits(cap.limit, committed, estimate).map_err(|room| CapRefusal::BatchExceeds {
        scope: cap.scope,
        window: cap.window,
        estimate,
        room,
    })
}

/// [`decide_at_line`] for a batch of `estimate`, which must fit: the store's `AtLine` names the
/// cap it does not fit (the room told from the node's view); without an answer, contended or
/// unseeded, the batch is refused when spend made leaves it no room, and cannot be confirmed
/// otherwise.
pub fn decide_fit_at_line(
    asked: &[(&Cap, CapSpend)],
    answer: Option<LineAnswer>,
    estimate: Nanos,
) -> Result<(), CapRefusal> {
    let committed = |spend: &CapSpend| spend.spent.saturating_add(spend.reserved);
    match answer {
        Some(LineAnswer::Reserved) => Ok(()),
        Some(LineAnswer::AtLine(i)) => match asked.get(i) {
            Some((cap, spend)) => {
                // The store saw it past the line; the node's view may be older: never say it fits.
                batch_fits(cap, committed(spend), estimate)?;
                Err(CapRefusal::BatchExceeds {
                    scope: cap.scope,
                    window: cap.window,
                    estimate,
                    room: crate::jobs::fits(cap.limit, committed(spend), Nanos(i64::MAX))
                        .err()
                        .unwrap_or(Nanos::ZERO),
                })
            }
            None => decide_fit_at_line(asked, None, estimate),
        },
        // As [`decide_at_line`]: only spend made refuses; the rest cannot be confirmed.
        Some(LineAnswer::Contended | LineAnswer::Unseeded) | None => {
            asked.iter().try_for_each(|(cap, spend)| batch_fits(cap, spend.spent, estimate))?;
            Err(unconfirmed(asked))
        }
    }
}

/// The most of an armed cap's limit that spare room may bring its spend and reservations to:
/// the last fifth of the line is decided request by request in the store, with no spare held.
pub fn spare_ceiling(limit: Nanos) -> Nanos {
    Nanos(limit.0.saturating_sub(limit.0 / 5))
}

/// The spare room a node asks the store to hold for its next requests on an armed cap's window,
/// given the room left below the line by everyone's spend and reservations (its own spare aside)
/// and what it admitted there since its last sync.
///
/// None within a fifth of the line: there every request asks the store, and no node holds room
/// that others would find taken. Farther away, twice the recent admissions, so that a node's
/// steady traffic is decided in memory, at least a sixteenth of the room, so that a first
/// request after a quiet spell is too, and at most a quarter of it, so that one node cannot take
/// the room of the others. The store grants it only below [`spare_ceiling`].
pub fn spare_wanted(limit: Nanos, room: Nanos, recent: Nanos) -> Nanos {
    let near = i128::from(room.0) * 5 <= i128::from(limit.0);
    if near || room <= Nanos::ZERO {
        return Nanos::ZERO;
    }
    let twice_recent = Nanos(recent.0.saturating_mul(2));
    twice_recent.max(Nanos(room.0 / 16)).min(Nanos(room.0 / 4))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::cell::RefCell;
    use std::collections::HashMap;

    const MAX_AGE: i64 = 60_000;
    /// 2026-03-17T12:00:00Z: its day starts at 2026-03-17, its week on Monday 2026-03-16, its month
    /// on 2026-03-01.
    const NOW: Timestamp = Timestamp(1_773_748_800_000);

    fn org() -> OrgId {
        OrgId::parse("org_a").expect("org id")
    }

    fn key() -> KeyId {
        KeyId::parse("key_a").expect("key id")
    }

    fn other_key() -> KeyId {
        KeyId::parse("key_b").expect("key id")
    }

    fn cap(id: &str, scope: Scope, window: Window, limit: i64, hard_stop: bool) -> Cap {
        Cap {
            id: CapId::parse(id).expect("cap id"),
            org_id: org(),
            scope,
            key_id: (scope == Scope::Key).then(key),
            window,
            limit: Nanos(limit),
            hard_stop,
            alert_at_permille: vec![500, 800, 1000],
            alert_webhook: None,
        }
    }

    fn armed(id: &str, scope: Scope, window: Window, limit: i64) -> Cap {
        cap(id, scope, window, limit, true)
    }

    fn soft(id: &str, scope: Scope, window: Window, limit: i64) -> Cap {
        cap(id, scope, window, limit, false)
    }

    /// Spend confirmed `age_ms` before `NOW`.
    fn confirmed(spent: i64, reserved: i64, age_ms: i64) -> CapSpend {
        CapSpend {
            spent: Nanos(spent),
            reserved: Nanos(reserved),
            confirmed_at: Some(Timestamp(NOW.0 - age_ms)),
        }
    }

    /// Counters keyed by cap and window start; anything else was never confirmed. Records what was read.
    #[derive(Default)]
    struct View {
        spend: HashMap<(CapId, Timestamp), CapSpend>,
        reads: RefCell<Vec<(CapId, Timestamp)>>,
    }

    impl View {
        /// Spend for `cap` in the window that contains `NOW`.
        fn with(mut self, cap: &Cap, spend: CapSpend) -> Self {
            self.spend.insert((cap.id.clone(), cap.window.start(NOW)), spend);
            self
        }
    }

    impl SpendView for View {
        fn spend(&self, _: &OrgId, cap: &CapId, window_start: Timestamp) -> CapSpend {
            self.reads.borrow_mut().push((cap.clone(), window_start));
            self.spend.get(&(cap.clone(), window_start)).copied().unwrap_or_default()
        }
    }

    fn check(caps: &[Cap], view: &View) -> Result<(), CapRefusal> {
        check_caps(caps, &org(), &key(), view, NOW, MAX_AGE)
    }

    fn exceeded(scope: Scope, window: Window) -> Result<(), CapRefusal> {
        Err(CapRefusal::Exceeded { scope, window })
    }

    fn unverifiable(scope: Scope, window: Window) -> Result<(), CapRefusal> {
        Err(CapRefusal::Unverifiable { scope, window })
    }

    #[test]
    fn no_caps_admit() {
        assert_eq!(check(&[], &View::default()), Ok(()));
    }

    #[test]
    fn spent_at_the_limit_refuses_and_one_nano_under_admits() {
        let month = armed("cap_m", Scope::Organization, Window::Month, 1_000);
        let at_limit = View::default().with(&month, confirmed(1_000, 0, 0));
        assert_eq!(
            check(std::slice::from_ref(&month), &at_limit),
            exceeded(Scope::Organization, Window::Month)
        );
        let over = View::default().with(&month, confirmed(5_000, 0, 0));
        assert_eq!(check(std::slice::from_ref(&month), &over), exceeded(Scope::Organization, Window::Month));
        let under = View::default().with(&month, confirmed(999, 0, 0));
        assert_eq!(check(std::slice::from_ref(&month), &under), Ok(()));
    }

    #[test]
    fn reservations_count() {
        let day = armed("cap_d", Scope::Key, Window::Day, 1_000);
        let full = View::default().with(&day, confirmed(600, 400, 0));
        assert_eq!(check(std::slice::from_ref(&day), &full), exceeded(Scope::Key, Window::Day));
        let room = View::default().with(&day, confirmed(600, 399, 0));
        assert_eq!(check(std::slice::from_ref(&day), &room), Ok(()));
        let only_reserved = View::default().with(&day, confirmed(0, 1_000, 0));
        assert_eq!(check(std::slice::from_ref(&day), &only_reserved), exceeded(Scope::Key, Window::Day));
    }

    #[test]
    fn huge_amounts_do_not_overflow() {
        let day = armed("cap_d", Scope::Key, Window::Day, i64::MAX);
        let view = View::default().with(&day, confirmed(i64::MAX, i64::MAX, 0));
        assert_eq!(check(std::slice::from_ref(&day), &view), exceeded(Scope::Key, Window::Day));
    }

    #[test]
    fn freshness_is_inclusive_of_max_age() {
        let week = armed("cap_w", Scope::Organization, Window::Week, 1_000);
        let exactly_max_age = View::default().with(&week, confirmed(0, 0, MAX_AGE));
        assert_eq!(check(std::slice::from_ref(&week), &exactly_max_age), Ok(()));
        let one_ms_over = View::default().with(&week, confirmed(0, 0, MAX_AGE + 1));
        assert_eq!(
            check(std::slice::from_ref(&week), &one_ms_over),
            unverifiable(Scope::Organization, Window::Week)
        );
        // A stale cap at its line is still unverifiable: the node does not enforce a figure it cannot trust.
        let stale_and_over = View::default().with(&week, confirmed(5_000, 0, MAX_AGE + 1));
        assert_eq!(
            check(std::slice::from_ref(&week), &stale_and_over),
            unverifiable(Scope::Organization, Window::Week)
        );
    }

    #[test]
    fn confirmed_in_the_future_counts_as_fresh() {
        let week = armed("cap_w", Scope::Organization, Window::Week, 1_000);
        let skewed = View::default().with(&week, confirmed(0, 0, -5_000));
        assert_eq!(check(std::slice::from_ref(&week), &skewed), Ok(()));
    }

    #[test]
    fn an_unmeterable_request_is_refused_by_any_armed_cap_whatever_its_spend() {
        let soft_month = soft("cap_s", Scope::Organization, Window::Month, 1_000);
        let armed_day = armed("cap_d", Scope::Key, Window::Day, 1_000);
        let request = "POST /v1/fine_tuning/jobs";
        assert_eq!(check_unmeterable(std::slice::from_ref(&soft_month), &org(), &key(), request), Ok(()));
        let both = [soft_month.clone(), armed_day.clone()];
        assert_eq!(
            check_unmeterable(&both, &org(), &key(), request),
            Err(CapRefusal::Unmeterable { scope: Scope::Key, window: Window::Day, request: request.into() })
        );
        // A key cap covers its own key only.
        assert_eq!(check_unmeterable(&both, &org(), &other_key(), request), Ok(()));
        let refusal = check_unmeterable(&both, &org(), &key(), request).expect_err("refused");
        assert_eq!(refusal.answer().status, 402);
        assert_eq!((refusal.cap_scope(), refusal.cap_window()), (Scope::Key, Window::Day));
    }

    #[test]
    fn a_batch_must_fit_in_the_room_each_armed_cap_has_left() {
        let month = armed("cap_m", Scope::Organization, Window::Month, 1_000);
        let soft_day = soft("cap_s", Scope::Key, Window::Day, 10);
        let caps = [soft_day, month.clone()];
        let view = View::default().with(&month, confirmed(600, 100, 0));
        let fit =
            |estimate, counting| check_fit(&caps, &org(), &key(), &view, NOW, Nanos(estimate), counting);
        assert_eq!(fit(300, Counting::Exact), Ok(()), "600 + 100 + 300 ends at the line");
        assert_eq!(
            fit(301, Counting::Exact),
            Err(CapRefusal::BatchExceeds {
                scope: Scope::Organization,
                window: Window::Month,
                estimate: Nanos(301),
                room: Nanos(300)
            }),
            "a soft cap never refuses; the armed one names its room"
        );
        // Shared counters: reservations may have settled, the store decides them at the line.
        assert_eq!(fit(400, Counting::Shared), Ok(()));
        assert!(fit(401, Counting::Shared).is_err());

        let asked = [(&month, confirmed(600, 100, 0))];
        let refused = |room| {
            Err(CapRefusal::BatchExceeds {
                scope: Scope::Organization,
                window: Window::Month,
                estimate: Nanos(200),
                room: Nanos(room),
            })
        };
        assert_eq!(decide_fit_at_line(&asked, Some(LineAnswer::Reserved), Nanos(200)), Ok(()));
        assert_eq!(decide_fit_at_line(&asked, Some(LineAnswer::AtLine(0)), Nanos(200)), refused(300));
        let unconfirmed = Err(CapRefusal::Unverifiable { scope: Scope::Organization, window: Window::Month });
        for answer in [None, Some(LineAnswer::Unseeded)] {
            assert_eq!(decide_fit_at_line(&asked, answer, Nanos(200)), unconfirmed, "not confirmed");
        }
        let full = [(&month, confirmed(900, 50, 0))];
        assert_eq!(decide_fit_at_line(&full, Some(LineAnswer::Unseeded), Nanos(200)), refused(100));
        // Spend made (900 of 1,000) leaves no room for 200: refused whatever the store says.
        assert_eq!(decide_fit_at_line(&full, Some(LineAnswer::Contended), Nanos(200)), refused(100));
        assert_eq!(decide_fit_at_line(&full, Some(LineAnswer::AtLine(7)), Nanos(200)), refused(100));
        // Only reservations stand in the way: they may have settled, so not confirmed.
        let reserved = [(&month, confirmed(700, 250, 0))];
        assert_eq!(decide_fit_at_line(&reserved, None, Nanos(200)), unconfirmed);
    }

    #[test]
    fn never_confirmed_is_unverifiable() {
        let month = armed("cap_m", Scope::Key, Window::Month, 1_000);
        let never = View::default()
            .with(&month, CapSpend { spent: Nanos::ZERO, reserved: Nanos::ZERO, confirmed_at: None });
        assert_eq!(check(std::slice::from_ref(&month), &never), unverifiable(Scope::Key, Window::Month));
        assert_eq!(
            check(std::slice::from_ref(&month), &View::default()),
            unverifiable(Scope::Key, Window::Month)
        );
    }

    #[test]
    fn soft_caps_never_refuse_and_are_not_read() {
        let caps = [
            soft("cap_1", Scope::Organization, Window::Month, 0),
            soft("cap_2", Scope::Key, Window::Day, 10),
        ];
        let view = View::default().with(&caps[1], confirmed(1_000, 1_000, 0));
        assert_eq!(check(&caps, &view), Ok(()));
        assert!(view.reads.borrow().is_empty());
    }

    #[test]
    fn spend_is_read_in_each_caps_current_window() {
        let caps = [
            armed("cap_d", Scope::Key, Window::Day, 1_000),
            armed("cap_w", Scope::Key, Window::Week, 1_000),
            armed("cap_m", Scope::Organization, Window::Month, 1_000),
        ];
        let view = caps.iter().fold(View::default(), |view, cap| view.with(cap, confirmed(0, 0, 0)));
        assert_eq!(check(&caps, &view), Ok(()));
        let start = |s: &str| Timestamp::parse_rfc3339(s).expect("instant");
        assert_eq!(
            *view.reads.borrow(),
            [
                (caps[0].id.clone(), start("2026-03-17T00:00:00Z")),
                (caps[1].id.clone(), start("2026-03-16T00:00:00Z")),
                (caps[2].id.clone(), start("2026-03-01T00:00:00Z")),
            ]
        );
    }

    #[test]
    fn key_caps_cover_only_their_key_and_org_caps_every_key() {
        let key_cap = armed("cap_k", Scope::Key, Window::Day, 0);
        let org_cap = armed("cap_o", Scope::Organization, Window::Day, 0);
        let view = View::default().with(&key_cap, confirmed(0, 0, 0)).with(&org_cap, confirmed(0, 0, 0));
        let by = |key: &KeyId, caps: &[Cap]| check_caps(caps, &org(), key, &view, NOW, MAX_AGE);
        assert_eq!(by(&key(), std::slice::from_ref(&key_cap)), exceeded(Scope::Key, Window::Day));
        assert_eq!(by(&other_key(), std::slice::from_ref(&key_cap)), Ok(()));
        assert_eq!(
            by(&other_key(), std::slice::from_ref(&org_cap)),
            exceeded(Scope::Organization, Window::Day)
        );
    }

    #[test]
    fn caps_of_other_organizations_are_ignored() {
        let mut foreign = armed("cap_f", Scope::Organization, Window::Month, 0);
        foreign.org_id = OrgId::parse("org_b").expect("org id");
        let mut foreign_key = armed("cap_g", Scope::Key, Window::Month, 0);
        foreign_key.org_id = OrgId::parse("org_b").expect("org id");
        let view = View::default();
        assert_eq!(check(&[foreign, foreign_key], &view), Ok(()));
        assert!(view.reads.borrow().is_empty());
    }

    #[test]
    fn exceeded_wins_over_unverifiable_whatever_the_order() {
        let stale = armed("cap_s", Scope::Key, Window::Day, 1_000);
        let full = armed("cap_f", Scope::Organization, Window::Month, 1_000);
        let view =
            View::default().with(&stale, confirmed(0, 0, MAX_AGE + 1)).with(&full, confirmed(1_000, 0, 0));
        let expected = exceeded(Scope::Organization, Window::Month);
        assert_eq!(check(&[stale.clone(), full.clone()], &view), expected);
        assert_eq!(check(&[full, stale], &view), expected);
    }

    #[test]
    fn among_equal_refusals_the_first_cap_wins() {
        let day = armed("cap_d", Scope::Key, Window::Day, 1_000);
        let month = armed("cap_m", Scope::Organization, Window::Month, 1_000);
        let both_full =
            View::default().with(&day, confirmed(1_000, 0, 0)).with(&month, confirmed(1_000, 0, 0));
        assert_eq!(check(&[day.clone(), month.clone()], &both_full), exceeded(Scope::Key, Window::Day));
        assert_eq!(
            check(&[month.clone(), day.clone()], &both_full),
            exceeded(Scope::Organization, Window::Month)
        );
        let both_stale = View::default();
        assert_eq!(check(&[day.clone(), month.clone()], &both_stale), unverifiable(Scope::Key, Window::Day));
        assert_eq!(check(&[month, day], &both_stale), unverifiable(Scope::Organization, Window::Month));
    }

    #[test]
    fn one_refusing_cap_among_several_refuses() {
        let caps = [
            armed("cap_1", Scope::Organization, Window::Month, 10_000),
            soft("cap_2", Scope::Key, Window::Day, 0),
            armed("cap_3", Scope::Key, Window::Week, 500),
        ];
        let view = View::default()
            .with(&caps[0], confirmed(9_000, 0, 0))
            .with(&caps[1], confirmed(1_000, 0, 0))
            .with(&caps[2], confirmed(500, 0, 0));
        assert_eq!(check(&caps, &view), exceeded(Scope::Key, Window::Week));
    }

    #[test]
    fn refusals_carry_their_answer() {
        let exceeded = CapRefusal::Exceeded { scope: Scope::Key, window: Window::Week };
        assert_eq!((exceeded.cap_scope(), exceeded.cap_window()), (Scope::Key, Window::Week));
        assert_eq!(exceeded.answer(), Answer::budget_exceeded("key", "week", "Weekly"));
        let unverifiable = CapRefusal::Unverifiable { scope: Scope::Organization, window: Window::Month };
        assert_eq!(
            (unverifiable.cap_scope(), unverifiable.cap_window()),
            (Scope::Organization, Window::Month)
        );
        assert_eq!(unverifiable.answer(), Answer::budget_unverifiable("organization", "month", "Monthly"));
        assert_eq!(unverifiable.answer().status, 503);
        assert_eq!(exceeded.answer().status, 402);
    }

    #[test]
    fn scope_names_round_trip() {
        for scope in [Scope::Organization, Scope::Key] {
            assert_eq!(Scope::parse(scope.as_str()), Some(scope));
        }
        assert_eq!(Scope::parse("org"), None);
    }

    #[test]
    fn shared_counting_leaves_reservations_to_the_store_but_refuses_spend_at_the_line() {
        let month = armed("cap_m", Scope::Organization, Window::Month, 1_000);
        let check = |view: &View| {
            check_caps_counting(
                std::slice::from_ref(&month),
                &org(),
                &key(),
                view,
                NOW,
                MAX_AGE,
                Counting::Shared,
            )
        };
        let reserved_full = View::default().with(&month, confirmed(600, 400, 0));
        assert_eq!(check(&reserved_full), Ok(()), "the store decides whether the reservations hold");
        let spent_full = View::default().with(&month, confirmed(1_000, 0, 0));
        assert_eq!(check(&spent_full), exceeded(Scope::Organization, Window::Month));
        let stale = View::default().with(&month, confirmed(0, 0, MAX_AGE + 1));
        assert_eq!(check(&stale), unverifiable(Scope::Organization, Window::Month));
    }

    #[test]
    fn a_request_is_decided_in_memory_only_when_the_spare_covers_it() {
        assert_eq!(line_check(Nanos(10), Nanos(10)), LineCheck::InMemory);
        assert_eq!(line_check(Nanos(11), Nanos(10)), LineCheck::InMemory);
        assert_eq!(line_check(Nanos(9), Nanos(10)), LineCheck::AskStore);
        assert_eq!(line_check(Nanos::ZERO, Nanos(1)), LineCheck::AskStore);
    }

    #[test]
    fn the_stores_answer_decides_at_the_line() {
        let day = armed("cap_d", Scope::Key, Window::Day, 1_000);
        let month = armed("cap_m", Scope::Organization, Window::Month, 1_000);
        let roomy = confirmed(0, 0, 0);
        let full = confirmed(900, 100, 0);
        let asked = [(&day, roomy), (&month, full)];
        assert_eq!(decide_at_line(&asked, Some(LineAnswer::Reserved)), Ok(()), "the store saw room");
        assert_eq!(decide_at_line(&asked, Some(LineAnswer::AtLine(0))), exceeded(Scope::Key, Window::Day));
        assert_eq!(
            decide_at_line(&asked, Some(LineAnswer::AtLine(1))),
            exceeded(Scope::Organization, Window::Month)
        );
        // No answer, a contended or unseeded one, or one about a cap that was not asked: what the
        // other nodes admitted meanwhile is unknown. Spend made at the limit refuses; anything else
        // is not confirmed, the first asked cap named, never admitted and never refused 402 below
        // the line.
        let unconfirmed = Err(CapRefusal::Unverifiable { scope: Scope::Key, window: Window::Day });
        let undecided =
            [None, Some(LineAnswer::Contended), Some(LineAnswer::Unseeded), Some(LineAnswer::AtLine(2))];
        for answer in undecided {
            assert_eq!(decide_at_line(&asked, answer), unconfirmed, "reservations are not spend");
            assert_eq!(decide_at_line(&[(&day, roomy), (&month, roomy)], answer), unconfirmed);
            let spent = [(&day, roomy), (&month, confirmed(1_000, 0, 0))];
            assert_eq!(decide_at_line(&spent, answer), exceeded(Scope::Organization, Window::Month));
        }
    }

    #[test]
    fn at_the_line_a_request_reads_the_reservations_of_the_others() {
        let day = armed("cap_day", Scope::Key, Window::Day, 1_000);
        // 300 reserved in the node's view: 100 of it the asking request's own, pending.
        let view = View::default().with(&day, confirmed(500, 300, 0));
        let spend = spend_at_line(&view, &day, day.window.start(NOW), Nanos(100));
        assert_eq!(spend, confirmed(500, 200, 0), "spend and confirmation as the view has them");
        assert_eq!(*view.reads.borrow(), [(day.id.clone(), day.window.start(NOW))], "the cap's own window");
        // A batch of 300 fits the room the others left (1000 - 500 - 200); counting its own 100
        // twice would have found 200 and refused it.
        assert_eq!(
            decide_fit_at_line(&[(&day, spend)], Some(LineAnswer::AtLine(0)), Nanos(300)),
            Err(CapRefusal::BatchExceeds {
                scope: Scope::Key,
                window: Window::Day,
                estimate: Nanos(300),
                room: Nanos(300)
            }),
            "the store saw the line; the room told is the others'"
        );
        // A view that somehow lost the estimate reads no reservations, never fewer than none.
        let lost = View::default().with(&day, confirmed(500, 40, 0));
        assert_eq!(spend_at_line(&lost, &day, day.window.start(NOW), Nanos(100)), confirmed(500, 0, 0));
    }

    #[test]
    fn spare_is_held_only_far_from_the_line() {
        let limit = Nanos(1_000_000);
        assert_eq!(spare_ceiling(limit), Nanos(800_000));
        // Within a fifth of the limit: none.
        assert_eq!(spare_wanted(limit, Nanos(200_000), Nanos(50_000)), Nanos::ZERO);
        assert_eq!(spare_wanted(limit, Nanos::ZERO, Nanos(1)), Nanos::ZERO);
        assert_eq!(spare_wanted(limit, Nanos(-5), Nanos(1)), Nanos::ZERO);
        // Farther: twice the recent admissions, between a sixteenth and a quarter of the room.
        assert_eq!(spare_wanted(limit, Nanos(800_000), Nanos(30_000)), Nanos(60_000));
        assert_eq!(spare_wanted(limit, Nanos(800_000), Nanos::ZERO), Nanos(50_000));
        assert_eq!(spare_wanted(limit, Nanos(800_000), Nanos(1_000_000)), Nanos(200_000));
        assert_eq!(spare_wanted(Nanos(i64::MAX), Nanos(i64::MAX), Nanos(i64::MAX)), Nanos(i64::MAX / 4));
    }

    /// A view that answers the same spend for every cap and window.
    struct Fixed(CapSpend);

    impl SpendView for Fixed {
        fn spend(&self, _: &OrgId, _: &CapId, _: Timestamp) -> CapSpend {
            self.0
        }
    }

    fn any_spend() -> impl Strategy<Value = CapSpend> {
        (any::<i64>(), any::<i64>(), proptest::option::of(any::<i64>())).prop_map(|(spent, reserved, at)| {
            CapSpend { spent: Nanos(spent), reserved: Nanos(reserved), confirmed_at: at.map(Timestamp) }
        })
    }

    fn any_cap(hard_stop: impl Strategy<Value = bool>) -> impl Strategy<Value = Cap> {
        (
            prop_oneof![Just(Scope::Organization), Just(Scope::Key)],
            prop_oneof![Just(Window::Day), Just(Window::Week), Just(Window::Month)],
            any::<i64>(),
            any::<bool>(),
            hard_stop,
        )
            .prop_map(|(scope, window, limit, for_other_key, hard_stop)| {
                let mut cap = cap("cap_p", scope, window, limit, hard_stop);
                if for_other_key && scope == Scope::Key {
                    cap.key_id = Some(other_key());
                }
                cap
            })
    }

    proptest! {
        /// Spare room is never wanted within a fifth of the line, and never more than a quarter of
        /// the room left, so that spare alone never takes a cap to its line.
        #[test]
        fn spare_stays_far_from_the_line(limit in 0_i64..i64::MAX, room in any::<i64>(), recent in any::<i64>()) {
            let wanted = spare_wanted(Nanos(limit), Nanos(room), Nanos(recent));
            prop_assert!(wanted >= Nanos::ZERO);
            prop_assert!(i128::from(wanted.0) * 4 <= i128::from(room.max(0)));
            if i128::from(room) * 5 <= i128::from(limit) {
                prop_assert_eq!(wanted, Nanos::ZERO);
            }
            prop_assert!(spare_ceiling(Nanos(limit)) <= Nanos(limit));
        }

        /// A reservation the store made always admits; a line the store found always refuses;
        /// without a sure answer only spend made refuses 402, and nothing is admitted.
        #[test]
        fn the_decision_at_the_line_follows_the_store_or_the_view(
            caps in proptest::collection::vec(any_cap(Just(true)), 1..4),
            spends in proptest::collection::vec(any_spend(), 4),
            at in 0_usize..4,
        ) {
            let asked: Vec<(&Cap, CapSpend)> = caps.iter().zip(spends.iter().copied()).collect();
            prop_assert_eq!(decide_at_line(&asked, Some(LineAnswer::Reserved)), Ok(()));
            let seen = |verdict: Result<(), CapRefusal>| verdict.err().map(|r| (r.cap_scope(), r.cap_window()));
            let spent = asked.iter().find(|(cap, s)| s.spent >= cap.limit);
            let unanswered = match spent {
                Some((cap, _)) => CapRefusal::Exceeded { scope: cap.scope, window: cap.window },
                None => CapRefusal::Unverifiable { scope: asked[0].0.scope, window: asked[0].0.window },
            };
            prop_assert_eq!(decide_at_line(&asked, None), Err(unanswered.clone()));
            prop_assert_eq!(decide_at_line(&asked, Some(LineAnswer::Contended)), Err(unanswered.clone()));
            prop_assert_eq!(decide_at_line(&asked, Some(LineAnswer::Unseeded)), Err(unanswered.clone()));
            let verdict = decide_at_line(&asked, Some(LineAnswer::AtLine(at)));
            match asked.get(at) {
                Some((cap, _)) => prop_assert_eq!(seen(verdict), Some((cap.scope, cap.window))),
                None => prop_assert_eq!(verdict, Err(unanswered)),
            }
        }
    }

    proptest! {
        /// Whatever the view says, a decision at the line reads the view's spend and
        /// confirmation as they are and reservations between none and the view's.
        #[test]
        fn spend_at_the_line_takes_only_the_estimate_away(spend in any_spend(), estimate in 0_i64..=i64::MAX) {
            let day = armed("cap_day", Scope::Key, Window::Day, 1_000);
            let read = spend_at_line(&Fixed(spend), &day, day.window.start(NOW), Nanos(estimate));
            prop_assert_eq!(read.spent, spend.spent);
            prop_assert_eq!(read.confirmed_at, spend.confirmed_at);
            prop_assert!(read.reserved >= Nanos::ZERO);
            prop_assert!(read.reserved <= spend.reserved.max(Nanos::ZERO));
        }

        /// A request pending at the line is in the view's reservations: what the rules read is
        /// the others' reservations exactly, so that a batch the store found at the line is told
        /// the room the others left, never that room less its own estimate.
        #[test]
        fn a_request_at_the_line_is_never_in_its_own_way(
            limit in 0_i64..1 << 60,
            spent in 0_i64..1 << 60,
            others in 0_i64..1 << 60,
            estimate in 0_i64..1 << 60,
            age in 0_i64..MAX_AGE,
        ) {
            let cap = armed("cap_p", Scope::Organization, Window::Month, limit);
            let view = Fixed(confirmed(spent, others + estimate, age));
            let read = spend_at_line(&view, &cap, cap.window.start(NOW), Nanos(estimate));
            prop_assert_eq!(read, confirmed(spent, others, age));
            let room = Nanos((limit - spent - others).max(0));
            let verdict = decide_fit_at_line(&[(&cap, read)], Some(LineAnswer::AtLine(0)), Nanos(estimate));
            let told = match verdict {
                Err(CapRefusal::BatchExceeds { room, .. }) => room,
                other => return Err(TestCaseError::fail(format!("{other:?}"))),
            };
            prop_assert_eq!(told, room);
        }
    }

    proptest! {
        #[test]
        fn a_soft_cap_never_refuses(
            caps in proptest::collection::vec(any_cap(Just(false)), 0..6),
            spend in any_spend(),
            now in any::<i64>(),
            max_age in any::<i64>(),
        ) {
            prop_assert_eq!(check_caps(&caps, &org(), &key(), &Fixed(spend), Timestamp(now), max_age), Ok(()));
        }

        /// The rule restated per cap: admitted exactly when every covering armed cap is fresh and
        /// under its limit; a refusal names a covering armed cap.
        #[test]
        fn admits_exactly_when_every_armed_cap_has_room(
            caps in proptest::collection::vec(any_cap(any::<bool>()), 0..6),
            spend in any_spend(),
            now in -4_000_000_000_000_i64..4_000_000_000_000,
            max_age in 0_i64..120_000,
        ) {
            let fresh = spend.confirmed_at.is_some_and(|at| i128::from(now) - i128::from(at.0) <= i128::from(max_age));
            let used = i128::from(spend.spent.0) + i128::from(spend.reserved.0);
            let refusing: Vec<&Cap> = caps
                .iter()
                .filter(|cap| cap.hard_stop && cap.covers(&org(), &key()))
                .filter(|cap| !fresh || used.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) >= i128::from(cap.limit.0))
                .collect();
            let verdict = check_caps(&caps, &org(), &key(), &Fixed(spend), Timestamp(now), max_age);
            match (&verdict, refusing.first()) {
                (Ok(()), None) => {}
                (Err(refusal), Some(first)) => {
                    prop_assert_eq!(refusal.cap_scope(), first.scope);
                    prop_assert_eq!(refusal.cap_window(), first.window);
                    prop_assert_eq!(matches!(refusal, CapRefusal::Unverifiable { .. }), !fresh);
                }
                _ => prop_assert!(false, "verdict {:?} but refusing caps {:?}", verdict, refusing),
            }
        }
    }
}
