//! The web console at `/` of the admin listener: server-rendered pages over the admin API.
//!
//! Every page reads and every form writes through [`Control::route`], the admin API's own code
//! path (see [`api`]): a form becomes the JSON body the API takes, and the page renders the JSON it
//! answers. Validation, error messages and whatever else the API does apply here unchanged; a
//! refused form shows the API's message beside the field it names.
//!
//! Who signs in decides what the pages show and do: the admin token opens the operator's console,
//! an organization token its organization's, and single sign-on ([`sign_on`]) whatever the
//! provider's claims map the person to. The session keeps that [`Principal`]; every page calls the
//! API as it, so what a visitor may reach is decided by the API's own `admin::access`, and a page
//! offers only what that decision lets through ([`Visit::may`]).
//!
//! Security: sign-in opens a server-side session ([`session`]); every POST carries the session's
//! CSRF token; every answer carries a strict Content-Security-Policy and is never cached. The
//! assets (one CSS file, one small script) are compiled into the binary.

#[cfg(test)]
mod access_tests;
mod api;
mod chart;
mod format;
mod pages;
mod session;
mod sign_on;

use std::net::SocketAddr;
use std::time::Instant;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};

use recovea_store::AuditAuth;

use crate::admin::Caller;
use crate::admin::access::{self, Scope};
use crate::admin::query::{Params, decode_path_segment};
use crate::admin::routes::Route;
use crate::principal::{Principal, Reach};
use crate::{ApiError, Control};
use api::ConsoleApi;

pub(crate) use session::Sessions;

const CSS: &str = include_str!("assets/console.css");
const JS: &str = include_str!("assets/console.js");
/// Console forms are a few short fields.
const MAX_FORM_BYTES: usize = 64 << 10;

/// Sent with every console answer: nothing loads from anywhere but this listener, nothing runs
/// inline, no page can be framed, and forms post only back here.
pub(crate) const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; style-src 'self'; script-src 'self'; \
     img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// Whether `path` is the console's rather than the admin API's (or the probes', answered before).
pub(crate) fn serves(path: &str) -> bool {
    !path.starts_with("/admin/")
}

/// A submitted form's fields.
pub(crate) struct Form(Params);

impl Form {
    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name)
    }

    /// A field's value, trimmed; `""` when absent.
    pub(crate) fn text(&self, name: &str) -> &str {
        self.get(name).map_or("", str::trim)
    }

    /// The fields to show again beside a refusal: never the CSRF token, a token or an API key.
    pub(crate) fn echo(&self) -> Vec<(String, String)> {
        self.0
            .pairs()
            .iter()
            .filter(|(name, _)| !matches!(name.as_str(), "csrf" | "token" | "api_key"))
            .cloned()
            .collect()
    }
}

/// What the page handlers need of the request and the session.
pub(crate) struct Visit {
    pub(crate) csrf: String,
    pub(crate) query: String,
    /// Who signed in: the pages call the API as them.
    pub(crate) principal: Principal,
}

impl Visit {
    /// What the visitor may reach in `route`, by the admin API's own decision (`access::decide`),
    /// so that a page offers what the API would let through and nothing more; `None` where the API
    /// answers `403`. Whose an id is, is checked when the API runs the route.
    pub(crate) fn scope(&self, route: Route<'_>) -> Option<Scope> {
        access::decide(&self.principal.reach(), route.access()).ok()
    }

    /// Whether the visitor may do `route` at all (see [`Self::scope`]).
    pub(crate) fn may(&self, route: Route<'_>) -> bool {
        self.scope(route).is_some()
    }

    /// Who is signed in, as the page's header says it.
    pub(crate) fn who(&self) -> String {
        who(&self.principal)
    }
}

/// `principal` as a page names it: the operator, a token by its name, a person by their email (or
/// the provider's subject); with the role they hold.
pub(crate) fn who(principal: &Principal) -> String {
    let role = |reach: &Reach| match reach {
        Reach::Everything => "operator",
        Reach::Org { role, .. } => role.as_str(),
    };
    match principal {
        Principal::Operator => "the operator".to_owned(),
        Principal::OrgToken { name, role, .. } => format!("token {name} ({})", role.as_str()),
        Principal::Person { subject, email, reach } => {
            format!("{} ({})", email.as_deref().unwrap_or(subject), role(reach))
        }
    }
}

