//! Tokens and cost by provider kind and model. Model labels are bounded: only a name of the
//! built-in price table (the entry a receipt was priced as) becomes one; any other model counts as
//! `other`, an entry an operator added included (it may be named after a tenant's fine-tune, and
//! `/metrics` must not name tenants).

use std::fmt::Write as _;
use std::sync::RwLock;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use foldhash::HashMap;
use recovea_core::snapshot::ProviderKind;
use recovea_core::usage::Usage;

/// The most model labels per provider kind; past it (a price table larger than any real one),
/// models count as `other`.
const MAX_MODELS: usize = 1024;

/// The label of a model the price table does not name.
pub(crate) const OTHER: &str = "other";

/// The token kinds of `recovea_tokens_total`, in [`Tally::tokens`]'s order.
const TOKEN_KINDS: [&str; 5] = ["input", "cached_input", "cache_write_input", "output", "reasoning"];

#[derive(Default)]
struct Tally {
    tokens: [AtomicU64; TOKEN_KINDS.len()],
    cost_nanos: AtomicU64,
}

impl Tally {
    fn add(&self, usage: &Usage, cost_nanos: u64) {
        let counts = [
            usage.input_tokens,
            usage.cached_input_tokens,
            usage.cache_write_input_tokens,
            usage.output_tokens,
            usage.reasoning_tokens,
        ];
        for (counter, n) in self.tokens.iter().zip(counts) {
            if n > 0 {
                counter.fetch_add(n, Relaxed);
            }
        }
        self.cost_nanos.fetch_add(cost_nanos, Relaxed);
    }
}

/// Per provider kind: the tallies of the price table's models (a model is added the first time it
/// is seen, under the write lock; after that, counting takes the read lock and allocates nothing),
/// and of every other model.
#[derive(Default)]
pub(crate) struct ByModel {
    known: [RwLock<HashMap<Box<str>, Tally>>; ProviderKind::ALL.len()],
    other: [Tally; ProviderKind::ALL.len()],
}

impl ByModel {
    /// Counts a receipt's usage and cost; `priced_as`: the price table entry it was priced as.
    pub(crate) fn add(&self, kind: ProviderKind, priced_as: Option<&str>, usage: &Usage, cost_nanos: u64) {
        let k = kind.index();
        let Some(model) = priced_as.filter(|m| *m != OTHER) else {
            self.other[k].add(usage, cost_nanos);
            return;
        };
        {
            let known = self.known[k].read().unwrap_or_else(|p| p.into_inner());
            if let Some(tally) = known.get(model) {
                tally.add(usage, cost_nanos);
                return;
            }
        }
        // A model first seen: labelled only if the built-in table names it.
        if recovea_core::pricing::PriceTable::builtin().get(model).is_none() {
            self.other[k].add(usage, cost_nanos);
            return;
        }
        let mut known = self.known[k].write().unwrap_or_else(|p| p.into_inner());
        if known.len() >= MAX_MODELS && !known.contains_key(model) {
            drop(known);
            self.other[k].add(usage, cost_nanos);
            return;
        }
        known.entry(model.into()).or_default().add(usage, cost_nanos);
    }

