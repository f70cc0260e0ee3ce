//! The operator's pages: nodes and prices.

use bytes::Bytes;
use http::{Method, Response, StatusCode};
use http_body_util::Full;
use maud::html;
use recovea_core::timestamp::Timestamp;
use serde_json::Value;

use super::{FormView, Refused, action_button, csrf_field, given, layout, list, now, refused_page, str_of};
use crate::admin::requests::PriceWire;
use crate::console::api::{Body, ConsoleApi};
use crate::console::format::{exact, nanos, utc, utc_at};
use crate::console::{Form, Visit, page, redirect};

/// A node not heard from for this long is marked stale (nodes report every few seconds).
const NODE_STALE_AFTER_MS: i64 = 60_000;

/// Whether a node last seen at `seen` is stale at `now`.
pub(crate) fn node_is_stale(seen: Option<Timestamp>, now: Timestamp) -> bool {
    seen.is_none_or(|seen| now.0.saturating_sub(seen.0) > NODE_STALE_AFTER_MS)
}

pub(super) async fn nodes_page(control: &ConsoleApi<'_>, visit: &Visit) -> Response<Full<Bytes>> {
    let nodes = match control.api_json(Method::GET, &["nodes"], "", None).await {
        Ok(nodes) => nodes,
        Err(refusal) => return refused_page(&refusal, visit),
    };
    let at = now();
    let body = html! {
        h1 { "Nodes" }
        p.muted { "Feed version published: " strong { (nodes["feed_version"]) } ". A node not heard from for "
            (NODE_STALE_AFTER_MS / 1000) " s is marked stale. As of " (utc_at(at)) "." }
        @if list(&nodes, "nodes").is_empty() { p { "No node has reported in the last hour." } }
        @else {
            div.scroll { table {
                thead { tr { th { "Node" } th.num { "Feed version" } th.num { "Snapshot age" } th { "Counters confirmed" }
                    th.num { "Fail-open passes" } th { "Last seen (UTC)" } } }
                tbody {
                    @for n in list(&nodes, "nodes") {
                        @let stale = node_is_stale(Timestamp::parse_rfc3339(str_of(n, "last_seen_at")), at);
                        tr.stale[stale] data-node=(str_of(n, "id")) {
                            td { code { (str_of(n, "id")) } @if stale { " " span.badge.armed { "stale" } } }
                            td.num { (n["feed_version"]) }
                            td.num { @match n["snapshot_age_seconds"].as_u64() { Some(s) => { (s) " s" } None => { "—" } } }
                            td { @match n["counters_confirmed_at"].as_str() { Some(t) => { (utc(t)) } None => { "never" } } }
                            td.num { (n["fail_open_total"]) }
                            td { (utc(str_of(n, "last_seen_at"))) }
                        }
                    }
                }
            } }
        }
    };
    page(StatusCode::OK, layout("Nodes", Some(visit), "nodes", body))
}

const PRICE_FIELDS: [(&str, &str); 4] = [
    ("input_per_mtok_usd", "Input"),
    ("output_per_mtok_usd", "Output"),
    ("cached_input_per_mtok_usd", "Cached input"),
    ("cache_write_per_mtok_usd", "Cache write"),
];

