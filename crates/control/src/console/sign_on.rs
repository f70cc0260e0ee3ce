//! Single sign-on in the console: `/console/oidc/login` sends the browser to the provider, and
//! `/console/oidc/callback` opens a session for the person the provider vouches for, as what their
//! claims map them to (`oidc::access`): the operator, or one organization's admin or viewer.
//!
//! The callback is the end of a navigation that began on the provider's site. A browser does not
//! send a `SameSite=Strict` cookie on a redirect that is still part of that cross-site navigation,
//! so a `303 /` would reach the console without the session just set, and send the person back to
//! the sign-in page. The callback answers instead a small page of this site that moves on to the
//! console (a meta refresh, and a link): that next request is this site's own, and carries the
//! cookie.

use std::net::SocketAddr;
use std::time::{Instant, SystemTime};

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Response, StatusCode};
use http_body_util::Full;
use maud::{DOCTYPE, Markup, html};
use recovea_core::org_tokens::OrgRole;

use super::{page, pages, session, set_header, unavailable, who};
use crate::Control;
use crate::oidc::{self, Access, CallbackError, SignInError, SignedIn};
use crate::principal::{Principal, Reach};

/// Where the sign-in page's link starts a login.
pub(crate) const LOGIN_PATH: &str = "/console/oidc/login";

/// What a person whose organization is not in the store is told: their claim names one that does
/// not exist here (never created, or a typo at the provider). The value is not repeated.
const NO_SUCH_ORGANIZATION: &str = "your account's organization does not exist in this Recovea";

impl Control {
    /// Starts a login at the provider: a `302` there, with the cookie that ties this browser to the
    /// login. Each start counts against the client address's allowance.
    pub(super) async fn sign_on_login(
        &self,
        client: Option<SocketAddr>,
        now: Instant,
    ) -> Response<Full<Bytes>> {
        let Some(sign_on) = self.sign_on() else { return not_configured() };
        let address = client.map(|c| c.ip());
        if let Err(wait) = self.inner.sign_on_starts.may_try(address, now) {
            let seconds = crate::attempts::whole_seconds(wait);
            let text = format!("Too many sign-ins from this address: try again in {seconds} s.");
            let mut response = page(StatusCode::TOO_MANY_REQUESTS, pages::sign_on_refused(&text));
            set_header(&mut response, header::RETRY_AFTER, &seconds.to_string());
            return response;
        }
        self.inner.sign_on_starts.count(address, now);
        match sign_on.login().await {
            Ok(login) => {
                let mut response = Response::new(Full::new(Bytes::new()));
                *response.status_mut() = StatusCode::FOUND;
                set_header(&mut response, header::LOCATION, &login.location);
                set_header(&mut response, header::SET_COOKIE, &login.set_cookie);
                super::secure_headers(response.headers_mut());
                response
            }
            Err(error) => {
                tracing::warn!(error = %error, "single sign-on: a login could not start");
                page(status_of(&error), pages::sign_on_refused(error.for_person()))
            }
        }
    }

    /// Finishes a login: a session for the person, or a page that says why not.
    pub(super) async fn sign_on_callback(
        &self,
        query: &str,
        cookies: &str,
        secure: bool,
        now: Instant,
    ) -> Response<Full<Bytes>> {
        let Some(sign_on) = self.sign_on() else { return not_configured() };
        let binding = session::cookie_value(cookies, oidc::LOGIN_COOKIE);
        let outcome = sign_on.callback(query, binding, SystemTime::now()).await;
        let used_up = uses_up_the_login(&outcome);
        // The redirect URL says the browser comes over TLS even where no proxy header does.
        let secure = secure || sign_on.party().config().console_over_tls();
        let mut response = match outcome {
            Ok(signed_in) => self.open_person_session(signed_in, secure, now).await,
            Err(error) => {
                tracing::warn!(error = %error, "single sign-on: a sign-in failed");
                page(status_of(&error), pages::sign_on_refused(error.for_person()))
            }
        };
        if used_up && let Ok(clear) = HeaderValue::try_from(sign_on.clear_login_cookie()) {
            response.headers_mut().append(header::SET_COOKIE, clear);
        }
        response
    }

    /// A session for the person `signed_in` names, when their access reaches anything: an
    /// organization must still exist in the store.
    async fn open_person_session(
        &self,
        signed_in: SignedIn,
        secure: bool,
        now: Instant,
    ) -> Response<Full<Bytes>> {
        let SignedIn { person, access } = signed_in;
        let reach = match reach_of(access) {
            Ok(reach) => reach,
            Err(why) => return refused(&why),
        };
        if let Reach::Org { org, .. } = &reach {
            let org = org.clone();
            match self.store(move |s| s.org(&org)).await {
                Ok(Some(_)) => {}
                Ok(None) => return refused(NO_SUCH_ORGANIZATION),
                Err(_) => return unavailable(),
            }
        }
        tracing::info!(
            subject = %person.subject.escape_debug(),
            "single sign-on: a person signed in to the console"
        );
        let principal = Principal::Person { subject: person.subject, email: person.email, reach };
        let landing = page(StatusCode::OK, landing(&who(&principal)));
        self.with_new_session(principal, secure, now, landing)
    }
}

