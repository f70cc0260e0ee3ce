//! The console held to what each principal reaches, in process: sessions opened with an
//! organization's admin and viewer tokens and by a person, each page and form answered by the
//! API's own decision (a forged write refused `403`, another organization's object `404` as an
//! unknown one, the operator's pages `403`), the write controls shown only where that decision
//! lets them through, and each change audited as its author's.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::{Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use recovea_core::crypto::MasterKey;
use recovea_core::ids::OrgId;
use recovea_core::org_tokens::OrgRole;
use recovea_store::{AuditAuth, SqliteStore};
use serde_json::{Value, json};

use crate::Control;
use crate::admin::{Caller, ReplyBody};
use crate::principal::{Principal, Reach};

const ADMIN_TOKEN: &str = "console-access-test-admin-token-0123456789";

fn client() -> Option<SocketAddr> {
    Some(SocketAddr::from(([192, 0, 2, 7], 50_000)))
}

fn control() -> Control {
    let store = Arc::new(SqliteStore::in_memory().expect("store"));
    Control::new(store.clone(), store, MasterKey::from_bytes([7; 32]), ADMIN_TOKEN, Arc::new(|_| {}))
}

/// The operator's admin API call at `path` (after `/admin/v1/`), which must succeed.
async fn operator(control: &Control, method: Method, path: &str, body: Option<Value>) -> Value {
    let caller = Caller { principal: Principal::Operator, auth: AuditAuth::AdminToken, client: None };
    let (path, query) = path.split_once('?').unwrap_or((path, ""));
    let segments: Vec<&str> = path.split('/').collect();
    let body = body.map_or_else(Bytes::new, |b| Bytes::from(b.to_string()));
    match control.route(caller, &method, &segments, query, body).await {
        Ok(reply) => match reply.body {
            ReplyBody::Json(value) => value,
            ReplyBody::Raw(_) | ReplyBody::Csv(_) => panic!("{path}: not JSON"),
        },
        Err(e) => panic!("{method} {path}: {:?}", e.answer()),
    }
}

/// A console answer: status, `location`, `set-cookie` and the page.
struct Page {
    status: StatusCode,
    location: String,
    cookie: String,
    html: String,
}

