//! The console's pages and forms. Each handler calls the admin API (see [`super::api`]) and renders
//! its JSON; a form is turned into the API's JSON body, and a refusal re-renders the page with the
//! API's message beside the field it names.

use std::collections::BTreeMap;

use bytes::Bytes;
use http::{Method, Response, StatusCode, header};
use http_body_util::Full;
use maud::{DOCTYPE, Markup, html};
use recovea_core::money::Nanos;
use recovea_core::projection::{Projection, reaches_line};
use recovea_core::timestamp::Timestamp;
use recovea_core::window::Window;
use serde_json::{Map, Value, json};

use super::api::{Answered, ConsoleApi, Refusal, encode, query};
use super::chart::{self, Bar};
use super::format::{
    cents, cost, exact, field_from_rfc3339, nanos, rfc3339_from_field, utc, utc_at, utc_minute,
};
use super::{Form, Visit, page, redirect, set_header};

const MS_PER_DAY: i64 = 86_400_000;
/// The charts of an organization's page cover this many days, today included.
const CHART_DAYS: i64 = 30;
/// A node not heard from for this long is marked stale (nodes report every few seconds).
const NODE_STALE_AFTER_MS: i64 = 60_000;
/// Receipts on one page of the console.
const RECEIPTS_PER_PAGE: &str = "50";

/// A form the API refused: which form, what it sent, and what the API said.
pub(crate) struct Refused {
    form: String,
    sent: Vec<(String, String)>,
    refusal: Refusal,
}

impl Refused {
    fn new(form: impl Into<String>, sent: &Form, refusal: Refusal) -> Self {
        Self { form: form.into(), sent: sent.echo(), refusal }
    }
}

/// A freshly created key's secret: shown on the page that answers the form, and never again.
struct NewSecret {
    name: String,
    secret: String,
}

pub(crate) async fn dispatch(
    control: &ConsoleApi<'_>,
    method: &Method,
    segments: &[&str],
    visit: &Visit,
    form: &Form,
) -> Response<Full<Bytes>> {
    match (method, segments) {
        (&Method::GET, []) => orgs_page(control, visit, None).await,
        (&Method::POST, ["orgs"]) => create_org(control, visit, form).await,
        (&Method::GET, ["orgs", org]) => org_page(control, visit, org, None, None).await,
        (&Method::POST, ["orgs", org, "caps"]) => create_cap(control, visit, org, form).await,
        (&Method::POST, ["orgs", org, "keys"]) => create_key(control, visit, org, form).await,
        (&Method::POST, ["orgs", org, "providers"]) => put_provider(control, visit, org, form).await,
        (&Method::GET, ["orgs", org, "receipts"]) => receipts_page(control, visit, org).await,
        (&Method::GET, ["orgs", org, "receipts.csv"]) => receipts_csv(control, visit, org).await,
        (&Method::GET, ["orgs", org, "receipts", receipt]) => {
            receipt_page(control, visit, org, receipt).await
        }
        (&Method::POST, ["caps", cap]) => cap_action(control, visit, cap, None, form).await,
        (&Method::POST, ["caps", cap, action]) => cap_action(control, visit, cap, Some(action), form).await,
        (&Method::POST, ["keys", key, action]) => key_action(control, visit, key, action, form).await,
        (&Method::GET, ["nodes"]) => nodes_page(control, visit).await,
        (&Method::GET, ["prices"]) => prices_page(control, visit, None).await,
        (&Method::POST, ["prices"]) => put_price(control, visit, form).await,
        (&Method::POST, ["prices", "remove"]) => remove_price(control, visit, form).await,
        _ => page(StatusCode::NOT_FOUND, message("No such page.", Some(&visit.csrf))),
    }
}

// ------------------------------------------------------------------------------------------------
// Layout and form pieces
// ------------------------------------------------------------------------------------------------

fn layout(title: &str, csrf: Option<&str>, current: &str, body: Markup) -> Markup {
    let link = |href: &str, name: &str, text: &str| {
        html! { a href=(href) aria-current=[(current == name).then_some("page")] { (text) } }
    };
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (shown(title)) " · Recovea console" }
                link rel="stylesheet" href="/assets/console.css";
                script src="/assets/console.js" defer {}
            }
            body {
                header.top {
                    a.brand href="/" { "Recovea" }
                    @if let Some(csrf) = csrf {
                        nav {
                            (link("/", "orgs", "Organizations"))
                            (link("/nodes", "nodes", "Nodes"))
                            (link("/prices", "prices", "Prices"))
                        }
                        form.sign-out method="post" action="/sign-out" {
                            (csrf_field(csrf))
                            button type="submit" { "Sign out" }
                        }
                    }
                }
                main { (body) }
                footer { "Times in UTC. Amounts in US dollars, to the cent in lists." }
            }
        }
    }
}

fn csrf_field(csrf: &str) -> Markup {
    html! { input type="hidden" name="csrf" value=(csrf); }
}

