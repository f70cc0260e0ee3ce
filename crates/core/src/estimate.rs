//! What a request reserves on the caps covering it before its answer is known: its *typical*
//! estimate, and its *worst* case, the most the request can cost as it was asked.
//!
//! Both take the request's estimated input at the rates its input reaches (the long context's
//! past the model's threshold), its built-in tool calls at their fee (the request's call limit,
//! else [`DEFAULT_TOOL_CALLS`]), and differ in two parts only:
//!
//! - **output**: the request's output limit in both; without one, [`DEFAULT_OUTPUT_ESTIMATE`]
//!   tokens for the typical estimate, the model's most output ([`Price::max_output_tokens`], else
//!   [`UNKNOWN_MAX_OUTPUT`], as a batch's lines) for the worst case;
//! - **tier**: the tier the request named in both (`flex`, `priority`, `default`); a request that
//!   leaves the tier to the provider (OpenAI's `auto` or no `service_tier`, Anthropic's `auto`)
//!   is typically served at the standard tier, and at worst at priority (a project or an
//!   organization with priority capacity gets it).
//!
//! [`reserved`] chooses between them: the worst case under an armed cap, the typical estimate
//! otherwise.

pub use crate::jobs::UNKNOWN_MAX_OUTPUT;
use crate::money::Nanos;
use crate::pricing::{self, Price, ServiceTier};
use crate::usage::Usage;

/// A request that sets no output limit is typically reserved as if it produced this much.
pub const DEFAULT_OUTPUT_ESTIMATE: u64 = 1024;

/// The calls reserved for a built-in web search tool the request sets no call limit for
/// (`max_tool_calls`, Anthropic's `max_uses`).
pub const DEFAULT_TOOL_CALLS: u64 = 5;

/// The tier a request asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum TierAsked {
    /// Named: `default` (OpenAI), `standard_only` (Anthropic), `flex`, `priority` (and `fast`, its
    /// other name).
    Named(ServiceTier),
    /// Left to the provider: OpenAI's `auto` or no `service_tier`, Anthropic's `auto` or none,
    /// and any name the gateway does not know. Standard typically, priority at worst.
    #[default]
    Provider,
}

impl TierAsked {
    /// A request's `service_tier` as OpenAI and Anthropic name it; `None`: the member is absent.
    pub fn parse(name: Option<&str>) -> TierAsked {
        match name {
            Some("default" | "standard_only" | "standard") => TierAsked::Named(ServiceTier::Standard),
            Some("flex") => TierAsked::Named(ServiceTier::Flex),
            Some("priority" | "fast") => TierAsked::Named(ServiceTier::Priority),
            _ => TierAsked::Provider,
        }
    }
}

/// What a request asks of its model, as its body says before it is forwarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Ask {
    /// Estimated input tokens.
    pub input_tokens: u64,
    /// `max_tokens` and the like; `None`: the request sets no output limit.
    pub output_limit: Option<u64>,
    pub tier: TierAsked,
    /// A built-in web search tool is offered.
    pub web_search: bool,
    /// The request's limit on built-in tool calls (`max_tool_calls`, `max_uses`).
    pub tool_call_limit: Option<u64>,
    /// A file search tool is offered (billed per call: `max_tool_calls`, or the default, of them)
    /// and a code interpreter (billed per container session: one).
    pub file_search: bool,
    pub code_interpreter: bool,
    /// `max_tool_calls` alone (a web search tool's `max_uses` does not bound the others).
    pub max_tool_calls: Option<u64>,
    /// What an images or audio request says it will be billed for beyond tokens (its images, the
    /// characters it speaks, the seconds it transcribes: `MediaRequest::unreported_usage`).
    pub media: Usage,
}

/// A request's two estimates; `worst >= typical` always.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Estimates {
    pub typical: Nanos,
    pub worst: Nanos,
}

/// The request's typical estimate and worst case at `price`.
pub fn estimates(price: &Price, ask: &Ask) -> Estimates {
    Estimates { typical: estimate(price, ask, false), worst: estimate(price, ask, true) }
}

