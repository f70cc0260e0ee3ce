//! Spend by day: the days a range covers, `spend_daily`'s rows, and the summaries' rows.

use recovea_core::money::Nanos;
use recovea_core::tags;

use super::{Columns, saturating_i64};
use crate::{Result, SpendRow, TagSpendRow};

/// The first millisecond of a UTC day, for a `started_at >=` bound an index can seek: a day past
/// either end of `i64` milliseconds saturates (the day itself is then compared as well).
pub(crate) fn day_start(day: i64) -> i64 {
    day.saturating_mul(MS_PER_DAY)
}

/// Sums per (day, tags text) rows, in (day, tags) order, into rows per (day, value of `key`), in
/// (day, value) order with the receipts without `key` first.
pub(crate) fn by_tag(rows: Vec<(String, Option<String>, SpendRow)>, key: &str) -> Vec<TagSpendRow> {
    let mut sums: std::collections::BTreeMap<(String, Option<String>), TagSpendRow> = Default::default();
    for (day, text, row) in rows {
        let value = text.as_deref().and_then(|text| tags::text_value(text, key)).map(str::to_owned);
        let sum = sums.entry((day.clone(), value.clone())).or_insert_with(|| TagSpendRow {
            day,
            value,
            requests: 0,
            input_tokens: 0,
            output_tokens: 0,
            cost: Nanos(0),
        });
        sum.requests += row.requests;
        sum.input_tokens = sum.input_tokens.saturating_add(row.input_tokens);
        sum.output_tokens = sum.output_tokens.saturating_add(row.output_tokens);
        sum.cost = Nanos(sum.cost.0.saturating_add(row.cost.0));
    }
    sums.into_values().collect()
}

/// A (day, tags text) row of the summary by tag: `day, tags, count, input, output, cost`.
pub(crate) fn tag_sum_row(row: &dyn Columns) -> Result<(String, Option<String>, SpendRow)> {
    Ok((
        row.string(0)?,
        row.optional_string(1)?,
        SpendRow {
            day: String::new(),
            key_id: String::new(),
            model: None,
            requests: row.count(2)?,
            input_tokens: row.count(3)?,
            output_tokens: row.count(4)?,
            cost: Nanos(row.integer(5)?),
        },
    ))
}

/// A row of the spend summary, from its day, key_id, model, request count and the sums of
/// input_tokens, output_tokens and cost_nanos, in that order: each backend computes the day its
/// own way.
pub(crate) fn spend_row(row: &dyn Columns) -> Result<SpendRow> {
    Ok(SpendRow {
        day: row.string(0)?,
        key_id: row.string(1)?,
        model: row.optional_string(2)?,
        requests: row.count(3)?,
        input_tokens: row.count(4)?,
        output_tokens: row.count(5)?,
        cost: Nanos(row.integer(6)?),
    })
}

/// Milliseconds in a UTC day: `spend_daily` keys its rows by `started_at` floored to these.
pub(crate) const MS_PER_DAY: i64 = 86_400_000;

/// The day of `spend_daily` a receipt started on: days since 1970-01-01 UTC, floored.
pub(crate) fn day_of(started_at: i64) -> i64 {
    started_at.div_euclid(MS_PER_DAY)
}

/// The days `[first, last)` of `spend_daily` a spend summary's range covers, when it is whole
/// days (a missing bound is no bound); `None`: a bound falls inside a day, so the receipts are read.
pub(crate) fn summary_days(from: Option<i64>, to: Option<i64>) -> Option<(i64, i64)> {
    let whole = |bound: Option<i64>, open: i64| match bound {
        None => Some(open),
        Some(ms) => (ms.rem_euclid(MS_PER_DAY) == 0).then(|| day_of(ms)),
    };
    Some((whole(from, i64::MIN)?, whole(to, i64::MAX)?))
}

/// `[from, to)` cut into the receipts of its first partial day `[from, head_end)`, the whole days
/// `[first_day, last_day)` that `spend_daily` sums, and the receipts of its last partial day
/// `[tail_start, to)`. Without a whole day inside, the receipts of all of it, and no day.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SpendSplit {
    pub head_end: i64,
    pub first_day: i64,
    pub last_day: i64,
    pub tail_start: i64,
}

pub(crate) fn spend_split(from: i64, to: i64) -> SpendSplit {
    let first_day = day_of(from) + i64::from(from.rem_euclid(MS_PER_DAY) != 0);
    let last_day = day_of(to);
    let bounds = first_day.checked_mul(MS_PER_DAY).zip(last_day.checked_mul(MS_PER_DAY));
    match bounds {
        Some((head_end, tail_start)) if first_day < last_day => {
            SpendSplit { head_end, first_day, last_day, tail_start }
        }
        _ => SpendSplit { head_end: to, first_day: 0, last_day: 0, tail_start: to },
    }
}

/// One receipt's part of a `spend_daily` row: the row's key, and what it adds.
pub(crate) type DailyKey<'a> = (&'a str, i64, &'a str, Option<&'a str>);

/// What the receipts of one `spend_daily` row add to it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct DailySums {
    pub requests: i64,
    pub input_tokens: i64,
    pub output_tokens: i64,
    pub cost_nanos: i64,
}

impl DailySums {
    pub(crate) fn add(&mut self, receipt: &recovea_core::receipt::Receipt) {
        self.requests = self.requests.saturating_add(1);
        self.input_tokens = self.input_tokens.saturating_add(saturating_i64(receipt.input_tokens));
        self.output_tokens = self.output_tokens.saturating_add(saturating_i64(receipt.output_tokens));
        self.cost_nanos = self.cost_nanos.saturating_add(receipt.cost_usd.0);
    }
}

#[cfg(test)]
mod day_tests {
    use super::*;

    #[test]
    fn a_range_splits_into_partial_days_and_whole_days() {
        let d = MS_PER_DAY;
        assert_eq!(
            spend_split(5, 3 * d + 7),
            SpendSplit { head_end: d, first_day: 1, last_day: 3, tail_start: 3 * d }
        );
        assert_eq!(
            spend_split(d, 3 * d),
            SpendSplit { head_end: d, first_day: 1, last_day: 3, tail_start: 3 * d }
        );
        let raw = |to| SpendSplit { head_end: to, first_day: 0, last_day: 0, tail_start: to };
        assert_eq!(spend_split(5, d + 7), raw(d + 7), "no whole day inside");
        assert_eq!(spend_split(5, 100), raw(100));
        assert_eq!(spend_split(i64::MAX - 5, i64::MAX), raw(i64::MAX), "no day past i64 ms");
        let all = spend_split(i64::MIN, i64::MAX);
        assert!(all.head_end - i64::MIN < d && i64::MAX - all.tail_start < d, "{all:?}");
        assert_eq!(spend_split(-d - 1, d).first_day, -1, "days before 1970 floor");
    }

    #[test]
    fn only_whole_day_ranges_are_summed_by_day() {
        let d = MS_PER_DAY;
        assert_eq!(summary_days(None, None), Some((i64::MIN, i64::MAX)));
        assert_eq!(summary_days(Some(2 * d), Some(5 * d)), Some((2, 5)));
        assert_eq!(summary_days(Some(-d), None), Some((-1, i64::MAX)));
        assert_eq!(summary_days(Some(2 * d + 1), None), None);
        assert_eq!(summary_days(None, Some(5 * d - 1)), None);
        assert_eq!(day_of(-1), -1);
    }
}