impl Page {
    /// Where the page's forms post.
    fn forms(&self) -> Vec<&str> {
        self.html
            .split(r#"method="post" action=""#)
            .skip(1)
            .map(|rest| &rest[..rest.find('"').expect("a closing quote")])
            .collect()
    }

    /// The session's CSRF token, from a form of the page.
    fn csrf(&self) -> String {
        let at = self.html.find(r#"name="csrf" value=""#).expect("a form with the CSRF token");
        let rest = &self.html[at + r#"name="csrf" value=""#.len()..];
        rest[..rest.find('"').expect("a closing quote")].to_owned()
    }
}

async fn visit(control: &Control, cookie: &str, method: Method, path: &str, form: &str) -> Page {
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header(header::COOKIE, cookie)
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Full::new(Bytes::from(form.to_owned())))
        .expect("a request");
    let response = control.console(request, client()).await;
    let text = |name| {
        response
            .headers()
            .get(name)
            .and_then(|v: &http::HeaderValue| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    let (status, location, cookie) = (response.status(), text(header::LOCATION), text(header::SET_COOKIE));
    let html = response.into_body().collect().await.expect("a body").to_bytes();
    Page { status, location, cookie, html: String::from_utf8_lossy(&html).into_owned() }
}

/// Signs in with `token`: the session cookie (`name=value`).
async fn sign_in(control: &Control, token: &str) -> String {
    let form = format!("token={}", crate::console::api::encode(token));
    let answer = visit(control, "", Method::POST, "/sign-in", &form).await;
    assert_eq!((answer.status, answer.location.as_str()), (StatusCode::SEE_OTHER, "/"), "{}", answer.html);
    answer.cookie.split(';').next().expect("a cookie").to_owned()
}

/// Two organizations, each with an armed cap of its own; org A has a token of each role.
struct World {
    a: String,
    b: String,
    cap_a: String,
    cap_b: String,
    admin: (String, String),
    viewer: String,
}

async fn world(control: &Control) -> World {
    let org = |name: &str| json!({ "name": name });
    let a = operator(control, Method::POST, "orgs", Some(org("Acme"))).await["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let b = operator(control, Method::POST, "orgs", Some(org("Bravo"))).await["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let cap = json!({ "scope": "organization", "window": "month", "limit_usd": "5", "hard_stop": false });
    let cap_of = |org: String| {
        let cap = cap.clone();
        async move {
            let path = format!("orgs/{org}/caps");
            operator(control, Method::POST, &path, Some(cap)).await["id"].as_str().expect("id").to_owned()
        }
    };
    let (cap_a, cap_b) = (cap_of(a.clone()).await, cap_of(b.clone()).await);
    let token = |role: &'static str| {
        let path = format!("orgs/{a}/tokens");
        async move {
            operator(
                control,
                Method::POST,
                &path,
                Some(json!({ "name": format!("ci-{role}"), "role": role })),
            )
            .await
        }
    };
    let admin = token("admin").await;
    let viewer = token("viewer").await;
    World {
        admin: (
            admin["id"].as_str().expect("id").to_owned(),
            admin["secret"].as_str().expect("secret").to_owned(),
        ),
        viewer: viewer["secret"].as_str().expect("secret").to_owned(),
        a,
        b,
        cap_a,
        cap_b,
    }
}

#[tokio::test]
async fn a_viewer_sees_its_organization_read_only_and_nothing_else() {
    let control = control();
    let w = world(&control).await;
    let cookie = sign_in(&control, &w.viewer).await;

    let home = visit(&control, &cookie, Method::GET, "/", "").await;
    assert_eq!((home.status, home.location.clone()), (StatusCode::SEE_OTHER, format!("/orgs/{}", w.a)));
    let own = visit(&control, &cookie, Method::GET, &format!("/orgs/{}", w.a), "").await;
    assert_eq!(own.status, StatusCode::OK, "{}", own.html);
    assert!(own.html.contains("Signed in as <strong>token ci-viewer (viewer)</strong>"), "{}", own.html);
    assert!(own.html.contains(&format!(r#"data-cap="{}""#, w.cap_a)));
    assert_eq!(own.forms(), ["/sign-out"], "a viewer is offered no change but signing out");
    assert!(!own.html.contains(r#"href="/nodes""#) && !own.html.contains(r#"href="/prices""#));

    // Another organization answers as an organization that does not exist.
    let other = visit(&control, &cookie, Method::GET, &format!("/orgs/{}", w.b), "").await;
    let unknown = visit(&control, &cookie, Method::GET, "/orgs/org_doesnotexist00000000", "").await;
    assert_eq!((other.status, unknown.status), (StatusCode::NOT_FOUND, StatusCode::NOT_FOUND));
    assert!(other.html.contains(&format!("No organization {}.", w.b)), "{}", other.html);
    assert_eq!(other.html.replace(&w.b, "ID"), unknown.html.replace("org_doesnotexist00000000", "ID"));
    for path in ["/nodes", "/prices"] {
        let page = visit(&control, &cookie, Method::GET, path, "").await;
        assert_eq!(page.status, StatusCode::FORBIDDEN, "{path}");
        assert!(page.html.contains("Only the operator may do this."), "{}", page.html);
    }

    // A forged write, with the session's own CSRF token, is the API's 403: nothing changes.
    let csrf = format!("csrf={}", own.csrf());
    let arm = visit(&control, &cookie, Method::POST, &format!("/caps/{}/arm", w.cap_a), &csrf).await;
    assert_eq!(arm.status, StatusCode::FORBIDDEN, "{}", arm.html);
    assert!(arm.html.contains("may only read"), "{}", arm.html);
    let cap = operator(&control, Method::GET, &format!("caps/{}", w.cap_a), None).await;
    assert_eq!(cap["hard_stop"], json!(false));
    let key =
        visit(&control, &cookie, Method::POST, &format!("/orgs/{}/keys", w.a), &format!("{csrf}&name=k"))
            .await;
    assert_eq!(key.status, StatusCode::FORBIDDEN);
    // Another organization's cap is unknown, before the role is looked at.
    let theirs = visit(&control, &cookie, Method::POST, &format!("/caps/{}/arm", w.cap_b), &csrf).await;
    assert_eq!(theirs.status, StatusCode::NOT_FOUND);
    let created = visit(&control, &cookie, Method::POST, "/orgs", &format!("{csrf}&name=Mine")).await;
    assert_eq!(created.status, StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn an_admin_changes_its_organization_audited_as_its_token_until_the_token_is_revoked() {
    let control = control();
    let w = world(&control).await;
    let (token_id, secret) = &w.admin;
    let cookie = sign_in(&control, secret).await;
    let own = visit(&control, &cookie, Method::GET, &format!("/orgs/{}", w.a), "").await;
    assert!(own.html.contains(&format!(r#"action="/caps/{}/arm""#, w.cap_a)), "{}", own.html);
    assert!(own.html.contains(r#"id="new-key""#) && own.html.contains(r#"id="new-token""#));
    assert!(!own.html.contains(r#"id="provider""#), "a credential is set whole by the operator alone");
    assert!(!own.html.contains(r#"href="/nodes""#) && !own.html.contains(r#"id="new-org""#));
    let csrf = format!("csrf={}", own.csrf());

    let arm = visit(&control, &cookie, Method::POST, &format!("/caps/{}/arm", w.cap_a), &csrf).await;
    assert_eq!(
        (arm.status, arm.location.as_str()),
        (StatusCode::SEE_OTHER, format!("/orgs/{}#caps", w.a).as_str())
    );
    assert_eq!(
        operator(&control, Method::GET, &format!("caps/{}", w.cap_a), None).await["hard_stop"],
        json!(true)
    );
    let theirs = visit(&control, &cookie, Method::POST, &format!("/caps/{}/arm", w.cap_b), &csrf).await;
    assert_eq!(theirs.status, StatusCode::NOT_FOUND);
    assert_eq!(
        operator(&control, Method::GET, &format!("caps/{}", w.cap_b), None).await["hard_stop"],
        json!(false)
    );

    let trail = operator(&control, Method::GET, &format!("orgs/{}/audit", w.a), None).await;
    let armed = trail["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .find(|e| e["object_id"] == json!(w.cap_a) && e["action"] == json!("update"))
        .expect("the arming is audited");
    assert_eq!(armed["actor"], json!({ "type": "org_token", "id": token_id, "name": "ci-admin" }));
    assert_eq!(armed["auth"], json!("console_session"));

    // Revoked: the session ends at its next request.
    operator(&control, Method::POST, &format!("tokens/{token_id}/revoke"), None).await;
    let after = visit(&control, &cookie, Method::GET, &format!("/orgs/{}", w.a), "").await;
    assert_eq!((after.status, after.location.as_str()), (StatusCode::SEE_OTHER, "/sign-in"));
}

#[tokio::test]
async fn a_persons_changes_are_audited_under_the_providers_subject() {
    let control = control();
    let w = world(&control).await;
    let person = Principal::Person {
        subject: "alice".into(),
        email: Some("alice@acme.example".into()),
        reach: Reach::Org { org: OrgId::parse(&w.a).expect("id"), role: OrgRole::Admin },
    };
    let (id, session) = control.inner.console_sessions.open(Instant::now(), person).expect("random");
    let cookie = format!("{}={id}", super::session::COOKIE);
    let form = format!("csrf={}", session.csrf);
    let arm = visit(&control, &cookie, Method::POST, &format!("/caps/{}/arm", w.cap_a), &form).await;
    assert_eq!(arm.status, StatusCode::SEE_OTHER);
    let own = visit(&control, &cookie, Method::GET, &format!("/orgs/{}", w.a), "").await;
    assert!(own.html.contains("Signed in as <strong>alice@acme.example (admin)</strong>"), "{}", own.html);
    let trail = operator(&control, Method::GET, &format!("orgs/{}/audit", w.a), None).await;
    let actors: Vec<&Value> =
        trail["entries"].as_array().expect("entries").iter().map(|e| &e["actor"]).collect();
    assert!(
        actors.contains(&&json!({ "type": "person", "subject": "alice", "email": "alice@acme.example" })),
        "{actors:?}"
    );
}

#[tokio::test]
async fn the_operators_session_still_reaches_everything() {
    let control = control();
    let w = world(&control).await;
    let cookie = sign_in(&control, ADMIN_TOKEN).await;
    let home = visit(&control, &cookie, Method::GET, "/", "").await;
    assert_eq!(home.status, StatusCode::OK);
    for shown in
        [r#"href="/nodes""#, r#"href="/prices""#, r#"id="new-org""#, &format!(r#"data-org="{}""#, w.b)]
    {
        assert!(home.html.contains(shown), "{shown}");
    }
    let org = visit(&control, &cookie, Method::GET, &format!("/orgs/{}", w.b), "").await;
    assert!(org.html.contains(r#"id="provider""#), "the operator sets credentials whole");
}