/// One of the request's [`Estimates`]: its worst case, or its typical estimate. The request path
/// prices only the one it reserves ([`reserved`]'s rule).
pub fn estimate(price: &Price, ask: &Ask, worst: bool) -> Nanos {
    let calls = match (ask.web_search, price.web_search_per_prompt) {
        (false, _) => 0,
        // Gemini 2's grounding: one fee per prompt, however many queries it runs.
        (true, true) => 1,
        (true, false) => ask.tool_call_limit.unwrap_or(DEFAULT_TOOL_CALLS),
    };
    let output = match (ask.output_limit, worst) {
        (Some(limit), _) => limit,
        (None, false) => DEFAULT_OUTPUT_ESTIMATE,
        (None, true) => price.max_output_tokens.unwrap_or(UNKNOWN_MAX_OUTPUT).max(DEFAULT_OUTPUT_ESTIMATE),
    };
    // The media's own quantities, with the request's tokens and tool calls added: every request
    // prices this, so it is built in place rather than summed field by field.
    let at = |service_tier: ServiceTier, price: &Price| {
        let mut usage = ask.media;
        usage.input_tokens = usage.input_tokens.saturating_add(ask.input_tokens);
        usage.output_tokens = usage.output_tokens.saturating_add(output);
        usage.web_search_calls = usage.web_search_calls.saturating_add(calls);
        if ask.file_search {
            let limit = ask.max_tool_calls.unwrap_or(DEFAULT_TOOL_CALLS);
            usage.file_search_calls = usage.file_search_calls.saturating_add(limit);
        }
        if ask.code_interpreter {
            usage.code_interpreter_sessions = usage.code_interpreter_sessions.saturating_add(1);
        }
        usage.service_tier = service_tier;
        pricing::cost(&usage, price)
    };
    match (ask.tier, worst) {
        (TierAsked::Named(tier), _) => at(tier, price),
        (TierAsked::Provider, false) => at(ServiceTier::Standard, price),
        // A tier left to the provider may be served at priority: the dearer of the two rates.
        // (Priority is dearer wherever a table lists it; the higher all the same, so that a table
        // listing it cheaper cannot lower the worst case.)
        (TierAsked::Provider, true) => match (price.priority, price.long_context) {
            (None, None) => at(ServiceTier::Standard, price),
            // The estimate bills input and output tokens alone (and what falls back to their
            // rates): priced once at the dearer of each, which no tier's bill passes.
            (Some(priority), None) => {
                let mut dearest = *price;
                dearest.input_per_mtok = price.input_per_mtok.max(priority.input_per_mtok);
                dearest.output_per_mtok = price.output_per_mtok.max(priority.output_per_mtok);
                at(ServiceTier::Standard, &dearest)
            }
            // Past a long context's threshold priority takes the dearer rates of its own.
            (_, Some(_)) => at(ServiceTier::Standard, price).max(at(ServiceTier::Priority, price)),
        },
    }
}