pub(crate) fn sign_in(error: Option<&str>) -> Markup {
    layout(
        "Sign in",
        None,
        "",
        html! {
            section.sign-in {
                h1 { "Sign in" }
                form method="post" action="/sign-in" {
                    label for="token" { "Admin token" }
                    input #token type="password" name="token" autocomplete="current-password" required autofocus;
                    @if let Some(error) = error {
                        p.form-error role="alert" { (error) }
                    }
                    button type="submit" { "Sign in" }
                }
                p.hint {
                    "The admin token: the one given to " code { "--admin-token" } ", or else the one generated on the first start, printed then and saved in "
                    code { "admin-token" } " in the data directory (" code { "./recovea-data/admin-token" } " by default). It stays on this server: the browser keeps only a session cookie."
                }
            }
        },
    )
}

pub(crate) fn message(text: &str, csrf: Option<&str>) -> Markup {
    layout(
        "Console",
        csrf,
        "",
        html! { p.form-error role="alert" { (text) } p { a href="/" { "Back to the organizations" } } },
    )
}

/// A form of a page, and the refusal to show in it if the API refused it.
struct FormView<'a> {
    id: &'a str,
    refused: Option<&'a Refused>,
}

impl<'a> FormView<'a> {
    fn new(id: &'a str, refused: Option<&'a Refused>) -> Self {
        Self { id, refused: refused.filter(|r| r.form == id) }
    }

    /// What the refused form sent in `field`, else `default`.
    fn value(&self, field: &str, default: &str) -> String {
        match self.refused {
            Some(r) => r.sent.iter().find(|(n, _)| n == field).map_or("", |(_, v)| v.as_str()).to_owned(),
            None => default.to_owned(),
        }
    }

    fn error(&self, field: &str) -> Markup {
        html! {
            @if let Some(r) = self.refused.filter(|r| r.refusal.param.as_deref() == Some(field)) {
                p.field-error id={ (self.id) "-" (field) "-error" } role="alert" { (r.refusal.message) }
            }
        }
    }

    /// The refusal when it names none of `fields` (a missing organization, a conflict).
    fn general(&self, fields: &[&str]) -> Markup {
        html! {
            @if let Some(r) = self.refused.filter(|r| !r.refusal.param.as_deref().is_some_and(|p| fields.contains(&p))) {
                p.form-error role="alert" { (r.refusal.message) }
            }
        }
    }

    /// A labelled input with its error below it.
    fn input(&self, field: &str, label: &str, kind: &str, default: &str, required: bool) -> Markup {
        let id = format!("{}-{field}", self.id);
        let invalid = self.refused.is_some_and(|r| r.refusal.param.as_deref() == Some(field));
        html! {
            div.field {
                label for=(id) { (label) }
                input id=(id) type=(kind) name=(field) value=(self.value(field, default)) required[required]
                    aria-invalid=[invalid.then_some("true")]
                    aria-describedby=[invalid.then(|| format!("{}-{field}-error", self.id))];
                (self.error(field))
            }
        }
    }

    fn select(&self, field: &str, label: &str, options: &[(&str, &str)], default: &str) -> Markup {
        let id = format!("{}-{field}", self.id);
        let chosen = self.value(field, default);
        html! {
            div.field {
                label for=(id) { (label) }
                select id=(id) name=(field) {
                    @for (value, text) in options {
                        option value=(value) selected[*value == chosen] { (shown(text)) }
                    }
                }
                (self.error(field))
            }
        }
    }
}

fn action_button(
    action: &str,
    csrf: &str,
    text: &str,
    confirm: Option<&str>,
    hidden: &[(&str, &str)],
) -> Markup {
    html! {
        form.inline method="post" action=(action) data-confirm=[confirm] {
            (csrf_field(csrf))
            @for (name, value) in hidden { input type="hidden" name=(name) value=(value); }
            button type="submit" { (text) }
        }
    }
}

fn str_of<'a>(value: &'a Value, field: &str) -> &'a str {
    value[field].as_str().unwrap_or("")
}

/// Text a tenant or a client wrote (a name, a model, a path), as a page shows it: a control
/// character or a bidirectional mark or override (which would show `gpt-4o` for `o4-tpg`, or hide
/// text) is shown as its escape, `\u{202e}`; HTML escaping is maud's.
fn shown(text: &str) -> std::borrow::Cow<'_, str> {
    let hidden = |c: char| {
        c.is_control()
            || matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    if !text.chars().any(hidden) {
        return std::borrow::Cow::Borrowed(text);
    }
    std::borrow::Cow::Owned(
        text.chars()
            .map(|c| if hidden(c) { c.escape_unicode().to_string() } else { c.to_string() })
            .collect(),
    )
}

fn list<'a>(value: &'a Value, field: &str) -> &'a [Value] {
    value[field].as_array().map_or(&[], Vec::as_slice)
}

fn refused_page(refusal: &Refusal, visit: &Visit) -> Response<Full<Bytes>> {
    page(refusal.status, message(&refusal.message, Some(&visit.csrf)))
}

fn now() -> Timestamp {
    Timestamp::from_system_time(std::time::SystemTime::now())
}

/// A whole number from a form field: the number when it is one, else the text itself, so that the
/// API, not the console, says what is wrong with it.
fn number_or_text(text: &str) -> Value {
    text.parse::<u64>().map_or_else(|_| json!(text), |n| json!(n))
}

