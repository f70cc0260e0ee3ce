//! One organization's page: its spend against each cap, caps, keys, credentials, charts and alerts.

use std::collections::BTreeMap;

use bytes::Bytes;
use http::{Method, Response, StatusCode};
use http_body_util::Full;
use maud::{Markup, html};
use recovea_core::money::Nanos;
use recovea_core::timestamp::Timestamp;
use recovea_core::window::Window;
use serde_json::Value;

use super::orgs::cap_bar;
use super::tokens::tokens_section;
use super::{
    FormView, NewSecret, Refused, action_button, csrf_field, layout, list, now, refused_page, shown, str_of,
};
use crate::admin::access;
use crate::admin::routes::Route;
use crate::console::api::{ConsoleApi, Refusal, encode, query};
use crate::console::chart::{self, Bar};
use crate::console::format::{cents, nanos, utc};
use crate::console::{Visit, page};

const MS_PER_DAY: i64 = 86_400_000;
/// The charts of an organization's page cover this many days, today included.
const CHART_DAYS: i64 = 30;

/// Everything an organization's page shows, read through the API.
struct OrgData {
    org: Value,
    caps: Value,
    spend: Value,
    keys: Value,
    providers: Value,
    alerts: Value,
    tokens: Value,
    summary: Value,
    month: Nanos,
}

async fn org_data(control: &ConsoleApi<'_>, org: &str, at: Timestamp) -> Result<OrgData, Refusal> {
    let get = |segments: Vec<&'static str>| {
        let mut path: Vec<&str> = vec!["orgs", org];
        path.extend(segments);
        path.iter().map(|s| (*s).to_owned()).collect::<Vec<String>>()
    };
    let read = |path: Vec<String>, q: String| async move {
        let segments: Vec<&str> = path.iter().map(String::as_str).collect();
        control.api_json(Method::GET, &segments, &q, None).await
    };
    // One summary serves the charts and the month to date: from whichever of their starts is first.
    let month_start = Window::Month.start(at);
    let summary_from = chart_start(at).min(month_start).to_rfc3339();
    let summary = read(get(vec!["receipts", "summary"]), query(&[("from", &summary_from)])).await?;
    let month = spend_since(&summary, month_start);
    Ok(OrgData {
        org: read(get(vec![]), String::new()).await?,
        caps: read(get(vec!["caps"]), String::new()).await?,
        spend: read(get(vec!["spend"]), String::new()).await?,
        keys: read(get(vec!["keys"]), String::new()).await?,
        providers: read(get(vec!["providers"]), String::new()).await?,
        alerts: read(get(vec!["alerts"]), String::new()).await?,
        tokens: read(get(vec!["tokens"]), String::new()).await?,
        summary,
        month,
    })
}

/// The first instant of the charts' first day.
pub(super) fn chart_start(at: Timestamp) -> Timestamp {
    Timestamp(Window::Day.start(at).0 - (CHART_DAYS - 1) * MS_PER_DAY)
}

/// `YYYY-MM-DD` of the UTC day of `at`, as the spend summary names days.
pub(super) fn day_of(at: Timestamp) -> String {
    at.to_rfc3339().chars().take(10).collect()
}

/// The spend of a summary's rows from the day of `since` on.
pub(super) fn spend_since(summary: &Value, since: Timestamp) -> Nanos {
    let first = day_of(since);
    list(summary, "rows")
        .iter()
        .filter(|row| str_of(row, "day") >= first.as_str())
        .fold(Nanos::ZERO, |sum, row| sum.saturating_add(nanos(str_of(row, "cost_usd"))))
}

