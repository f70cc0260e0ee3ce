//! Instants as milliseconds since the Unix epoch, printed as RFC 3339 UTC at the edges.

use time::OffsetDateTime;

use time::format_description::well_known::Rfc3339;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(pub i64);

/// How far a node's clock may stand from the shared counter store's before it is a fault worth an
/// alarm. Nodes decide windows on the store's clock whatever the offset; an offset this large
/// still says the node's own clock (its receipts' times, its logs) is wrong.
pub const CLOCK_TOLERANCE_MS: i64 = 2_000;

/// Whether a clock offset (milliseconds, either way) is past [`CLOCK_TOLERANCE_MS`].
pub fn clock_drifted(offset_ms: i64) -> bool {
    offset_ms.unsigned_abs() > CLOCK_TOLERANCE_MS.unsigned_abs()
}

impl Timestamp {
    pub fn from_unix_millis(ms: i64) -> Self {
        Self(ms)
    }

    /// The caller reads the clock; core only converts.
    pub fn from_system_time(at: std::time::SystemTime) -> Self {
        let ms = at.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
        Self(i64::try_from(ms).unwrap_or(i64::MAX))
    }

    pub fn unix_millis(self) -> i64 {
        self.0
    }

    pub fn parse_rfc3339(s: &str) -> Option<Self> {
        let at = OffsetDateTime::parse(s, &Rfc3339).ok()?;
        i64::try_from(at.unix_timestamp_nanos() / 1_000_000).ok().map(Self)
    }

    /// `YYYY-MM-DDTHH:MM:SS[.fff]Z`, the fraction without trailing zeros, as the `time` crate
    /// prints it (a property test holds them equal). Written by hand: every receipt carries two,
    /// and the general formatter cost a tenth of a receipt's serialization on the response path.
    pub fn to_rfc3339(self) -> String {
        let mut out = String::with_capacity(24);
        self.push_rfc3339(&mut out);
        out
    }

    /// [`Self::to_rfc3339`] appended to `out`.
    pub fn push_rfc3339(self, out: &mut String) {
        let day = self.0.div_euclid(MS_PER_DAY);
        let (year, month, day_of_month) = civil_from_days(day);
        if !(0..=9999).contains(&year) {
            out.push_str(&self.to_rfc3339_by_time());
            return;
        }
        let ms_of_day = self.0.rem_euclid(MS_PER_DAY);
        let (seconds, ms) = (ms_of_day / 1000, ms_of_day % 1000);
        // Written into a buffer and pushed once: a push a character costs a capacity check each.
        let mut text = *b"0000-00-00T00:00:00.000Z";
        // Every field is non-negative and below 10^width.
        let mut put = |at: usize, mut value: i64, width: usize| {
            for digit in text[at..at + width].iter_mut().rev() {
                *digit = b'0' + (value % 10) as u8;
                value /= 10;
            }
        };
        put(0, year, 4);
        put(5, month, 2);
        put(8, day_of_month, 2);
        put(11, seconds / 3600, 2);
        put(14, seconds / 60 % 60, 2);
        put(17, seconds % 60, 2);
        // The fraction without its trailing zeros, and none at all for a whole second.
        let (fraction, digits) = match ms {
            0 => (0, 0),
            _ if ms % 100 == 0 => (ms / 100, 1),
            _ if ms % 10 == 0 => (ms / 10, 2),
            _ => (ms, 3),
        };
        put(20, fraction, digits);
        let length = if digits == 0 { 19 } else { 20 + digits };
        text[length] = b'Z';
        out.push_str(std::str::from_utf8(&text[..=length]).unwrap_or_default());
    }

    fn to_rfc3339_by_time(self) -> String {
        let at = OffsetDateTime::from_unix_timestamp_nanos(i128::from(self.0) * 1_000_000)
            .unwrap_or(OffsetDateTime::UNIX_EPOCH);
        at.format(&Rfc3339).unwrap_or_default()
    }
}

impl serde::Serialize for Timestamp {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_rfc3339())
    }
}

pub(crate) const MS_PER_DAY: i64 = 86_400_000;

/// The proleptic Gregorian `(year, month 1..=12, day 1..=31)` of a day number.
///
/// Howard Hinnant's `civil_from_days`: days are counted in 400-year eras (146 097 days each) of
/// years that start on March 1st, so that the leap day is the last day of its year.
pub(crate) fn civil_from_days(day: i64) -> (i64, i64, i64) {
    let shifted = day + 719_468; // from 1970-01-01 to 0000-03-01
    let era = shifted.div_euclid(146_097);
    let day_of_era = shifted.rem_euclid(146_097); // 0..=146_096
    let year_of_era = (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100); // 0..=365
    let march_based_month = (5 * day_of_year + 2) / 153; // 0 = March .. 11 = February
    let day_of_month = day_of_year - (153 * march_based_month + 2) / 5 + 1;
    let month = if march_based_month < 10 { march_based_month + 3 } else { march_based_month - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day_of_month)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clock_drifts_past_the_tolerance_either_way() {
        assert!(!clock_drifted(0));
        assert!(!clock_drifted(2_000) && !clock_drifted(-2_000), "the tolerance itself is within");
        assert!(clock_drifted(2_001) && clock_drifted(-2_001));
        assert!(clock_drifted(i64::MIN), "no overflow");
    }

    #[test]
    fn rfc3339_round_trip() {
        let t = Timestamp::parse_rfc3339("2026-11-30T01:02:03.456Z").expect("valid");
        assert_eq!(t.to_rfc3339(), "2026-11-30T01:02:03.456Z");
        assert_eq!(Timestamp(0).to_rfc3339(), "1970-01-01T00:00:00Z");
        assert_eq!(
            Timestamp::parse_rfc3339("2026-11-30T02:00:00+01:00"),
            Timestamp::parse_rfc3339("2026-11-30T01:00:00Z")
        );
        assert_eq!(Timestamp::parse_rfc3339("yesterday"), None);
    }

    proptest::proptest! {
        #[test]
        fn prints_what_the_time_crate_prints(ms in -62_167_219_200_000_i64..253_402_300_800_000) {
            let at = Timestamp(ms);
            proptest::prop_assert_eq!(at.to_rfc3339(), at.to_rfc3339_by_time());
            proptest::prop_assert_eq!(Timestamp::parse_rfc3339(&at.to_rfc3339()), Some(at));
        }

        #[test]
        fn prints_round_seconds_and_tenths_alike(seconds in 0_i64..4_102_444_800, tenths in 0_i64..10) {
            let at = Timestamp(seconds * 1000 + tenths * 100);
            proptest::prop_assert_eq!(at.to_rfc3339(), at.to_rfc3339_by_time());
        }
    }

    #[test]
    fn years_outside_four_digits_fall_back_to_the_time_crate() {
        let before_year_zero = Timestamp(-62_167_219_200_001);
        assert_eq!(before_year_zero.to_rfc3339(), before_year_zero.to_rfc3339_by_time());
        assert_eq!(
            Timestamp(253_402_300_800_000).to_rfc3339(),
            Timestamp(253_402_300_800_000).to_rfc3339_by_time()
        );
    }
}
