//! When a cap's spend reaches its line if it goes on at the rate of its window so far.
//!
//! The console shows this next to each cap's bar. It is a straight line through the window's start
//! and the spend now, computed in integers (nano-dollars times milliseconds in `i128`), so the
//! instant is exact to the millisecond and never passes through a float.

use crate::money::Nanos;
use crate::timestamp::Timestamp;

/// Where a cap's window stands against its line at the rate so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Projection {
    /// Spend is at or over the limit already.
    Reached,
    /// At the rate so far, spend reaches the limit at this instant, before the window ends.
    At(Timestamp),
    /// At the rate so far the window ends first, or there is no rate yet (nothing spent, or the
    /// window has only just begun).
    NotThisWindow,
}

/// Projects `spent` (since `window_start`, as of `now`) forward at its average rate: the first
/// millisecond at which the line through `(window_start, 0)` and `(now, spent)` reaches `limit`,
/// if that is before `window_end`.
pub fn reaches_line(
    spent: Nanos,
    limit: Nanos,
    window_start: Timestamp,
    window_end: Timestamp,
    now: Timestamp,
) -> Projection {
    if spent >= limit {
        return Projection::Reached;
    }
    let elapsed = i128::from(now.0) - i128::from(window_start.0);
    if spent.0 <= 0 || elapsed <= 0 {
        return Projection::NotThisWindow;
    }
    // spent / elapsed = limit / t  =>  t = limit * elapsed / spent, rounded up to the first
    // millisecond at which the extrapolated spend is at least the limit.
    let (limit, spent) = (i128::from(limit.0), i128::from(spent.0));
    let since_start = (limit * elapsed + spent - 1) / spent;
    let at = i128::from(window_start.0) + since_start;
    if at >= i128::from(window_end.0) {
        return Projection::NotThisWindow;
    }
    // `at` is below `window_end`, an i64.
    Projection::At(Timestamp(i64::try_from(at).unwrap_or(i64::MAX)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const HOUR: i64 = 3_600_000;

    fn usd(text: &str) -> Nanos {
        Nanos::parse_usd(text).expect("an amount")
    }

    #[test]
    fn a_quarter_spent_after_a_quarter_of_the_window_reaches_the_line_at_its_end_or_not() {
        let (start, end) = (Timestamp(0), Timestamp(24 * HOUR));
        // $2.50 of $10 after 6 hours: $10 after 24 hours, which is the window's end: not this one.
        assert_eq!(
            reaches_line(usd("2.50"), usd("10"), start, end, Timestamp(6 * HOUR)),
            Projection::NotThisWindow
        );
        // $5 of $10 after 6 hours: the line at 12 hours.
        assert_eq!(
            reaches_line(usd("5"), usd("10"), start, end, Timestamp(6 * HOUR)),
            Projection::At(Timestamp(12 * HOUR))
        );
    }

    #[test]
    fn at_or_over_the_limit_is_reached_and_nothing_spent_has_no_rate() {
        let (start, end, now) = (Timestamp(0), Timestamp(HOUR), Timestamp(HOUR / 2));
        assert_eq!(reaches_line(usd("10"), usd("10"), start, end, now), Projection::Reached);
        assert_eq!(reaches_line(usd("11"), usd("10"), start, end, now), Projection::Reached);
        assert_eq!(reaches_line(Nanos::ZERO, usd("10"), start, end, now), Projection::NotThisWindow);
        assert_eq!(reaches_line(usd("1"), usd("10"), start, end, start), Projection::NotThisWindow);
    }

    #[test]
    fn the_instant_rounds_up_to_the_first_millisecond_at_the_line() {
        // 3 nano-dollars in 1 ms toward 10: 10/3 ms = 3.33 ms, so the line is reached at 4 ms.
        assert_eq!(
            reaches_line(Nanos(3), Nanos(10), Timestamp(0), Timestamp(100), Timestamp(1)),
            Projection::At(Timestamp(4))
        );
    }

    proptest! {
        #[test]
        fn the_instant_is_the_first_millisecond_on_the_line(
            start in -1_000_000_000_000_i64..1_000_000_000_000,
            elapsed in 1_i64..40 * 24 * HOUR,
            length in 1_i64..400 * 24 * HOUR,
            spent in 1_i64..1_000_000_000_000_000,
            limit in 0_i64..1_000_000_000_000_000,
        ) {
            let (now, end) = (Timestamp(start + elapsed), Timestamp(start + length));
            let projection = reaches_line(Nanos(spent), Nanos(limit), Timestamp(start), end, now);
            let on_line = |t: i64| i128::from(spent) * i128::from(t - start) >= i128::from(limit) * i128::from(elapsed);
            match projection {
                Projection::Reached => prop_assert!(spent >= limit),
                Projection::At(at) => {
                    prop_assert!(spent < limit);
                    prop_assert!(now < at && at < end);
                    prop_assert!(on_line(at.0));
                    prop_assert!(!on_line(at.0 - 1));
                }
                Projection::NotThisWindow => {
                    prop_assert!(spent < limit);
                    prop_assert!(!on_line(end.0 - 1));
                }
            }
        }

        #[test]
        fn spending_more_never_reaches_the_line_later(
            elapsed in 1_i64..30 * 24 * HOUR,
            spent in 1_i64..1_000_000_000_000,
            more in 0_i64..1_000_000_000_000,
            limit in 1_i64..10_000_000_000_000,
        ) {
            let (start, end, now) = (Timestamp(0), Timestamp(31 * 24 * HOUR), Timestamp(elapsed));
            let rank = |p: Projection| match p {
                Projection::Reached => i64::MIN,
                Projection::At(at) => at.0,
                Projection::NotThisWindow => i64::MAX,
            };
            let less = reaches_line(Nanos(spent), Nanos(limit), start, end, now);
            let greater = reaches_line(Nanos(spent + more), Nanos(limit), start, end, now);
            prop_assert!(rank(greater) <= rank(less));
        }
    }
}