// ------------------------------------------------------------------------------------------------
// Organizations
// ------------------------------------------------------------------------------------------------

/// One cap's window as `GET /orgs/{org}/spend` reports it.
struct CapSpend<'a> {
    row: &'a Value,
    spent: Nanos,
    limit: Nanos,
}

impl<'a> CapSpend<'a> {
    fn of(row: &'a Value) -> Self {
        Self { row, spent: nanos(str_of(row, "spend_usd")), limit: nanos(str_of(row, "limit_usd")) }
    }

    fn projection(&self, at: Timestamp) -> Projection {
        let time = |field| Timestamp::parse_rfc3339(str_of(self.row, field)).unwrap_or(at);
        reaches_line(self.spent, self.limit, time("window_start"), time("window_end"), at)
    }
}

fn cap_bar(row: &Value, at: Timestamp) -> Markup {
    let cap = CapSpend::of(row);
    let armed = row["hard_stop"].as_bool().unwrap_or(false);
    let scope = match row["key_id"].as_str() {
        Some(key) => format!("key {key}"),
        None => "whole organization".to_owned(),
    };
    let window = Window::parse(str_of(row, "window")).map_or("", Window::adjective);
    let label = format!("{window} cap on the {scope}: {} of {}", cents(cap.spent), cents(cap.limit));
    html! {
        div.cap-bar data-cap=(str_of(row, "cap_id")) {
            div.cap-head {
                span.cap-name { (window) " cap · " (scope) }
                @if armed { span.badge.armed { "armed" } } @else { span.badge.soft { "soft" } }
            }
            (chart::meter(cap.spent, cap.limit, &label))
            div.cap-figures {
                span.spent { (cents(cap.spent)) } " of " span.limit { (cents(cap.limit)) }
                " (" (chart::permille(cap.spent, cap.limit) / 10) "%)"
            }
            div.cap-window {
                "Window " (utc_minute(Timestamp::parse_rfc3339(str_of(row, "window_start")).unwrap_or(at)))
                " to " (utc_minute(Timestamp::parse_rfc3339(str_of(row, "window_end")).unwrap_or(at)))
            }
            div.projection {
                @match cap.projection(at) {
                    Projection::Reached => { strong { "At the line" } @if armed { ": requests are refused until the window ends." } @else { ": soft cap, requests still pass." } }
                    Projection::At(when) => { "Reaches the line at the current rate on " strong { (utc_minute(when)) } }
                    Projection::NotThisWindow => { "Does not reach the line this window at the current rate." }
                }
            }
        }
    }
}

/// Month-to-date spend of an organization: the sum of its spend summary since the month began.
async fn month_to_date(control: &ConsoleApi<'_>, org: &str, at: Timestamp) -> Result<Nanos, Refusal> {
    let from = Window::Month.start(at);
    let q = query(&[("from", &from.to_rfc3339())]);
    let summary = control.api_json(Method::GET, &["orgs", org, "receipts", "summary"], &q, None).await?;
    Ok(spend_since(&summary, from))
}

async fn orgs_page(
    control: &ConsoleApi<'_>,
    visit: &Visit,
    refused: Option<&Refused>,
) -> Response<Full<Bytes>> {
    let orgs = match control.api_json(Method::GET, &["orgs"], "", None).await {
        Ok(orgs) => orgs,
        Err(refusal) => return refused_page(&refusal, visit),
    };
    let at = now();
    let mut cards = Vec::new();
    for org in list(&orgs, "orgs") {
        let id = str_of(org, "id");
        let spend = match month_to_date(control, id, at).await {
            Ok(spend) => spend,
            Err(refusal) => return refused_page(&refusal, visit),
        };
        let caps = match control.api_json(Method::GET, &["orgs", id, "spend"], "", None).await {
            Ok(caps) => caps,
            Err(refusal) => return refused_page(&refusal, visit),
        };
        cards.push(html! {
            section.org-card data-org=(id) {
                div.org-head {
                    h2 { a href={ "/orgs/" (encode(id)) } { (shown(str_of(org, "name"))) } }
                    span.month-spend { "Month to date " strong { (cents(spend)) } }
                }
                p.muted { code { (id) } }
                @for row in list(&caps, "spend") { (cap_bar(row, at)) }
                @if list(&caps, "spend").is_empty() { p.muted { "No caps." } }
            }
        });
    }
    let form = FormView::new("new-org", refused);
    let status = refused.map_or(StatusCode::OK, |r| r.refusal.status);
    page(
        status,
        layout(
            "Organizations",
            Some(&visit.csrf),
            "orgs",
            html! {
                h1 { "Organizations" }
                p.muted { "Spend as of " (utc_at(at)) "." }
                @for card in &cards { (card) }
                @if cards.is_empty() { p { "No organizations yet." } }
                section.panel {
                    h2 { "New organization" }
                    form #new-org method="post" action="/orgs" {
                        (csrf_field(&visit.csrf))
                        (form.input("name", "Name", "text", "", true))
                        (form.general(&["name"]))
                        button type="submit" { "Create organization" }
                    }
                }
            },
        ),
    )
}

