//! Calendar windows of spend caps, in UTC: days, weeks starting Monday, months.

use crate::timestamp::{MS_PER_DAY, Timestamp, civil_from_days};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Window {
    Day,
    Week,
    Month,
}

impl Window {
    /// The wire name: `day`, `week`, `month`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Day => "day",
            Self::Week => "week",
            Self::Month => "month",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "day" => Some(Self::Day),
            "week" => Some(Self::Week),
            "month" => Some(Self::Month),
            _ => None,
        }
    }

    /// The word that opens refusal messages: `Daily`, `Weekly`, `Monthly`.
    pub fn adjective(self) -> &'static str {
        match self {
            Self::Day => "Daily",
            Self::Week => "Weekly",
            Self::Month => "Monthly",
        }
    }

    /// The first instant of the window that contains `at`.
    pub fn start(self, at: Timestamp) -> Timestamp {
        self.bounds(at).0
    }

    /// The first instant after the window that contains `at` (the next window's start).
    pub fn end(self, at: Timestamp) -> Timestamp {
        self.bounds(at).1
    }

    /// The window containing `at` as `[start, end)`, from the day number of `at` (days since
    /// 1970-01-01, floored, so instants before the epoch fall in the day they belong to).
    ///
    /// Exact over the whole range of `Timestamp` except within a month of its ends (some
    /// 292 million years away), where an instant that cannot be represented saturates.
    fn bounds(self, at: Timestamp) -> (Timestamp, Timestamp) {
        let day = at.0.div_euclid(MS_PER_DAY);
        let (first_day, days) = match self {
            Self::Day => (day, 1),
            Self::Week => (day - days_since_monday(day), 7),
            Self::Month => {
                let (year, month, day_of_month) = civil_from_days(day);
                (day - (day_of_month - 1), days_in_month(year, month))
            }
        };
        (day_start(first_day), day_start(first_day + days))
    }
}

/// The first millisecond of a day number, saturating at the ends of the representable range.
fn day_start(day: i64) -> Timestamp {
    Timestamp(day.saturating_mul(MS_PER_DAY))
}

/// 0 for a Monday through 6 for a Sunday. Day 0, 1970-01-01, was a Thursday.
fn days_since_monday(day: i64) -> i64 {
    (day + 3).rem_euclid(7)
}

