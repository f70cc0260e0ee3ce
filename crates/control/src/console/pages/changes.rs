//! The forms of an organization's page: caps, keys and credentials, changed through the API.

use bytes::Bytes;
use http::{Method, Response, StatusCode};
use http_body_util::Full;
use serde_json::{Map, Value, json};

use super::org::org_page;
use super::{NewSecret, Refused, insert_if_given, message, number_or_text, refused_page, str_of};
use crate::console::api::{ConsoleApi, Refusal, encode};
use crate::console::format::rfc3339_from_field;
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
    let mut body = Map::new();
    body.insert("name".into(), json!(form.text("name")));
    for field in ["requests_per_minute", "tokens_per_minute"] {
        if !form.text(field).is_empty() {
            body.insert(field.into(), number_or_text(form.text(field)));
        }
    }
    create_with_secret(control, visit, (org, "keys"), ("Key", "new-key"), form, body).await
}

/// `POST /orgs/{org}/{what}` with `body` (and the form's expiry, if any): the organization's page
/// showing the new secret (a key's, a token's) once, or the form again with the refusal.
pub(super) async fn create_with_secret(
    control: &ConsoleApi<'_>,
    visit: &Visit,
    (org, collection): (&str, &str),
    (what, form_id): (&'static str, &'static str),
    form: &Form,
    mut body: Map<String, Value>,
) -> Response<Full<Bytes>> {
    if !form.text("expires_at").is_empty() {
        body.insert("expires_at".into(), json!(rfc3339_from_field(form.text("expires_at"))));
    }
    match control.api_json(Method::POST, &["orgs", org, collection], "", Some(Value::Object(body))).await {
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
