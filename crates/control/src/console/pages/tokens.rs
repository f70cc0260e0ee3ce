//! An organization's tokens on its page: listed, issued (the secret shown once) and revoked, by the
//! operator or the organization's admin, through `/orgs/{org}/tokens` and `/tokens/{token}/revoke`.

use bytes::Bytes;
use http::{Method, Response};
use http_body_util::Full;
use maud::{Markup, html};
use serde_json::Value;

use super::changes::create_with_secret;
use super::{FormView, Refused, action_button, csrf_field, expiry, list, refused_page, shown, str_of};
use crate::admin::requests::NewOrgToken;
use crate::admin::routes::Route;
use crate::console::api::{Body, ConsoleApi, encode};
use crate::console::format::utc;
use crate::console::{Form, Visit, redirect};

/// The tokens of `org` (`GET /orgs/{org}/tokens`'s answer), with what the visitor may do to them.
pub(super) fn tokens_section(org: &str, tokens: &Value, visit: &Visit, refused: Option<&Refused>) -> Markup {
    let form = FormView::new("new-token", refused);
    html! {
        section.panel #tokens {
            h2 { "Organization tokens" }
            p.muted { "Each opens this organization alone, in the admin API and this console: an admin's changes what a key's holder may, a viewer's only reads." }
            @if list(tokens, "tokens").is_empty() { p.muted { "No tokens." } }
            @for token in list(tokens, "tokens") {
                @let id = str_of(token, "id");
                @let revoked = token["revoked_at"].as_str();
                div.token-row data-token=(id) {
                    div.cap-head {
                        strong { (shown(str_of(token, "name"))) }
                        span.badge.role { (str_of(token, "role")) }
                        code { (str_of(token, "prefix")) "…" }
                        @if let Some(at) = revoked { span.badge.armed.revoked { "revoked " (utc(at)) } }
                        @else { span.badge.soft { "active" } }
                    }
                    p.muted { code { (id) } " · created " (utc(str_of(token, "created_at")))
                        @if let Some(at) = token["expires_at"].as_str() { " · expires " (utc(at)) } }
                    @if revoked.is_none() && visit.may(Route::RevokeOrgToken { token: id }) {
                        div.actions {
                            (action_button(&format!("/tokens/{}/revoke", encode(id)), &visit.csrf, "Revoke",
                                Some("Revoke this token? Its holder is signed out at once."), &[]))
                        }
                    }
                }
            }
            @if visit.may(Route::CreateOrgToken { org }) {
                h3 { "New token" }
                form #new-token.grid method="post" action={ "/orgs/" (encode(org)) "/tokens" } {
                    (csrf_field(&visit.csrf))
                    (form.input("name", "Name", "text", "", true))
                    (form.select("role", "Role", &[("viewer", "Viewer: reads only"), ("admin", "Admin: keys, caps, credentials' API keys")], "viewer"))
                    (form.input("expires_at", "Expires at, UTC (optional)", "datetime-local", "", false))
                    (form.general(&["name", "role", "expires_at"]))
                    button type="submit" { "Create token" }
                }
            }
        }
    }
}

/// `POST /orgs/{org}/tokens`: the new token's secret on the page that answers, once.
pub(super) async fn create_token(
    control: &ConsoleApi<'_>,
    visit: &Visit,
    org: &str,
    form: &Form,
) -> Response<Full<Bytes>> {
    let body = NewOrgToken {
        name: form.text("name").to_owned(),
        role: form.text("role").to_owned(),
        expires_at: expiry(form),
    };
    create_with_secret(control, visit, (org, "tokens"), ("Token", "new-token"), form, Body::of(&body)).await
}

/// `POST /tokens/{token}/revoke`, back to its organization's page.
pub(super) async fn revoke_token(
    control: &ConsoleApi<'_>,
    visit: &Visit,
    token: &str,
) -> Response<Full<Bytes>> {
    match control.api_json(Method::POST, &["tokens", token, "revoke"], "", None).await {
        Ok(revoked) => redirect(&format!("/orgs/{}#tokens", encode(str_of(&revoked, "org_id")))),
        Err(refusal) => refused_page(&refusal, visit),
    }
}
