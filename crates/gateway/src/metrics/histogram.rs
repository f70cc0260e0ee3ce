//! Latency histograms kept in atomics (no lock, no allocation on the request path) and written in
//! the Prometheus text format, in seconds.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// The upper bounds of the buckets, in microseconds: from a gateway's own refusal (well under a
/// millisecond) to a long generation (minutes).
pub(crate) const BUCKETS_US: [u64; 17] = [
    1_000,
    2_500,
    5_000,
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    30_000_000,
    60_000_000,
    120_000_000,
    300_000_000,
];

/// Counts per bucket (not cumulative: one increment per observation), the last one `+Inf`'s, and
/// the sum in microseconds.
#[derive(Default)]
pub(crate) struct Histogram {
    buckets: [AtomicU64; BUCKETS_US.len() + 1],
    sum_us: AtomicU64,
}

impl Histogram {
    pub(crate) fn observe(&self, elapsed: Duration) {
        let us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        // The first bucket whose bound holds it (`le`: less than or equal).
        let bucket = BUCKETS_US.partition_point(|bound| *bound < us);
        self.buckets[bucket].fetch_add(1, Relaxed);
        self.sum_us.fetch_add(us, Relaxed);
    }

    fn count(&self) -> u64 {
        self.buckets.iter().map(|n| n.load(Relaxed)).sum()
    }

    /// Its `_bucket`, `_sum` and `_count` lines, `labels` (`a="x",b="y"`) on each.
    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let mut cumulative = 0;
        for (i, n) in self.buckets.iter().enumerate() {
            cumulative += n.load(Relaxed);
            match BUCKETS_US.get(i) {
                Some(bound) => {
                    let _ =
                        writeln!(out, "{name}_bucket{{{labels},le=\"{}\"}} {cumulative}", Seconds(*bound));
                }
                None => {
                    let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {cumulative}");
                }
            }
        }
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", Seconds(self.sum_us.load(Relaxed)));
        let _ = writeln!(out, "{name}_count{{{labels}}} {cumulative}");
    }
}

/// A family of histograms with two labels; only the series that observed something are written
/// (the others would be thousands of zero lines).
pub(crate) fn render_family<'h>(
    out: &mut String,
    (name, help): (&str, &str),
    (first, second): (&str, &str),
    series: impl Iterator<Item = (&'static str, &'static str, &'h Histogram)>,
) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
    let mut labels = String::new();
    for (a, b, histogram) in series {
        if histogram.count() == 0 {
            continue;
        }
        labels.clear();
        let _ = write!(labels, "{first}=\"{a}\",{second}=\"{b}\"");
        histogram.render(out, name, &labels);
    }
}

/// Microseconds written as seconds, exactly (no float on the way).
struct Seconds(u64);

impl std::fmt::Display for Seconds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (whole, micros) = (self.0 / 1_000_000, self.0 % 1_000_000);
        if micros == 0 {
            return write!(f, "{whole}");
        }
        let fraction = format!("{micros:06}");
        write!(f, "{whole}.{}", fraction.trim_end_matches('0'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_observation_counts_in_its_bucket_and_every_later_one() {
        let histogram = Histogram::default();
        histogram.observe(Duration::from_micros(1_000));
        histogram.observe(Duration::from_millis(30));
        histogram.observe(Duration::from_secs(3600));
        let mut out = String::new();
        histogram.render(&mut out, "t", "p=\"x\"");
        assert!(out.contains("t_bucket{p=\"x\",le=\"0.001\"} 1\n"), "{out}");
        assert!(out.contains("t_bucket{p=\"x\",le=\"0.025\"} 1\n"), "{out}");
        assert!(out.contains("t_bucket{p=\"x\",le=\"0.05\"} 2\n"), "{out}");
        assert!(out.contains("t_bucket{p=\"x\",le=\"300\"} 2\n"), "{out}");
        assert!(out.contains("t_bucket{p=\"x\",le=\"+Inf\"} 3\n"), "{out}");
        assert!(out.contains("t_sum{p=\"x\"} 3600.031\n"), "{out}");
        assert!(out.contains("t_count{p=\"x\"} 3\n"), "{out}");
    }

    #[test]
    fn seconds_are_written_exactly() {
        assert_eq!(Seconds(2_500).to_string(), "0.0025");
        assert_eq!(Seconds(1_000_000).to_string(), "1");
        assert_eq!(Seconds(1).to_string(), "0.000001");
        assert_eq!(Seconds(0).to_string(), "0");
    }
}
