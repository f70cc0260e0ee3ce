//! Instants as milliseconds since the Unix epoch, printed as RFC 3339 UTC at the edges.

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(pub i64);

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

    pub fn to_rfc3339(self) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
