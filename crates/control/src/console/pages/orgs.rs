//! The organizations page: each organization's month to date and its caps' bars; a new one.

use bytes::Bytes;
use http::{Method, Response, StatusCode};
use http_body_util::Full;
use maud::{Markup, html};
use recovea_core::money::Nanos;
use recovea_core::projection::{Projection, reaches_line};
use recovea_core::timestamp::Timestamp;
use recovea_core::window::Window;
use serde_json::Value;

use super::org::spend_since;
use super::{FormView, Refused, csrf_field, layout, list, now, refused_page, shown, str_of};
use crate::admin::requests::NewOrg;
use crate::admin::routes::Route;
use crate::console::api::{Body, ConsoleApi, Refusal, encode, query};
use crate::console::chart;
use crate::console::format::{cents, nanos, utc_at, utc_minute};
use crate::console::{Form, Visit, page, redirect};

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

pub(super) fn cap_bar(row: &Value, at: Timestamp) -> Markup {
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

pub(super) async fn orgs_page(
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
            Some(visit),
            "orgs",
            html! {
                h1 { "Organizations" }
                p.muted { "Spend as of " (utc_at(at)) "." }
                @for card in &cards { (card) }
                @if cards.is_empty() { p { "No organizations yet." } }
                @if visit.may(Route::CreateOrg) {
                    section.panel {
                        h2 { "New organization" }
                        form #new-org method="post" action="/orgs" {
                            (csrf_field(&visit.csrf))
                            (form.input("name", "Name", "text", "", true))
                            (form.general(&["name"]))
                            button type="submit" { "Create organization" }
                        }
                    }
                }
            },
        ),
    )
}

pub(super) async fn create_org(
    control: &ConsoleApi<'_>,
    visit: &Visit,
    form: &Form,
) -> Response<Full<Bytes>> {
    let body = NewOrg { name: form.text("name").to_owned(), ..NewOrg::default() };
    match control.api_json(Method::POST, &["orgs"], "", Some(Body::of(&body))).await {
        Ok(org) => redirect(&format!("/orgs/{}", encode(str_of(&org, "id")))),
        // Only the operator is offered the form: anyone else's is the API's 403 alone.
        Err(refusal) if refusal.status == StatusCode::FORBIDDEN => refused_page(&refusal, visit),
        Err(refusal) => orgs_page(control, visit, Some(&Refused::new("new-org", form, refusal))).await,
    }
}
