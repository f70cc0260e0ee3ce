//! How the console prints money and time: dollars to the cent in lists (exact in a receipt's
//! detail), times in UTC with the zone written out.

use recovea_core::money::Nanos;
use recovea_core::timestamp::Timestamp;

const NANOS_PER_CENT: u128 = 10_000_000;

/// An amount from the API (`"12.345678"`), or zero if it is not one.
pub(crate) fn nanos(text: &str) -> Nanos {
    Nanos::parse_usd(text).unwrap_or(Nanos::ZERO)
}

/// `$1,234.57`: rounded half away from zero to the cent, thousands separated.
pub(crate) fn cents(amount: Nanos) -> String {
    let abs = u128::from(amount.0.unsigned_abs());
    let cents = (abs + NANOS_PER_CENT / 2) / NANOS_PER_CENT;
    let (dollars, cents) = (cents / 100, cents % 100);
    let digits = dollars.to_string();
    let mut grouped = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(digit);
    }
    let sign = if amount.0 < 0 && (dollars, cents) != (0, 0) { "-" } else { "" };
    format!("{sign}${grouped}.{cents:02}")
}

/// A request's cost in a list: in cents, unless it is under a cent but not nothing, which cents
/// would show as `$0.00`: then exactly (`$0.0033`).
pub(crate) fn cost(amount: Nanos) -> String {
    if amount.0 != 0 && u128::from(amount.0.unsigned_abs()) < NANOS_PER_CENT {
        exact(amount)
    } else {
        cents(amount)
    }
}

/// `$0.000153` exactly, as the ledger holds it.
pub(crate) fn exact(amount: Nanos) -> String {
    if amount.0 < 0 {
        format!("-${}", Nanos(amount.0.saturating_neg()).to_usd_string())
    } else {
        format!("${}", amount.to_usd_string())
    }
}

/// `2026-12-02 07:38:05 UTC` from the API's RFC 3339 time; the text itself if it is not one.
pub(crate) fn utc(text: &str) -> String {
    match Timestamp::parse_rfc3339(text) {
        Some(at) => utc_at(at),
        None => text.to_owned(),
    }
}

pub(crate) fn utc_at(at: Timestamp) -> String {
    let text = at.to_rfc3339();
    let seconds = text.split(['.', 'Z']).next().unwrap_or(&text);
    format!("{} UTC", seconds.replacen('T', " ", 1))
}

/// `2026-12-02 07:38 UTC`: minutes are enough for a projection.
pub(crate) fn utc_minute(at: Timestamp) -> String {
    let text = utc_at(at);
    match text.rsplit_once(':') {
        Some((minutes, _)) => format!("{minutes} UTC"),
        None => text,
    }
}

/// What a `datetime-local` field (`2026-12-02T07:38`, meant as UTC) is as RFC 3339; other text is
/// passed on as typed, for the API to judge.
pub(crate) fn rfc3339_from_field(text: &str) -> String {
    let text = text.trim();
    let bytes = text.as_bytes();
    let local = |len: usize| bytes.len() == len && bytes.get(10) == Some(&b'T') && !text.contains(['Z', '+']);
    if local(16) {
        format!("{text}:00Z")
    } else if local(19) {
        format!("{text}Z")
    } else {
        text.to_owned()
    }
}

/// The value a `datetime-local` field shows for an RFC 3339 time given before (UTC, to the minute).
pub(crate) fn field_from_rfc3339(text: &str) -> String {
    match Timestamp::parse_rfc3339(text) {
        Some(at) => at.to_rfc3339().chars().take(16).collect(),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cost_under_a_cent_is_shown_exactly_and_never_as_nothing() {
        assert_eq!(cost(nanos("0")), "$0.00");
        assert_eq!(cost(nanos("0.0033")), "$0.0033");
        assert_eq!(cost(nanos("0.000000001")), "$0.000000001");
        assert_eq!(cost(nanos("0.01")), "$0.01");
        assert_eq!(cost(nanos("1234.567")), "$1,234.57");
    }

    #[test]
    fn lists_show_cents_rounded_half_up() {
        assert_eq!(cents(nanos("0")), "$0.00");
        assert_eq!(cents(nanos("0.004999999")), "$0.00");
        assert_eq!(cents(nanos("0.005")), "$0.01");
        assert_eq!(cents(nanos("1234567.891")), "$1,234,567.89");
        assert_eq!(cents(nanos("999.995")), "$1,000.00");
        assert_eq!(cents(Nanos(-15_000_000)), "-$0.02");
        assert_eq!(cents(Nanos(-1)), "$0.00");
        assert_eq!(exact(nanos("0.000153")), "$0.000153");
        assert_eq!(exact(Nanos(-1)), "-$0.000000001");
    }

    #[test]
    fn times_are_utc_and_say_so() {
        assert_eq!(utc("2026-12-02T07:38:05.123Z"), "2026-12-02 07:38:05 UTC");
        assert_eq!(utc("2026-12-02T08:38:05+01:00"), "2026-12-02 07:38:05 UTC");
        assert_eq!(utc("nonsense"), "nonsense");
        assert_eq!(utc_minute(Timestamp(0)), "1970-01-01 00:00 UTC");
    }

    #[test]
    fn datetime_fields_are_utc() {
        assert_eq!(rfc3339_from_field("2026-12-02T07:38"), "2026-12-02T07:38:00Z");
        assert_eq!(rfc3339_from_field("2026-12-02T07:38:09"), "2026-12-02T07:38:09Z");
        assert_eq!(rfc3339_from_field("2026-12-02T07:38:00+01:00"), "2026-12-02T07:38:00+01:00");
        assert_eq!(rfc3339_from_field("yesterday"), "yesterday");
        assert_eq!(field_from_rfc3339("2026-12-02T07:38:00Z"), "2026-12-02T07:38");
    }
}