pub(super) async fn org_page(
    control: &ConsoleApi<'_>,
    visit: &Visit,
    org: &str,
    refused: Option<&Refused>,
    secret: Option<NewSecret>,
) -> Response<Full<Bytes>> {
    let at = now();
    let data = match org_data(control, org, at).await {
        Ok(data) => data,
        Err(refusal) => return refused_page(&refusal, visit),
    };
    let status = refused.map_or(StatusCode::OK, |r| r.refusal.status);
    let name = str_of(&data.org, "name").to_owned();
    let body = html! {
        h1 { (shown(&name)) }
        p.muted { code { (org) } " · created " (utc(str_of(&data.org, "created_at"))) " · "
            a href={ "/orgs/" (encode(org)) "/receipts" } { "Receipts" } }
        @if let Some(secret) = &secret {
            section.panel.new-secret #new-secret role="status" {
                h2 { (secret.what) " " (shown(&secret.name)) " created" }
                p { "Its secret is shown this once. Copy it now: it is stored only as a hash." }
                p.secret { code #secret-value { (secret.secret) } button.copy type="button" data-copy="secret-value" hidden { "Copy" } }
            }
        }
        section.panel #spend {
            h2 { "Spend" }
            p { "Month to date " strong.month-spend { (cents(data.month)) } }
            @for row in list(&data.spend, "spend") { (cap_bar(row, at)) }
        }
        (caps_section(org, &data, visit, refused))
        (keys_section(org, &data, visit, refused))
        (providers_section(org, &data, visit, refused))
        (charts_section(&data, at))
        (alerts_section(&data))
        (tokens_section(org, &data.tokens, visit, refused))
    };
    page(status, layout(&name, Some(visit), "orgs", body))
}

fn caps_section(org: &str, data: &OrgData, visit: &Visit, refused: Option<&Refused>) -> Markup {
    let keys = list(&data.keys, "keys");
    let mut key_options: Vec<(&str, &str)> = vec![("", "(none: the whole organization)")];
    key_options.extend(keys.iter().map(|k| (str_of(k, "id"), str_of(k, "name"))));
    let form = FormView::new("new-cap", refused);
    html! {
        section.panel #caps {
            h2 { "Caps" }
            @if list(&data.caps, "caps").is_empty() { p.muted { "No caps." } }
            @for cap in list(&data.caps, "caps") {
                @let id = str_of(cap, "id");
                @let armed = cap["hard_stop"].as_bool().unwrap_or(false);
                @let edit = FormView::new(id, refused);
                @let alert_at: Vec<String> = list(cap, "alert_at").iter().map(Value::to_string).collect();
                div.cap-row data-cap=(id) {
                    div.cap-head {
                        span.cap-name { (str_of(cap, "window")) " · "
                            @match cap["key_id"].as_str() { Some(key) => { "key " code { (key) } } None => { "organization" } } }
                        @if armed { span.badge.armed { "armed" } } @else { span.badge.soft { "soft" } }
                        span.muted { "alerts at " (alert_at.join(", ")) }
                    }
                    @if visit.may(Route::UpdateCap { cap: id }) {
                        form.row method="post" action={ "/caps/" (encode(id)) } {
                            (csrf_field(&visit.csrf))
                            (edit.input("limit_usd", "Limit (USD)", "text", str_of(cap, "limit_usd"), true))
                            (edit.input("alert_webhook", "Alert webhook", "url", str_of(cap, "alert_webhook"), false))
                            (edit.general(&["limit_usd", "alert_webhook"]))
                            button type="submit" { "Save" }
                        }
                    } @else {
                        p.cap-settings { "Limit " strong.cap-limit { "$" (str_of(cap, "limit_usd")) }
                            @if let Some(hook) = cap["alert_webhook"].as_str() { " · alerts to " code { (shown(hook)) } } }
                    }
                    div.actions {
                        @if visit.may(Route::UpdateCap { cap: id }) {
                            @if armed {
                                (action_button(&format!("/caps/{}/disarm", encode(id)), &visit.csrf, "Disarm", None, &[]))
                            } @else {
                                (action_button(&format!("/caps/{}/arm", encode(id)), &visit.csrf, "Arm", None, &[]))
                            }
                        }
                        @if visit.may(Route::DeleteCap { cap: id }) {
                            (action_button(&format!("/caps/{}/delete", encode(id)), &visit.csrf, "Delete",
                                Some("Delete this cap?"), &[]))
                        }
                    }
                }
            }
            @if visit.may(Route::CreateCap { org }) { (new_cap_form(org, visit, &key_options, &form)) }
        }
    }
}

