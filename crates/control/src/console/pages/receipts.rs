//! An organization's receipts: the filtered list, one receipt, and the CSV export.

use bytes::Bytes;
use http::{Method, Response, StatusCode, header};
use http_body_util::Full;
use maud::html;
use serde_json::{Value, json};

use super::{FormView, Refused, layout, list, message, refused_page, shown, str_of};
use crate::console::api::{Answered, ConsoleApi, encode, query};
use crate::console::format::{cost, exact, field_from_rfc3339, nanos, rfc3339_from_field, utc};
use crate::console::{Visit, page, set_header};

/// Receipts on one page of the console.
const RECEIPTS_PER_PAGE: &str = "50";

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

pub(super) async fn receipts_page(
    control: &ConsoleApi<'_>,
    visit: &Visit,
    org: &str,
) -> Response<Full<Bytes>> {
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
    page(status, layout("Receipts", Some(visit), "orgs", body))
}

pub(super) async fn receipts_csv(
    control: &ConsoleApi<'_>,
    visit: &Visit,
    org: &str,
) -> Response<Full<Bytes>> {
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
            crate::console::secure_headers(response.headers_mut());
            response
        }
        Ok(Answered::Json(_)) => {
            page(StatusCode::INTERNAL_SERVER_ERROR, message("The export was not CSV.", Some(visit)))
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
pub(super) async fn receipt_page(
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
    page(StatusCode::OK, layout("Receipt", Some(visit), "orgs", body))
}
