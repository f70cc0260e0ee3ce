//! Per-key rate limits as GCRA (the generic cell rate algorithm): requests per minute and tokens
//! per minute, each a "theoretical arrival time" that a call may not push too far ahead of now.

/// A key's limits; `None` is unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct KeyLimits {
    pub requests_per_minute: Option<u32>,
    pub tokens_per_minute: Option<u32>,
}

impl KeyLimits {
    pub fn is_unlimited(&self) -> bool {
        self.requests_per_minute.is_none() && self.tokens_per_minute.is_none()
    }
}

const MINUTE_MS: u64 = 60_000;

/// One GCRA lane: `per_minute` units a minute on average, with a burst of up to a minute's worth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gcra {
    /// Microseconds one unit takes to "drain": a minute divided by the rate.
    interval_us: u64,
    /// How far ahead of now the arrival time may run: the burst, a minute's worth of units.
    tolerance_us: u64,
}

impl Gcra {
    /// `None` for a rate of 0 (no lane: nothing passes). Rates are per minute.
    pub fn per_minute(per_minute: u32) -> Option<Self> {
        (per_minute > 0).then(|| {
            let interval_us = (MINUTE_MS * 1000).div_ceil(u64::from(per_minute));
            Self { interval_us, tolerance_us: interval_us * u64::from(per_minute) }
        })
    }

    /// Whether `units` may pass at `now_us` given the lane's arrival time `tat_us`: the new arrival
    /// time, or how many microseconds to wait. A lane whose arrival time is in the past starts from now.
    pub fn check(&self, tat_us: u64, now_us: u64, units: u64) -> Result<u64, u64> {
        let new_tat = tat_us.max(now_us).saturating_add(self.interval_us.saturating_mul(units.max(1)));
        let allowed_until = now_us.saturating_add(self.tolerance_us);
        if new_tat <= allowed_until { Ok(new_tat) } else { Err(new_tat - allowed_until) }
    }

    /// Whether the lane has room at all at `now_us` (used for token lanes, charged after the fact).
    pub fn has_room(&self, tat_us: u64, now_us: u64) -> Result<(), u64> {
        let allowed_until = now_us.saturating_add(self.tolerance_us);
        if tat_us <= allowed_until { Ok(()) } else { Err(tat_us - allowed_until) }
    }

    /// The arrival time after `units` were spent (tokens, known once the answer is over).
    pub fn charge(&self, tat_us: u64, now_us: u64, units: u64) -> u64 {
        tat_us.max(now_us).saturating_add(self.interval_us.saturating_mul(units))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_minute_of_requests_passes_at_once_then_one_per_interval() {
        let lane = Gcra::per_minute(60).expect("a lane");
        let mut tat = 0;
        let now = 1_000_000_000;
        for n in 0..60 {
            tat = lane.check(tat, now, 1).unwrap_or_else(|wait| panic!("request {n} waited {wait}"));
        }
        let wait = lane.check(tat, now, 1).expect_err("the 61st waits");
        assert_eq!(wait, 1_000_000, "one second: a minute over sixty");
        assert!(lane.check(tat, now + wait, 1).is_ok(), "and passes once that has passed");
    }

    #[test]
    fn a_zero_rate_has_no_lane() {
        assert_eq!(Gcra::per_minute(0), None);
    }

    #[test]
    fn token_lanes_are_charged_after_and_block_until_drained() {
        let lane = Gcra::per_minute(1000).expect("a lane");
        let now = 5_000_000_000;
        assert!(lane.has_room(0, now).is_ok());
        let tat = lane.charge(0, now, 3000);
        let wait = lane.has_room(tat, now).expect_err("three minutes of tokens spent");
        assert_eq!(wait, 120_000_000, "two minutes over the one-minute burst");
        assert!(lane.has_room(tat, now + wait).is_ok());
    }

    proptest! {
        #[test]
        fn a_span_passes_at_most_a_burst_plus_its_refill(rate in 1u32..500, gaps in proptest::collection::vec(0u64..2_000_000, 1..400)) {
            let lane = Gcra::per_minute(rate).expect("a lane");
            let (mut tat, mut now, mut passed) = (0u64, 10_000_000_000u64, Vec::new());
            for gap in gaps {
                now += gap;
                if let Ok(next) = lane.check(tat, now, 1) {
                    tat = next;
                    passed.push(now);
                }
            }
            // Between any two passes, at most a minute's burst plus what drained in between.
            let interval = (MINUTE_MS * 1000).div_ceil(u64::from(rate));
            for (i, start) in passed.iter().enumerate() {
                for (j, end) in passed.iter().enumerate().skip(i) {
                    let allowed = u64::from(rate) + (end - start) / interval + 1;
                    prop_assert!((j - i + 1) as u64 <= allowed, "{} passed in {} us, rate {rate}", j - i + 1, end - start);
                }
            }
        }
    }
}