/// What a request reserves: its worst case while an armed cap covers it, its typical estimate
/// otherwise.
///
/// Under an armed cap the line counts every request in flight at its worst, so that whatever
/// they write, the spend the cap admits exceeds its limit by at most one request's reservation.
/// A rule that reserved the typical estimate while the cap's room (limit, less spend and the
/// reservations in flight) still held the request's worst case would not keep that bound: every
/// request in flight at that moment is reserved at its typical estimate, and all of them may
/// write their worst.
pub fn reserved(estimates: Estimates, under_armed_cap: bool) -> Nanos {
    if under_armed_cap { estimates.worst } else { estimates.typical }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::pricing::{LongContext, Rates};

    const M: i64 = 1_000_000_000; // $1 per Mtok in nanos per Mtok

    fn gpt5() -> Price {
        Price {
            input_per_mtok: Nanos(M + M / 4),
            output_per_mtok: Nanos(10 * M),
            web_search_per_call: Some(Nanos(10_000_000)),
            priority: Some(Rates {
                input_per_mtok: Nanos(2 * M + M / 2),
                output_per_mtok: Nanos(20 * M),
                ..Rates::default()
            }),
            flex: Some(Rates {
                input_per_mtok: Nanos(M / 2 + M / 8),
                output_per_mtok: Nanos(5 * M),
                ..Rates::default()
            }),
            max_output_tokens: Some(128_000),
            ..Price::default()
        }
    }

    #[test]
    fn without_an_output_limit_typical_is_1024_tokens_and_worst_the_models_most() {
        let ask = Ask { input_tokens: 1000, tier: TierAsked::Named(ServiceTier::Standard), ..Ask::default() };
        let e = estimates(&gpt5(), &ask);
        // 1000 x $1.25 + 1024 x $10, per Mtok.
        assert_eq!(e.typical, Nanos(1_250_000 + 10_240_000));
        assert_eq!(e.worst, Nanos(1_250_000 + 1_280_000_000));
        assert_eq!(reserved(e, false), e.typical);
        assert_eq!(reserved(e, true), e.worst);
    }

    #[test]
    fn an_output_limit_is_both_estimates() {
        let ask = Ask {
            input_tokens: 1000,
            output_limit: Some(500),
            tier: TierAsked::Named(ServiceTier::Standard),
            ..Ask::default()
        };
        let e = estimates(&gpt5(), &ask);
        assert_eq!(e.typical, Nanos(1_250_000 + 5_000_000));
        assert_eq!(e.worst, e.typical);
    }

    #[test]
    fn an_unknown_most_output_falls_back() {
        let price = Price { max_output_tokens: None, ..gpt5() };
        let ask = Ask { tier: TierAsked::Named(ServiceTier::Standard), ..Ask::default() };
        // A file search tool reserves its calls (the tool-call limit, else the default) at their fee,
        // a code interpreter one container session.
        let tools = Price {
            file_search_per_call: Some(Nanos::parse_usd("0.0025").expect("usd")),
            code_interpreter_per_session: Some(Nanos::parse_usd("0.03").expect("usd")),
            ..Price::default()
        };
        let limited = Ask { file_search: true, max_tool_calls: Some(2), tool_call_limit: Some(1), ..ask };
        assert_eq!(estimates(&tools, &limited).worst, Nanos::parse_usd("0.005").expect("usd"));
        let unlimited = Ask { file_search: true, code_interpreter: true, ..ask };
        assert_eq!(estimates(&tools, &unlimited).typical, Nanos::parse_usd("0.0425").expect("usd"));
        // What an images or audio request asks for is reserved in both: two HD images at $0.12.
        let image = Price { per_image: Some(Nanos::parse_usd("0.12").expect("usd")), ..Price::default() };
        let two = Ask { media: Usage { images: 2, ..Usage::default() }, ..ask };
        let both = Nanos::parse_usd("0.24").expect("usd");
        assert_eq!(estimates(&image, &two), Estimates { typical: both, worst: both });
        assert_eq!(estimates(&price, &ask).worst, Nanos(UNKNOWN_MAX_OUTPUT as i64 * 10 * 1000));
    }

    #[test]
    fn a_named_tier_is_its_rates_and_a_tier_left_to_the_provider_is_priority_at_worst() {
        let limit = Some(1_000_000);
        let at = |tier| estimates(&gpt5(), &Ask { output_limit: limit, tier, ..Ask::default() });
        assert_eq!(at(TierAsked::Named(ServiceTier::Flex)).worst, Nanos(5 * M));
        assert_eq!(at(TierAsked::Named(ServiceTier::Priority)).typical, Nanos(20 * M));
        assert_eq!(at(TierAsked::Named(ServiceTier::Standard)).worst, Nanos(10 * M));
        let auto = at(TierAsked::Provider);
        assert_eq!((auto.typical, auto.worst), (Nanos(10 * M), Nanos(20 * M)));
    }

    #[test]
    fn tiers_as_requests_name_them() {
        assert_eq!(TierAsked::parse(Some("flex")), TierAsked::Named(ServiceTier::Flex));
        assert_eq!(TierAsked::parse(Some("priority")), TierAsked::Named(ServiceTier::Priority));
        assert_eq!(TierAsked::parse(Some("default")), TierAsked::Named(ServiceTier::Standard));
        assert_eq!(TierAsked::parse(Some("standard_only")), TierAsked::Named(ServiceTier::Standard));
        assert_eq!(TierAsked::parse(Some("auto")), TierAsked::Provider);
        assert_eq!(TierAsked::parse(None), TierAsked::Provider);
    }

    #[test]
    fn a_long_prompt_is_at_the_long_context_rates() {
        let price = Price {
            long_context: Some(LongContext {
                above_input_tokens: 200_000,
                standard: Rates {
                    input_per_mtok: Nanos(2 * M),
                    output_per_mtok: Nanos(20 * M),
                    ..Rates::default()
                },
                ..LongContext::default()
            }),
            ..gpt5()
        };
        let ask = |input_tokens| Ask {
            input_tokens,
            output_limit: Some(0),
            tier: TierAsked::Named(ServiceTier::Standard),
            ..Ask::default()
        };
        assert_eq!(estimates(&price, &ask(200_000)).typical, Nanos(250_000_000));
        assert_eq!(estimates(&price, &ask(200_001)).typical, Nanos(400_002_000));
    }

    #[test]
    fn web_search_reserves_its_call_limit_or_the_default_times_the_fee() {
        let ask = |tool_call_limit| Ask {
            output_limit: Some(0),
            tier: TierAsked::Named(ServiceTier::Standard),
            web_search: true,
            tool_call_limit,
            ..Ask::default()
        };
        assert_eq!(estimates(&gpt5(), &ask(Some(3))).typical, Nanos(30_000_000));
        assert_eq!(estimates(&gpt5(), &ask(None)).worst, Nanos(DEFAULT_TOOL_CALLS as i64 * 10_000_000));
        let per_prompt = Price { web_search_per_prompt: true, ..gpt5() };
        assert_eq!(estimates(&per_prompt, &ask(None)).worst, Nanos(10_000_000));
        // A limit without a search tool reserves nothing.
        let no_tool = Ask { web_search: false, ..ask(Some(3)) };
        assert_eq!(estimates(&gpt5(), &no_tool).worst, Nanos::ZERO);
    }

    fn rates() -> impl Strategy<Value = Rates> {
        (0..100 * M, 0..100 * M).prop_map(|(i, o)| Rates {
            input_per_mtok: Nanos(i),
            output_per_mtok: Nanos(o),
            ..Rates::default()
        })
    }

    fn prices() -> impl Strategy<Value = Price> {
        (
            rates(),
            proptest::option::of(rates()),
            proptest::option::of(rates()),
            proptest::option::of((0u64..300_000, rates())),
            proptest::option::of(0..M),
            any::<bool>(),
            proptest::option::of(1u64..2_000_000),
            (proptest::option::of(0..M), proptest::option::of(0..M), proptest::option::of(0..M)),
        )
            .prop_map(
                |(standard, flex, priority, long, search, per_prompt, max_output, (file, code, image))| {
                    Price {
                        input_per_mtok: standard.input_per_mtok,
                        output_per_mtok: standard.output_per_mtok,
                        flex,
                        priority,
                        long_context: long.map(|(above_input_tokens, standard)| LongContext {
                            above_input_tokens,
                            standard,
                            ..LongContext::default()
                        }),
                        web_search_per_call: search.map(Nanos),
                        web_search_per_prompt: per_prompt,
                        max_output_tokens: max_output,
                        file_search_per_call: file.map(Nanos),
                        code_interpreter_per_session: code.map(Nanos),
                        per_image: image.map(Nanos),
                        ..Price::default()
                    }
                },
            )
    }

    fn asks() -> impl Strategy<Value = Ask> {
        let tier = prop_oneof![
            Just(TierAsked::Provider),
            Just(TierAsked::Named(ServiceTier::Standard)),
            Just(TierAsked::Named(ServiceTier::Flex)),
            Just(TierAsked::Named(ServiceTier::Priority)),
        ];
        (
            0u64..1_000_000,
            proptest::option::of(0u64..1_000_000),
            tier,
            any::<bool>(),
            proptest::option::of(0u64..100),
            (0u64..5, 0u64..10_000, 0u64..1_000),
            (any::<bool>(), any::<bool>(), proptest::option::of(0u64..100)),
        )
            .prop_map(
                |(
                    input_tokens,
                    output_limit,
                    tier,
                    web_search,
                    tool_call_limit,
                    (images, characters, seconds),
                    (file_search, code_interpreter, max_tool_calls),
                )| {
                    let media = Usage { images, characters, seconds, ..Usage::default() };
                    Ask {
                        input_tokens,
                        output_limit,
                        tier,
                        web_search,
                        tool_call_limit,
                        media,
                        file_search,
                        code_interpreter,
                        max_tool_calls,
                    }
                },
            )
    }

    /// A cap's line as the gateway keeps it, exactly (one node): a request is admitted while spend
    /// plus the reservations in flight is below the limit, and reserves what `rule` chooses; a
    /// receipt replaces the reservation by the cost. `events`: admit a request of these estimates
    /// and real cost, or settle the oldest request in flight. The spend once all have settled.
    fn line(
        limit: Nanos,
        events: &[Option<(Estimates, Nanos)>],
        rule: impl Fn(Estimates, Nanos) -> Nanos,
    ) -> Nanos {
        let (mut spent, mut in_flight) = (Nanos::ZERO, std::collections::VecDeque::new());
        for event in events {
            match *event {
                Some((estimates, cost)) => {
                    let reserved = in_flight.iter().fold(Nanos::ZERO, |sum, &(r, _)| sum.saturating_add(r));
                    let committed = spent.saturating_add(reserved);
                    if committed < limit {
                        in_flight.push_back((rule(estimates, Nanos(limit.0 - committed.0)), cost));
                    }
                }
                None => {
                    if let Some((_, cost)) = in_flight.pop_front() {
                        spent = spent.saturating_add(cost);
                    }
                }
            }
        }
        in_flight.into_iter().fold(spent, |sum, (_, cost)| sum.saturating_add(cost))
    }

    #[test]
    fn reserving_the_worst_case_only_once_the_room_is_below_it_does_not_hold_the_line() {
        // Ten requests in flight at once, each reserved at its typical $1 while the room ($100)
        // holds its worst case ($20); each then costs $20: $200 against a $100 limit, 5 worst
        // cases over. Reserving the worst case under the armed cap admits 5, and holds.
        let request = (Estimates { typical: Nanos(1), worst: Nanos(20) }, Nanos(20));
        let events: Vec<_> =
            std::iter::repeat_n(Some(request), 10).chain(std::iter::repeat_n(None, 10)).collect();
        let when_near = |e: Estimates, room: Nanos| if room < e.worst { e.worst } else { e.typical };
        assert_eq!(line(Nanos(100), &events, when_near), Nanos(200));
        assert_eq!(line(Nanos(100), &events, |e, _| reserved(e, true)), Nanos(100));
    }

    proptest! {
        /// The worst case is never below the typical estimate, and neither is negative.
        #[test]
        fn worst_is_never_below_typical(price in prices(), ask in asks()) {
            let e = estimates(&price, &ask);
            prop_assert!(e.typical >= Nanos::ZERO);
            prop_assert!(e.worst >= e.typical);
            prop_assert!(reserved(e, true) >= reserved(e, false));
        }

        /// Whatever the answer writes within what the request allows, at the tier it can be
        /// served at, it costs no more than the worst case (tool calls within the limit).
        #[test]
        fn no_answer_the_request_allows_costs_more_than_its_worst_case(
            price in prices(),
            ask in asks(),
            share in 0u64..=1000,
            served in prop_oneof![Just(ServiceTier::Standard), Just(ServiceTier::Priority), Just(ServiceTier::Flex)],
        ) {
            let most = ask.output_limit.unwrap_or(price.max_output_tokens.unwrap_or(UNKNOWN_MAX_OUTPUT));
            let tier = match ask.tier {
                TierAsked::Named(tier) => tier,
                TierAsked::Provider if served == ServiceTier::Flex => ServiceTier::Standard,
                TierAsked::Provider => served,
            };
            let calls = match (ask.web_search, price.web_search_per_prompt) {
                (false, _) => 0,
                (true, true) => 1,
                (true, false) => ask.tool_call_limit.unwrap_or(DEFAULT_TOOL_CALLS) * share / 1000,
            };
            let file_search_calls = if ask.file_search {
                ask.max_tool_calls.unwrap_or(DEFAULT_TOOL_CALLS) * share / 1000
            } else {
                0
            };
            let answer = Usage {
                input_tokens: ask.input_tokens,
                output_tokens: most * share / 1000,
                web_search_calls: calls,
                file_search_calls,
                code_interpreter_sessions: u64::from(ask.code_interpreter),
                service_tier: tier,
                ..ask.media
            };
            prop_assert!(pricing::cost(&answer, &price) <= estimates(&price, &ask).worst);
        }

        /// The bound: whatever the requests in flight write within what they asked, the spend an
        /// armed cap admits exceeds its limit by at most one request's reservation.
        #[test]
        fn under_an_armed_cap_the_spend_passes_the_limit_by_at_most_one_reservation(
            limit in 0i64..1_000_000,
            events in proptest::collection::vec(
                proptest::option::of((0i64..10_000, 0i64..100_000, 0u32..=1000)),
                0..200,
            ),
        ) {
            let events: Vec<_> = events
                .into_iter()
                .map(|event| {
                    event.map(|(typical, extra, share)| {
                        let worst = Nanos(typical + extra);
                        let cost = Nanos(worst.0 * i64::from(share) / 1000);
                        (Estimates { typical: Nanos(typical), worst }, cost)
                    })
                })
                .collect();
            let most = events.iter().flatten().map(|(e, _)| e.worst).max().unwrap_or(Nanos::ZERO);
            let spend = line(Nanos(limit), &events, |e, _| reserved(e, true));
            prop_assert!(spend.0 <= limit + most.0, "{spend:?} over {limit} + {most:?}");
        }

        /// With an output limit and a named tier, the worst case is the typical estimate: nothing
        /// changes for a request that bounds itself.
        #[test]
        fn a_bounded_request_has_one_estimate(price in prices(), ask in asks(), limit in 0u64..1_000_000, tier in 0usize..3) {
            let tier = [ServiceTier::Standard, ServiceTier::Flex, ServiceTier::Priority][tier];
            let ask = Ask { output_limit: Some(limit), tier: TierAsked::Named(tier), ..ask };
            let e = estimates(&price, &ask);
            prop_assert_eq!(e.typical, e.worst);
        }
    }
}