async fn create_org(control: &ConsoleApi<'_>, visit: &Visit, form: &Form) -> Response<Full<Bytes>> {
    let body = json!({ "name": form.text("name") });
    match control.api_json(Method::POST, &["orgs"], "", Some(body)).await {
        Ok(org) => redirect(&format!("/orgs/{}", encode(str_of(&org, "id")))),
        Err(refusal) => orgs_page(control, visit, Some(&Refused::new("new-org", form, refusal))).await,
    }
}

// ------------------------------------------------------------------------------------------------
// One organization
// ------------------------------------------------------------------------------------------------

/// Everything an organization's page shows, read through the API.
struct OrgData {
    org: Value,
    caps: Value,
    spend: Value,
    keys: Value,
    providers: Value,
    alerts: Value,
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
        summary,
        month,
    })
}

/// The first instant of the charts' first day.
fn chart_start(at: Timestamp) -> Timestamp {
    Timestamp(Window::Day.start(at).0 - (CHART_DAYS - 1) * MS_PER_DAY)
}

/// `YYYY-MM-DD` of the UTC day of `at`, as the spend summary names days.
fn day_of(at: Timestamp) -> String {
    at.to_rfc3339().chars().take(10).collect()
}

/// The spend of a summary's rows from the day of `since` on.
fn spend_since(summary: &Value, since: Timestamp) -> Nanos {
    let first = day_of(since);
    list(summary, "rows")
        .iter()
        .filter(|row| str_of(row, "day") >= first.as_str())
        .fold(Nanos::ZERO, |sum, row| sum.saturating_add(nanos(str_of(row, "cost_usd"))))
}