pub(super) async fn prices_page(
    control: &ConsoleApi<'_>,
    visit: &Visit,
    refused: Option<&Refused>,
) -> Response<Full<Bytes>> {
    let prices = match control.api_json(Method::GET, &["prices"], "", None).await {
        Ok(prices) => prices,
        Err(refusal) => return refused_page(&refusal, visit),
    };
    let form = FormView::new("price", refused);
    let cell = |entry: &Value, field: &str| {
        entry[field].as_str().map(|usd| exact(nanos(usd))).unwrap_or_else(|| "—".into())
    };
    let status = refused.map_or(StatusCode::OK, |r| r.refusal.status);
    // Hundreds of models: a search on their names, as the URL's `q`.
    let params = crate::admin::query::Params::parse(&visit.query).unwrap_or_default();
    let searched = params.get("q").unwrap_or("").trim().to_owned();
    let wanted = searched.to_lowercase();
    let table = prices["prices"].as_object();
    let shown: Vec<(&String, &Value)> =
        table.into_iter().flatten().filter(|(model, _)| model.to_lowercase().contains(&wanted)).collect();
    let body = html! {
        h1 { "Prices" }
        p.muted { "Revision " strong { (prices["revision"]) } ". Dollars per million tokens, exact." }
        section.panel {
            h2 { "Override a price" }
            form #price.grid method="post" action="/prices" {
                (csrf_field(&visit.csrf))
                (form.input("model", "Model", "text", "", true))
                (form.select("kind", "Kind", &[("", "(not known)"), ("openai", "OpenAI-compatible"), ("anthropic", "Anthropic")], ""))
                @for (field, label) in PRICE_FIELDS {
                    (form.input(field, &format!("{label} (USD / MTok)"), "text", "", field.starts_with("input") || field.starts_with("output")))
                }
                (form.general(&["model", "kind", "input_per_mtok_usd", "output_per_mtok_usd", "cached_input_per_mtok_usd", "cache_write_per_mtok_usd"]))
                button type="submit" { "Save price" }
            }
        }
        h2 { "Fallback (an unpriced model of each kind)" }
        div.scroll { table {
            thead { tr { th { "Kind" } @for (_, label) in PRICE_FIELDS { th.num { (label) } } th { "Source" } } }
            tbody {
                @if let Some(fallback) = prices["fallback"].as_object() {
                    @for (kind, entry) in fallback {
                        tr { td { (kind) } @for (field, _) in PRICE_FIELDS { td.num { (cell(entry, field)) } } td { (str_of(entry, "source")) } }
                    }
                }
            }
        } }
        h2 { "The table in force" }
        form.search method="get" action="/prices" {
            input type="search" name="q" value=(searched) placeholder="Search models" aria-label="Search models";
            button type="submit" { "Search" }
        }
        p.muted.count { (shown.len()) " of " (table.map_or(0, serde_json::Map::len)) " models" }
        div.scroll { table.prices {
            thead { tr { th { "Model" } th { "Kind" } @for (_, label) in PRICE_FIELDS { th.num { (label) } } th { "Source" } th {} } }
            tbody {
                {
                    @for (model, entry) in &shown {
                        tr data-model=(model) {
                            td { code { (model) } }
                            td { (entry["kind"].as_str().unwrap_or("—")) }
                            @for (field, _) in PRICE_FIELDS { td.num { (cell(entry, field)) } }
                            td { (str_of(entry, "source")) @if let Some(rev) = entry["revision"].as_u64() { " (rev " (rev) ")" } }
                            td { @if str_of(entry, "source") == "override" {
                                (action_button("/prices/remove", &visit.csrf, "Remove override", Some("Remove this override?"), &[("model", model)]))
                            } }
                        }
                    }
                }
            }
        } }
    };
    page(status, layout("Prices", Some(visit), "prices", body))
}

pub(super) async fn put_price(control: &ConsoleApi<'_>, visit: &Visit, form: &Form) -> Response<Full<Bytes>> {
    let body = PriceWire {
        kind: given(form, "kind"),
        input_per_mtok_usd: form.text("input_per_mtok_usd").to_owned(),
        output_per_mtok_usd: form.text("output_per_mtok_usd").to_owned(),
        cached_input_per_mtok_usd: given(form, "cached_input_per_mtok_usd"),
        cache_write_per_mtok_usd: given(form, "cache_write_per_mtok_usd"),
        ..PriceWire::default()
    };
    let model = form.text("model");
    let mut segments = vec!["prices"];
    segments.extend(model.split('/'));
    match control.api_json(Method::PUT, &segments, "", Some(Body::of(&body))).await {
        Ok(_) => redirect("/prices"),
        Err(refusal) => prices_page(control, visit, Some(&Refused::new("price", form, refusal))).await,
    }
}

pub(super) async fn remove_price(
    control: &ConsoleApi<'_>,
    visit: &Visit,
    form: &Form,
) -> Response<Full<Bytes>> {
    let mut segments = vec!["prices"];
    segments.extend(form.text("model").split('/'));
    match control.api_json(Method::DELETE, &segments, "", None).await {
        Ok(_) => redirect("/prices"),
        Err(refusal) => prices_page(control, visit, Some(&Refused::new("price", form, refusal))).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_is_stale_after_a_minute_unheard() {
        let now = Timestamp(10_000_000);
        assert!(!node_is_stale(Some(now), now));
        assert!(!node_is_stale(Some(Timestamp(now.0 - NODE_STALE_AFTER_MS)), now));
        assert!(node_is_stale(Some(Timestamp(now.0 - NODE_STALE_AFTER_MS - 1)), now));
        assert!(node_is_stale(None, now));
    }
}