    /// `recovea_tokens_total` and `recovea_cost_nanodollars_total`, models in name order.
    pub(crate) fn render(&self, out: &mut String) {
        let mut rows: Vec<(&str, String, [u64; TOKEN_KINDS.len()], u64)> = Vec::new();
        for kind in ProviderKind::ALL {
            let k = kind.index();
            let read = |tally: &Tally| {
                (tally.tokens.each_ref().map(|n| n.load(Relaxed)), tally.cost_nanos.load(Relaxed))
            };
            let known = self.known[k].read().unwrap_or_else(|p| p.into_inner());
            let mut models: Vec<_> = known.iter().map(|(m, t)| (m.to_string(), read(t))).collect();
            drop(known);
            models.sort();
            let (tokens, cost) = read(&self.other[k]);
            models.push((OTHER.to_owned(), (tokens, cost)));
            rows.extend(models.into_iter().map(|(m, (tokens, cost))| (kind.as_str(), m, tokens, cost)));
        }
        out.push_str(
            "# HELP recovea_tokens_total Tokens of receipts, by provider kind, model (price table names; others are `other`) and kind of token. input counts every input token, the cached ones included.\n# TYPE recovea_tokens_total counter\n",
        );
        for (provider, model, tokens, _) in &rows {
            for (kind, n) in TOKEN_KINDS.iter().zip(tokens) {
                let _ = writeln!(
                    out,
                    "recovea_tokens_total{{provider=\"{provider}\",model=\"{}\",kind=\"{kind}\"}} {n}",
                    escape(model)
                );
            }
        }
        out.push_str(
            "# HELP recovea_cost_nanodollars_total Cost of receipts in nano-dollars (1e-9 USD), exact, by provider kind and model.\n# TYPE recovea_cost_nanodollars_total counter\n",
        );
        for (provider, model, _, cost) in &rows {
            let _ = writeln!(
                out,
                "recovea_cost_nanodollars_total{{provider=\"{provider}\",model=\"{}\"}} {cost}",
                escape(model)
            );
        }
    }
}

/// A label value as the text format needs it: backslash, double quote and newline escaped.
fn escape(value: &str) -> std::borrow::Cow<'_, str> {
    if !value.contains(['\\', '"', '\n']) {
        return value.into();
    }
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n").into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_models_get_their_label_and_the_rest_count_as_other() {
        let by_model = ByModel::default();
        let usage = Usage { input_tokens: 10, cached_input_tokens: 4, output_tokens: 3, ..Usage::default() };
        by_model.add(ProviderKind::OpenAi, Some("gpt-4o"), &usage, 150);
        by_model.add(ProviderKind::OpenAi, Some("gpt-4o"), &usage, 150);
        by_model.add(ProviderKind::OpenAi, None, &usage, 7);
        by_model.add(ProviderKind::Anthropic, Some("claude-sonnet-4-5"), &usage, 1);
        // An entry an operator added, named after a tenant's fine-tune: no label names it.
        by_model.add(ProviderKind::OpenAi, Some("ft:gpt-4o:acme-corp::abc123"), &usage, 5);
        let mut out = String::new();
        by_model.render(&mut out);
        for line in [
            "recovea_tokens_total{provider=\"openai\",model=\"gpt-4o\",kind=\"input\"} 20\n",
            "recovea_tokens_total{provider=\"openai\",model=\"gpt-4o\",kind=\"cached_input\"} 8\n",
            "recovea_tokens_total{provider=\"openai\",model=\"gpt-4o\",kind=\"output\"} 6\n",
            "recovea_tokens_total{provider=\"openai\",model=\"other\",kind=\"input\"} 20\n",
            "recovea_cost_nanodollars_total{provider=\"openai\",model=\"gpt-4o\"} 300\n",
            "recovea_cost_nanodollars_total{provider=\"openai\",model=\"other\"} 12\n",
            "recovea_cost_nanodollars_total{provider=\"anthropic\",model=\"claude-sonnet-4-5\"} 1\n",
            "recovea_cost_nanodollars_total{provider=\"anthropic\",model=\"other\"} 0\n",
        ] {
            assert!(out.contains(line), "{line}{out}");
        }
    }

    #[test]
    fn the_model_labels_are_bounded() {
        let by_model = ByModel::default();
        let usage = Usage { input_tokens: 1, ..Usage::default() };
        let builtin = recovea_core::pricing::PriceTable::builtin();
        for (name, _) in builtin.iter().take(MAX_MODELS + 10) {
            by_model.add(ProviderKind::OpenAi, Some(name), &usage, 1);
        }
        let mut out = String::new();
        by_model.render(&mut out);
        let models = out
            .lines()
            .filter(|l| l.starts_with("recovea_cost_nanodollars_total{provider=\"openai\""))
            .count();
        assert_eq!(models, MAX_MODELS + 1);
        assert!(
            out.contains("recovea_cost_nanodollars_total{provider=\"openai\",model=\"other\"} 10\n"),
            "{out}"
        );
    }
}