impl Control {
    /// Answers one request for the console.
    pub(crate) async fn console<B>(
        &self,
        request: Request<B>,
        client: Option<SocketAddr>,
    ) -> Response<Full<Bytes>>
    where
        B: http_body::Body<Data = Bytes>,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let (parts, body) = request.into_parts();
        let secure = over_tls(&parts.headers);
        let method = parts.method.clone();
        let path = parts.uri.path().to_owned();
        let query = parts.uri.query().unwrap_or("").to_owned();
        if method == Method::GET {
            match path.as_str() {
                "/assets/console.css" => return asset(CSS, "text/css; charset=utf-8"),
                "/assets/console.js" => return asset(JS, "text/javascript; charset=utf-8"),
                _ => {}
            }
        }
        if method != Method::GET && method != Method::POST {
            return page(StatusCode::METHOD_NOT_ALLOWED, pages::message("Method not allowed", None));
        }
        let form = if method == Method::POST {
            let Ok(collected) = Limited::new(body, MAX_FORM_BYTES).collect().await else {
                return page(StatusCode::PAYLOAD_TOO_LARGE, pages::message("The form is too large.", None));
            };
            let bytes = collected.to_bytes();
            match std::str::from_utf8(&bytes).ok().and_then(|text| Params::parse(text).ok()) {
                Some(params) => Form(params),
                None => {
                    return page(StatusCode::BAD_REQUEST, pages::message("The form is unreadable.", None));
                }
            }
        } else {
            Form(Params::default())
        };
        let cookie = parts.headers.get(header::COOKIE).and_then(|v| v.to_str().ok()).unwrap_or("");
        let session_id = session::cookie_value(cookie, session::COOKIE).unwrap_or("").to_owned();
        let now = Instant::now();
        if method == Method::GET {
            match path.as_str() {
                sign_on::LOGIN_PATH => return self.sign_on_login(client, now).await,
                crate::oidc::CALLBACK_PATH => {
                    return self.sign_on_callback(&query, cookie, secure, now).await;
                }
                _ => {}
            }
        }
        let session = match self.inner.console_sessions.get(&session_id, now) {
            Some(session) => match self.still_stands(&session.principal).await {
                Ok(true) => Some(session),
                Ok(false) => {
                    self.inner.console_sessions.close(&session_id);
                    None
                }
                Err(_) => return unavailable(),
            },
            None => None,
        };

        if path == "/sign-in" {
            return match (&method, session) {
                (&Method::GET, Some(_)) => redirect("/"),
                (&Method::GET, None) => page(StatusCode::OK, pages::sign_in(None, self.sign_on().is_some())),
                _ => self.sign_in(form.get("token").unwrap_or(""), secure, now, client).await,
            };
        }
        let Some(session) = session else {
            return if method == Method::GET {
                redirect("/sign-in")
            } else {
                page(
                    StatusCode::UNAUTHORIZED,
                    pages::sign_in(Some("Your session has ended: sign in again."), self.sign_on().is_some()),
                )
            };
        };
        let visit = Visit { csrf: session.csrf.clone(), query, principal: session.principal.clone() };
        if method == Method::POST && !session.csrf_matches(form.get("csrf")) {
            return page(
                StatusCode::FORBIDDEN,
                pages::message(
                    "This form did not come from this console's current session. Reload the page and submit it again.",
                    Some(&visit),
                ),
            );
        }
        if method == Method::POST && path == "/sign-out" {
            self.inner.console_sessions.close(&session_id);
            let mut response = redirect("/sign-in");
            set_header(&mut response, header::SET_COOKIE, &session::clear_cookie(secure));
            return response;
        }
        let segments: Option<Vec<String>> =
            path.trim_matches('/').split('/').filter(|s| !s.is_empty()).map(decode_path_segment).collect();
        let Some(segments) = segments else {
            return page(StatusCode::BAD_REQUEST, pages::message("Bad path.", Some(&visit)));
        };
        let segments: Vec<&str> = segments.iter().map(String::as_str).collect();
        // Every change is audited as the session's principal's, made through a console session.
        let caller = Caller { principal: session.principal, auth: AuditAuth::ConsoleSession, client };
        let api = ConsoleApi { control: self, caller };
        pages::dispatch(&api, &method, &segments, &visit, &form).await
    }

    /// Signs in with a token, as the API would take it in an `Authorization` header: the admin
    /// token opens the operator's session, an organization token (neither revoked nor expired)
    /// its organization's. The right token is always let in, however many wrong ones came from
    /// its address.
    async fn sign_in(
        &self,
        token: &str,
        secure: bool,
        now: Instant,
        client: Option<SocketAddr>,
    ) -> Response<Full<Bytes>> {
        let sign_on = self.sign_on().is_some();
        let authorization = format!("Bearer {}", token.trim());
        let principal = match self.authenticate(Some(&authorization), client, "/sign-in", now).await {
            Ok((principal, _)) => principal,
            Err(ApiError::Unauthorized) => {
                return page(StatusCode::UNAUTHORIZED, pages::sign_in(Some("Wrong token."), sign_on));
            }
            Err(ApiError::TooManyWrongTokens(wait)) => {
                let seconds = crate::attempts::whole_seconds(wait);
                let text = format!("Too many wrong tokens from this address: try again in {seconds} s.");
                let mut response = page(StatusCode::TOO_MANY_REQUESTS, pages::sign_in(Some(&text), sign_on));
                set_header(&mut response, header::RETRY_AFTER, &seconds.to_string());
                return response;
            }
            Err(
                ApiError::Unavailable(_)
                | ApiError::Internal(_)
                | ApiError::BadRequest { .. }
                | ApiError::NodeUnauthorized
                | ApiError::PermissionDenied(_)
                | ApiError::NotFound(_)
                | ApiError::MethodNotAllowed,
            ) => return unavailable(),
        };
        self.with_new_session(principal, secure, now, redirect("/"))
    }

    /// `response` with the cookie of a new session for `principal`; the page that says why instead,
    /// when none could be opened.
    fn with_new_session(
        &self,
        principal: Principal,
        secure: bool,
        now: Instant,
        mut response: Response<Full<Bytes>>,
    ) -> Response<Full<Bytes>> {
        match self.inner.console_sessions.open(now, principal) {
            Ok((id, _)) => {
                set_header(&mut response, header::SET_COOKIE, &session::set_cookie(&id, secure));
                response
            }
            Err(_) => page(
                StatusCode::INTERNAL_SERVER_ERROR,
                pages::message("The operating system's random generator failed.", None),
            ),
        }
    }
}

