//! US dollar amounts as integer nano-dollars, parsed from and printed as exact decimal strings.
//!
//! Money never passes through a float: the admin API's decimal strings are parsed digit by digit
//! into an `i64` of nano-dollars (1e-9 USD) and printed back the same way.

use std::fmt;

const NANOS_PER_USD: u64 = 1_000_000_000;
/// A nano-dollar is the ninth decimal place of a dollar.
const MAX_DECIMALS: usize = 9;

/// US dollars in nano-dollars (1e-9 USD).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Nanos(pub i64);

impl Nanos {
    pub const ZERO: Nanos = Nanos(0);

    /// Parses a decimal amount of US dollars exactly: `"25.00"`, `"0.000150"`, `"3"`.
    ///
    /// The grammar is JSON's for a non-negative number without exponent: one or more digits,
    /// optionally a point followed by one to nine digits. So `"1."` and `".5"` are refused (as JSON
    /// refuses them), as are signs, exponents, spaces and more than nine decimals: an amount that
    /// cannot be held exactly is an error, never rounded. Leading zeros (`"007"`) are accepted.
    pub fn parse_usd(s: &str) -> Result<Nanos, MoneyError> {
        if s.is_empty() {
            return Err(MoneyError(Kind::Empty));
        }
        if s.starts_with('-') {
            return Err(MoneyError(Kind::Negative));
        }
        let (whole, decimals) = match s.split_once('.') {
            Some((whole, decimals)) => (whole, decimals),
            None => (s, ""),
        };
        let all_digits = |part: &str| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit());
        if !all_digits(whole) || (s.contains('.') && !all_digits(decimals)) {
            return Err(MoneyError(Kind::NotDecimal));
        }
        if decimals.len() > MAX_DECIMALS {
            return Err(MoneyError(Kind::TooPrecise));
        }
        let mut nanos: i64 = 0;
        for digit in whole
            .bytes()
            .chain(decimals.bytes())
            .chain(std::iter::repeat_n(b'0', MAX_DECIMALS - decimals.len()))
        {
            nanos = nanos
                .checked_mul(10)
                .and_then(|n| n.checked_add(i64::from(digit - b'0')))
                .ok_or(MoneyError(Kind::TooLarge))?;
        }
        Ok(Nanos(nanos))
    }

    /// The amount as a decimal string with at least two decimals and no trailing zeros beyond them:
    /// 25 USD is `"25.00"`, 150 000 nano-dollars `"0.00015"`, one nano-dollar `"0.000000001"`.
    /// Dollars with two to nine decimals (trailing zeros dropped down to two): `2.50`, `0.00015`.
    /// Digit by digit rather than through `format!`: every receipt carries one.
    pub fn to_usd_string(self) -> String {
        let mut out = String::with_capacity(24);
        self.push_usd(&mut out);
        out
    }

    /// [`Self::to_usd_string`] appended to `out`.
    pub fn push_usd(self, out: &mut String) {
        let abs = self.0.unsigned_abs();
        let (mut whole, mut fraction) = (abs / NANOS_PER_USD, abs % NANOS_PER_USD);
        let mut decimals = 9;
        while decimals > 2 && fraction % 10 == 0 {
            fraction /= 10;
            decimals -= 1;
        }
        // Written backwards into a buffer long enough for i64::MIN's 10 + 1 + 9 digits and sign.
        let mut digits = [0u8; 21];
        let mut at = digits.len();
        let mut put = |byte: u8| {
            at -= 1;
            digits[at] = byte;
            at
        };
        for _ in 0..decimals {
            put(b'0' + (fraction % 10) as u8);
            fraction /= 10;
        }
        put(b'.');
        let mut start = loop {
            let at = put(b'0' + (whole % 10) as u8);
            whole /= 10;
            if whole == 0 {
                break at;
            }
        };
        if self.0 < 0 {
            start = put(b'-');
        }
        out.extend(digits[start..].iter().map(|&byte| char::from(byte)));
    }

    pub fn saturating_add(self, other: Nanos) -> Nanos {
        Nanos(self.0.saturating_add(other.0))
    }
}

impl fmt::Display for Nanos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_usd_string())
    }
}

/// The wire form is the decimal string: JSON numbers would invite float parsing downstream.
impl serde::Serialize for Nanos {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_usd_string())
    }
}

/// Why a string is not an amount of US dollars.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MoneyError(Kind);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Empty,
    Negative,
    NotDecimal,
    TooPrecise,
    TooLarge,
}

impl fmt::Display for MoneyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.0 {
            Kind::Empty => "an amount of US dollars is required, e.g. \"25.00\"",
            Kind::Negative => "a negative amount is not allowed",
            Kind::NotDecimal => "not a plain decimal amount of US dollars, e.g. \"25.00\" or \"0.000150\"",
            Kind::TooPrecise => "more than 9 decimal places (the smallest amount is 0.000000001 USD)",
            Kind::TooLarge => "amount too large (at most 9223372036.854775807 USD)",
        })
    }
}

