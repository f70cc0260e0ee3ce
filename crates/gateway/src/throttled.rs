//! Logging what may happen thousands of times a second (refused connections, lost receipts): a
//! line at most once a second, saying how many happened since the last.

use std::time::{Duration, Instant};

/// How often a throttled event is logged at most.
const EVERY: Duration = Duration::from_secs(1);

/// Counts an event and says when to log it.
#[derive(Default)]
pub(crate) struct Throttled {
    count: u64,
    logged_at: Option<Instant>,
}

impl Throttled {
    /// Counts one; `Some(n)`: log now, `n` events since the last line (this one included).
    pub(crate) fn note(&mut self) -> Option<u64> {
        self.count += 1;
        if self.logged_at.is_some_and(|at| at.elapsed() < EVERY) {
            return None;
        }
        self.logged_at = Some(Instant::now());
        Some(std::mem::take(&mut self.count))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_is_logged_and_the_next_within_a_second_are_counted_into_the_following_line() {
        let mut throttled = Throttled::default();
        assert_eq!(throttled.note(), Some(1));
        assert_eq!((throttled.note(), throttled.note()), (None, None));
        // As if the second had passed.
        throttled.logged_at = Instant::now().checked_sub(EVERY);
        assert_eq!(throttled.note(), Some(3));
    }
}
