//! The forms of an organization's page: caps, keys and credentials, changed through the API.

use bytes::Bytes;
use http::{Method, Response, StatusCode};
use http_body_util::Full;
use serde_json::{Value, json};

use super::org::org_page;
use super::{NewSecret, Refused, expiry, given, message, number_or_text, refused_page, str_of};
use crate::admin::requests::{CapPatch, Change, KeyPatch, NewCap, NewKey, ProviderBody};
use crate::console::api::{Body, ConsoleApi, Refusal, encode};
use crate::console::{Form, Visit, page, redirect};

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
        Err(refusal) => refused_on_org(control, visit, org, (form_name, form), refusal).await,
    }
}

/// The answer to a form of `org`'s page the API refused: the page again with the API's message on
/// the form, or, for a `403` (what the page does not offer this visitor: a viewer's change, the
/// operator's setting), the message alone, as no form of the page may be there to show it.
pub(super) async fn refused_on_org(
    control: &ConsoleApi<'_>,
    visit: &Visit,
    org: &str,
    (form_name, form): (&str, &Form),
    refusal: Refusal,
) -> Response<Full<Bytes>> {
    if refusal.status == StatusCode::FORBIDDEN {
        return refused_page(&refusal, visit);
    }
    org_page(control, visit, org, Some(&Refused::new(form_name, form, refusal)), None).await
}

pub(super) async fn create_cap(
    control: &ConsoleApi<'_>,
    visit: &Visit,
    org: &str,
    form: &Form,
) -> Response<Full<Bytes>> {
    let alert_at = form.text("alert_at");
    let body: NewCap<Value> = NewCap {
        scope: form.text("scope").to_owned(),
        key_id: given(form, "key_id"),
        window: form.text("window").to_owned(),
        limit_usd: form.text("limit_usd").to_owned(),
        hard_stop: form.text("hard_stop") == "true",
        // `0.5, 0.8, 1` is a JSON array's contents; anything else goes as text for the API to refuse.
        alert_at: (!alert_at.is_empty()).then(|| {
            serde_json::from_str::<Value>(&format!("[{alert_at}]")).unwrap_or_else(|_| json!(alert_at))
        }),
        alert_webhook: given(form, "alert_webhook"),
    };
    let result = control.api_json(Method::POST, &["orgs", org, "caps"], "", Some(Body::of(&body))).await;
    back_to_org(control, visit, org, "caps", ("new-cap", form), result).await
}

pub(super) async fn cap_action(
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
            let body: CapPatch = CapPatch {
                limit_usd: Some(form.text("limit_usd").to_owned()),
                alert_webhook: Some(given(form, "alert_webhook").map_or(Change::Remove, Change::Set)),
                ..CapPatch::default()
            };
            control.api_json(Method::PATCH, &["caps", cap], "", Some(Body::of(&body))).await
        }
        Some(armed @ ("arm" | "disarm")) => {
            let body: CapPatch = CapPatch { hard_stop: Some(armed == "arm"), ..CapPatch::default() };
            control.api_json(Method::PATCH, &["caps", cap], "", Some(Body::of(&body))).await
        }
        Some("delete") => control.api_json(Method::DELETE, &["caps", cap], "", None).await,
        Some(_) => return page(StatusCode::NOT_FOUND, message("No such page.", Some(visit))),
    };
    back_to_org(control, visit, &org, "caps", (cap, form), result).await
}

pub(super) async fn create_key(
    control: &ConsoleApi<'_>,
    visit: &Visit,
    org: &str,
    form: &Form,
) -> Response<Full<Bytes>> {
    let body: NewKey<Value> = NewKey {
        name: form.text("name").to_owned(),
        expires_at: expiry(form),
        requests_per_minute: given(form, "requests_per_minute").map(|text| number_or_text(&text)),
        tokens_per_minute: given(form, "tokens_per_minute").map(|text| number_or_text(&text)),
        ..NewKey::default()
    };
    create_with_secret(control, visit, (org, "keys"), ("Key", "new-key"), form, Body::of(&body)).await
}

/// `POST /orgs/{org}/{what}` with `body`: the organization's page showing the new secret (a key's, a
/// token's) once, or the form again with the refusal.
pub(super) async fn create_with_secret(
    control: &ConsoleApi<'_>,
    visit: &Visit,
    (org, collection): (&str, &str),
    (what, form_id): (&'static str, &'static str),
    form: &Form,
    body: Body,
) -> Response<Full<Bytes>> {
    match control.api_json(Method::POST, &["orgs", org, collection], "", Some(body)).await {
        Ok(created) => {
            let secret = NewSecret {
                what,
                name: str_of(&created, "name").to_owned(),
                secret: str_of(&created, "secret").to_owned(),
            };
            org_page(control, visit, org, None, Some(secret)).await
        }
        Err(refusal) => refused_on_org(control, visit, org, (form_id, form), refusal).await,
    }
}

pub(super) async fn key_action(
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
            let limit = |field: &str| {
                Some(given(form, field).map_or(Change::Remove, |text| Change::Set(number_or_text(&text))))
            };
            let body: KeyPatch<Value> = KeyPatch {
                requests_per_minute: limit("requests_per_minute"),
                tokens_per_minute: limit("tokens_per_minute"),
                ..KeyPatch::default()
            };
            control.api_json(Method::PATCH, &["keys", key], "", Some(Body::of(&body))).await
        }
        _ => return page(StatusCode::NOT_FOUND, message("No such page.", Some(visit))),
    };
    match result {
        Ok(answer) => redirect(&format!("/orgs/{}#keys", encode(str_of(&answer, "org_id")))),
        Err(refusal) => match control.api_json(Method::GET, &["keys", key], "", None).await {
            Ok(current) => {
                let org = str_of(&current, "org_id").to_owned();
                refused_on_org(control, visit, &org, (key, form), refusal).await
            }
            Err(_) => refused_page(&refusal, visit),
        },
    }
}

pub(super) async fn put_provider(
    control: &ConsoleApi<'_>,
    visit: &Visit,
    org: &str,
    form: &Form,
) -> Response<Full<Bytes>> {
    let body = ProviderBody {
        kind: form.text("kind").to_owned(),
        base_url: given(form, "base_url"),
        api_key: form.get("api_key").unwrap_or("").to_owned(),
        price_namespace: given(form, "price_namespace"),
        fallback_input_per_mtok_usd: given(form, "fallback_input_per_mtok_usd"),
        fallback_output_per_mtok_usd: given(form, "fallback_output_per_mtok_usd"),
    };
    let name = form.text("name");
    let result =
        control.api_json(Method::PUT, &["orgs", org, "providers", name], "", Some(Body::of(&body))).await;
    back_to_org(control, visit, org, "providers", ("provider", form), result).await
}