async fn org_page(
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
                h2 { "Key " (secret.name) " created" }
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
    };
    page(status, layout(&name, Some(&visit.csrf), "orgs", body))
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
                    form.row method="post" action={ "/caps/" (encode(id)) } {
                        (csrf_field(&visit.csrf))
                        (edit.input("limit_usd", "Limit (USD)", "text", str_of(cap, "limit_usd"), true))
                        (edit.input("alert_webhook", "Alert webhook", "url", str_of(cap, "alert_webhook"), false))
                        (edit.general(&["limit_usd", "alert_webhook"]))
                        button type="submit" { "Save" }
                    }
                    div.actions {
                        @if armed {
                            (action_button(&format!("/caps/{}/disarm", encode(id)), &visit.csrf, "Disarm", None, &[]))
                        } @else {
                            (action_button(&format!("/caps/{}/arm", encode(id)), &visit.csrf, "Arm", None, &[]))
                        }
                        (action_button(&format!("/caps/{}/delete", encode(id)), &visit.csrf, "Delete",
                            Some("Delete this cap?"), &[]))
                    }
                }
            }
            h3 { "New cap" }
            form #new-cap.grid method="post" action={ "/orgs/" (encode(org)) "/caps" } {
                (csrf_field(&visit.csrf))
                (form.select("scope", "Scope", &[("organization", "Organization"), ("key", "One key")], "organization"))
                (form.select("key_id", "Key (scope: one key)", &key_options, ""))
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
                    @if revoked.is_none() {
                        form.row method="post" action={ "/keys/" (encode(id)) "/limits" } {
                            (csrf_field(&visit.csrf))
                            (edit.input("requests_per_minute", "Requests / minute", "text", &limit(key, "requests_per_minute"), false))
                            (edit.input("tokens_per_minute", "Tokens / minute", "text", &limit(key, "tokens_per_minute"), false))
                            (edit.general(&["requests_per_minute", "tokens_per_minute"]))
                            button type="submit" { "Save limits" }
                        }
                        div.actions {
                            (action_button(&format!("/keys/{}/revoke", encode(id)), &visit.csrf, "Revoke",
                                Some("Revoke this key? Requests with it are refused at once."), &[]))
                        }
                    }
                }
            }
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
    html! {
        section.panel #providers {
            h2 { "Provider credentials" }
            @if list(&data.providers, "providers").is_empty() { p.muted { "None: requests use the client's own provider key." } }
            @else {
                div.scroll { table {
                    thead { tr { th { "Name" } th { "Kind" } th { "Base URL" } th { "Key" } th { "Priced" } } }
                    tbody {
                        @for p in list(&data.providers, "providers") {
                            tr data-provider=(str_of(p, "name")) {
                                td { (shown(str_of(p, "name"))) } td { (str_of(p, "kind")) }
                                td { (p["base_url"].as_str().unwrap_or("(default)")) }
                                td { code.hint { (str_of(p, "key_hint")) } }
                                td.pricing { (pricing_of(p)) }
                            }
                        }
                    }
                } }
            }
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

/// Puts the form's `field` into `body` if the form gave it: an empty field is left for the API's
/// default.
fn insert_if_given(body: &mut Map<String, Value>, form: &Form, field: &str) {
    if !form.text(field).is_empty() {
        body.insert(field.into(), json!(form.text(field)));
    }
}

/// Answers a form of `org`'s page: back to its `section` once the API took it, or the page again
/// with the refusal shown on the form called `form_name`.
async fn back_to_org(
    control: &ConsoleApi<'_>,
    visit: &Visit,
    org: &str,
    section: &str,
    (form_name, form): (&str, &Form),
    result: Result<Value, Refusal>,
) -> Response<Full<Bytes>> {
    match result {
        Ok(_) => redirect(&format!("/orgs/{}#{section}", encode(org))),
        Err(refusal) => {
            org_page(control, visit, org, Some(&Refused::new(form_name, form, refusal)), None).await
        }
    }
}

async fn create_cap(
    control: &ConsoleApi<'_>,
    visit: &Visit,
    org: &str,
    form: &Form,
) -> Response<Full<Bytes>> {
    let mut body = Map::new();
    body.insert("scope".into(), json!(form.text("scope")));
    insert_if_given(&mut body, form, "key_id");
    body.insert("window".into(), json!(form.text("window")));
    body.insert("limit_usd".into(), json!(form.text("limit_usd")));
    body.insert("hard_stop".into(), json!(form.text("hard_stop") == "true"));
    let alert_at = form.text("alert_at");
    if !alert_at.is_empty() {
        // `0.5, 0.8, 1` is a JSON array's contents; anything else goes as text for the API to refuse.
        let parsed =
            serde_json::from_str::<Value>(&format!("[{alert_at}]")).unwrap_or_else(|_| json!(alert_at));
        body.insert("alert_at".into(), parsed);
    }
    insert_if_given(&mut body, form, "alert_webhook");
    let result = control.api_json(Method::POST, &["orgs", org, "caps"], "", Some(Value::Object(body))).await;
    back_to_org(control, visit, org, "caps", ("new-cap", form), result).await
}

async fn cap_action(
    control: &ConsoleApi<'_>,
    visit: &Visit,
    cap: &str,
    action: Option<&str>,
    form: &Form,
) -> Response<Full<Bytes>> {
    // The cap's organization, for the page to return to (and to show a refusal on).
    let current = match control.api_json(Method::GET, &["caps", cap], "", None).await {
        Ok(current) => current,
        Err(refusal) => return refused_page(&refusal, visit),
    };
    let org = str_of(&current, "org_id").to_owned();
    let result = match action {
        None => {
            let webhook = form.text("alert_webhook");
            let body = json!({
                "limit_usd": form.text("limit_usd"),
                "alert_webhook": if webhook.is_empty() { Value::Null } else { json!(webhook) },
            });
            control.api_json(Method::PATCH, &["caps", cap], "", Some(body)).await
        }
        Some("arm") => {
            control.api_json(Method::PATCH, &["caps", cap], "", Some(json!({ "hard_stop": true }))).await
        }
        Some("disarm") => {
            control.api_json(Method::PATCH, &["caps", cap], "", Some(json!({ "hard_stop": false }))).await
        }
        Some("delete") => control.api_json(Method::DELETE, &["caps", cap], "", None).await,
        Some(_) => return page(StatusCode::NOT_FOUND, message("No such page.", Some(&visit.csrf))),
    };
    back_to_org(control, visit, &org, "caps", (cap, form), result).await
}

async fn create_key(
    control: &ConsoleApi<'_>,
    visit: &Visit,
    org: &str,
    form: &Form,
) -> Response<Full<Bytes>> {
    let mut body = Map::new();
    body.insert("name".into(), json!(form.text("name")));
    for field in ["requests_per_minute", "tokens_per_minute"] {
        if !form.text(field).is_empty() {
            body.insert(field.into(), number_or_text(form.text(field)));
        }
    }
    if !form.text("expires_at").is_empty() {
        body.insert("expires_at".into(), json!(rfc3339_from_field(form.text("expires_at"))));
    }
    match control.api_json(Method::POST, &["orgs", org, "keys"], "", Some(Value::Object(body))).await {
        Ok(key) => {
            let secret = NewSecret {
                name: str_of(&key, "name").to_owned(),
                secret: str_of(&key, "secret").to_owned(),
            };
            org_page(control, visit, org, None, Some(secret)).await
        }
        Err(refusal) => {
            org_page(control, visit, org, Some(&Refused::new("new-key", form, refusal)), None).await
        }
    }
}

async fn key_action(
    control: &ConsoleApi<'_>,
    visit: &Visit,
    key: &str,
    action: &str,
    form: &Form,
) -> Response<Full<Bytes>> {
    let result = match action {
        "revoke" => control.api_json(Method::POST, &["keys", key, "revoke"], "", None).await,
        "limits" => {
            // An empty field removes the limit (`null`), as the API's patch reads it.
            let limit = |field: &str| match form.text(field) {
                "" => Value::Null,
                text => number_or_text(text),
            };
            let body = json!({
                "requests_per_minute": limit("requests_per_minute"),
                "tokens_per_minute": limit("tokens_per_minute"),
            });
            control.api_json(Method::PATCH, &["keys", key], "", Some(body)).await
        }
        _ => return page(StatusCode::NOT_FOUND, message("No such page.", Some(&visit.csrf))),
    };
    match result {
        Ok(answer) => redirect(&format!("/orgs/{}#keys", encode(str_of(&answer, "org_id")))),
        Err(refusal) => match control.api_json(Method::GET, &["keys", key], "", None).await {
            Ok(current) => {
                let org = str_of(&current, "org_id").to_owned();
                org_page(control, visit, &org, Some(&Refused::new(key, form, refusal)), None).await
            }
            Err(_) => refused_page(&refusal, visit),
        },
    }
}

async fn put_provider(
    control: &ConsoleApi<'_>,
    visit: &Visit,
    org: &str,
    form: &Form,
) -> Response<Full<Bytes>> {
    let mut body = Map::new();
    body.insert("kind".into(), json!(form.text("kind")));
    for field in
        ["base_url", "price_namespace", "fallback_input_per_mtok_usd", "fallback_output_per_mtok_usd"]
    {
        insert_if_given(&mut body, form, field);
    }
    body.insert("api_key".into(), json!(form.get("api_key").unwrap_or("")));
    let name = form.text("name");
    let result =
        control.api_json(Method::PUT, &["orgs", org, "providers", name], "", Some(Value::Object(body))).await;
    back_to_org(control, visit, org, "providers", ("provider", form), result).await
}

// ------------------------------------------------------------------------------------------------
// Receipts
// ------------------------------------------------------------------------------------------------

/// The receipts filters of a console URL, as the API's query.
fn receipt_filters(visit: &Visit) -> (Vec<(&'static str, String)>, String) {
    let params = crate::admin::query::Params::parse(&visit.query).unwrap_or_default();
    let get = |name: &str| params.get(name).unwrap_or("").trim().to_owned();
    let filters = vec![
        ("from", rfc3339_from_field(&get("from"))),
        ("to", rfc3339_from_field(&get("to"))),
        ("key_id", get("key_id")),
        ("model", get("model")),
        ("status", get("status")),
        ("usage_source", get("usage_source")),
    ];
    (filters, get("cursor"))
}

fn pairs<'a>(filters: &'a [(&'static str, String)]) -> Vec<(&'a str, &'a str)> {
    filters.iter().map(|(n, v)| (*n, v.as_str())).collect()
}

async fn receipts_page(control: &ConsoleApi<'_>, visit: &Visit, org: &str) -> Response<Full<Bytes>> {
    let (filters, cursor) = receipt_filters(visit);
    let org_json = match control.api_json(Method::GET, &["orgs", org], "", None).await {
        Ok(org) => org,
        Err(refusal) => return refused_page(&refusal, visit),
    };
    let keys = match control.api_json(Method::GET, &["orgs", org, "keys"], "", None).await {
        Ok(keys) => keys,
        Err(refusal) => return refused_page(&refusal, visit),
    };
    let mut api_query = pairs(&filters);
    api_query.push(("cursor", &cursor));
    api_query.push(("limit", RECEIPTS_PER_PAGE));
    let answer = control.api_json(Method::GET, &["orgs", org, "receipts"], &query(&api_query), None).await;
    let (receipts, refused) = match answer {
        Ok(receipts) => (receipts, None),
        Err(refusal) => (json!({ "receipts": [], "next_cursor": null }), Some(refusal)),
    };
    let refused = refused.map(|refusal| Refused {
        form: "filters".into(),
        // As the fields show them: times in the `datetime-local` form.
        sent: filters
            .iter()
            .map(|(n, v)| {
                let shown = if matches!(*n, "from" | "to") { field_from_rfc3339(v) } else { v.clone() };
                ((*n).to_owned(), shown)
            })
            .collect(),
        refusal,
    });
    let view = FormView::new("filters", refused.as_ref());
    let value = |name: &str| filters.iter().find(|(n, _)| *n == name).map_or("", |(_, v)| v.as_str());
    let filter_query = query(&pairs(&filters));
    let base = format!("/orgs/{}/receipts", encode(org));
    let mut key_options: Vec<(&str, &str)> = vec![("", "All keys")];
    key_options.extend(list(&keys, "keys").iter().map(|k| (str_of(k, "id"), str_of(k, "name"))));
    let name = str_of(&org_json, "name");
    let status = refused.as_ref().map_or(StatusCode::OK, |r| r.refusal.status);
    let body = html! {
        h1 { "Receipts · " a href={ "/orgs/" (encode(org)) } { (shown(name)) } }
        form #filters.grid method="get" action=(base) {
            (view.input("from", "From, UTC (inclusive)", "datetime-local", &field_from_rfc3339(value("from")), false))
            (view.input("to", "To, UTC (exclusive)", "datetime-local", &field_from_rfc3339(value("to")), false))
            (view.select("key_id", "Key", &key_options, value("key_id")))
            (view.input("model", "Model", "text", value("model"), false))
            (view.input("status", "HTTP status", "text", value("status"), false))
            (view.select("usage_source", "Usage", &[("", "Any"), ("provider", "Reported by the provider"), ("estimated", "Estimated"), ("unmetered", "Unmetered")], value("usage_source")))
            (view.general(&["from", "to", "key_id", "model", "status", "usage_source"]))
            button type="submit" { "Filter" }
        }
        p.actions {
            a.button #csv href={ (base) ".csv" @if !filter_query.is_empty() { "?" (filter_query) } } { "Export CSV (filtered, up to 100,000)" }
            @if !cursor.is_empty() { " " a href={ (base) @if !filter_query.is_empty() { "?" (filter_query) } } { "First page" } }
        }
        @if list(&receipts, "receipts").is_empty() { p.muted { "No receipts." } }
        @else {
            div.scroll { table.receipts {
                thead { tr { th { "Started (UTC)" } th { "Key" } th { "Model" } th { "Endpoint" } th.num { "Status" }
                    th.num { "Tokens in / out" } th.num { "Cost" } th { "Usage" } } }
                tbody {
                    @for r in list(&receipts, "receipts") {
                        tr {
                            td { a href={ (base) "/" (encode(str_of(r, "id"))) } { (utc(str_of(r, "started_at"))) } }
                            td { code { (str_of(r, "key_id")) } }
                            td { (shown(r["model"].as_str().unwrap_or("—"))) }
                            td { (shown(str_of(r, "endpoint"))) }
                            td.num { (r["status"]) }
                            td.num { (r["input_tokens"]) " / " (r["output_tokens"]) }
                            td.num { (cost(nanos(str_of(r, "cost_usd")))) }
                            td {
                                @match str_of(r, "usage_source") { "estimated" => { span.badge.soft { "estimated" } } "unmetered" => { span.badge.soft { "unmetered" } } _ => { "reported" } }
                                @if r["priced"] == json!(false) {
                                    " " span.badge.warn title={ "No price: costed at " (str_of(r, "priced_as")) } { "fallback price" }
                                }
                            }
                        }
                    }
                }
            } }
        }
        @if let Some(next) = receipts["next_cursor"].as_str() {
            p { a.button #next-page href={ (base) "?" (query(&[pairs(&filters).as_slice(), &[("cursor", next)]].concat())) } { "Next page" } }
        }
    };
    page(status, layout("Receipts", Some(&visit.csrf), "orgs", body))
}

async fn receipts_csv(control: &ConsoleApi<'_>, visit: &Visit, org: &str) -> Response<Full<Bytes>> {
    let (filters, _) = receipt_filters(visit);
    let mut api_query = pairs(&filters);
    api_query.push(("format", "csv"));
    match control.api(Method::GET, &["orgs", org, "receipts"], &query(&api_query), None).await {
        Ok(Answered::Csv(text)) => {
            let mut response = Response::new(Full::new(Bytes::from(text)));
            set_header(&mut response, header::CONTENT_TYPE, "text/csv; charset=utf-8");
            let file = format!("attachment; filename=\"receipts-{}.csv\"", encode(org));
            set_header(&mut response, header::CONTENT_DISPOSITION, &file);
            set_header(&mut response, header::CACHE_CONTROL, "no-store");
            super::secure_headers(response.headers_mut());
            response
        }
        Ok(Answered::Json(_)) => {
            page(StatusCode::INTERNAL_SERVER_ERROR, message("The export was not CSV.", Some(&visit.csrf)))
        }
        Err(refusal) => refused_page(&refusal, visit),
    }
}

/// A receipt's fields in the order a reader wants them; any other field follows.
const RECEIPT_ORDER: [&str; 22] = [
    "id",
    "request_id",
    "started_at",
    "finished_at",
    "org_id",
    "key_id",
    "provider",
    "model",
    "endpoint",
    "status",
    "stream",
    "cost_usd",
    "input_tokens",
    "output_tokens",
    "cached_input_tokens",
    "cache_write_input_tokens",
    "reasoning_tokens",
    "usage_source",
    "priced",
    "priced_as",
    "price_revision",
    "node_id",
];

/// One receipt, by `GET /orgs/{org}/receipts/{id}`.
async fn receipt_page(
    control: &ConsoleApi<'_>,
    visit: &Visit,
    org: &str,
    receipt: &str,
) -> Response<Full<Bytes>> {
    let r = match control.api_json(Method::GET, &["orgs", org, "receipts", receipt], "", None).await {
        Ok(answer) => answer,
        Err(refusal) => return refused_page(&refusal, visit),
    };
    let body = html! {
        h1 { "Receipt " code { (receipt) } }
        p { a href={ "/orgs/" (encode(org)) "/receipts" } { "All receipts of this organization" } }
        dl.detail {
            @if let Some(fields) = r.as_object() {
                @for (name, value) in RECEIPT_ORDER.iter().filter_map(|n| fields.get_key_value(*n))
                    .chain(fields.iter().filter(|(n, _)| !RECEIPT_ORDER.contains(&n.as_str()))) {
                    dt { (name) }
                    dd {
                        @match (name.as_str(), value) {
                            ("cost_usd", Value::String(usd)) => { strong.exact { (exact(nanos(usd))) } " (exact)" }
                            ("started_at" | "finished_at", Value::String(at)) => { (utc(at)) " (" (at) ")" }
                            (_, Value::String(text)) => { (text) }
                            (_, Value::Null) => { "—" }
                            (_, other) => { (other.to_string()) }
                        }
                    }
                }
            }
        }
    };
    page(StatusCode::OK, layout("Receipt", Some(&visit.csrf), "orgs", body))
}

// ------------------------------------------------------------------------------------------------
// Nodes and prices
// ------------------------------------------------------------------------------------------------

/// Whether a node last seen at `seen` is stale at `now`.
pub(crate) fn node_is_stale(seen: Option<Timestamp>, now: Timestamp) -> bool {
    seen.is_none_or(|seen| now.0.saturating_sub(seen.0) > NODE_STALE_AFTER_MS)
}

async fn nodes_page(control: &ConsoleApi<'_>, visit: &Visit) -> Response<Full<Bytes>> {
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
    page(StatusCode::OK, layout("Nodes", Some(&visit.csrf), "nodes", body))
}

const PRICE_FIELDS: [(&str, &str); 4] = [
    ("input_per_mtok_usd", "Input"),
    ("output_per_mtok_usd", "Output"),
    ("cached_input_per_mtok_usd", "Cached input"),
    ("cache_write_per_mtok_usd", "Cache write"),
];

async fn prices_page(
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
    page(status, layout("Prices", Some(&visit.csrf), "prices", body))
}

async fn put_price(control: &ConsoleApi<'_>, visit: &Visit, form: &Form) -> Response<Full<Bytes>> {
    let mut body = Map::new();
    insert_if_given(&mut body, form, "kind");
    for (field, _) in PRICE_FIELDS {
        if !form.text(field).is_empty() || field.starts_with("input") || field.starts_with("output") {
            body.insert(field.into(), json!(form.text(field)));
        }
    }
    let model = form.text("model");
    let mut segments = vec!["prices"];
    segments.extend(model.split('/'));
    match control.api_json(Method::PUT, &segments, "", Some(Value::Object(body))).await {
        Ok(_) => redirect("/prices"),
        Err(refusal) => prices_page(control, visit, Some(&Refused::new("price", form, refusal))).await,
    }
}

async fn remove_price(control: &ConsoleApi<'_>, visit: &Visit, form: &Form) -> Response<Full<Bytes>> {
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
    fn text_a_tenant_wrote_cannot_reorder_or_hide_what_a_page_shows() {
        assert!(matches!(shown("acme · gpt-4o"), std::borrow::Cow::Borrowed("acme · gpt-4o")));
        assert_eq!(shown("\u{202e}o4-tpg"), "\\u{202e}o4-tpg");
        assert_eq!(shown("a\u{2066}b\u{2069}c\u{200f}"), "a\\u{2066}b\\u{2069}c\\u{200f}");
        assert_eq!(shown("line\nbreak\u{1b}[2J"), "line\\u{a}break\\u{1b}[2J");
        let page = html! { td { (shown("\u{202e}<b>evil</b>")) } }.into_string();
        assert_eq!(page, "<td>\\u{202e}&lt;b&gt;evil&lt;/b&gt;</td>");
    }

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

    #[test]
    fn a_node_is_stale_after_a_minute_unheard() {
        let now = Timestamp(10_000_000);
        assert!(!node_is_stale(Some(now), now));
        assert!(!node_is_stale(Some(Timestamp(now.0 - NODE_STALE_AFTER_MS)), now));
        assert!(node_is_stale(Some(Timestamp(now.0 - NODE_STALE_AFTER_MS - 1)), now));
        assert!(node_is_stale(None, now));
    }

    #[test]
    fn refusals_show_beside_their_field_and_values_are_escaped() {
        let form = Form(crate::admin::query::Params::parse("limit_usd=%3Cb%3E&csrf=x").expect("parses"));
        let refused = Refused::new(
            "new-cap",
            &form,
            Refusal {
                status: StatusCode::BAD_REQUEST,
                message: "limit_usd: <not> a decimal".into(),
                param: Some("limit_usd".into()),
            },
        );
        let view = FormView::new("new-cap", Some(&refused));
        let html = view.input("limit_usd", "Limit", "text", "", true).into_string();
        assert!(html.contains("value=\"&lt;b&gt;\""), "{html}");
        assert!(html.contains("<p class=\"field-error\" id=\"new-cap-limit_usd-error\" role=\"alert\">limit_usd: &lt;not&gt; a decimal</p>"), "{html}");
        assert!(html.contains("aria-invalid=\"true\""));
        assert!(view.general(&["limit_usd"]).into_string().is_empty());
        let other = FormView::new("new-key", Some(&refused));
        assert!(!other.input("limit_usd", "Limit", "text", "", true).into_string().contains("field-error"));
    }

    #[test]
    fn a_secret_form_field_is_never_shown_again() {
        let form =
            Form(crate::admin::query::Params::parse("name=openai&api_key=sk-secret&csrf=x").expect("parses"));
        let refusal = Refusal {
            status: StatusCode::BAD_REQUEST,
            message: "kind: bad".into(),
            param: Some("kind".into()),
        };
        let refused = Refused::new("provider", &form, refusal);
        assert!(refused.sent.iter().all(|(_, v)| v != "sk-secret" && v != "x"));
    }

    #[test]
    fn a_form_field_left_empty_is_left_out_of_the_body() {
        let form = Form(crate::admin::query::Params::parse("key_id=key_1&base_url=+&kind=").expect("parses"));
        let mut body = Map::new();
        for field in ["key_id", "base_url", "kind", "absent"] {
            insert_if_given(&mut body, &form, field);
        }
        assert_eq!(Value::Object(body), json!({ "key_id": "key_1" }));
    }
}