fn new_cap_form(org: &str, visit: &Visit, key_options: &[(&str, &str)], form: &FormView<'_>) -> Markup {
    html! {
        h3 { "New cap" }
        form #new-cap.grid method="post" action={ "/orgs/" (encode(org)) "/caps" } {
            (csrf_field(&visit.csrf))
            (form.select("scope", "Scope", &[("organization", "Organization"), ("key", "One key")], "organization"))
            (form.select("key_id", "Key (scope: one key)", key_options, ""))
            (form.select("window", "Window", &[("day", "Day"), ("week", "Week"), ("month", "Month")], "month"))
            (form.input("limit_usd", "Limit (USD)", "text", "", true))
            div.field.check {
                input #new-cap-hard_stop type="checkbox" name="hard_stop" value="true"
                    checked[form.value("hard_stop", "true") == "true"];
                label for="new-cap-hard_stop" { "Armed: refuse requests at the line (402)" }
            }
            (form.input("alert_at", "Alert at (fractions of the limit)", "text", "0.5, 0.8, 1", false))
            (form.input("alert_webhook", "Alert webhook (optional)", "url", "", false))
            (form.general(&["scope", "key_id", "window", "limit_usd", "alert_at", "alert_webhook"]))
            button type="submit" { "Create cap" }
        }
    }
}

fn keys_section(org: &str, data: &OrgData, visit: &Visit, refused: Option<&Refused>) -> Markup {
    let form = FormView::new("new-key", refused);
    let limit = |key: &Value, field: &str| key[field].as_u64().map(|n| n.to_string()).unwrap_or_default();
    html! {
        section.panel #keys {
            h2 { "Keys" }
            @if list(&data.keys, "keys").is_empty() { p.muted { "No keys." } }
            @for key in list(&data.keys, "keys") {
                @let id = str_of(key, "id");
                @let revoked = key["revoked_at"].as_str();
                @let edit = FormView::new(id, refused);
                div.key-row data-key=(id) {
                    div.cap-head {
                        strong { (shown(str_of(key, "name"))) }
                        code { (str_of(key, "prefix")) "…" }
                        @if let Some(at) = revoked { span.badge.armed.revoked { "revoked " (utc(at)) } }
                        @else { span.badge.soft { "active" } }
                    }
                    p.muted { "Created " (utc(str_of(key, "created_at")))
                        @if let Some(at) = key["expires_at"].as_str() { " · expires " (utc(at)) } }
                    @if revoked.is_none() && visit.may(Route::UpdateKey { key: id }) {
                        form.row method="post" action={ "/keys/" (encode(id)) "/limits" } {
                            (csrf_field(&visit.csrf))
                            (edit.input("requests_per_minute", "Requests / minute", "text", &limit(key, "requests_per_minute"), false))
                            (edit.input("tokens_per_minute", "Tokens / minute", "text", &limit(key, "tokens_per_minute"), false))
                            (edit.general(&["requests_per_minute", "tokens_per_minute"]))
                            button type="submit" { "Save limits" }
                        }
                    } @else if revoked.is_none() {
                        p.muted { "Requests / minute " (or_none(&limit(key, "requests_per_minute")))
                            " · tokens / minute " (or_none(&limit(key, "tokens_per_minute"))) }
                    }
                    @if revoked.is_none() && visit.may(Route::RevokeKey { key: id }) {
                        div.actions {
                            (action_button(&format!("/keys/{}/revoke", encode(id)), &visit.csrf, "Revoke",
                                Some("Revoke this key? Requests with it are refused at once."), &[]))
                        }
                    }
                }
            }
            @if visit.may(Route::CreateKey { org }) { (new_key_form(org, visit, &form)) }
        }
    }
}

/// A limit as a page shows it: "no limit" when there is none.
fn or_none(limit: &str) -> &str {
    if limit.is_empty() { "no limit" } else { limit }
}

fn new_key_form(org: &str, visit: &Visit, form: &FormView<'_>) -> Markup {
    html! {
        h3 { "New key" }
        form #new-key.grid method="post" action={ "/orgs/" (encode(org)) "/keys" } {
            (csrf_field(&visit.csrf))
            (form.input("name", "Name", "text", "", true))
            (form.input("requests_per_minute", "Requests / minute (optional)", "text", "", false))
            (form.input("tokens_per_minute", "Tokens / minute (optional)", "text", "", false))
            (form.input("expires_at", "Expires at, UTC (optional)", "datetime-local", "", false))
            (form.general(&["name", "requests_per_minute", "tokens_per_minute", "expires_at"]))
            button type="submit" { "Create key" }
        }
    }
}

