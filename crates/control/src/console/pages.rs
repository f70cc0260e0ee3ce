//! The console's pages and forms. Each handler calls the admin API (see [`super::api`]) and renders
//! its JSON; a form is turned into the API's JSON body, and a refusal re-renders the page with the
//! API's message beside the field it names.

mod changes;
mod operator;
mod org;
mod orgs;
mod receipts;
mod tokens;

use bytes::Bytes;
use http::{Method, Response, StatusCode};
use http_body_util::Full;
use maud::{DOCTYPE, Markup, html};
use recovea_core::timestamp::Timestamp;
use serde_json::{Value, json};

use super::api::{ConsoleApi, Refusal, encode};
use super::format::rfc3339_from_field;
use super::{Form, Visit, page, redirect};
use crate::admin::routes::Route;
use crate::principal::Reach;
use changes::{cap_action, create_cap, create_key, key_action, put_provider};
use operator::{nodes_page, prices_page, put_price, remove_price};
use org::org_page;
use orgs::{create_org, orgs_page};
use receipts::{receipt_page, receipts_csv, receipts_page};
use tokens::{create_token, revoke_token};

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
    /// What was created: "Key", "Token".
    what: &'static str,
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
        // A visitor within one organization has one to see: theirs.
        (&Method::GET, []) => match visit.principal.reach() {
            Reach::Everything => orgs_page(control, visit, None).await,
            Reach::Org { org, .. } => redirect(&format!("/orgs/{}", encode(org.as_str()))),
        },
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
        (&Method::POST, ["orgs", org, "tokens"]) => create_token(control, visit, org, form).await,
        (&Method::POST, ["tokens", token, "revoke"]) => revoke_token(control, visit, token).await,
        (&Method::GET, ["nodes"]) => nodes_page(control, visit).await,
        (&Method::GET, ["prices"]) => prices_page(control, visit, None).await,
        (&Method::POST, ["prices"]) => put_price(control, visit, form).await,
        (&Method::POST, ["prices", "remove"]) => remove_price(control, visit, form).await,
        _ => page(StatusCode::NOT_FOUND, message("No such page.", Some(visit))),
    }
}

// ------------------------------------------------------------------------------------------------
// Layout and form pieces
// ------------------------------------------------------------------------------------------------

pub(super) fn layout(title: &str, visit: Option<&Visit>, current: &str, body: Markup) -> Markup {
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
                    @if let Some(visit) = visit {
                        // Only what the visitor may open: the API's own decision for each page.
                        nav {
                            @match visit.principal.reach() {
                                Reach::Everything => { (link("/", "orgs", "Organizations")) }
                                Reach::Org { org, .. } => {
                                    (link(&format!("/orgs/{}", encode(org.as_str())), "orgs", "Organization"))
                                }
                            }
                            @if visit.may(Route::ListNodes) { (link("/nodes", "nodes", "Nodes")) }
                            @if visit.may(Route::ListPrices) { (link("/prices", "prices", "Prices")) }
                        }
                        span.who { "Signed in as " strong { (shown(&visit.who())) } }
                        form.sign-out method="post" action="/sign-out" {
                            (csrf_field(&visit.csrf))
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

/// The sign-in page: a token, and a link to the provider when single sign-on is configured (a
/// link, not a form: the login leaves for the provider's site, where `form-action 'self'` would
/// stop a form).
pub(crate) fn sign_in(error: Option<&str>, sign_on: bool) -> Markup {
    layout(
        "Sign in",
        None,
        "",
        html! {
            section.sign-in {
                h1 { "Sign in" }
                @if sign_on {
                    p { a.button #sign-on href=(super::sign_on::LOGIN_PATH) { "Sign in with single sign-on" } }
                    p.muted { "Or with a token:" }
                }
                form method="post" action="/sign-in" {
                    label for="token" { "Admin or organization token" }
                    input #token type="password" name="token" autocomplete="current-password" required autofocus[!sign_on];
                    @if let Some(error) = error {
                        p.form-error role="alert" { (error) }
                    }
                    button type="submit" { "Sign in" }
                }
                p.hint {
                    "The operator's admin token: the one given to " code { "--admin-token" } ", or else the one generated on the first start, printed then and saved in "
                    code { "admin-token" } " in the data directory (" code { "./recovea-data/admin-token" } " by default). "
                    "Or an organization token (" code { "rot_..." } "), which opens its organization alone. "
                    "It stays on this server: the browser keeps only a session cookie."
                }
            }
        },
    )
}

/// A page of single sign-on that signed no one in: why, and the way back to the sign-in page.
pub(crate) fn sign_on_refused(text: &str) -> Markup {
    layout(
        "Sign in",
        None,
        "",
        html! {
            section.sign-in {
                h1 { "Not signed in" }
                p.form-error #sign-on-error role="alert" { (text) }
                p { a href="/sign-in" { "Back to the sign-in page" } }
            }
        },
    )
}

pub(crate) fn message(text: &str, visit: Option<&Visit>) -> Markup {
    layout(
        "Console",
        visit,
        "",
        html! { p.form-error role="alert" { (text) } p { a href="/" { "Back to the console" } } },
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
pub(super) fn shown(text: &str) -> std::borrow::Cow<'_, str> {
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
    page(refusal.status, message(&refusal.message, Some(visit)))
}

fn now() -> Timestamp {
    Timestamp::from_system_time(std::time::SystemTime::now())
}

/// A whole number from a form field: the number when it is one, else the text itself, so that the
/// API, not the console, says what is wrong with it.
fn number_or_text(text: &str) -> Value {
    text.parse::<u64>().map_or_else(|_| json!(text), |n| json!(n))
}

/// The form's `field` if the form gave it: an empty field is left out, for the API's default.
fn given(form: &Form, field: &str) -> Option<String> {
    Some(form.text(field)).filter(|text| !text.is_empty()).map(str::to_owned)
}

/// A `datetime-local` expiry (a key's, a token's) as the API reads it, if the form gave one.
fn expiry(form: &Form) -> Option<String> {
    given(form, "expires_at").map(|text| rfc3339_from_field(&text))
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
        let given: Vec<Option<String>> =
            ["key_id", "base_url", "kind", "absent"].iter().map(|field| given(&form, field)).collect();
        assert_eq!(given, [Some("key_1".to_owned()), None, None, None]);
    }
}