/// The page of a store that did not answer (the cause is in the log).
fn unavailable() -> Response<Full<Bytes>> {
    let mut response = page(
        StatusCode::SERVICE_UNAVAILABLE,
        pages::message("The control plane's store did not answer: try again in a moment.", None),
    );
    set_header(&mut response, header::RETRY_AFTER, "1");
    response
}

/// Whether the browser reached us over TLS: the admin listener speaks plain HTTP, so only a TLS
/// proxy in front of it can say so, with `X-Forwarded-Proto: https` (or RFC 7239 `Forwarded`).
/// Believing it can only add `Secure` to the cookie, never remove a protection.
pub(crate) fn over_tls(headers: &HeaderMap) -> bool {
    let forwarded_proto = headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').next().is_some_and(|first| first.trim().eq_ignore_ascii_case("https")));
    let forwarded = headers
        .get(header::FORWARDED)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split([';', ',']).any(|pair| pair.trim().eq_ignore_ascii_case("proto=https")));
    forwarded_proto || forwarded
}

/// The headers every console answer carries.
pub(crate) fn secure_headers(headers: &mut HeaderMap) {
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
}

pub(crate) fn page(status: StatusCode, markup: maud::Markup) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(markup.into_string())));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"));
    // Pages show secrets once and spend as of now: never from a cache.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    secure_headers(headers);
    response
}

/// `303 See Other`: after a form, the browser loads `location` with a GET.
pub(crate) fn redirect(location: &str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = StatusCode::SEE_OTHER;
    set_header(&mut response, header::LOCATION, location);
    secure_headers(response.headers_mut());
    response
}

fn asset(text: &'static str, content_type: &'static str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    secure_headers(headers);
    response
}

pub(crate) fn set_header(response: &mut Response<Full<Bytes>>, name: header::HeaderName, value: &str) {
    if let Ok(value) = HeaderValue::try_from(value) {
        response.headers_mut().insert(name, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_tls_proxy_makes_the_cookie_secure() {
        let headers = |pairs: &[(&'static str, &'static str)]| {
            let mut map = HeaderMap::new();
            for (name, value) in pairs {
                map.insert(*name, HeaderValue::from_static(value));
            }
            map
        };
        assert!(!over_tls(&headers(&[])));
        assert!(over_tls(&headers(&[("x-forwarded-proto", "https")])));
        assert!(over_tls(&headers(&[("x-forwarded-proto", "HTTPS, http")])));
        assert!(!over_tls(&headers(&[("x-forwarded-proto", "http")])));
        assert!(over_tls(&headers(&[("forwarded", "for=192.0.2.1;proto=https")])));
        assert!(!over_tls(&headers(&[("forwarded", "for=192.0.2.1;proto=http")])));
    }

    #[test]
    fn every_page_is_locked_down() {
        let response = page(StatusCode::OK, maud::html! { p { "hi" } });
        let header = |name: &str| response.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("");
        let csp = header("content-security-policy");
        for directive in [
            "default-src 'none'",
            "style-src 'self'",
            "script-src 'self'",
            "frame-ancestors 'none'",
            "form-action 'self'",
        ] {
            assert!(csp.contains(directive), "{directive} in {csp}");
        }
        assert!(!csp.contains("unsafe"), "{csp}");
        assert_eq!(header("x-content-type-options"), "nosniff");
        assert_eq!(header("referrer-policy"), "no-referrer");
        assert_eq!(header("cache-control"), "no-store");
        assert_eq!(header("content-type"), "text/html; charset=utf-8");
        assert!(redirect("/").headers().contains_key("content-security-policy"));
    }

    #[test]
    fn the_console_leaves_the_admin_api_alone() {
        assert!(serves("/"));
        assert!(serves("/orgs/org_x"));
        assert!(!serves("/admin/v1/orgs"));
    }

    #[test]
    fn a_refused_form_never_echoes_a_secret() {
        let form = Form(Params::parse("csrf=c&token=t&api_key=sk-1&name=n").expect("parses"));
        assert_eq!(form.echo(), vec![("name".to_owned(), "n".to_owned())]);
    }
}