/// Where a credential's models are priced: its namespace (its name's unless set), and the fallback
/// price a model no entry prices gets (its own, or its namespace's or kind's most expensive).
fn pricing_of(provider: &Value) -> Markup {
    let namespace = provider["price_namespace"].as_str().unwrap_or_else(|| str_of(provider, "name"));
    html! {
        "namespace " code { (namespace) }
        @if provider["price_namespace"].is_null() { span.muted { " (its name, if priced)" } }
        br;
        @match (provider["fallback_input_per_mtok_usd"].as_str(), provider["fallback_output_per_mtok_usd"].as_str()) {
            (Some(input), Some(output)) => { "fallback $" (input) " / $" (output) " per Mtok" }
            _ => { span.muted { "fallback: the namespace's or kind's dearest price" } }
        }
    }
}

fn providers_section(org: &str, data: &OrgData, visit: &Visit, refused: Option<&Refused>) -> Markup {
    let form = FormView::new("provider", refused);
    // The operator sets a credential whole; an organization's admin replaces its API key alone
    // (`access::credential_settings`), which leaving the other settings out keeps.
    let scope = visit.scope(Route::PutProvider { org, name: "" });
    let whole = scope.as_ref().is_some_and(access::sets_whole_credentials);
    let key_alone = scope.is_some() && !whole;
    html! {
        section.panel #providers {
            h2 { "Provider credentials" }
            @if list(&data.providers, "providers").is_empty() { p.muted { "None: requests use the client's own provider key." } }
            @else {
                div.scroll { table {
                    thead { tr { th { "Name" } th { "Kind" } th { "Base URL" } th { "Key" } th { "Priced" } @if key_alone { th { "Replace the API key" } } } }
                    tbody {
                        @for p in list(&data.providers, "providers") {
                            tr data-provider=(str_of(p, "name")) {
                                td { (shown(str_of(p, "name"))) } td { (str_of(p, "kind")) }
                                td { (p["base_url"].as_str().unwrap_or("(default)")) }
                                td { code.hint { (str_of(p, "key_hint")) } }
                                td.pricing { (pricing_of(p)) }
                                @if key_alone { td { (replace_key_form(org, p, visit)) } }
                            }
                        }
                    }
                } }
            }
            @if whole { (credential_form(org, visit, &form)) }
        }
    }
}

/// A credential's API key replaced, its other settings kept (an organization admin's form).
fn replace_key_form(org: &str, provider: &Value, visit: &Visit) -> Markup {
    let name = str_of(provider, "name");
    html! {
        form.inline.replace-key method="post" action={ "/orgs/" (encode(org)) "/providers" } {
            (csrf_field(&visit.csrf))
            input type="hidden" name="name" value=(name);
            input type="hidden" name="kind" value=(str_of(provider, "kind"));
            input type="password" name="api_key" autocomplete="off" required aria-label={ "New API key of " (name) };
            button type="submit" { "Replace" }
        }
    }
}

/// A credential set whole: the operator's form.
fn credential_form(org: &str, visit: &Visit, form: &FormView<'_>) -> Markup {
    html! {
        h3 { "Set or replace a credential" }
        form #provider.grid method="post" action={ "/orgs/" (encode(org)) "/providers" } {
            (csrf_field(&visit.csrf))
            (form.input("name", "Name", "text", "openai", true))
            (form.select("kind", "Kind", &[("openai", "OpenAI-compatible"), ("anthropic", "Anthropic")], "openai"))
            (form.input("base_url", "Base URL (optional)", "url", "", false))
            (form.input("price_namespace", "Price namespace (optional: its name's)", "text", "", false))
            (form.input("fallback_input_per_mtok_usd", "Fallback input $/Mtok (optional)", "text", "", false))
            (form.input("fallback_output_per_mtok_usd", "Fallback output $/Mtok (optional)", "text", "", false))
            div.field {
                label for="provider-api_key" { "API key" }
                input #provider-api_key type="password" name="api_key" autocomplete="off" required;
                (form.error("api_key"))
            }
            (form.general(&["name", "kind", "base_url", "api_key", "price_namespace", "fallback_input_per_mtok_usd", "fallback_output_per_mtok_usd"]))
            button type="submit" { "Save credential" }
        }
    }
}