impl std::error::Error for MoneyError {}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn usd(s: &str) -> Nanos {
        Nanos::parse_usd(s).expect("valid amount")
    }

    #[test]
    fn parses_exact_amounts() {
        assert_eq!(usd("25.00"), Nanos(25_000_000_000));
        assert_eq!(usd("0.000150"), Nanos(150_000));
        assert_eq!(usd("3"), Nanos(3_000_000_000));
        assert_eq!(usd("0"), Nanos::ZERO);
        assert_eq!(usd("0.000000001"), Nanos(1));
        assert_eq!(usd("007.5"), Nanos(7_500_000_000));
        assert_eq!(usd("9223372036.854775807"), Nanos(i64::MAX));
    }

    #[test]
    fn refuses_what_it_cannot_hold_exactly() {
        let refused = |s: &str, kind: Kind| assert_eq!(Nanos::parse_usd(s), Err(MoneyError(kind)), "{s:?}");
        refused("0.0000000001", Kind::TooPrecise);
        refused("1.0000000000", Kind::TooPrecise);
        refused("-1", Kind::Negative);
        refused("-0", Kind::Negative);
        refused("", Kind::Empty);
        refused("9223372036.854775808", Kind::TooLarge);
        refused("99999999999999999999999", Kind::TooLarge);
        for not_decimal in ["1e3", " 1", "1 ", "1.", ".5", ".", "+1", "1,5", "1.2.3", "0x10", "1_000", "١"] {
            refused(not_decimal, Kind::NotDecimal);
        }
    }

    #[test]
    fn errors_say_what_is_wrong() {
        let message = |s: &str| Nanos::parse_usd(s).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(message("1.0000000001").contains("9 decimal places"));
        assert!(message("-1").contains("negative"));
        assert!(message("1e3").contains("decimal"));
    }

    proptest! {
        #[test]
        fn prints_what_format_prints(n in any::<i64>()) {
            let abs = n.unsigned_abs();
            let mut decimals = format!("{:09}", abs % NANOS_PER_USD);
            while decimals.len() > 2 && decimals.ends_with('0') {
                decimals.pop();
            }
            let sign = if n < 0 { "-" } else { "" };
            prop_assert_eq!(Nanos(n).to_usd_string(), format!("{sign}{}.{decimals}", abs / NANOS_PER_USD));
        }
    }

    #[test]
    fn prints_two_to_nine_decimals() {
        assert_eq!(Nanos(25_000_000_000).to_usd_string(), "25.00");
        assert_eq!(Nanos(150_000).to_usd_string(), "0.00015");
        assert_eq!(Nanos(1).to_usd_string(), "0.000000001");
        assert_eq!(Nanos::ZERO.to_usd_string(), "0.00");
        assert_eq!(Nanos(2_500_000_000).to_usd_string(), "2.50");
        assert_eq!(Nanos(-1_250_000_000).to_usd_string(), "-1.25");
        assert_eq!(Nanos(i64::MAX).to_usd_string(), "9223372036.854775807");
        assert_eq!(Nanos(i64::MIN).to_usd_string(), "-9223372036.854775808");
    }

    #[test]
    fn serializes_as_the_decimal_string() {
        assert_eq!(serde_json::to_string(&Nanos(150_000)).expect("json"), "\"0.00015\"");
    }

    #[test]
    fn adds_without_overflow() {
        assert_eq!(Nanos(1).saturating_add(Nanos(2)), Nanos(3));
        assert_eq!(Nanos(i64::MAX).saturating_add(Nanos(1)), Nanos(i64::MAX));
    }

    proptest! {
        #[test]
        fn print_then_parse_is_identity(n in 0..=i64::MAX) {
            prop_assert_eq!(Nanos::parse_usd(&Nanos(n).to_usd_string()), Ok(Nanos(n)));
        }

        #[test]
        fn parse_agrees_with_integer_arithmetic(whole in 0u32.., decimals in proptest::collection::vec(0u8..10, 0..=9)) {
            let text = if decimals.is_empty() {
                whole.to_string()
            } else {
                format!("{whole}.{}", decimals.iter().map(|d| char::from(b'0' + d)).collect::<String>())
            };
            let fraction = decimals.iter().enumerate().map(|(i, &d)| i64::from(d) * 10_i64.pow(8 - i as u32)).sum::<i64>();
            prop_assert_eq!(Nanos::parse_usd(&text), Ok(Nanos(i64::from(whole) * 1_000_000_000 + fraction)));
        }
    }
}