fn is_leap_year(year: i64) -> bool {
    year.rem_euclid(4) == 0 && (year.rem_euclid(100) != 0 || year.rem_euclid(400) == 0)
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if is_leap_year(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const ALL: [Window; 3] = [Window::Day, Window::Week, Window::Month];

    fn at(rfc3339: &str) -> Timestamp {
        Timestamp::parse_rfc3339(rfc3339).expect("valid instant")
    }

    /// `(start, end)` of the window containing `instant`, printed.
    fn bounds(window: Window, instant: &str) -> (String, String) {
        let t = at(instant);
        (window.start(t).to_rfc3339(), window.end(t).to_rfc3339())
    }

    fn pair(start: &str, end: &str) -> (String, String) {
        (start.to_owned(), end.to_owned())
    }

    #[test]
    fn names_round_trip() {
        for window in ALL {
            assert_eq!(Window::parse(window.as_str()), Some(window));
        }
        assert_eq!(Window::parse("year"), None);
        assert_eq!(Window::parse("Month"), None);
        assert_eq!(Window::Month.adjective(), "Monthly");
        assert_eq!(Window::Week.adjective(), "Weekly");
        assert_eq!(Window::Day.adjective(), "Daily");
    }

    #[test]
    fn days_run_midnight_to_midnight() {
        let day = pair("2026-03-14T00:00:00Z", "2026-03-15T00:00:00Z");
        assert_eq!(bounds(Window::Day, "2026-03-14T00:00:00Z"), day);
        assert_eq!(bounds(Window::Day, "2026-03-14T13:45:10.5Z"), day);
        assert_eq!(bounds(Window::Day, "2026-03-14T23:59:59.999Z"), day);
        assert_eq!(bounds(Window::Day, "2026-03-15T00:00:00Z").0, "2026-03-15T00:00:00Z");
        assert_eq!(
            bounds(Window::Day, "2024-02-29T12:00:00Z"),
            pair("2024-02-29T00:00:00Z", "2024-03-01T00:00:00Z")
        );
        assert_eq!(
            bounds(Window::Day, "2025-12-31T23:59:59.999Z"),
            pair("2025-12-31T00:00:00Z", "2026-01-01T00:00:00Z")
        );
    }

    #[test]
    fn weeks_start_on_monday() {
        // 2026-03-09 is a Monday.
        let week = pair("2026-03-09T00:00:00Z", "2026-03-16T00:00:00Z");
        assert_eq!(bounds(Window::Week, "2026-03-09T00:00:00Z"), week);
        assert_eq!(bounds(Window::Week, "2026-03-12T08:00:00Z"), week);
        assert_eq!(bounds(Window::Week, "2026-03-15T23:59:59.999Z"), week);
        assert_eq!(bounds(Window::Week, "2026-03-16T00:00:00Z").0, "2026-03-16T00:00:00Z");
        // The epoch was a Thursday; its week started on Monday 1969-12-29.
        assert_eq!(
            bounds(Window::Week, "1970-01-01T00:00:00Z"),
            pair("1969-12-29T00:00:00Z", "1970-01-05T00:00:00Z")
        );
        // A week across a new year, and one across a leap day.
        assert_eq!(
            bounds(Window::Week, "2026-01-01T00:00:00Z"),
            pair("2025-12-29T00:00:00Z", "2026-01-05T00:00:00Z")
        );
        assert_eq!(
            bounds(Window::Week, "2024-02-29T00:00:00Z"),
            pair("2024-02-26T00:00:00Z", "2024-03-04T00:00:00Z")
        );
    }

    #[test]
    fn months_run_from_the_first_to_the_next_first() {
        let month = pair("2026-03-01T00:00:00Z", "2026-04-01T00:00:00Z");
        assert_eq!(bounds(Window::Month, "2026-03-01T00:00:00Z"), month);
        assert_eq!(bounds(Window::Month, "2026-03-17T09:30:00Z"), month);
        assert_eq!(bounds(Window::Month, "2026-03-31T23:59:59.999Z"), month);
        assert_eq!(bounds(Window::Month, "2026-04-01T00:00:00Z").0, "2026-04-01T00:00:00Z");
    }

    #[test]
    fn month_ends_of_every_length() {
        let cases = [
            ("2025-02-28T23:59:59.999Z", "2025-02-01T00:00:00Z", "2025-03-01T00:00:00Z"), // 28 days
            ("2024-02-29T00:00:00Z", "2024-02-01T00:00:00Z", "2024-03-01T00:00:00Z"),     // 29 days
            ("2024-02-29T23:59:59.999Z", "2024-02-01T00:00:00Z", "2024-03-01T00:00:00Z"),
            ("2000-02-29T12:00:00Z", "2000-02-01T00:00:00Z", "2000-03-01T00:00:00Z"), // leap by 400
            ("2100-02-28T12:00:00Z", "2100-02-01T00:00:00Z", "2100-03-01T00:00:00Z"), // not leap by 100
            ("2026-04-30T23:59:59.999Z", "2026-04-01T00:00:00Z", "2026-05-01T00:00:00Z"), // 30 days
            ("2026-01-31T23:59:59.999Z", "2026-01-01T00:00:00Z", "2026-02-01T00:00:00Z"), // 31 days
            ("2025-12-31T23:59:59.999Z", "2025-12-01T00:00:00Z", "2026-01-01T00:00:00Z"), // new year
            ("2026-01-01T00:00:00Z", "2026-01-01T00:00:00Z", "2026-02-01T00:00:00Z"),
        ];
        for (instant, start, end) in cases {
            assert_eq!(bounds(Window::Month, instant), pair(start, end), "{instant}");
        }
        assert_eq!(bounds(Window::Day, "2100-02-28T12:00:00Z").1, "2100-03-01T00:00:00Z");
    }

    #[test]
    fn instants_before_the_epoch() {
        let last_ms_of_1969 = Timestamp(-1);
        assert_eq!(Window::Day.start(last_ms_of_1969), at("1969-12-31T00:00:00Z"));
        assert_eq!(Window::Day.end(last_ms_of_1969), Timestamp(0));
        assert_eq!(Window::Month.start(last_ms_of_1969), at("1969-12-01T00:00:00Z"));
        assert_eq!(Window::Month.end(last_ms_of_1969), Timestamp(0));
        assert_eq!(Window::Week.start(last_ms_of_1969), at("1969-12-29T00:00:00Z"));
        assert_eq!(
            bounds(Window::Month, "1900-02-15T00:00:00Z"),
            pair("1900-02-01T00:00:00Z", "1900-03-01T00:00:00Z")
        );
        assert_eq!(
            bounds(Window::Month, "1600-02-15T00:00:00Z"),
            pair("1600-02-01T00:00:00Z", "1600-03-01T00:00:00Z")
        );
    }

    #[test]
    fn the_ends_of_the_range_saturate_without_panicking() {
        for window in ALL {
            for t in [Timestamp(i64::MIN), Timestamp(i64::MAX)] {
                assert!(window.start(t) <= t);
                assert!(window.end(t) >= t);
            }
        }
    }

    /// The same windows computed by the `time` crate's calendar, for instants it can represent.
    fn oracle(window: Window, t: Timestamp) -> (Timestamp, Timestamp) {
        use time::{Date, Duration, Month, OffsetDateTime};
        let date = OffsetDateTime::from_unix_timestamp(t.0.div_euclid(1_000)).expect("in range").date();
        let (start, end) = match window {
            Window::Day => (date, date + Duration::days(1)),
            Window::Week => {
                let monday = date - Duration::days(i64::from(date.weekday().number_days_from_monday()));
                (monday, monday + Duration::days(7))
            }
            Window::Month => {
                let first = Date::from_calendar_date(date.year(), date.month(), 1).expect("valid");
                let next = match date.month() {
                    Month::December => Date::from_calendar_date(date.year() + 1, Month::January, 1),
                    month => Date::from_calendar_date(date.year(), month.next(), 1),
                };
                (first, next.expect("valid"))
            }
        };
        let ms = |d: Date| Timestamp(d.midnight().assume_utc().unix_timestamp() * 1_000);
        (ms(start), ms(end))
    }

    fn any_window() -> impl Strategy<Value = Window> {
        prop_oneof![Just(Window::Day), Just(Window::Week), Just(Window::Month)]
    }

    /// About ±300 000 years around the epoch.
    fn any_instant() -> impl Strategy<Value = Timestamp> {
        (-10_000_000_000_000_000_i64..10_000_000_000_000_000).prop_map(Timestamp)
    }

    /// Years 1 to 9998, where the `time` crate can check us.
    fn common_era_instant() -> impl Strategy<Value = Timestamp> {
        (-62_135_596_800_000_i64..253_370_764_800_000).prop_map(Timestamp)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]

        #[test]
        fn the_window_contains_the_instant(window in any_window(), t in any_instant()) {
            prop_assert!(window.start(t) <= t);
            prop_assert!(t < window.end(t));
        }

        #[test]
        fn start_is_idempotent(window in any_window(), t in any_instant()) {
            let start = window.start(t);
            prop_assert_eq!(window.start(start), start);
            prop_assert_eq!(window.end(start), window.end(t));
        }

        #[test]
        fn windows_tile(window in any_window(), t in any_instant()) {
            let end = window.end(t);
            prop_assert_eq!(window.start(end), end);
            prop_assert_eq!(window.end(Timestamp(end.0 - 1)), end);
            prop_assert_eq!(window.end(Timestamp(window.start(t).0 - 1)), window.start(t));
        }

        #[test]
        fn windows_have_their_calendar_length(t in any_instant()) {
            prop_assert_eq!(Window::Day.end(t).0 - Window::Day.start(t).0, MS_PER_DAY);
            prop_assert_eq!(Window::Week.end(t).0 - Window::Week.start(t).0, 7 * MS_PER_DAY);
            let month = Window::Month.end(t).0 - Window::Month.start(t).0;
            prop_assert!((28 * MS_PER_DAY..=31 * MS_PER_DAY).contains(&month), "{month}");
            prop_assert_eq!(Window::Day.start(t).0 % MS_PER_DAY, 0);
            prop_assert_eq!(days_since_monday(Window::Week.start(t).0 / MS_PER_DAY), 0);
            prop_assert_eq!(civil_from_days(Window::Month.start(t).0 / MS_PER_DAY).2, 1);
        }

        #[test]
        fn agrees_with_the_time_crate(window in any_window(), t in common_era_instant()) {
            prop_assert_eq!((window.start(t), window.end(t)), oracle(window, t));
        }
    }
}
