//! Charts as SVG drawn on the server: no script, no library, and nothing a strict
//! Content-Security-Policy would block (geometry in attributes, colours from the style sheet).
//!
//! Lengths are integers scaled in `i128` from nano-dollars, so a bar's length is exact to the unit
//! of the drawing and no amount passes through a float.

use maud::{Markup, html};
use recovea_core::money::Nanos;

use super::format::cents;

/// One bar: its label and its amount.
pub(crate) struct Bar {
    pub(crate) label: String,
    pub(crate) value: Nanos,
}

/// `value` of `max` as a length of `full` units, rounded down; a positive value shows at least one.
pub(crate) fn scaled(value: Nanos, max: Nanos, full: i64) -> i64 {
    if value.0 <= 0 || max.0 <= 0 {
        return 0;
    }
    let length = i128::from(value.0.min(max.0)) * i128::from(full) / i128::from(max.0);
    i64::try_from(length).unwrap_or(full).max(1)
}

/// A cap's bar: spend against the limit, in thousandths of the width; `over` past the line.
pub(crate) fn meter(spent: Nanos, limit: Nanos, label: &str) -> Markup {
    let filled = if limit.0 <= 0 { if spent.0 > 0 { 1000 } else { 0 } } else { scaled(spent, limit, 1000) };
    let level = match permille(spent, limit) {
        p if p >= 1000 => "over",
        p if p >= 800 => "near",
        _ => "under",
    };
    html! {
        svg.meter viewBox="0 0 1000 16" preserveAspectRatio="none" role="img" aria-label=(label) {
            rect.track x="0" y="0" width="1000" height="16" {}
            rect class={ "fill " (level) } x="0" y="0" width=(filled) height="16" {}
        }
    }
}

/// Spend as thousandths of the limit, saturating at 10 000 (ten times over).
pub(crate) fn permille(spent: Nanos, limit: Nanos) -> i64 {
    if limit.0 <= 0 {
        return if spent.0 > 0 { 10_000 } else { 0 };
    }
    let p = i128::from(spent.0.max(0)) * 1000 / i128::from(limit.0);
    i64::try_from(p.min(10_000)).unwrap_or(10_000)
}

const COLUMN_WIDTH: i64 = 24;
const COLUMN_GAP: i64 = 6;
const PLOT_HEIGHT: i64 = 160;
const LABEL_BAND: i64 = 34;

/// Vertical bars, one per label (days): the label under every seventh bar, every amount in its
/// bar's tooltip and in the table the page prints beside the chart.
pub(crate) fn columns(bars: &[Bar], caption: &str) -> Markup {
    let max = bars.iter().map(|b| b.value).max().unwrap_or(Nanos::ZERO);
    let count = i64::try_from(bars.len()).unwrap_or(0);
    let width = (count * (COLUMN_WIDTH + COLUMN_GAP)).max(COLUMN_WIDTH);
    let height = PLOT_HEIGHT + LABEL_BAND;
    html! {
        figure.chart {
            svg viewBox={ "0 0 " (width) " " (height) } role="img" aria-label=(caption) {
                line.axis x1="0" y1=(PLOT_HEIGHT) x2=(width) y2=(PLOT_HEIGHT) {}
                @for (i, bar) in (0_i64..).zip(bars) {
                    @let h = scaled(bar.value, max, PLOT_HEIGHT);
                    @let x = i * (COLUMN_WIDTH + COLUMN_GAP);
                    rect.bar x=(x) y=(PLOT_HEIGHT - h) width=(COLUMN_WIDTH) height=(h) {
                        title { (bar.label) ": " (cents(bar.value)) }
                    }
                    // Every seventh day, and the last unless it would crowd the one before.
                    @if i % 7 == 0 || (i == count - 1 && i % 7 >= 3) {
                        text.tick x=(x) y=(PLOT_HEIGHT + 22) { (short_day(&bar.label)) }
                    }
                }
            }
            figcaption { (caption) "; highest " (cents(max)) }
        }
    }
}

const ROW_HEIGHT: i64 = 22;
const ROW_GAP: i64 = 6;
const LABEL_WIDTH: i64 = 260;
const ROW_PLOT: i64 = 440;
const AMOUNT_WIDTH: i64 = 110;

/// Horizontal bars, one per label (models), each with its label and amount written beside it.
pub(crate) fn rows(bars: &[Bar], caption: &str) -> Markup {
    let max = bars.iter().map(|b| b.value).max().unwrap_or(Nanos::ZERO);
    let count = i64::try_from(bars.len()).unwrap_or(0);
    let height = (count * (ROW_HEIGHT + ROW_GAP)).max(ROW_HEIGHT);
    let width = LABEL_WIDTH + ROW_PLOT + AMOUNT_WIDTH;
    html! {
        figure.chart {
            svg viewBox={ "0 0 " (width) " " (height) } role="img" aria-label=(caption) {
                @for (i, bar) in (0_i64..).zip(bars) {
                    @let y = i * (ROW_HEIGHT + ROW_GAP);
                    @let w = scaled(bar.value, max, ROW_PLOT);
                    text.label x="0" y=(y + 16) { (ellipsis(&bar.label, 34)) }
                    rect.bar x=(LABEL_WIDTH) y=(y) width=(w) height=(ROW_HEIGHT) {
                        title { (bar.label) ": " (cents(bar.value)) }
                    }
                    text.amount x=(LABEL_WIDTH + w + 8) y=(y + 16) { (cents(bar.value)) }
                }
            }
            figcaption { (caption) }
        }
    }
}

/// `12-02` from `2026-12-02`.
fn short_day(day: &str) -> &str {
    day.get(5..).unwrap_or(day)
}

fn ellipsis(text: &str, max_chars: usize) -> String {
    if text.chars().count() <= max_chars {
        return text.to_owned();
    }
    let mut out: String = text.chars().take(max_chars - 1).collect();
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_scale_exactly_and_a_spend_always_shows() {
        assert_eq!(scaled(Nanos(5), Nanos(10), 1000), 500);
        assert_eq!(scaled(Nanos(1), Nanos(1_000_000_000_000), 1000), 1, "a tiny spend still shows");
        assert_eq!(scaled(Nanos(0), Nanos(10), 1000), 0);
        assert_eq!(scaled(Nanos(20), Nanos(10), 1000), 1000, "never past the full length");
        assert_eq!(scaled(Nanos(i64::MAX), Nanos(i64::MAX), 1000), 1000);
        assert_eq!(permille(Nanos(8), Nanos(10)), 800);
        assert_eq!(permille(Nanos(1), Nanos(0)), 10_000);
    }

    #[test]
    fn a_meter_says_where_spend_stands() {
        let text = |spent, limit| meter(Nanos(spent), Nanos(limit), "spend").into_string();
        assert!(text(5, 10).contains("class=\"fill under\" x=\"0\" y=\"0\" width=\"500\""));
        assert!(text(8, 10).contains("fill near"));
        assert!(text(12, 10).contains("class=\"fill over\" x=\"0\" y=\"0\" width=\"1000\""));
    }

    #[test]
    fn labels_are_escaped() {
        let bars = [Bar { label: "<script>".into(), value: Nanos(1) }];
        let svg = rows(&bars, "by model").into_string();
        assert!(!svg.contains("<script>"));
        assert!(svg.contains("&lt;script&gt;"));
    }
}