/// What a sign-on decision reaches, or why it reaches nothing (the refusal's text names a claim,
/// never its value, and may be shown). An organization is still to be found in the store.
pub(crate) fn reach_of(access: Access) -> Result<Reach, String> {
    match access {
        Access::Operator => Ok(Reach::Everything),
        Access::Org { org_id, role } => Ok(Reach::Org { org: org_id, role: role_of(role) }),
        Access::Refused(refusal) => Err(refusal.to_string()),
    }
}

/// A role the provider's claims give, as an organization token's of the same name: a person is
/// held to exactly what a token of their role is.
fn role_of(role: oidc::Role) -> OrgRole {
    match role {
        oidc::Role::Admin => OrgRole::Admin,
        oidc::Role::Viewer => OrgRole::Viewer,
    }
}

/// Whether a callback's outcome used up the login its browser started, whose cookie may then go.
/// A callback that does not carry this browser's state (a link from another site) leaves the
/// login waiting, and its cookie with it, for the provider's real answer.
fn uses_up_the_login(outcome: &Result<SignedIn, SignInError>) -> bool {
    match outcome {
        Err(SignInError::Callback(CallbackError::Malformed | CallbackError::WrongState)) => false,
        Ok(_)
        | Err(
            SignInError::Callback(CallbackError::Denied(_) | CallbackError::WrongIssuer)
            | SignInError::Provider(_)
            | SignInError::CodeRefused(_)
            | SignInError::NoLoginWaiting
            | SignInError::IdToken(_)
            | SignInError::RandomUnavailable,
        ) => true,
    }
}

fn status_of(error: &SignInError) -> StatusCode {
    match error {
        SignInError::Provider(_) | SignInError::RandomUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        SignInError::CodeRefused(_)
        | SignInError::Callback(_)
        | SignInError::NoLoginWaiting
        | SignInError::IdToken(_) => StatusCode::BAD_REQUEST,
    }
}

fn refused(why: &str) -> Response<Full<Bytes>> {
    page(
        StatusCode::FORBIDDEN,
        pages::sign_on_refused(&format!("You cannot sign in to this console: {why}.")),
    )
}

fn not_configured() -> Response<Full<Bytes>> {
    page(StatusCode::NOT_FOUND, pages::sign_on_refused("Single sign-on is not configured here."))
}

/// The page a new session lands on, which moves on to the console from this site (see the
/// module's documentation).
fn landing(who: &str) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta http-equiv="refresh" content="0; url=/";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { "Signed in · Recovea console" }
                link rel="stylesheet" href="/assets/console.css";
            }
            body {
                main {
                    section.sign-in #signed-in {
                        h1 { "Signed in" }
                        p { "Signed in as " strong { (pages::shown(who)) } "." }
                        p { a.button #continue href="/" { "Continue to the console" } }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use recovea_core::ids::OrgId;

    #[test]
    fn a_decision_reaches_what_a_token_of_its_role_would() {
        assert_eq!(reach_of(Access::Operator), Ok(Reach::Everything));
        let org = OrgId::parse("org_acme").expect("id");
        for (role, as_token) in [(oidc::Role::Admin, OrgRole::Admin), (oidc::Role::Viewer, OrgRole::Viewer)] {
            assert_eq!(
                reach_of(Access::Org { org_id: org.clone(), role }),
                Ok(Reach::Org { org: org.clone(), role: as_token })
            );
        }
    }

    #[test]
    fn a_refusal_says_why_by_the_claims_name_alone() {
        let why = reach_of(Access::Refused(oidc::Refusal::UnknownRole { claim: "recovea_role".into() }))
            .expect_err("refused");
        assert_eq!(why, "your account's role (claim \"recovea_role\") is neither admin nor viewer");
        let page = refused(&why);
        assert_eq!(page.status(), StatusCode::FORBIDDEN);
    }

    #[test]
    fn only_a_callback_of_this_browsers_login_forgets_its_cookie() {
        let kept = [CallbackError::Malformed, CallbackError::WrongState];
        for error in kept {
            assert!(!uses_up_the_login(&Err(SignInError::Callback(error))));
        }
        assert!(uses_up_the_login(&Err(SignInError::NoLoginWaiting)));
        assert!(uses_up_the_login(&Err(SignInError::Callback(CallbackError::Denied(
            "access_denied".into()
        )))));
        assert!(uses_up_the_login(&Err(SignInError::CodeRefused("invalid_grant".into()))));
    }

    #[test]
    fn the_landing_page_moves_on_from_this_site_and_escapes_the_name() {
        let html = landing("<b>eve</b>@example.com (admin)").into_string();
        assert!(html.contains(r#"<meta http-equiv="refresh" content="0; url=/">"#), "{html}");
        assert!(html.contains(r#"href="/""#));
        assert!(html.contains("&lt;b&gt;eve&lt;/b&gt;"), "{html}");
    }
}