fn charts_section(data: &OrgData, at: Timestamp) -> Markup {
    let first_day = chart_start(at);
    let mut by_day: BTreeMap<String, Nanos> =
        (0..CHART_DAYS).map(|i| (day_of(Timestamp(first_day.0 + i * MS_PER_DAY)), Nanos::ZERO)).collect();
    let mut by_model: BTreeMap<String, Nanos> = BTreeMap::new();
    let first_label = day_of(first_day);
    // The summary may start earlier (at the month's start): the charts take their days only.
    for row in list(&data.summary, "rows").iter().filter(|row| str_of(row, "day") >= first_label.as_str()) {
        let cost = nanos(str_of(row, "cost_usd"));
        let day = by_day.entry(str_of(row, "day").to_owned()).or_default();
        *day = day.saturating_add(cost);
        let model = row["model"].as_str().unwrap_or("(no model)").to_owned();
        let spent = by_model.entry(model).or_default();
        *spent = spent.saturating_add(cost);
    }
    let days: Vec<Bar> = by_day.into_iter().map(|(label, value)| Bar { label, value }).collect();
    let mut models: Vec<Bar> = by_model.into_iter().map(|(label, value)| Bar { label, value }).collect();
    models.sort_by(|a, b| b.value.cmp(&a.value).then_with(|| a.label.cmp(&b.label)));
    html! {
        section.panel #charts {
            h2 { "Spend, last " (CHART_DAYS) " days" }
            h3 { "By day (UTC)" }
            (chart::columns(&days, &format!("Spend per UTC day, last {CHART_DAYS} days")))
            details {
                summary { "By day, as a table" }
                div.scroll { table {
                    thead { tr { th { "Day (UTC)" } th.num { "Spend" } } }
                    tbody { @for d in days.iter().rev() { tr { td { (d.label) } td.num { (cents(d.value)) } } } }
                } }
            }
            h3 { "By model" }
            @if models.is_empty() { p.muted { "No spend in these days." } }
            @else { (chart::rows(&models, &format!("Spend per model, last {CHART_DAYS} days"))) }
        }
    }
}

fn alerts_section(data: &OrgData) -> Markup {
    html! {
        section.panel #alerts {
            h2 { "Alerts" }
            @if list(&data.alerts, "alerts").is_empty() { p.muted { "No alert raised." } }
            @else {
                div.scroll { table {
                    thead { tr { th { "Raised (UTC)" } th { "Cap" } th.num { "Threshold" } th.num { "Spend" } th.num { "Limit" } th { "Delivered" } } }
                    tbody {
                        @for a in list(&data.alerts, "alerts") {
                            tr {
                                td { (utc(str_of(a, "raised_at"))) }
                                td { code { (str_of(a, "cap_id")) } }
                                td.num { (a["threshold"]) }
                                td.num { (cents(nanos(str_of(a, "spend_usd")))) }
                                td.num { (cents(nanos(str_of(a, "limit_usd")))) }
                                td { @match a["delivered_at"].as_str() {
                                    Some(at) => { (utc(at)) }
                                    None => { "not yet (" (a["delivery_attempts"]) " attempts)" }
                                } }
                            }
                        }
                    }
                } }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_month_to_date_counts_the_days_of_the_month_only() {
        let summary = json!({ "rows": [
            { "day": "2026-11-30", "cost_usd": "5.00" },
            { "day": "2026-12-01", "cost_usd": "0.000000001" },
            { "day": "2026-12-02", "cost_usd": "1.50" },
        ] });
        let december = Timestamp::parse_rfc3339("2026-12-01T00:00:00Z").expect("a time");
        assert_eq!(spend_since(&summary, december), Nanos(1_500_000_001));
        assert_eq!(
            day_of(Timestamp::parse_rfc3339("2026-12-02T23:59:59.999Z").expect("a time")),
            "2026-12-02"
        );
    }
}
