//! One suite, two backends: every test body runs against `SqliteStore` (a file in a temporary
//! directory) and `PostgresStore` (a database of its own, created for the test and dropped after).
//!
//! PostgreSQL is required, never skipped: the server is `RECOVEA_TEST_POSTGRES_URL` (default
//! `postgres://postgres@127.0.0.1:5432`, trust auth), and a test fails loudly when it cannot connect.

use std::path::PathBuf;
use std::sync::Barrier;

use recovea_core::caps::{Cap, Scope};
use recovea_core::channel::JobKind;
use recovea_core::endpoints::EndpointAllowlist;
use recovea_core::ids::{CapId, KeyId, NodeCredentialId, OrgId, OrgTokenId};
use recovea_core::jobs::BatchInput;
use recovea_core::keys::hash_secret;
use recovea_core::models::ModelAllowlist;
use recovea_core::money::Nanos;
use recovea_core::org_tokens::OrgRole;
use recovea_core::pricing::PriceWire;
use recovea_core::ratelimit::KeyLimits;
use recovea_core::receipt::{ProviderKey, Receipt, SerializedReceipt};
use recovea_core::snapshot::ProviderKind;
use recovea_core::timestamp::Timestamp;
use recovea_core::usage::UsageSource;
use recovea_core::window::Window;
use std::time::Duration;

use recovea_store::{
    AccessRules, ActiveKey, AlertRecord, AuditActor, AuditAuth, AuditContext, AuditEntry, AuditQuery,
    BookRows, CapRecord, ControlStore, FileRecord, JobPoll, JobRecord, JobStore, KeyRecord,
    NodeCredentialRecord, NodeRecord, OrgRecord, OrgTokenRecord, PostgresStore, PresentedCredential,
    PriceChange, PriceOverride, PriceTarget, ProviderRecord, ReceiptLedger, ReceiptQuery, SqliteStore,
    StoreError,
};

/// A fresh, empty database; `open` gives a new store instance on it each time it is called.
trait Backend {
    type Store: ControlStore + ReceiptLedger + JobStore;
    fn open(&self) -> Self::Store;
    /// Makes the database refuse to insert the receipt `id` (the schema must exist: open a store
    /// first), so that a transaction inserting it fails part way.
    fn refuse_receipt(&self, id: &str);
    /// Runs `sql` on the database under the store, as another program (an older control plane)
    /// would.
    fn run_sql(&self, sql: &str);
}

struct Sqlite {
    dir: PathBuf,
}

impl Sqlite {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!(
            "recovea-store-suite-{}-{:016x}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir_all(&dir).expect("temporary directory");
        Self { dir }
    }
}

impl Backend for Sqlite {
    type Store = SqliteStore;

    fn open(&self) -> SqliteStore {
        SqliteStore::open(&self.dir.join("control.db")).expect("open SQLite")
    }

    fn refuse_receipt(&self, id: &str) {
        self.connection()
            .execute_batch(&format!(
                "CREATE TRIGGER refuse_{id} BEFORE INSERT ON receipts WHEN NEW.id = '{id}'
             BEGIN SELECT RAISE(ABORT, 'refused by the test'); END;"
            ))
            .expect("trigger");
    }

    fn run_sql(&self, sql: &str) {
        self.connection().execute_batch(sql).expect("SQL runs");
    }
}

impl Sqlite {
    fn connection(&self) -> rusqlite::Connection {
        rusqlite::Connection::open(self.dir.join("control.db")).expect("open SQLite")
    }
}

impl Drop for Sqlite {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

struct Postgres {
    server: String,
    name: String,
}

impl Postgres {
    fn new() -> Self {
        let server = std::env::var("RECOVEA_TEST_POSTGRES_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into());
        let name = format!("recovea_test_{:016x}", fastrand::u64(..));
        let mut admin = ::postgres::Client::connect(&format!("{server}/postgres"), ::postgres::NoTls)
            .unwrap_or_else(|e| {
                panic!("these tests need PostgreSQL at {server} (set RECOVEA_TEST_POSTGRES_URL): {e:?}")
            });
        admin.batch_execute(&format!("CREATE DATABASE {name}")).expect("CREATE DATABASE");
        Self { server, name }
    }

    fn url(&self) -> String {
        format!("{}/{}", self.server, self.name)
    }

    fn admin(&self) -> Result<::postgres::Client, ::postgres::Error> {
        ::postgres::Client::connect(&format!("{}/postgres", self.server), ::postgres::NoTls)
    }

    /// A plain client on the test's database, to look under the store.
    fn client(&self) -> ::postgres::Client {
        ::postgres::Client::connect(&self.url(), ::postgres::NoTls).expect("connect to the test database")
    }
}

impl Backend for Postgres {
    type Store = PostgresStore;

    fn open(&self) -> PostgresStore {
        PostgresStore::connect(&self.url()).expect("connect PostgresStore")
    }

    fn refuse_receipt(&self, id: &str) {
        self.client()
            .batch_execute(&format!(
                "CREATE FUNCTION refuse_{id}() RETURNS trigger LANGUAGE plpgsql AS $$
                 BEGIN RAISE EXCEPTION 'refused by the test'; END $$;
                 CREATE TRIGGER refuse_{id} BEFORE INSERT ON receipts FOR EACH ROW
                 WHEN (NEW.id = '{id}') EXECUTE FUNCTION refuse_{id}();"
            ))
            .expect("trigger");
    }

    fn run_sql(&self, sql: &str) {
        self.client().batch_execute(sql).expect("SQL runs");
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
        let dropped = self.admin().and_then(|mut admin| admin.batch_execute(&sql));
        if let Err(e) = dropped {
            eprintln!("could not drop test database {}: {e:?}", self.name);
        }
    }
}

/// Runs each named body once per backend, as `sqlite::name` and `postgres::name`.
macro_rules! suite {
    ($($test:ident),* $(,)?) => {
        mod sqlite {
            $( #[test] fn $test() { super::$test(&super::Sqlite::new()); } )*
        }
        mod postgres {
            $( #[test] fn $test() { super::$test(&super::Postgres::new()); } )*
        }
    };
}

suite!(
    keys_revoke_once_and_leave_the_active_state,
    key_limits_are_kept_and_changed,
    model_allowlists_are_kept_and_changed,
    endpoint_allowlists_and_concurrency_limits_are_kept_and_changed,
    receipts_keep_their_tags_and_filter_and_sum_by_them,
    children_of_unknown_orgs_are_refused,
    state_survives_reopening,
    state_holds_every_table,
    receipts_insert_once_and_page_in_order,
    spend_summary_groups_by_day_key_and_model,
    receipts_filter_by_model_status_usage_source_and_provider_key,
    spend_sums_costs_in_a_window,
    daily_spend_answers_as_the_receipts_do_and_counts_a_replay_once,
    each_price_change_is_a_new_revision,
    prices_are_removed_imported_and_set_per_kind_in_one_revision_each,
    caps_are_created_read_updated_and_deleted,
    alerts_are_raised_once_per_threshold,
    the_state_version_grows_with_each_change,
    two_stores_on_one_database_see_each_others_changes,
    concurrent_changes_each_bump_the_version,
    concurrent_replays_insert_each_receipt_once,
    nodes_are_recorded_replaced_and_listed_since_a_time,
    node_credentials_are_created_listed_looked_up_by_hash_and_revoked_once,
    org_tokens_are_created_listed_looked_up_by_hash_and_revoked_once,
    every_audit_row_names_its_actor,
    a_row_written_without_an_actor_is_the_operators,
    a_node_report_names_the_credential_it_presented,
    key_owners_name_the_organization_of_every_key_revoked_or_not,
    every_change_writes_its_audit_row,
    refused_changes_write_no_audit_row,
    the_audit_log_is_filtered_and_paged,
    jobs_and_files_are_recorded_once,
    the_book_holds_pending_and_recent_jobs_recent_files_and_spend_by_day,
    one_poller_holds_the_lease_until_it_lapses,
    polls_are_recorded_without_a_version_bump,
    a_job_settles_once_with_its_receipts,
    a_settlement_that_fails_writes_nothing,
    concurrent_settlements_settle_once,
    counted_spend_is_every_receipt_but_settlements_and_what_writers_hold,
    an_organizations_jobs_list_newest_first,
    jobs_survive_reopening_and_are_shared_between_stores,
);

fn nodes_are_recorded_replaced_and_listed_since_a_time(db: &impl Backend) {
    let store = db.open();
    let version = store.version().expect("version");
    let node = |id: &str, feed_version: Option<u64>, seen_at: i64| NodeRecord {
        id: id.into(),
        feed_version,
        snapshot_age_ms: feed_version.map(|_| 250),
        counters_confirmed_at: feed_version.map(|_| Timestamp(seen_at - 1)),
        fail_open_total: 3,
        seen_at: Timestamp(seen_at),
        // A clock measured, and one not.
        clock_offset_ms: feed_version.map(|v| -30_000 - i64::try_from(v).unwrap_or(0)),
        credential: None,
    };
    store.record_node(&node("node_b", None, 100)).expect("recorded");
    store.record_node(&node("node_a", Some(7), 100)).expect("recorded");
    store.record_node(&node("node_b", Some(8), 200)).expect("replaced");
    assert_eq!(
        store.nodes(Timestamp(0)).expect("nodes"),
        vec![node("node_a", Some(7), 100), node("node_b", Some(8), 200)]
    );
    assert_eq!(store.nodes(Timestamp(150)).expect("nodes"), vec![node("node_b", Some(8), 200)]);
    assert_eq!(store.version().expect("version"), version, "nodes are not part of the state");
}

fn node_credential_id(id: &str) -> NodeCredentialId {
    NodeCredentialId::parse(id).expect("node credential id")
}

fn node_credential(id: &str, name: &str, created_at: i64) -> NodeCredentialRecord {
    NodeCredentialRecord {
        id: node_credential_id(id),
        name: name.into(),
        created_at: Timestamp(created_at),
        revoked_at: None,
    }
}

fn node_credentials_are_created_listed_looked_up_by_hash_and_revoked_once(db: &impl Backend) {
    let store = db.open();
    let (edge_1, edge_2) = (node_credential("ncr_b1", "edge-1", 10), node_credential("ncr_a2", "edge-2", 20));
    let (token_1, token_2) = (hash_secret("rnt_token_of_edge_1"), hash_secret("rnt_token_of_edge_2"));
    store.create_node_credential(&edge_1, token_1, &audit()).expect("created");
    store.create_node_credential(&edge_2, token_2, &audit()).expect("created");
    assert!(
        store.create_node_credential(&node_credential("ncr_c3", "copy", 30), token_1, &audit()).is_err(),
        "one token, one credential"
    );
    assert_eq!(store.node_credentials().expect("listed"), [edge_1.clone(), edge_2.clone()], "oldest first");
    assert_eq!(store.node_credential_by_hash(token_2).expect("looked up"), Some(edge_2.clone()));
    assert_eq!(store.node_credential_by_hash(hash_secret("rnt_never_issued")).expect("looked up"), None);

    let version = store.version().expect("version");
    let revoked = store.revoke_node_credential(&edge_1.id, Timestamp(40), &audit()).expect("revoked");
    let edge_1_revoked = NodeCredentialRecord { revoked_at: Some(Timestamp(40)), ..edge_1.clone() };
    assert_eq!(revoked, Some(edge_1_revoked.clone()));
    assert!(store.version().expect("version") > version, "a revocation is a change of the state");
    let again = store.revoke_node_credential(&edge_1.id, Timestamp(50), &audit()).expect("revoked again");
    assert_eq!(again, Some(edge_1_revoked.clone()), "the first revocation time is kept");
    assert_eq!(
        store
            .revoke_node_credential(&node_credential_id("ncr_none"), Timestamp(50), &audit())
            .expect("revoke"),
        None
    );
    // Another store on the database (another replica) sees the revocation at its next lookup.
    let replica = db.open();
    assert_eq!(replica.node_credential_by_hash(token_1).expect("looked up"), Some(edge_1_revoked.clone()));
    assert_eq!(replica.node_credentials().expect("listed"), [edge_1_revoked, edge_2]);

    // Create and revoke are audited; nothing of the token's hash is in their rows.
    let rows = audit_rows(&store);
    let kinds: Vec<(&str, &str, &str)> =
        rows.iter().map(|r| (r.action.as_str(), r.object_kind.as_str(), r.object_id.as_str())).collect();
    assert_eq!(
        kinds,
        [
            ("create", "node_credential", "ncr_b1"),
            ("create", "node_credential", "ncr_a2"),
            ("revoke", "node_credential", "ncr_b1"),
            ("revoke", "node_credential", "ncr_b1"),
        ]
    );
    assert_eq!(
        rows[2].after.as_deref(),
        Some(
            r#"{"created_at":"1970-01-01T00:00:00.01Z","id":"ncr_b1","name":"edge-1","revoked_at":"1970-01-01T00:00:00.04Z"}"#
        )
    );
    assert!(rows.iter().all(|r| r.org_id.is_none()), "a node credential is no organization's");
    let hex: String = token_1.0.iter().map(|b| format!("{b:02x}")).collect();
    for entry in &rows {
        let text = format!("{:?} {:?}", entry.before, entry.after);
        assert!(!text.contains(&hex) && !text.contains("hash") && !text.contains("token"), "{text}");
    }
}

fn org_token(id: &str, org: &str, role: OrgRole, created_at: i64) -> OrgTokenRecord {
    OrgTokenRecord {
        id: OrgTokenId::parse(id).expect("token id"),
        org_id: org_id(org),
        name: format!("{id} name"),
        role,
        prefix: "rot_abcdef".into(),
        created_at: Timestamp(created_at),
        expires_at: (role == OrgRole::Viewer).then_some(Timestamp(created_at + 1_000)),
        revoked_at: None,
    }
}

fn org_tokens_are_created_listed_looked_up_by_hash_and_revoked_once(db: &impl Backend) {
    let store = db.open();
    store.create_org(&org("org_a"), &audit()).expect("org");
    store.create_org(&org("org_b"), &audit()).expect("org");
    let admin = org_token("tok_b1", "org_a", OrgRole::Admin, 10);
    let viewer = org_token("tok_a2", "org_a", OrgRole::Viewer, 20);
    let other = org_token("tok_c3", "org_b", OrgRole::Admin, 5);
    let (secret_1, secret_2, secret_3) =
        (hash_secret("rot_secret_1"), hash_secret("rot_secret_2"), hash_secret("rot_secret_3"));
    store.create_org_token(&admin, secret_1, &audit()).expect("created");
    store.create_org_token(&viewer, secret_2, &audit()).expect("created");
    store.create_org_token(&other, secret_3, &audit()).expect("created");
    assert!(
        store
            .create_org_token(&org_token("tok_d4", "org_a", OrgRole::Admin, 30), secret_1, &audit())
            .is_err(),
        "one secret, one token"
    );
    assert!(
        matches!(
            store.create_org_token(
                &org_token("tok_e5", "org_x", OrgRole::Admin, 30),
                hash_secret("x"),
                &audit()
            ),
            Err(StoreError::NotFound)
        ),
        "no token of an unknown organization"
    );
    assert_eq!(
        store.org_tokens(&org_id("org_a")).expect("listed"),
        [admin.clone(), viewer.clone()],
        "oldest first"
    );
    assert_eq!(
        store.org_tokens(&org_id("org_b")).expect("listed"),
        std::slice::from_ref(&other),
        "its own alone"
    );
    assert_eq!(store.org_token(&viewer.id).expect("read"), Some(viewer.clone()));
    assert_eq!(store.org_token_by_hash(secret_3).expect("looked up"), Some(other.clone()));
    assert_eq!(store.org_token_by_hash(hash_secret("rot_never_issued")).expect("looked up"), None);

    let version = store.version().expect("version");
    let revoked = store.revoke_org_token(&admin.id, Timestamp(40), &audit()).expect("revoked");
    let admin_revoked = OrgTokenRecord { revoked_at: Some(Timestamp(40)), ..admin.clone() };
    assert_eq!(revoked, Some(admin_revoked.clone()));
    assert!(store.version().expect("version") > version, "a revocation is a change");
    let again = store.revoke_org_token(&admin.id, Timestamp(50), &audit()).expect("revoked again");
    assert_eq!(again, Some(admin_revoked.clone()), "the first revocation time is kept");
    let unknown = OrgTokenId::parse("tok_none").expect("token id");
    assert_eq!(store.revoke_org_token(&unknown, Timestamp(50), &audit()).expect("revoke"), None);
    // Another store on the database (another replica) sees the revocation at its next lookup.
    assert_eq!(db.open().org_token_by_hash(secret_1).expect("looked up"), Some(admin_revoked));

    // Create and revoke are audited as the organization's; nothing of the secret's hash is kept.
    let rows: Vec<AuditEntry> =
        audit_rows(&store).into_iter().filter(|r| r.object_kind == "org_token").collect();
    let kinds: Vec<(&str, &str, Option<&str>)> = rows
        .iter()
        .map(|r| (r.action.as_str(), r.object_id.as_str(), r.org_id.as_ref().map(OrgId::as_str)))
        .collect();
    assert_eq!(
        kinds,
        [
            ("create", "tok_b1", Some("org_a")),
            ("create", "tok_a2", Some("org_a")),
            ("create", "tok_c3", Some("org_b")),
            ("revoke", "tok_b1", Some("org_a")),
            ("revoke", "tok_b1", Some("org_a")),
        ]
    );
    assert_eq!(
        rows[1].after.as_deref(),
        Some(
            r#"{"created_at":"1970-01-01T00:00:00.02Z","expires_at":"1970-01-01T00:00:01.02Z","id":"tok_a2","name":"tok_a2 name","org_id":"org_a","prefix":"rot_abcdef","revoked_at":null,"role":"viewer"}"#
        )
    );
    let hex: String = secret_1.0.iter().map(|b| format!("{b:02x}")).collect();
    for entry in &rows {
        let text = format!("{:?} {:?}", entry.before, entry.after);
        assert!(!text.contains(&hex) && !text.contains("hash") && !text.contains("secret"), "{text}");
    }
}

fn every_audit_row_names_its_actor(db: &impl Backend) {
    let store = db.open();
    let by = |id: &str, auth: AuditAuth, actor: AuditActor| AuditContext {
        id: id.into(),
        at: Timestamp(1_000),
        auth,
        actor,
        client: None,
    };
    let token =
        AuditActor::OrgToken { id: OrgTokenId::parse("tok_a").expect("id"), name: "ci deploys".into() };
    let person =
        AuditActor::Person { subject: "248289761001".into(), email: Some("jane@example.com".into()) };
    let anonymous = AuditActor::Person { subject: "sub|7".into(), email: None };
    store.create_org(&org("org_a"), &by("aud_1", AuditAuth::AdminToken, AuditActor::Operator)).expect("org");
    store
        .create_key(
            &key("key_a", "org_a"),
            hash_secret("a"),
            &by("aud_2", AuditAuth::OrgToken, token.clone()),
        )
        .expect("key");
    store
        .create_key(
            &key("key_b", "org_a"),
            hash_secret("b"),
            &by("aud_3", AuditAuth::ConsoleSession, person.clone()),
        )
        .expect("key");
    store
        .revoke_key(
            &key_id("key_b"),
            Timestamp(5),
            &by("aud_4", AuditAuth::ConsoleSession, anonymous.clone()),
        )
        .expect("revoke");
    let rows = audit_rows(&store);
    let who: Vec<(AuditAuth, AuditActor)> = rows.iter().map(|r| (r.auth, r.actor.clone())).collect();
    assert_eq!(
        who,
        [
            (AuditAuth::AdminToken, AuditActor::Operator),
            (AuditAuth::OrgToken, token.clone()),
            (AuditAuth::ConsoleSession, person.clone()),
            (AuditAuth::ConsoleSession, anonymous.clone()),
        ]
    );
    // The contract's shapes, byte for byte.
    let shapes: Vec<String> = rows.iter().map(|r| r.actor.to_json().to_string()).collect();
    assert_eq!(
        shapes,
        [
            r#"{"type":"operator"}"#,
            r#"{"id":"tok_a","name":"ci deploys","type":"org_token"}"#,
            r#"{"email":"jane@example.com","subject":"248289761001","type":"person"}"#,
            r#"{"email":null,"subject":"sub|7","type":"person"}"#,
        ]
    );
}

fn a_row_written_without_an_actor_is_the_operators(db: &impl Backend) {
    let store = db.open();
    store.create_org(&org("org_a"), &audit()).expect("org");
    // As a control plane from before actors writes it: every column but `actor`.
    db.run_sql(
        "INSERT INTO audit_log (id, version, at, auth, client, action, object_kind, object_id, org_id, before_json, after_json)
         VALUES ('aud_old', 1000, 5, 'console_session', NULL, 'create', 'org', 'org_z', 'org_z', NULL, '{}')",
    );
    let old = audit_rows(&store).into_iter().find(|r| r.id == "aud_old").expect("the older writer's row");
    assert_eq!((old.auth, old.actor), (AuditAuth::ConsoleSession, AuditActor::Operator));
}

fn a_node_report_names_the_credential_it_presented(db: &impl Backend) {
    let store = db.open();
    let report = |id: &str, credential: Option<PresentedCredential>| NodeRecord {
        id: id.into(),
        feed_version: Some(1),
        snapshot_age_ms: None,
        counters_confirmed_at: None,
        fail_open_total: 0,
        seen_at: Timestamp(100),
        clock_offset_ms: None,
        credential,
    };
    let own = PresentedCredential::Own { id: node_credential_id("ncr_a1"), name: "edge-1".into() };
    store.record_node(&report("node_a", Some(own.clone()))).expect("recorded");
    store.record_node(&report("node_b", Some(PresentedCredential::Shared))).expect("recorded");
    store.record_node(&report("node_c", None)).expect("recorded");
    assert_eq!(
        store.nodes(Timestamp(0)).expect("nodes"),
        [
            report("node_a", Some(own)),
            report("node_b", Some(PresentedCredential::Shared)),
            report("node_c", None)
        ]
    );
    // A node restarted with another token is named by the one it presented last.
    store.record_node(&report("node_a", Some(PresentedCredential::Shared))).expect("replaced");
    assert_eq!(store.nodes(Timestamp(0)).expect("nodes")[0].credential, Some(PresentedCredential::Shared));
}

fn key_owners_name_the_organization_of_every_key_revoked_or_not(db: &impl Backend) {
    let store = db.open();
    store.create_org(&org("org_a"), &audit()).expect("org");
    store.create_org(&org("org_b"), &audit()).expect("org");
    store.create_key(&key("key_a", "org_a"), hash_secret("rk_a"), &audit()).expect("key");
    store.create_key(&key("key_b", "org_b"), hash_secret("rk_b"), &audit()).expect("key");
    store.create_key(&key("key_old", "org_b"), hash_secret("rk_old"), &audit()).expect("key");
    store.revoke_key(&key_id("key_old"), Timestamp(5), &audit()).expect("revoked");
    let mut owners = store
        .key_owners(&[key_id("key_b"), key_id("key_nobody"), key_id("key_a"), key_id("key_old")])
        .expect("owners");
    owners.sort();
    assert_eq!(
        owners,
        [
            (key_id("key_a"), org_id("org_a")),
            (key_id("key_b"), org_id("org_b")),
            (key_id("key_old"), org_id("org_b")),
        ]
    );
    assert_eq!(store.key_owners(&[]).expect("none asked"), []);
}

/// The audit context of a test's change: ids in the order they are made, an admin from nowhere.
fn audit() -> AuditContext {
    static MADE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let n = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    AuditContext {
        id: format!("aud_{n:08}"),
        at: Timestamp(1_000),
        auth: AuditAuth::AdminToken,
        actor: AuditActor::Operator,
        client: None,
    }
}

fn org_id(id: &str) -> OrgId {
    OrgId::parse(id).expect("org id")
}

fn key_id(id: &str) -> KeyId {
    KeyId::parse(id).expect("key id")
}

fn cap_id(id: &str) -> CapId {
    CapId::parse(id).expect("cap id")
}

fn org(id: &str) -> OrgRecord {
    OrgRecord {
        id: org_id(id),
        name: format!("{id} name"),
        created_at: Timestamp(1),
        allowed_models: None,
        allowed_endpoints: None,
        max_concurrent_requests: None,
    }
}

fn key(id: &str, org: &str) -> KeyRecord {
    KeyRecord {
        id: key_id(id),
        org_id: org_id(org),
        name: "k".into(),
        prefix: "rk_abc".into(),
        created_at: Timestamp(2),
        expires_at: None,
        revoked_at: None,
        limits: KeyLimits::default(),
        allowed_models: None,
        allowed_endpoints: None,
        max_concurrent_requests: None,
    }
}

fn provider(org: &str) -> ProviderRecord {
    ProviderRecord {
        org_id: org_id(org),
        name: "openai".into(),
        kind: ProviderKind::OpenAi,
        base_url: None,
        sealed_key: vec![1, 2, 3],
        key_hint: "...".into(),
        updated_at: Timestamp(3),
        price_namespace: None,
        fallback_price: None,
    }
}

fn cap(id: &str, org: &str, key: Option<&str>) -> CapRecord {
    CapRecord {
        cap: Cap {
            id: cap_id(id),
            org_id: org_id(org),
            scope: if key.is_some() { Scope::Key } else { Scope::Organization },
            key_id: key.map(key_id),
            window: Window::Month,
            limit: Nanos(1_000_000_000),
            hard_stop: true,
            alert_at_permille: vec![500, 800, 1000],
            alert_webhook: Some("https://hooks.example/recovea".into()),
        },
        created_at: Timestamp(4),
    }
}

fn wire(input: &str) -> PriceWire {
    PriceWire {
        input_per_mtok_usd: input.into(),
        output_per_mtok_usd: "1".into(),
        cache_write_per_mtok_usd: Some("0.5".into()),
        batch_input_per_mtok_usd: Some("0.25".into()),
        max_output_tokens: Some(4096),
        ..PriceWire::default()
    }
}

fn serialized(receipts: &[Receipt]) -> Vec<SerializedReceipt> {
    receipts.iter().cloned().map(SerializedReceipt::new).collect()
}

fn receipt(id: &str, key: &str, started_at: i64, cost: i64) -> Receipt {
    Receipt {
        key_id: key.into(),
        input_tokens: 10,
        output_tokens: 5,
        cost_usd: Nanos(cost),
        started_at: Timestamp(started_at),
        finished_at: Timestamp(started_at + 5),
        ..Receipt::example(id)
    }
}

fn alert(id: &str, window_start: i64, threshold: u32, raised_at: i64) -> AlertRecord {
    AlertRecord {
        id: id.into(),
        cap_id: cap_id("cap_a"),
        org_id: org_id("org_a"),
        window_start: Timestamp(window_start),
        threshold_permille: threshold,
        spend: Nanos(600),
        limit: Nanos(1000),
        raised_at: Timestamp(raised_at),
        delivered_at: None,
        attempts: 0,
    }
}

fn ids(receipts: &[Receipt]) -> Vec<&str> {
    receipts.iter().map(|r| r.id.as_str()).collect()
}

fn keys_revoke_once_and_leave_the_active_state(db: &impl Backend) {
    let store = db.open();
    store.create_org(&org("org_a"), &audit()).expect("org");
    store.create_key(&key("key_a", "org_a"), hash_secret("rk_a"), &audit()).expect("key");
    store.create_key(&key("key_b", "org_a"), hash_secret("rk_b"), &audit()).expect("key");
    let before = store.state().expect("state");
    assert_eq!(before.active_keys.len(), 2);

    let revoked = store.revoke_key(&key_id("key_a"), Timestamp(10), &audit()).expect("revoke");
    assert_eq!(revoked.expect("known").revoked_at, Some(Timestamp(10)));
    let again = store.revoke_key(&key_id("key_a"), Timestamp(20), &audit()).expect("revoke");
    assert_eq!(again.expect("known").revoked_at, Some(Timestamp(10)), "the first revocation is kept");
    assert_eq!(store.revoke_key(&key_id("key_zz"), Timestamp(20), &audit()).expect("ok"), None);

    let after = store.state().expect("state");
    assert!(after.version > before.version);
    assert_eq!(store.version().expect("version"), after.version);
    assert_eq!(after.active_keys.len(), 1);
    assert_eq!(after.active_keys[0].hash, hash_secret("rk_b"));
    assert_eq!(store.list_keys(&org_id("org_a")).expect("list").len(), 2, "revoked keys are still listed");
    assert!(matches!(
        store.create_key(&key("key_c", "org_a"), hash_secret("rk_b"), &audit()),
        Err(StoreError::Backend(_))
    ));
}

fn key_limits_are_kept_and_changed(db: &impl Backend) {
    let store = db.open();
    store.create_org(&org("org_a"), &audit()).expect("org");
    let limited = KeyLimits { requests_per_minute: Some(60), tokens_per_minute: Some(u32::MAX) };
    let mut record = key("key_a", "org_a");
    record.limits = limited;
    record.expires_at = Some(Timestamp(99));
    store.create_key(&record, hash_secret("rk_a"), &audit()).expect("key");
    assert_eq!(store.key(&key_id("key_a")).expect("read"), Some(record.clone()));
    assert_eq!(store.key(&key_id("key_zz")).expect("read"), None);

    let version = store.version().expect("version");
    let lifted = KeyLimits { requests_per_minute: None, tokens_per_minute: Some(1000) };
    let changed = store
        .update_key(&key_id("key_a"), lifted, &AccessRules::default(), &audit())
        .expect("set")
        .expect("known");
    assert_eq!(changed, KeyRecord { limits: lifted, ..record });
    assert!(store.version().expect("version") > version);
    assert_eq!(store.state().expect("state").active_keys[0].limits, lifted);
    assert_eq!(
        store.update_key(&key_id("key_zz"), lifted, &AccessRules::default(), &audit()).expect("ok"),
        None
    );
}

fn model_allowlists_are_kept_and_changed(db: &impl Backend) {
    let store = db.open();
    let models =
        |p: &[&str]| ModelAllowlist::parse(p.iter().map(|m| (*m).to_owned()).collect()).expect("valid");
    let listed = OrgRecord { allowed_models: Some(models(&["gpt-*", "claude-sonnet-4-5"])), ..org("org_a") };
    store.create_org(&listed, &audit()).expect("org");
    assert_eq!(store.org(&org_id("org_a")).expect("read"), Some(listed.clone()));
    let mut record = key("key_a", "org_a");
    record.allowed_models = Some(models(&["gpt-4o-mini"]));
    store.create_key(&record, hash_secret("rk_a"), &audit()).expect("key");
    assert_eq!(store.key(&key_id("key_a")).expect("read"), Some(record.clone()));
    let state = store.state().expect("state");
    assert_eq!(state.orgs[0].allowed_models, listed.allowed_models);
    assert_eq!(state.active_keys[0].allowed_models, record.allowed_models);

    let version = store.version().expect("version");
    let empty = models(&[]);
    let changed = store
        .update_key(
            &key_id("key_a"),
            record.limits,
            &AccessRules { allowed_models: Some(empty.clone()), ..AccessRules::default() },
            &audit(),
        )
        .expect("set")
        .expect("known");
    assert_eq!(
        changed,
        KeyRecord { allowed_models: Some(empty.clone()), ..record.clone() },
        "an empty list is kept, not cleared"
    );
    assert!(store.version().expect("version") > version);
    let cleared = store
        .update_key(&key_id("key_a"), record.limits, &AccessRules::default(), &audit())
        .expect("set")
        .expect("known");
    assert_eq!(cleared.allowed_models, None);
    assert_eq!(
        store.update_key(&key_id("key_zz"), record.limits, &AccessRules::default(), &audit()).expect("ok"),
        None
    );

    let version = store.version().expect("version");
    let org = store
        .set_org_rules(&org_id("org_a"), &AccessRules::default(), &audit())
        .expect("set")
        .expect("known");
    assert_eq!(org, OrgRecord { allowed_models: None, ..listed });
    assert!(store.version().expect("version") > version);
    assert_eq!(store.state().expect("state").orgs[0].allowed_models, None);
    let rules = AccessRules { allowed_models: Some(empty), ..AccessRules::default() };
    assert_eq!(store.set_org_rules(&org_id("org_zz"), &rules, &audit()).expect("ok"), None);
}

fn endpoint_allowlists_and_concurrency_limits_are_kept_and_changed(db: &impl Backend) {
    let store = db.open();
    let endpoints =
        |p: &[&str]| EndpointAllowlist::parse(p.iter().map(|m| (*m).to_owned()).collect()).expect("valid");
    let listed = OrgRecord {
        allowed_endpoints: Some(endpoints(&["/v1/chat/completions", "/v1/files*"])),
        max_concurrent_requests: Some(20),
        ..org("org_a")
    };
    store.create_org(&listed, &audit()).expect("org");
    assert_eq!(store.org(&org_id("org_a")).expect("read"), Some(listed.clone()));
    let mut record = key("key_a", "org_a");
    record.allowed_endpoints = Some(endpoints(&["/v1/chat/completions"]));
    record.max_concurrent_requests = Some(u32::MAX);
    store.create_key(&record, hash_secret("rk_a"), &audit()).expect("key");
    assert_eq!(store.key(&key_id("key_a")).expect("read"), Some(record.clone()));
    let state = store.state().expect("state");
    assert_eq!(state.orgs[0].allowed_endpoints, listed.allowed_endpoints);
    assert_eq!(state.orgs[0].max_concurrent_requests, Some(20));
    assert_eq!(state.active_keys[0].allowed_endpoints, record.allowed_endpoints);
    assert_eq!(state.active_keys[0].max_concurrent_requests, Some(u32::MAX), "the whole range of a u32");

    // One change sets every rule of the key; its audit row shows them.
    let version = store.version().expect("version");
    let rules = AccessRules {
        allowed_models: None,
        allowed_endpoints: Some(endpoints(&[])),
        max_concurrent_requests: Some(0),
    };
    let changed =
        store.update_key(&key_id("key_a"), record.limits, &rules, &audit()).expect("set").expect("known");
    assert_eq!(changed.rules(), rules, "an empty list and a zero limit are kept, not cleared");
    assert!(store.version().expect("version") > version);
    let log = store.audit_log(&AuditQuery { limit: 1000, ..AuditQuery::default() }).expect("audit");
    let last = log.last().expect("a row");
    assert_eq!((last.action.as_str(), last.object_id.as_str()), ("update", "key_a"));
    let shown: serde_json::Value = serde_json::from_str(last.after.as_deref().expect("after")).expect("json");
    assert_eq!(shown["allowed_endpoints"], serde_json::json!([]));
    assert_eq!(shown["max_concurrent_requests"], 0);

    let org = store
        .set_org_rules(&org_id("org_a"), &AccessRules::default(), &audit())
        .expect("set")
        .expect("known");
    assert_eq!(org, OrgRecord { allowed_endpoints: None, max_concurrent_requests: None, ..listed });
    let state = store.state().expect("state");
    assert_eq!(
        (state.orgs[0].allowed_endpoints.as_ref(), state.orgs[0].max_concurrent_requests),
        (None, None)
    );
}

fn children_of_unknown_orgs_are_refused(db: &impl Backend) {
    let store = db.open();
    assert!(matches!(
        store.create_key(&key("key_a", "org_x"), hash_secret("x"), &audit()),
        Err(StoreError::NotFound)
    ));
    let provider = provider("org_x");
    assert!(matches!(store.put_provider(&provider, &audit()), Err(StoreError::NotFound)));
    assert!(matches!(store.create_cap(&cap("cap_a", "org_x", None), &audit()), Err(StoreError::NotFound)));
    assert_eq!(store.version().expect("version"), 0, "refused changes leave the version alone");

    store.create_org(&org("org_x"), &audit()).expect("org");
    store.put_provider(&provider, &audit()).expect("put");
    let replaced = ProviderRecord {
        kind: ProviderKind::Anthropic,
        base_url: Some("http://127.0.0.1:9".into()),
        sealed_key: vec![9; 40],
        price_namespace: Some("groq".into()),
        fallback_price: Some((Nanos(0), Nanos(1_500_000_000))),
        ..provider.clone()
    };
    store.put_provider(&replaced, &audit()).expect("put again");
    assert_eq!(store.list_providers(&provider.org_id).expect("list"), vec![replaced.clone()]);
    // Its pricing goes as it came, and can be taken away again.
    let plain = ProviderRecord { price_namespace: None, fallback_price: None, ..replaced };
    store.put_provider(&plain, &audit()).expect("put a third time");
    assert_eq!(store.list_providers(&provider.org_id).expect("list"), vec![plain]);
    assert!(
        matches!(store.create_org(&org("org_x"), &audit()), Err(StoreError::Backend(_))),
        "ids are unique"
    );
}

fn state_survives_reopening(db: &impl Backend) {
    {
        let store = db.open();
        store.create_org(&org("org_a"), &audit()).expect("org");
        store.insert_receipts(&serialized(&[receipt("rcpt_a", "key_a", 1, 1)])).expect("insert");
    }
    let store = db.open();
    assert_eq!(store.list_orgs().expect("list"), vec![org("org_a")]);
    assert_eq!(store.version().expect("version"), 1);
    assert_eq!(store.insert_receipts(&serialized(&[receipt("rcpt_a", "key_a", 1, 1)])).expect("replay"), 0);
}

fn state_holds_every_table(db: &impl Backend) {
    let store = db.open();
    store.create_org(&org("org_a"), &audit()).expect("org");
    store.create_org(&OrgRecord { created_at: Timestamp(0), ..org("org_b") }, &audit()).expect("org");
    store.create_key(&key("key_a", "org_a"), hash_secret("rk_a"), &audit()).expect("key");
    store.put_provider(&provider("org_a"), &audit()).expect("provider");
    store.create_cap(&cap("cap_a", "org_a", Some("key_a")), &audit()).expect("cap");
    store.put_price("gpt-4o", &wire("2.5"), Timestamp(5), &audit()).expect("price");

    let state = store.state().expect("state");
    assert_eq!(state.version, 6);
    let mut orgs = state.orgs.clone();
    orgs.sort_by(|a, b| a.id.as_str().cmp(b.id.as_str()));
    assert_eq!(orgs, vec![org("org_a"), OrgRecord { created_at: Timestamp(0), ..org("org_b") }]);
    assert_eq!(
        state.active_keys,
        vec![ActiveKey {
            id: key_id("key_a"),
            org_id: org_id("org_a"),
            hash: hash_secret("rk_a"),
            expires_at: None,
            limits: KeyLimits::default(),
            allowed_models: None,
            allowed_endpoints: None,
            max_concurrent_requests: None,
        }]
    );
    let org_a = state.orgs.iter().find(|o| o.id == org_id("org_a")).expect("org_a");
    assert_eq!(
        state.active_keys[0].org_id.as_str().as_ptr(),
        org_a.id.as_str().as_ptr(),
        "a key shares its organization's id rather than holding a copy"
    );
    assert_eq!(state.providers, vec![provider("org_a")]);
    assert_eq!(state.caps, vec![cap("cap_a", "org_a", Some("key_a"))]);
    assert_eq!(state.price_revision, 1);
    assert_eq!(in_force(&state.price_overrides), vec![("gpt-4o".to_owned(), wire("2.5"))]);
    assert_eq!((state.price_overrides[0].revision, state.price_overrides[0].set_at), (1, Timestamp(5)));
    assert_eq!(store.list_orgs().expect("list")[0].id, org_id("org_b"), "listed oldest first");
    assert_eq!(store.org(&org_id("org_a")).expect("read"), Some(org("org_a")));
    assert_eq!(store.org(&org_id("org_zz")).expect("read"), None);
}

fn receipts_insert_once_and_page_in_order(db: &impl Backend) {
    let store = db.open();
    let day = 86_400_000;
    let batch = [
        receipt("rcpt_b", "key_a", 2, 7),
        receipt("rcpt_a", "key_a", 2, 3),
        receipt("rcpt_c", "key_b", day + 1, 11),
    ];
    assert_eq!(store.insert_receipts(&serialized(&batch)).expect("insert"), 3);
    assert_eq!(
        store.insert_receipts(&serialized(&batch)).expect("replay"),
        0,
        "inserts are idempotent by id"
    );
    assert_eq!(store.insert_receipts(&[]).expect("empty"), 0);

    let query = |after, key: Option<&str>| ReceiptQuery {
        org_id: org_id("org_a"),
        from: None,
        to: None,
        key_id: key.map(key_id),
        model: None,
        status: None,
        usage_source: None,
        provider_key: None,
        limit: 2,
        after,
        tag: None,
    };
    let first = store.receipts(&query(None, None)).expect("page");
    assert_eq!(ids(&first), ["rcpt_a", "rcpt_b"]);
    let last = &first[1];
    let next = store.receipts(&query(Some((last.started_at, last.id.clone())), None)).expect("page");
    assert_eq!(next, vec![batch[2].clone()]);
    assert_eq!(store.receipts(&query(None, Some("key_b"))).expect("filter"), vec![batch[2].clone()]);
    let window = ReceiptQuery {
        from: Some(Timestamp(2)),
        to: Some(Timestamp(day + 1)),
        limit: 10,
        ..query(None, None)
    };
    assert_eq!(ids(&store.receipts(&window).expect("window")), ["rcpt_a", "rcpt_b"], "[from, to)");
    let other_org = ReceiptQuery { org_id: org_id("org_b"), ..query(None, None) };
    assert_eq!(store.receipts(&other_org).expect("other org"), vec![]);
    assert_eq!(store.receipt(&org_id("org_a"), "rcpt_c").expect("one"), Some(batch[2].clone()));
    assert_eq!(store.receipt(&org_id("org_b"), "rcpt_c").expect("one"), None, "another org's");
    assert_eq!(store.receipt(&org_id("org_a"), "rcpt_zz").expect("one"), None);

    // Ids order by bytes (upper case first), and a batch may carry the same receipt twice.
    let mixed = [
        receipt("rcpt_x", "key_a", 50, 1),
        receipt("rcpt_X", "key_a", 50, 1),
        receipt("rcpt_x", "key_a", 50, 1),
    ];
    assert_eq!(store.insert_receipts(&serialized(&mixed)).expect("insert"), 2);
    let at_50 =
        ReceiptQuery { from: Some(Timestamp(50)), to: Some(Timestamp(51)), limit: 10, ..query(None, None) };
    assert_eq!(ids(&store.receipts(&at_50).expect("page")), ["rcpt_X", "rcpt_x"]);
    let after_upper = ReceiptQuery { after: Some((Timestamp(50), "rcpt_X".into())), ..at_50 };
    assert_eq!(ids(&store.receipts(&after_upper).expect("page")), ["rcpt_x"]);
    assert_eq!(store.receipts(&after_upper).expect("page")[0], mixed[0], "the receipt reads back whole");
}

fn receipts_keep_their_tags_and_filter_and_sum_by_them(db: &impl Backend) {
    let store = db.open();
    let day = 86_400_000;
    let tagged = |id: &str, started_at: i64, cost: i64, tags: &[(&str, &str)]| Receipt {
        tags: tags.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
        ..receipt(id, "key_a", started_at, cost)
    };
    let batch = [
        tagged("rcpt_a", 1, 3, &[("team", "search"), ("feature", "autocomplete")]),
        tagged("rcpt_b", 2, 5, &[("team", "search")]),
        tagged("rcpt_c", 3, 7, &[("team", "ads"), ("feature", "search")]),
        tagged("rcpt_d", 4, 11, &[]),
        tagged("rcpt_e", day + 1, 13, &[("team", "search_x")]),
    ];
    store.insert_receipts(&serialized(&batch)).expect("insert");
    let all = ReceiptQuery {
        org_id: org_id("org_a"),
        from: None,
        to: None,
        key_id: None,
        model: None,
        status: None,
        usage_source: None,
        provider_key: None,
        limit: 10,
        after: None,
        tag: None,
    };
    assert_eq!(store.receipts(&all).expect("all"), batch.to_vec(), "tags read back, none as none");
    let team = |value: &str| ReceiptQuery { tag: Some(("team".into(), value.into())), ..all.clone() };
    assert_eq!(
        ids(&store.receipts(&team("search")).expect("filter")),
        ["rcpt_a", "rcpt_b"],
        "whole values only"
    );
    assert_eq!(ids(&store.receipts(&team("ads")).expect("filter")), ["rcpt_c"]);
    let feature = ReceiptQuery { tag: Some(("feature".into(), "search".into())), ..all.clone() };
    assert_eq!(
        ids(&store.receipts(&feature).expect("filter")),
        ["rcpt_c"],
        "a value is matched under its key"
    );
    assert_eq!(store.receipts(&team("nobody")).expect("filter"), vec![]);

    let org = org_id("org_a");
    let rows: Vec<_> = store
        .spend_by_tag(&org, None, None, None, "team")
        .expect("summary")
        .into_iter()
        .map(|r| (r.day, r.value, r.requests, r.input_tokens, r.output_tokens, r.cost))
        .collect();
    let first = "1970-01-01".to_owned();
    assert_eq!(
        rows,
        vec![
            (first.clone(), None, 1, 10, 5, Nanos(11)),
            (first.clone(), Some("ads".into()), 1, 10, 5, Nanos(7)),
            (first, Some("search".into()), 2, 20, 10, Nanos(8)),
            ("1970-01-02".into(), Some("search_x".into()), 1, 10, 5, Nanos(13)),
        ]
    );
    let window =
        store.spend_by_tag(&org, None, Some(Timestamp(2)), Some(Timestamp(4)), "feature").expect("summary");
    let values: Vec<_> = window.iter().map(|r| (r.value.clone(), r.requests)).collect();
    assert_eq!(values, [(None, 1), (Some("search".into()), 1)]);
}

fn receipts_filter_by_model_status_usage_source_and_provider_key(db: &impl Backend) {
    let store = db.open();
    let batch = [
        Receipt { provider_key: Some(ProviderKey::Managed), ..receipt("rcpt_f1", "key_a", 1, 1) },
        Receipt {
            model: Some("claude-haiku-4-5".into()),
            provider_key: Some(ProviderKey::Client),
            ..receipt("rcpt_f2", "key_a", 2, 1)
        },
        Receipt { status: 500, ..receipt("rcpt_f3", "key_a", 3, 1) },
        Receipt { usage_source: UsageSource::Estimated, ..receipt("rcpt_f4", "key_a", 4, 1) },
        Receipt { model: None, ..receipt("rcpt_f5", "key_a", 5, 1) },
    ];
    store.insert_receipts(&serialized(&batch)).expect("insert");
    let all = ReceiptQuery {
        org_id: org_id("org_a"),
        from: None,
        to: None,
        key_id: None,
        model: None,
        status: None,
        usage_source: None,
        provider_key: None,
        limit: 100,
        after: None,
        tag: None,
    };
    let found = |q: ReceiptQuery| -> Vec<String> {
        store.receipts(&q).expect("receipts").into_iter().map(|r| r.id).collect()
    };
    assert_eq!(store.receipts(&all).expect("all"), batch.to_vec(), "who paid reads back, unknown as unknown");
    assert_eq!(found(ReceiptQuery { provider_key: Some(ProviderKey::Managed), ..all.clone() }), ["rcpt_f1"]);
    assert_eq!(found(ReceiptQuery { provider_key: Some(ProviderKey::Client), ..all.clone() }), ["rcpt_f2"]);
    assert_eq!(
        found(ReceiptQuery { model: Some("gpt-4o".into()), ..all.clone() }),
        ["rcpt_f1", "rcpt_f3", "rcpt_f4"]
    );
    assert_eq!(found(ReceiptQuery { model: Some("claude-haiku-4-5".into()), ..all.clone() }), ["rcpt_f2"]);
    assert_eq!(found(ReceiptQuery { status: Some(500), ..all.clone() }), ["rcpt_f3"]);
    assert_eq!(
        found(ReceiptQuery { usage_source: Some(UsageSource::Estimated), ..all.clone() }),
        ["rcpt_f4"]
    );
    assert_eq!(found(ReceiptQuery { usage_source: Some(UsageSource::Provider), ..all.clone() }).len(), 4);
    assert_eq!(
        found(ReceiptQuery { status: Some(500), usage_source: Some(UsageSource::Estimated), ..all.clone() }),
        Vec::<String>::new(),
        "filters combine"
    );
    // A filter pages like the rest: the cursor continues after the last receipt that matched.
    let first = store.receipts(&ReceiptQuery { status: Some(200), limit: 2, ..all.clone() }).expect("page");
    assert_eq!(ids(&first), ["rcpt_f1", "rcpt_f2"]);
    let last = first.last().expect("a receipt");
    let after = Some((last.started_at, last.id.clone()));
    assert_eq!(found(ReceiptQuery { status: Some(200), limit: 2, after, ..all }), ["rcpt_f4", "rcpt_f5"]);
}

fn spend_summary_groups_by_day_key_and_model(db: &impl Backend) {
    let store = db.open();
    let day = 86_400_000;
    let unpriced =
        Receipt { model: None, input_tokens: 7, output_tokens: 0, ..receipt("rcpt_d", "key_a", 3, 0) };
    store
        .insert_receipts(&serialized(&[
            receipt("rcpt_b", "key_a", 2, 7),
            receipt("rcpt_a", "key_a", 2, 3),
            receipt("rcpt_c", "key_b", day + 1, 11),
            unpriced,
        ]))
        .expect("insert");
    let org = org_id("org_a");
    let summary = store.spend_summary(&org, None, None, None).expect("summary");
    let rows: Vec<_> = summary
        .iter()
        .map(|r| {
            (
                r.day.as_str(),
                r.key_id.as_str(),
                r.model.as_deref(),
                r.requests,
                r.input_tokens,
                r.output_tokens,
                r.cost,
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            ("1970-01-01", "key_a", None, 1, 7, 0, Nanos(0)),
            ("1970-01-01", "key_a", Some("gpt-4o"), 2, 20, 10, Nanos(10)),
            ("1970-01-02", "key_b", Some("gpt-4o"), 1, 10, 5, Nanos(11)),
        ]
    );
    let second_day =
        store.spend_summary(&org, None, Some(Timestamp(day)), Some(Timestamp(2 * day))).expect("summary");
    assert_eq!(second_day.len(), 1);
    assert_eq!(second_day[0].cost, Nanos(11));
    let key_b = store.spend_summary(&org, Some(&key_id("key_b")), None, None).expect("summary");
    assert_eq!(key_b, [second_day[0].clone()], "only the key's rows");
    assert_eq!(store.spend_summary(&org_id("org_b"), None, None, None).expect("summary"), vec![]);
}

/// The whole-day summaries and spends read the daily rollup; ranges with a bound inside a day
/// read the receipts. Both must give the same answers, and a replayed receipt must count once.
fn daily_spend_answers_as_the_receipts_do_and_counts_a_replay_once(db: &impl Backend) {
    let store = db.open();
    let day = 86_400_000;
    // Days -1 to 3, two keys, a model and no model, two organizations; none in a day's first or
    // last millisecond, so that a range moved by one millisecond holds the same receipts.
    let mut all = Vec::new();
    for (n, d) in (-1..4_i64).enumerate() {
        for (k, key) in ["key_a", "key_b"].into_iter().enumerate() {
            let at = d * day + 1_000 + i64::try_from(n * 7 + k).expect("small");
            all.push(receipt(&format!("rcpt_{n}_{k}_x"), key, at, 100 + at.rem_euclid(97)));
            all.push(Receipt {
                model: None,
                input_tokens: 3,
                ..receipt(&format!("rcpt_{n}_{k}_y"), key, at + 3_600_000, 1 + at.rem_euclid(13))
            });
        }
        all.push(Receipt {
            org_id: "org_b".into(),
            ..receipt(&format!("rcpt_{n}_z"), "key_a", d * day + 5, 1_000)
        });
    }
    let (first, rest) = all.split_at(all.len() / 2);
    assert_eq!(store.insert_receipts(&serialized(first)).expect("insert"), first.len());
    // A replay of the first batch with the rest: only the rest is new.
    assert_eq!(store.insert_receipts(&serialized(&all)).expect("insert"), rest.len());
    assert_eq!(store.insert_receipts(&serialized(&all)).expect("insert"), 0, "a replay inserts none");

    let org = org_id("org_a");
    let summary = |key: Option<&str>, from: Option<i64>, to: Option<i64>| {
        store
            .spend_summary(&org, key.map(key_id).as_ref(), from.map(Timestamp), to.map(Timestamp))
            .expect("summary")
    };
    for key in [None, Some("key_a"), Some("key_b")] {
        let by_day = summary(key, None, None);
        assert_eq!(by_day, summary(key, Some(-2 * day + 1), Some(5 * day - 1)), "all, {key:?}");
        assert_eq!(by_day.iter().map(|r| r.requests).sum::<u64>(), if key.is_some() { 10 } else { 20 });
        assert_eq!(summary(key, Some(0), Some(2 * day)), summary(key, Some(1), Some(2 * day - 1)), "{key:?}");
        assert_eq!(summary(key, Some(-day), None), summary(key, Some(-day - 1), None), "{key:?}");
    }
    let whole = summary(None, Some(day), Some(2 * day));
    assert_eq!(whole.len(), 4, "two keys, with and without a model: {whole:?}");
    assert_eq!(whole[0].day, "1970-01-02");
    assert_eq!((whole[0].key_id.as_str(), whole[0].model.as_deref()), ("key_a", None));
    assert_eq!(whole[1].model.as_deref(), Some("gpt-4o"));

    // Spend in windows cut anywhere: the receipts' costs, counted once.
    let truth = |key: Option<&str>, from: i64, to: i64| {
        Nanos(
            all.iter()
                .filter(|r| r.org_id == "org_a" && key.is_none_or(|k| r.key_id == k))
                .filter(|r| (from..to).contains(&r.started_at.0))
                .map(|r| r.cost_usd.0)
                .sum(),
        )
    };
    let cuts = [i64::MIN, -day - 5, -day, 0, 1_500, day, day + 3_601_000, 3 * day, 4 * day, i64::MAX];
    for key in [None, Some("key_b")] {
        for &from in &cuts {
            for &to in cuts.iter().filter(|&&to| to > from) {
                let spent = store
                    .spend(&org, key.map(key_id).as_ref(), Timestamp(from), Timestamp(to))
                    .expect("spend");
                assert_eq!(spent, truth(key, from, to), "{key:?} [{from}, {to})");
            }
        }
    }
}

fn spend_sums_costs_in_a_window(db: &impl Backend) {
    let store = db.open();
    let other_org = Receipt { org_id: "org_b".into(), ..receipt("rcpt_z", "key_a", 5, 1000) };
    store
        .insert_receipts(&serialized(&[
            receipt("rcpt_a", "key_a", 10, 3),
            receipt("rcpt_b", "key_b", 15, 5),
            receipt("rcpt_c", "key_a", 20, 7),
            other_org,
        ]))
        .expect("insert");
    let org = org_id("org_a");
    let spend = |key: Option<&str>, from, to| {
        store.spend(&org, key.map(key_id).as_ref(), Timestamp(from), Timestamp(to)).expect("spend")
    };
    assert_eq!(spend(None, 0, 100), Nanos(15));
    assert_eq!(spend(Some("key_a"), 0, 100), Nanos(10));
    assert_eq!(spend(None, 10, 20), Nanos(8), "from is in, to is out");
    assert_eq!(spend(Some("key_zz"), 0, 100), Nanos(0));
    assert_eq!(spend(None, 100, 200), Nanos(0));
    let big = Receipt { cost_usd: Nanos(i64::MAX / 2), ..receipt("rcpt_big", "key_a", 30, 0) };
    store.insert_receipts(&serialized(&[big])).expect("insert");
    assert_eq!(spend(None, 30, 31), Nanos(i64::MAX / 2), "money is a 64-bit integer");
}

fn each_price_change_is_a_new_revision(db: &impl Backend) {
    let store = db.open();
    assert_eq!(store.state().expect("state").price_revision, 0);
    let first = store.put_price("m", &wire("2"), Timestamp(1), &audit()).expect("put");
    let second = store.put_price("m", &wire("3"), Timestamp(2), &audit()).expect("put");
    store.put_price("n", &wire("4"), Timestamp(3), &audit()).expect("put");
    assert!(second > first);
    let state = store.state().expect("state");
    assert_eq!(state.price_revision, 3);
    assert_eq!(
        in_force(&state.price_overrides),
        vec![("m".to_owned(), wire("3")), ("n".to_owned(), wire("4"))]
    );
}

fn prices_are_removed_imported_and_set_per_kind_in_one_revision_each(db: &impl Backend) {
    let store = db.open();
    let model = |name: &str, price: Option<&str>| PriceChange {
        target: PriceTarget::Model(name.into()),
        kind: Some(ProviderKind::Anthropic),
        price: price.map(wire),
    };
    let version = store.version().expect("version");
    // An import: many prices, one revision; of two changes to one model the later wins.
    let imported = store
        .change_prices(
            &[model("a", Some("1")), model("b/c", Some("2")), model("a", Some("3"))],
            Timestamp(1),
            &audit(),
        )
        .expect("import");
    assert_eq!(imported, 1);
    assert_eq!(store.version().expect("version"), version + 1);
    let state = store.state().expect("state");
    assert_eq!(
        in_force(&state.price_overrides),
        vec![("a".to_owned(), wire("3")), ("b/c".to_owned(), wire("2"))]
    );
    assert!(state.price_overrides.iter().all(|o| o.kind == Some(ProviderKind::Anthropic) && o.revision == 1));

    // A fallback price is kept apart from models, even one named like a kind.
    let fallback = PriceChange {
        target: PriceTarget::Fallback(ProviderKind::OpenAi),
        kind: None,
        price: Some(wire("150")),
    };
    let openai_model =
        PriceChange { target: PriceTarget::Model("openai".into()), kind: None, price: Some(wire("9")) };
    assert_eq!(store.change_prices(&[fallback, openai_model], Timestamp(2), &audit()).expect("fallback"), 2);
    let state = store.state().expect("state");
    assert_eq!(
        state.price_overrides[0].target,
        PriceTarget::Fallback(ProviderKind::OpenAi),
        "fallbacks first"
    );
    assert_eq!(state.price_overrides.len(), 4);

    // A removal is a revision of its own; the price is gone, the others stay.
    assert_eq!(store.change_prices(&[model("a", None)], Timestamp(3), &audit()).expect("remove"), 3);
    let state = store.state().expect("state");
    assert_eq!(state.price_revision, 3);
    let names: Vec<PriceTarget> = state.price_overrides.iter().map(|o| o.target.clone()).collect();
    assert_eq!(
        names,
        [
            PriceTarget::Fallback(ProviderKind::OpenAi),
            PriceTarget::Model("b/c".into()),
            PriceTarget::Model("openai".into())
        ]
    );
    // Removing what is not in force changes nothing, not even the version.
    let version = store.version().expect("version");
    let fallback_gone =
        PriceChange { target: PriceTarget::Fallback(ProviderKind::Anthropic), kind: None, price: None };
    assert!(matches!(
        store.change_prices(&[model("a", None)], Timestamp(4), &audit()),
        Err(StoreError::NotFound)
    ));
    assert!(matches!(
        store.change_prices(&[fallback_gone], Timestamp(4), &audit()),
        Err(StoreError::NotFound)
    ));
    assert_eq!(
        (store.version().expect("version"), store.state().expect("state").price_revision),
        (version, 3)
    );
    // Set again after its removal, a price is back at a new revision.
    assert_eq!(store.put_price("a", &wire("5"), Timestamp(5), &audit()).expect("put"), 4);
    let reopened = db.open().state().expect("state");
    let a = reopened.price_overrides.iter().find(|o| o.target == PriceTarget::Model("a".into())).expect("a");
    assert_eq!((a.price.clone(), a.kind, a.revision, a.set_at), (wire("5"), None, 4, Timestamp(5)));
}

/// The models' prices in force, by name.
fn in_force(overrides: &[PriceOverride]) -> Vec<(String, PriceWire)> {
    overrides
        .iter()
        .filter_map(|o| match &o.target {
            PriceTarget::Model(model) => Some((model.clone(), o.price.clone())),
            PriceTarget::Fallback(_) => None,
        })
        .collect()
}

fn caps_are_created_read_updated_and_deleted(db: &impl Backend) {
    let store = db.open();
    store.create_org(&org("org_a"), &audit()).expect("org");
    store.create_key(&key("key_a", "org_a"), hash_secret("rk_a"), &audit()).expect("key");
    let org_cap = CapRecord { created_at: Timestamp(9), ..cap("cap_b", "org_a", None) };
    let key_cap = cap("cap_a", "org_a", Some("key_a"));
    store.create_cap(&org_cap, &audit()).expect("org cap");
    store.create_cap(&key_cap, &audit()).expect("key cap");
    assert!(
        matches!(
            store.create_cap(&cap("cap_c", "org_a", Some("key_zz")), &audit()),
            Err(StoreError::Backend(_))
        ),
        "a key cap needs its key"
    );
    assert_eq!(store.caps(&org_id("org_a")).expect("list"), vec![key_cap.clone(), org_cap.clone()]);
    assert_eq!(store.caps(&org_id("org_b")).expect("list"), vec![]);
    assert_eq!(store.cap(&cap_id("cap_b")).expect("read"), Some(org_cap.clone()));
    assert_eq!(store.cap(&cap_id("cap_zz")).expect("read"), None);

    let mut updated = org_cap.clone();
    updated.cap.limit = Nanos(5);
    updated.cap.hard_stop = false;
    updated.cap.alert_at_permille = vec![];
    updated.cap.alert_webhook = None;
    updated.cap.window = Window::Day;
    updated.created_at = Timestamp(100);
    store.update_cap(&updated, &audit()).expect("update");
    let read = store.cap(&cap_id("cap_b")).expect("read").expect("known");
    assert_eq!(read.cap.limit, Nanos(5));
    assert!(!read.cap.hard_stop);
    assert_eq!(read.cap.alert_at_permille, Vec::<u32>::new());
    assert_eq!(read.cap.alert_webhook, None);
    assert_eq!((read.cap.window, read.created_at), (Window::Month, Timestamp(9)), "window and creation stay");
    assert!(matches!(store.update_cap(&cap("cap_zz", "org_a", None), &audit()), Err(StoreError::NotFound)));

    assert!(store.delete_cap(&cap_id("cap_b"), &audit()).expect("delete"));
    assert!(!store.delete_cap(&cap_id("cap_b"), &audit()).expect("delete again"));
    assert_eq!(store.state().expect("state").caps, vec![key_cap]);
}

fn alerts_are_raised_once_per_threshold(db: &impl Backend) {
    let store = db.open();
    let version = store.version().expect("version");
    assert!(store.raise_alert(&alert("alrt_1", 0, 500, 10)).expect("raise"));
    assert!(
        !store.raise_alert(&alert("alrt_2", 0, 500, 11)).expect("again"),
        "once per (cap, window, threshold)"
    );
    assert!(store.raise_alert(&alert("alrt_3", 0, 800, 10)).expect("next threshold"));
    assert!(store.raise_alert(&alert("alrt_4", 1000, 500, 12)).expect("next window"));
    assert!(!store.raise_alert(&alert("alrt_1", 5, 900, 13)).expect("same id"), "ids are unique too");
    assert_eq!(store.version().expect("version"), version, "alerts are not part of the state");

    let listed = store.alerts(&org_id("org_a")).expect("alerts");
    assert_eq!(listed.iter().map(|a| a.id.as_str()).collect::<Vec<_>>(), ["alrt_1", "alrt_3", "alrt_4"]);
    assert_eq!(listed[0], alert("alrt_1", 0, 500, 10));
    assert_eq!(store.alerts(&org_id("org_b")).expect("alerts"), vec![]);

    store.alert_delivery("alrt_1", None).expect("failed attempt");
    store.alert_delivery("alrt_1", Some(Timestamp(20))).expect("delivered");
    store.alert_delivery("alrt_1", None).expect("late attempt");
    store.alert_delivery("alrt_zz", None).expect("unknown ids are ignored");
    let first = store.alerts(&org_id("org_a")).expect("alerts").remove(0);
    assert_eq!((first.attempts, first.delivered_at), (3, Some(Timestamp(20))));
}

fn the_state_version_grows_with_each_change(db: &impl Backend) {
    let store = db.open();
    let mut last = store.version().expect("version");
    let mut grew = |what: &str| {
        let now = store.version().expect("version");
        assert!(now > last, "{what} moves the version ({last} -> {now})");
        assert_eq!(store.state().expect("state").version, now);
        last = now;
    };
    store.create_org(&org("org_a"), &audit()).expect("org");
    grew("create_org");
    store.create_key(&key("key_a", "org_a"), hash_secret("rk_a"), &audit()).expect("key");
    grew("create_key");
    store
        .update_key(&key_id("key_a"), KeyLimits::default(), &AccessRules::default(), &audit())
        .expect("limits");
    grew("update_key");
    store.revoke_key(&key_id("key_a"), Timestamp(5), &audit()).expect("revoke");
    grew("revoke_key");
    store.put_provider(&provider("org_a"), &audit()).expect("provider");
    grew("put_provider");
    store.put_price("m", &wire("1"), Timestamp(5), &audit()).expect("price");
    grew("put_price");
    store.create_cap(&cap("cap_a", "org_a", None), &audit()).expect("cap");
    grew("create_cap");
    store.update_cap(&cap("cap_a", "org_a", None), &audit()).expect("cap");
    grew("update_cap");
    store.delete_cap(&cap_id("cap_a"), &audit()).expect("cap");
    grew("delete_cap");

    let before = store.version().expect("version");
    store.insert_receipts(&serialized(&[receipt("rcpt_a", "key_a", 1, 1)])).expect("insert");
    store.raise_alert(&alert("alrt_a", 0, 500, 1)).expect("alert");
    store.alert_delivery("alrt_a", Some(Timestamp(2))).expect("delivery");
    assert!(matches!(store.update_cap(&cap("cap_a", "org_a", None), &audit()), Err(StoreError::NotFound)));
    assert_eq!(store.version().expect("version"), before, "ledger writes and refused changes leave it");
}

fn two_stores_on_one_database_see_each_others_changes(db: &impl Backend) {
    let (a, b) = (db.open(), db.open());
    assert_eq!(a.version().expect("a"), b.version().expect("b"));

    a.create_org(&org("org_a"), &audit()).expect("org on a");
    assert_eq!(b.version().expect("b"), a.version().expect("a"), "b sees a's version move");
    assert_eq!(b.list_orgs().expect("list on b"), vec![org("org_a")]);

    let before = a.version().expect("a");
    b.create_key(&key("key_a", "org_a"), hash_secret("rk_a"), &audit()).expect("key on b");
    b.put_price("m", &wire("2"), Timestamp(1), &audit()).expect("price on b");
    let revision = a.put_price("m", &wire("3"), Timestamp(2), &audit()).expect("price on a");
    assert!(a.version().expect("a") > before, "a sees b's version move");
    let (state_a, state_b) = (a.state().expect("a"), b.state().expect("b"));
    assert_eq!(state_a.version, state_b.version);
    assert_eq!(state_a.active_keys, state_b.active_keys);
    assert_eq!(
        (state_b.price_revision, in_force(&state_b.price_overrides)),
        (revision, vec![("m".to_owned(), wire("3"))])
    );

    let batch = [receipt("rcpt_a", "key_a", 1, 3), receipt("rcpt_b", "key_a", 2, 4)];
    assert_eq!(a.insert_receipts(&serialized(&batch)).expect("a"), 2);
    assert_eq!(
        b.insert_receipts(&serialized(&batch)).expect("b"),
        0,
        "a replay through another instance counts once"
    );
    assert_eq!(b.spend(&org_id("org_a"), None, Timestamp(0), Timestamp(10)).expect("spend"), Nanos(7));
    assert!(a.raise_alert(&alert("alrt_a", 0, 500, 1)).expect("a"));
    assert!(!b.raise_alert(&alert("alrt_b", 0, 500, 1)).expect("b"), "one alert across instances");
}

fn concurrent_changes_each_bump_the_version(db: &impl Backend) {
    let stores = [db.open(), db.open()];
    let start = stores[0].version().expect("version");
    let (threads, each) = (4, 10);
    let barrier = Barrier::new(threads);
    std::thread::scope(|s| {
        for t in 0..threads {
            let (store, barrier) = (&stores[t % 2], &barrier);
            s.spawn(move || {
                barrier.wait();
                for i in 0..each {
                    store.create_org(&org(&format!("org_{t}x{i}")), &audit()).expect("org");
                }
            });
        }
    });
    let total = u64::try_from(threads * each).expect("small");
    assert_eq!(stores[1].version().expect("version"), start + total);
    assert_eq!(stores[0].state().expect("state").orgs.len(), threads * each);
}

fn concurrent_replays_insert_each_receipt_once(db: &impl Backend) {
    let stores = [db.open(), db.open()];
    let batch: Vec<_> = (0..200).map(|i| receipt(&format!("rcpt_{i:03}"), "key_a", i, 1)).collect();
    let barrier = Barrier::new(4);
    let inserted: usize = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|t| {
                let (store, barrier, batch) = (&stores[t % 2], &barrier, &batch);
                s.spawn(move || {
                    barrier.wait();
                    store.insert_receipts(&serialized(batch)).expect("insert")
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("thread")).sum()
    });
    assert_eq!(inserted, 200);
    assert_eq!(
        stores[0].spend(&org_id("org_a"), None, Timestamp(0), Timestamp(1000)).expect("spend"),
        Nanos(200)
    );
}

/// Several control replicas starting at once on a new database: each migration is applied once.
#[test]
fn postgres_concurrent_migrations_apply_once() {
    let db = Postgres::new();
    let barrier = Barrier::new(4);
    let stores: Vec<PostgresStore> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    PostgresStore::connect(&db.url())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("thread").expect("every replica starts")).collect()
    });
    let mut client = db.client();
    let versions: Vec<i64> = client
        .query("SELECT version FROM schema_migrations ORDER BY version", &[])
        .expect("schema_migrations")
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert!(!versions.is_empty());
    assert_eq!(versions, (1..=i64::try_from(versions.len()).expect("few")).collect::<Vec<_>>());
    stores[0].create_org(&org("org_a"), &audit()).expect("org");
    assert_eq!(stores[3].version().expect("version"), 1, "one state_version row, seeded once");

    drop(stores);
    let again = PostgresStore::connect(&db.url()).expect("a later start");
    assert_eq!(again.list_orgs().expect("list"), vec![org("org_a")]);
    let count: i64 = client.query_one("SELECT COUNT(*) FROM schema_migrations", &[]).expect("count").get(0);
    assert_eq!(count, i64::try_from(versions.len()).expect("few"), "nothing re-applied");
}

#[test]
fn postgres_connect_errors_are_reported() {
    let refused = PostgresStore::connect("postgres://postgres@127.0.0.1:1/recovea");
    assert!(
        matches!(&refused, Err(StoreError::Unavailable(m)) if m.contains("connect")),
        "{:?}",
        refused.as_ref().err()
    );
    assert!(matches!(PostgresStore::connect("postgres://:not-a-port"), Err(StoreError::Backend(_))));
    let db = Postgres::new();
    let missing = format!("{}/{}_missing", db.server, db.name);
    let error = PostgresStore::connect(&missing).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(error.contains("does not exist"), "the server's message is kept: {error}");
}

/// The pool holds at most its connections; a call finds none within the pool wait, or a statement
/// runs past the statement timeout: either is `Unavailable` within its bound, not a hang.
#[test]
fn postgres_calls_are_bounded_by_the_pool_wait_and_the_statement_timeout() {
    use recovea_store::postgres::Bounds;

    let db = Postgres::new();
    let bounds = Bounds {
        max_connections: 1,
        pool_wait: Duration::from_millis(200),
        statement_timeout: Duration::from_secs(5),
    };
    let store = PostgresStore::connect_bounded(&db.url(), bounds).expect("connect");
    store.version().expect("answers");
    // Another session holds the version row's table: the store's one connection waits on it.
    let mut blocker = db.client();
    let mut lock = blocker.transaction().expect("transaction");
    lock.batch_execute("LOCK TABLE state_version IN ACCESS EXCLUSIVE MODE").expect("lock");
    std::thread::scope(|s| {
        let waiting = s.spawn(|| store.version());
        let mut watcher = db.client();
        let blocked = "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'recovea' AND wait_event_type = 'Lock'";
        while watcher.query_one(blocked, &[]).expect("activity").get::<_, i64>(0) == 0 {
            std::thread::sleep(Duration::from_millis(10));
        }
        let started = std::time::Instant::now();
        let second = store.version();
        assert!(matches!(second, Err(StoreError::Unavailable(_))), "{second:?}");
        assert!(started.elapsed() < Duration::from_secs(4), "the pool wait bounds a call, not the statement");
        let first = waiting.join().expect("thread");
        assert!(
            matches!(&first, Err(StoreError::Unavailable(m)) if m.contains("statement timeout")),
            "{first:?}"
        );
    });
    lock.rollback().expect("unlock");
    store.version().expect("answers again once the database does");
}

/// A connection the server closed is dropped from the pool: once its failure is reported, the
/// next call opens a new one.
#[test]
fn postgres_broken_connections_are_replaced() {
    let db = Postgres::new();
    let store = PostgresStore::connect(&db.url()).expect("connect");
    store.version().expect("answers");
    let kill = format!(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{}' AND application_name = 'recovea'",
        db.name
    );
    db.client().batch_execute(&kill).expect("terminated");
    let after = store.version();
    assert!(after.is_ok() || matches!(after, Err(StoreError::Unavailable(_))), "{after:?}");
    store.version().expect("a new connection answers");
}

/// A store dropped on an async worker thread closes its connections without panicking.
#[test]
fn postgres_store_can_be_dropped_inside_a_runtime() {
    let db = Postgres::new();
    let store = PostgresStore::connect(&db.url()).expect("connect");
    store.version().expect("a pooled connection");
    let runtime = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
    runtime.block_on(async move { drop(store) });
}

/// Several processes (here threads) opening one fresh SQLite file at once each apply the
/// migrations exactly once, and all succeed.
#[test]
fn sqlite_opened_by_many_at_once_migrates_once() {
    for _ in 0..5 {
        let db = Sqlite::new();
        let barrier = Barrier::new(4);
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    barrier.wait();
                    let store = db.open();
                    store.version().expect("a usable store");
                });
            }
        });
        assert_eq!(db.open().list_orgs().expect("list"), Vec::new());
    }
}

/// Every row of the audit log, oldest first.
fn audit_rows(store: &impl ControlStore) -> Vec<AuditEntry> {
    store.audit_log(&AuditQuery { limit: 1000, ..AuditQuery::default() }).expect("audit log")
}

/// A row's what: action, kind, object id, org id, before and after.
type What = (String, String, String, Option<String>, Option<String>, Option<String>);

fn what(entry: &AuditEntry) -> What {
    (
        entry.action.clone(),
        entry.object_kind.clone(),
        entry.object_id.clone(),
        entry.org_id.as_ref().map(|id| id.as_str().to_owned()),
        entry.before.clone(),
        entry.after.clone(),
    )
}

fn row(
    action: &str,
    kind: &str,
    id: &str,
    org: Option<&str>,
    before: Option<&str>,
    after: Option<&str>,
) -> What {
    (
        action.into(),
        kind.into(),
        id.into(),
        org.map(Into::into),
        before.map(Into::into),
        after.map(Into::into),
    )
}

fn every_change_writes_its_audit_row(db: &impl Backend) {
    let store = db.open();
    let by = AuditContext {
        id: "aud_0".into(),
        at: Timestamp(1_000),
        auth: AuditAuth::AdminToken,
        actor: AuditActor::Operator,
        client: Some("10.0.0.7:51234".into()),
    };
    store.create_org(&org("org_a"), &by).expect("org");
    let hash = hash_secret("rk_the_secret_of_key_a");
    store.create_key(&key("key_a", "org_a"), hash, &audit()).expect("key");
    let limits = KeyLimits { requests_per_minute: Some(60), tokens_per_minute: None };
    store.update_key(&key_id("key_a"), limits, &AccessRules::default(), &audit()).expect("limits");
    store.revoke_key(&key_id("key_a"), Timestamp(9), &audit()).expect("revoke");
    store.put_provider(&provider("org_a"), &audit()).expect("provider");
    let replaced = ProviderRecord { key_hint: "sk-...wxyz".into(), ..provider("org_a") };
    store.put_provider(&replaced, &audit()).expect("provider replaced");
    store.create_cap(&cap("cap_a", "org_a", None), &audit()).expect("cap");
    let mut changed = cap("cap_a", "org_a", None);
    changed.cap.limit = Nanos(2_500_000_000);
    changed.cap.alert_webhook = None;
    store.update_cap(&changed, &audit()).expect("cap updated");
    store.delete_cap(&cap_id("cap_a"), &audit()).expect("cap deleted");
    store.put_price("m", &wire("2"), Timestamp(5), &audit()).expect("price");
    let import = [
        PriceChange {
            target: PriceTarget::Model("m".into()),
            kind: Some(ProviderKind::OpenAi),
            price: Some(wire("3")),
        },
        PriceChange {
            target: PriceTarget::Fallback(ProviderKind::Anthropic),
            kind: None,
            price: Some(wire("4")),
        },
    ];
    store.change_prices(&import, Timestamp(6), &audit()).expect("import");
    let removal = PriceChange { target: PriceTarget::Model("m".into()), kind: None, price: None };
    store.change_prices(&[removal], Timestamp(7), &audit()).expect("removal");

    let rows = audit_rows(&store);
    let first = &rows[0];
    assert_eq!(
        (first.id.as_str(), first.at, first.auth, first.client.as_deref()),
        ("aud_0", Timestamp(1_000), AuditAuth::AdminToken, Some("10.0.0.7:51234")),
        "who and when, as given"
    );
    let key_before = r#"{"allowed_endpoints":null,"allowed_models":null,"created_at":"1970-01-01T00:00:00.002Z","expires_at":null,"id":"key_a","max_concurrent_requests":null,"name":"k","org_id":"org_a","prefix":"rk_abc","requests_per_minute":null,"revoked_at":null,"tokens_per_minute":null}"#;
    let key_limited = r#"{"allowed_endpoints":null,"allowed_models":null,"created_at":"1970-01-01T00:00:00.002Z","expires_at":null,"id":"key_a","max_concurrent_requests":null,"name":"k","org_id":"org_a","prefix":"rk_abc","requests_per_minute":60,"revoked_at":null,"tokens_per_minute":null}"#;
    let key_revoked = r#"{"allowed_endpoints":null,"allowed_models":null,"created_at":"1970-01-01T00:00:00.002Z","expires_at":null,"id":"key_a","max_concurrent_requests":null,"name":"k","org_id":"org_a","prefix":"rk_abc","requests_per_minute":60,"revoked_at":"1970-01-01T00:00:00.009Z","tokens_per_minute":null}"#;
    let provider_first = r#"{"base_url":null,"fallback_input_per_mtok_usd":null,"fallback_output_per_mtok_usd":null,"key_hint":"...","kind":"openai","name":"openai","price_namespace":null}"#;
    let provider_second = r#"{"base_url":null,"fallback_input_per_mtok_usd":null,"fallback_output_per_mtok_usd":null,"key_hint":"sk-...wxyz","kind":"openai","name":"openai","price_namespace":null}"#;
    let cap_first = r#"{"alert_at":[0.5,0.8,1.0],"alert_webhook":"https://hooks.example/recovea","created_at":"1970-01-01T00:00:00.004Z","hard_stop":true,"id":"cap_a","key_id":null,"limit_usd":"1.00","org_id":"org_a","scope":"organization","window":"month"}"#;
    let cap_changed = r#"{"alert_at":[0.5,0.8,1.0],"alert_webhook":null,"created_at":"1970-01-01T00:00:00.004Z","hard_stop":true,"id":"cap_a","key_id":null,"limit_usd":"2.50","org_id":"org_a","scope":"organization","window":"month"}"#;
    let price_1 = r#"{"batch_input_per_mtok_usd":"0.25","cache_write_per_mtok_usd":"0.5","input_per_mtok_usd":"2","kind":null,"max_output_tokens":4096,"output_per_mtok_usd":"1","revision":1}"#;
    let price_2 = r#"{"batch_input_per_mtok_usd":"0.25","cache_write_per_mtok_usd":"0.5","input_per_mtok_usd":"3","kind":"openai","max_output_tokens":4096,"output_per_mtok_usd":"1","revision":2}"#;
    let fallback_2 = r#"{"batch_input_per_mtok_usd":"0.25","cache_write_per_mtok_usd":"0.5","input_per_mtok_usd":"4","kind":null,"max_output_tokens":4096,"output_per_mtok_usd":"1","revision":2}"#;
    let import_before = format!(r#"{{"fallback:anthropic":null,"model:m":{price_1}}}"#);
    let import_after = format!(r#"{{"fallback:anthropic":{fallback_2},"model:m":{price_2}}}"#);
    assert_eq!(
        rows.iter().map(what).collect::<Vec<_>>(),
        [
            row(
                "create",
                "org",
                "org_a",
                Some("org_a"),
                None,
                Some(
                    r#"{"allowed_endpoints":null,"allowed_models":null,"created_at":"1970-01-01T00:00:00.001Z","id":"org_a","max_concurrent_requests":null,"name":"org_a name"}"#
                )
            ),
            row("create", "key", "key_a", Some("org_a"), None, Some(key_before)),
            row("update", "key", "key_a", Some("org_a"), Some(key_before), Some(key_limited)),
            row("revoke", "key", "key_a", Some("org_a"), Some(key_limited), Some(key_revoked)),
            row("set", "provider", "openai", Some("org_a"), None, Some(provider_first)),
            row("set", "provider", "openai", Some("org_a"), Some(provider_first), Some(provider_second)),
            row("create", "cap", "cap_a", Some("org_a"), None, Some(cap_first)),
            row("update", "cap", "cap_a", Some("org_a"), Some(cap_first), Some(cap_changed)),
            row("delete", "cap", "cap_a", Some("org_a"), Some(cap_changed), None),
            row("set", "price", "m", None, None, Some(price_1)),
            row("import", "prices", "import", None, Some(&import_before), Some(&import_after)),
            row("delete", "price", "m", None, Some(price_2), None),
        ]
    );
    // Nothing of the key's hash nor of the sealed provider key is kept, in any form.
    let hex: String = hash.0.iter().map(|b| format!("{b:02x}")).collect();
    for entry in &rows {
        let text = format!("{:?} {:?}", entry.before, entry.after);
        assert!(!text.contains(&hex) && !text.contains("sealed") && !text.contains("hash"), "{text}");
    }
    assert_eq!(db.open().audit_log(&AuditQuery { limit: 1000, ..AuditQuery::default() }).expect("log"), rows);
    let last = rows.last().expect("rows").version;
    assert_eq!(last, store.version().expect("version"), "a row holds the state version its change made");
}

fn refused_changes_write_no_audit_row(db: &impl Backend) {
    let store = db.open();
    assert!(matches!(
        store.create_key(&key("key_a", "org_x"), hash_secret("a"), &audit()),
        Err(StoreError::NotFound)
    ));
    assert!(matches!(store.put_provider(&provider("org_x"), &audit()), Err(StoreError::NotFound)));
    assert!(matches!(store.create_cap(&cap("cap_a", "org_x", None), &audit()), Err(StoreError::NotFound)));
    assert!(matches!(store.update_cap(&cap("cap_a", "org_x", None), &audit()), Err(StoreError::NotFound)));
    assert!(!store.delete_cap(&cap_id("cap_a"), &audit()).expect("delete"));
    assert_eq!(store.revoke_key(&key_id("key_a"), Timestamp(1), &audit()).expect("revoke"), None);
    assert_eq!(
        store
            .update_key(&key_id("key_a"), KeyLimits::default(), &AccessRules::default(), &audit())
            .expect("limits"),
        None
    );
    let removal = PriceChange { target: PriceTarget::Model("m".into()), kind: None, price: None };
    assert!(matches!(store.change_prices(&[removal], Timestamp(1), &audit()), Err(StoreError::NotFound)));
    assert_eq!(audit_rows(&store), []);
    // A change whose audit row cannot be written does not land either: the row's id is taken.
    let taken = audit();
    store.create_org(&org("org_a"), &taken).expect("org");
    assert!(store.create_org(&org("org_b"), &taken).is_err());
    assert_eq!(store.org(&org_id("org_b")).expect("read"), None, "no change without its row");
    assert_eq!(audit_rows(&store).len(), 1);
}

fn the_audit_log_is_filtered_and_paged(db: &impl Backend) {
    let store = db.open();
    let at = |id: &str, ms: i64| AuditContext {
        id: id.into(),
        at: Timestamp(ms),
        auth: AuditAuth::AdminToken,
        actor: AuditActor::Operator,
        client: None,
    };
    store.create_org(&org("org_a"), &at("aud_1", 10)).expect("org");
    store.create_org(&org("org_b"), &at("aud_2", 20)).expect("org");
    store.create_key(&key("key_a", "org_a"), hash_secret("a"), &at("aud_3", 20)).expect("key");
    store.create_key(&key("key_b", "org_b"), hash_secret("b"), &at("aud_4", 30)).expect("key");
    store.revoke_key(&key_id("key_a"), Timestamp(40), &at("aud_5", 40)).expect("revoke");
    let ids = |query: AuditQuery| -> Vec<String> {
        store.audit_log(&query).expect("audit log").into_iter().map(|e| e.id).collect()
    };
    let all = AuditQuery { limit: 100, ..AuditQuery::default() };
    assert_eq!(ids(all.clone()), ["aud_1", "aud_2", "aud_3", "aud_4", "aud_5"]);
    assert_eq!(ids(AuditQuery { org_id: Some(org_id("org_a")), ..all.clone() }), ["aud_1", "aud_3", "aud_5"]);
    assert_eq!(
        ids(AuditQuery { object_kind: Some("key".into()), ..all.clone() }),
        ["aud_3", "aud_4", "aud_5"]
    );
    assert_eq!(ids(AuditQuery { action: Some("revoke".into()), ..all.clone() }), ["aud_5"]);
    assert_eq!(
        ids(AuditQuery { from: Some(Timestamp(20)), to: Some(Timestamp(40)), ..all.clone() }),
        ["aud_2", "aud_3", "aud_4"]
    );
    let page = AuditQuery { limit: 2, ..all.clone() };
    assert_eq!(ids(page.clone()), ["aud_1", "aud_2"]);
    let versions: Vec<u64> = store.audit_log(&all).expect("audit log").iter().map(|e| e.version).collect();
    assert!(versions.windows(2).all(|w| w[0] < w[1]), "one version per change, in order: {versions:?}");
    assert_eq!(ids(AuditQuery { after_version: Some(versions[1]), ..page.clone() }), ["aud_3", "aud_4"]);
    assert_eq!(ids(AuditQuery { after_version: Some(versions[3]), ..page }), ["aud_5"]);
}

const DAY: i64 = 86_400_000;

/// A pending job of `org`'s credential `provider`, created through `key` at `started_at`.
fn job(org: &str, provider: &str, id: &str, key: &str, started_at: i64) -> JobRecord {
    JobRecord {
        org_id: org_id(org),
        provider: provider.into(),
        job_id: id.into(),
        key_id: key_id(key),
        kind: JobKind::OpenAiBatch,
        endpoint: "/v1/batches".into(),
        model: Some("gpt-4o".into()),
        request_id: format!("req_{}", id.replace('/', "_")),
        started_at: Timestamp(started_at),
        held: Nanos(1_000),
        settled_at: None,
        cost: None,
        polls: 0,
        next_poll_at: Timestamp(started_at + 60_000),
        last_error: None,
    }
}

fn file(org: &str, id: &str, created_at: i64) -> FileRecord {
    let mut input = BatchInput::default();
    input.add(Some("gpt-4o"), 120, Some(64));
    input.add(None, 7, None);
    FileRecord {
        org_id: org_id(org),
        provider: "openai".into(),
        file_id: id.into(),
        created_at: Timestamp(created_at),
        input,
    }
}

/// The receipt of the request that created `job`: it costs nothing, and names what the job holds.
fn creating_receipt(id: &str, job: &JobRecord) -> Receipt {
    Receipt {
        org_id: job.org_id.to_string(),
        job_id: Some(job.job_id.clone()),
        held_usd: Some(job.held),
        endpoint: job.endpoint.clone(),
        ..receipt(id, job.key_id.as_str(), job.started_at.0, 0)
    }
}

/// A receipt settling (part of) `job`: in its windows, at its start.
fn settling_receipt(id: &str, job: &JobRecord, cost: i64) -> Receipt {
    Receipt {
        org_id: job.org_id.to_string(),
        job_id: Some(job.job_id.clone()),
        endpoint: job.endpoint.clone(),
        ..receipt(id, job.key_id.as_str(), job.started_at.0, cost)
    }
}

fn settle(
    store: &impl JobStore,
    job: &JobRecord,
    cost: i64,
    at: i64,
    receipts: &[Receipt],
) -> Result<bool, StoreError> {
    store.settle_job(
        &job.org_id,
        &job.provider,
        &job.job_id,
        Nanos(cost),
        Timestamp(at),
        &serialized(receipts),
    )
}

fn stored(store: &impl JobStore, job: &JobRecord) -> Option<JobRecord> {
    store.job(&job.org_id, &job.provider, &job.job_id).expect("job")
}

fn job_ids(jobs: &[JobRecord]) -> Vec<String> {
    jobs.iter().map(|job| format!("{}/{}/{}", job.org_id, job.provider, job.job_id)).collect()
}

fn jobs_and_files_are_recorded_once(db: &impl Backend) {
    let store = db.open();
    assert_eq!(store.jobs_version().expect("version"), 0);
    assert!(!store.record_jobs(&[], &[]).expect("nothing"), "nothing is new");
    assert_eq!(store.jobs_version().expect("version"), 0, "nothing recorded, no change");

    let a = job("org_a", "openai", "batch_a", "key_a", 10);
    let b = job("org_a", "openai", "batch_b", "key_a", 20);
    assert!(store.record_jobs(&[a.clone(), b.clone()], &[file("org_a", "file-a", 5)]).expect("record"));
    assert_eq!(store.jobs_version().expect("version"), 1, "one change for the batch");
    assert_eq!(stored(&store, &a), Some(a.clone()));

    // Recorded again, as a replayed receipt would: the first record stays, and nothing changed.
    let again = JobRecord { held: Nanos(9_999), endpoint: "/v1/other".into(), polls: 4, ..a.clone() };
    let file_again = FileRecord { created_at: Timestamp(6), ..file("org_a", "file-a", 5) };
    assert!(!store.record_jobs(std::slice::from_ref(&again), &[file_again]).expect("replay"), "nothing new");
    assert_eq!(store.jobs_version().expect("version"), 1);
    assert_eq!(stored(&store, &a), Some(a.clone()), "the first record is kept");

    // One new among known ones is a change; a key twice in one batch keeps its first.
    let c = job("org_a", "openai", "batch_c", "key_b", 30);
    let c_later = JobRecord { held: Nanos(5), ..c.clone() };
    assert!(store.record_jobs(&[again, c.clone(), c_later], &[]).expect("record"));
    assert_eq!(store.jobs_version().expect("version"), 2);
    assert_eq!(stored(&store, &c), Some(c.clone()));
    assert!(store.record_jobs(&[], &[file("org_a", "file-b", 7)]).expect("a new file alone"));
    assert_eq!(store.jobs_version().expect("version"), 3);

    // The same provider id under another credential or organization is another job.
    let other_provider = job("org_a", "azure", "batch_a", "key_a", 40);
    let other_org = job("org_b", "openai", "batch_a", "key_x", 50);
    assert!(store.record_jobs(&[other_provider.clone(), other_org.clone()], &[]).expect("record"));
    assert_eq!(stored(&store, &other_provider), Some(other_provider));
    assert_eq!(stored(&store, &other_org), Some(other_org));
    assert_eq!(stored(&store, &a), Some(a));
    assert_eq!(store.job(&org_id("org_a"), "openai", "batch_zz").expect("job"), None);

    // Every field reads back as written.
    let unusual = JobRecord {
        kind: JobKind::BackgroundResponse,
        endpoint: "/v1/responses".into(),
        model: None,
        held: Nanos(i64::MAX / 3),
        settled_at: Some(Timestamp(-7)),
        cost: Some(Nanos(123_456_789)),
        polls: u32::MAX,
        next_poll_at: Timestamp(-3),
        last_error: Some("upstream 502".into()),
        ..job("org_c", "openai-eu", "resp_x:y/z", "key_c", -DAY - 1)
    };
    assert!(store.record_jobs(std::slice::from_ref(&unusual), &[]).expect("record"));
    assert_eq!(stored(&store, &unusual), Some(unusual));
    let book = store.job_book(Timestamp(i64::MIN), Timestamp(0), i64::MIN).expect("book");
    assert_eq!(book.files, vec![file("org_a", "file-a", 5), file("org_a", "file-b", 7)]);
}

fn the_book_holds_pending_and_recent_jobs_recent_files_and_spend_by_day(db: &impl Backend) {
    let store = db.open();
    assert_eq!(store.job_book(Timestamp(0), Timestamp(0), 0).expect("book"), BookRows::default());
    // Jobs over days -1 to 3 of two keys and two organizations, settled at various times.
    let jobs = [
        (job("org_a", "openai", "batch_1", "key_a", 5), Some((12, 100))),
        (job("org_a", "openai", "batch_2", "key_a", DAY - 1), Some((7, 5_000))),
        (job("org_a", "anthropic", "msgbatch_3", "key_a", 2 * DAY + 3), Some((3, 6_000))),
        (job("org_a", "openai", "batch_4", "key_b", DAY + 4), Some((4, 200))),
        (job("org_a", "openai", "batch_5", "key_a", -5), Some((9, 300))),
        (job("org_a", "openai", "batch_6", "key_a", 3 * DAY), Some((0, 7_000))),
        (job("org_a", "openai", "batch_7", "key_a", DAY + 1), None),
        (job("org_b", "openai", "batch_1", "key_x", DAY + 9), Some((6, 400))),
        (job("org_b", "openai", "batch_8", "key_x", 2 * DAY), None),
    ];
    let records: Vec<JobRecord> = jobs.iter().map(|(job, _)| job.clone()).collect();
    let files = [file("org_b", "file-1", 10), file("org_a", "file-2", 2_000), file("org_a", "file-1", 3_000)];
    assert!(store.record_jobs(&records, &files).expect("record"));
    for (job, settlement) in &jobs {
        if let Some((cost, at)) = settlement {
            assert!(settle(&store, job, *cost, *at, &[]).expect("settle"));
        }
    }

    let book = store.job_book(Timestamp(5_000), Timestamp(2_000), 0).expect("book");
    assert_eq!(
        job_ids(&book.jobs),
        [
            "org_a/anthropic/msgbatch_3",
            "org_a/openai/batch_2",
            "org_a/openai/batch_6",
            "org_a/openai/batch_7",
            "org_b/openai/batch_8",
        ],
        "pending, and settled at or after settled_since, by key"
    );
    let settled = &book.jobs[1];
    assert_eq!((settled.settled_at, settled.cost), (Some(Timestamp(5_000)), Some(Nanos(7))));
    assert_eq!((book.jobs[3].settled_at, book.jobs[3].cost), (None, None));
    assert_eq!(book.files, vec![file("org_a", "file-1", 3_000), file("org_a", "file-2", 2_000)]);
    let spend = |org: &str, key: &str, day: i64, cost: i64| (org_id(org), key_id(key), day, Nanos(cost));
    assert_eq!(
        book.spend,
        vec![
            spend("org_a", "key_a", 0, 12 + 7),
            spend("org_a", "key_a", 2, 3),
            spend("org_a", "key_b", 1, 4),
            spend("org_b", "key_x", 1, 6),
        ],
        "every settled job from day 0 on, whenever settled; pending jobs and zero days left out"
    );
    let from_day_1 = store.job_book(Timestamp(5_000), Timestamp(2_000), 1).expect("book").spend;
    assert_eq!(
        from_day_1,
        vec![spend("org_a", "key_a", 2, 3), spend("org_a", "key_b", 1, 4), spend("org_b", "key_x", 1, 6)]
    );
    let all = store.job_book(Timestamp(i64::MIN), Timestamp(i64::MIN), i64::MIN).expect("book");
    assert_eq!(all.jobs.len(), jobs.len());
    assert_eq!(all.files.len(), files.len());
    assert_eq!(all.spend[0], spend("org_a", "key_a", -1, 9), "days before 1970 floor");
    assert_eq!(store.job_book(Timestamp(0), Timestamp(0), i64::MAX).expect("book").spend, vec![]);
}

fn one_poller_holds_the_lease_until_it_lapses(db: &impl Backend) {
    let (first, second) = (db.open(), db.open());
    let lease = |store: &_, holder: &str, now: i64, until: i64| {
        JobStore::poller_lease(store, holder, Timestamp(now), Timestamp(until)).expect("lease")
    };
    assert!(lease(&first, "replica-a", 1_000, 6_000), "free: taken");
    assert!(lease(&first, "replica-a", 2_000, 7_000), "renewed by its holder");
    assert!(!lease(&second, "replica-b", 6_999, 12_000), "held by another until it lapses");
    assert!(lease(&second, "replica-b", 7_000, 12_000), "lapsed: taken over");
    assert!(!lease(&first, "replica-a", 8_000, 13_000), "the first holder lost it");
    let version = first.jobs_version().expect("version");
    assert!(lease(&second, "replica-b", 11_000, 16_000));
    assert_eq!(first.jobs_version().expect("version"), version, "the lease is not in the book");
}

fn polls_are_recorded_without_a_version_bump(db: &impl Backend) {
    let store = db.open();
    let a = job("org_a", "openai", "batch_a", "key_a", 1);
    store.record_jobs(std::slice::from_ref(&a), &[]).expect("record");
    let version = store.jobs_version().expect("version");
    let poll = |polls: u32, next: i64, error: Option<&'static str>| JobPoll {
        org_id: &a.org_id,
        provider: &a.provider,
        job_id: &a.job_id,
        polls,
        next_poll_at: Timestamp(next),
        error,
    };

    store.job_polled(&poll(3, 5_000, Some("provider said 502"))).expect("polled");
    let polled = stored(&store, &a).expect("job");
    assert_eq!((polled.polls, polled.next_poll_at), (3, Timestamp(5_000)));
    assert_eq!(polled.last_error.as_deref(), Some("provider said 502"));
    store.job_polled(&poll(4, 9_000, None)).expect("polled");
    let polled = stored(&store, &a).expect("job");
    assert_eq!(polled, JobRecord { polls: 4, next_poll_at: Timestamp(9_000), last_error: None, ..a.clone() });

    let unknown = store.job_polled(&JobPoll { provider: "azure", ..poll(1, 1, None) });
    assert!(matches!(unknown, Err(StoreError::NotFound)), "{unknown:?}");
    assert_eq!(store.jobs_version().expect("version"), version, "polls are not in the book");
}

fn a_job_settles_once_with_its_receipts(db: &impl Backend) {
    let store = db.open();
    let org = org_id("org_a");
    let a = job("org_a", "openai", "batch_a", "key_a", DAY + 500);
    store.record_jobs(std::slice::from_ref(&a), &[]).expect("record");
    store.insert_receipts(&serialized(&[creating_receipt("rcpt_create", &a)])).expect("insert");
    let version = store.jobs_version().expect("version");
    let (whole, partial) =
        ((Timestamp(0), Timestamp(10 * DAY)), (Timestamp(DAY + 500), Timestamp(DAY + 501)));
    let spend = |(from, to): (Timestamp, Timestamp)| store.spend(&org, None, from, to).expect("spend");

    let first = [settling_receipt("rcpt_s1", &a, 10), settling_receipt("rcpt_s2", &a, 20)];
    assert!(settle(&store, &a, 30, 7_000, &first).expect("settle"));
    assert_eq!(store.jobs_version().expect("version"), version + 1);
    let settled = JobRecord { settled_at: Some(Timestamp(7_000)), cost: Some(Nanos(30)), ..a.clone() };
    assert_eq!(stored(&store, &a), Some(settled.clone()));
    assert_eq!(store.receipt(&org, "rcpt_s2").expect("receipt"), Some(first[1].clone()));
    assert_eq!((spend(whole), spend(partial)), (Nanos(30), Nanos(30)), "the daily spend and the receipts");

    // Settled again (another replica, a retried poll): nothing at all is written.
    let replay = [settling_receipt("rcpt_s1", &a, 10), settling_receipt("rcpt_s3", &a, 99)];
    assert!(!settle(&store, &a, 45, 8_000, &replay).expect("settle again"));
    assert!(!settle(&store, &a, 30, 7_000, &first).expect("settle again"));
    assert_eq!(stored(&store, &a), Some(settled), "the first settlement stays");
    assert_eq!(store.receipt(&org, "rcpt_s3").expect("receipt"), None, "no receipt of a second settlement");
    assert_eq!((spend(whole), spend(partial)), (Nanos(30), Nanos(30)), "counted once");
    let summary = store.spend_summary(&org, None, Some(whole.0), Some(whole.1)).expect("summary");
    assert_eq!(summary.iter().map(|row| row.requests).sum::<u64>(), 3, "the creating receipt and two");
    assert_eq!(store.jobs_version().expect("version"), version + 1);

    let unknown = job("org_a", "openai", "batch_zz", "key_a", DAY);
    let refused = settle(&store, &unknown, 5, 9_000, &[settling_receipt("rcpt_zz", &unknown, 5)]);
    assert!(matches!(refused, Err(StoreError::NotFound)), "{refused:?}");
    assert_eq!(store.receipt(&org, "rcpt_zz").expect("receipt"), None);
    assert_eq!(store.jobs_version().expect("version"), version + 1);
    let book = store.job_book(Timestamp(0), Timestamp(0), 0).expect("book");
    assert_eq!(book.spend, vec![(org.clone(), key_id("key_a"), 1, Nanos(30))]);
}

fn a_settlement_that_fails_writes_nothing(db: &impl Backend) {
    let store = db.open();
    db.refuse_receipt("rcpt_refused");
    let org = org_id("org_a");
    let a = job("org_a", "openai", "batch_a", "key_a", 3 * DAY);
    store.record_jobs(std::slice::from_ref(&a), &[]).expect("record");
    let version = store.jobs_version().expect("version");

    let failing = [settling_receipt("rcpt_ok", &a, 10), settling_receipt("rcpt_refused", &a, 20)];
    let failed = settle(&store, &a, 30, 7_000, &failing);
    assert!(matches!(failed, Err(StoreError::Backend(_))), "{failed:?}");
    assert_eq!(stored(&store, &a), Some(a.clone()), "still pending");
    assert_eq!(store.receipt(&org, "rcpt_ok").expect("receipt"), None, "no receipt of the failed batch");
    assert_eq!(store.spend(&org, None, Timestamp(0), Timestamp(10 * DAY)).expect("spend"), Nanos(0));
    assert_eq!(store.spend_summary(&org, None, None, None).expect("summary"), vec![]);
    assert_eq!(store.jobs_version().expect("version"), version);
    let pending = store.job_book(Timestamp(0), Timestamp(0), 0).expect("book").jobs;
    assert_eq!(pending, vec![a.clone()], "pending, to be polled again");

    let retried = [settling_receipt("rcpt_ok", &a, 10), settling_receipt("rcpt_other", &a, 20)];
    assert!(settle(&store, &a, 30, 8_000, &retried).expect("settle"));
    assert_eq!(store.spend(&org, None, Timestamp(0), Timestamp(10 * DAY)).expect("spend"), Nanos(30));
    assert_eq!(stored(&store, &a).and_then(|job| job.settled_at), Some(Timestamp(8_000)));
}

fn concurrent_settlements_settle_once(db: &impl Backend) {
    let stores = [db.open(), db.open()];
    let jobs: Vec<JobRecord> =
        (0..20).map(|i| job("org_a", "openai", &format!("batch_{i:02}"), "key_a", DAY + i)).collect();
    stores[0].record_jobs(&jobs, &[]).expect("record");
    let version = stores[0].jobs_version().expect("version");
    let barrier = Barrier::new(4);
    let settled: usize = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|t| {
                let (store, barrier, jobs) = (&stores[t % 2], &barrier, &jobs);
                s.spawn(move || {
                    barrier.wait();
                    jobs.iter()
                        .filter(|job| {
                            // Each thread its own receipt ids: only the winner's may land.
                            let receipt = settling_receipt(&format!("rcpt_{}_{t}", job.job_id), job, 5);
                            settle(store, job, 5, 1_000, &[receipt]).expect("settle")
                        })
                        .count()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("thread")).sum()
    });
    assert_eq!(settled, jobs.len(), "each job settled once");
    assert_eq!(stores[1].jobs_version().expect("version"), version + 20);
    let org = org_id("org_a");
    assert_eq!(stores[1].spend(&org, None, Timestamp(0), Timestamp(2 * DAY)).expect("spend"), Nanos(100));
    assert_eq!(stores[1].spend(&org, None, Timestamp(DAY), Timestamp(DAY + 20)).expect("spend"), Nanos(100));
}

fn counted_spend_is_every_receipt_but_settlements_and_what_writers_hold(db: &impl Backend) {
    let store = db.open();
    let (a, b) = ("key_a", "key_b");
    let j1 = job("org_a", "openai", "batch_1", a, DAY + 1_000);
    let j2 = job("org_a", "anthropic", "msgbatch_2", b, 2 * DAY + 20);
    let pending = job("org_a", "openai", "batch_3", a, DAY + 2_000);
    let elsewhere = job("org_b", "openai", "batch_1", a, DAY + 1_000);
    store.record_jobs(&[j1.clone(), j2.clone(), pending.clone(), elsewhere.clone()], &[]).expect("record");
    // Everything the counters hold: the creating requests' receipts (free) and ordinary ones.
    let counted = [
        creating_receipt("rcpt_c1", &j1),
        creating_receipt("rcpt_c2", &j2),
        creating_receipt("rcpt_c3", &pending),
        receipt("rcpt_o1", a, DAY + 500, 7),
        Receipt { node_id: "node_b".into(), ..receipt("rcpt_o2", b, 2 * DAY + 10, 11) },
        Receipt { node_id: "node_b".into(), ..receipt("rcpt_o3", a, 3 * DAY + 5, 13) },
        receipt("rcpt_o4", a, -DAY + 3, 17),
        Receipt { cost_usd: Nanos(19), ..creating_receipt("rcpt_c4", &j1) },
    ];
    store.insert_receipts(&serialized(&counted)).expect("insert");
    store
        .insert_receipts(&serialized(&[Receipt {
            org_id: "org_b".into(),
            ..receipt("rcpt_b1", a, DAY + 1_000, 1_000)
        }]))
        .expect("insert");
    assert!(
        settle(
            &store,
            &j1,
            100,
            9_000,
            &[settling_receipt("rcpt_s1", &j1, 40), settling_receipt("rcpt_s2", &j1, 60)]
        )
        .expect("settle")
    );
    assert!(settle(&store, &j2, 25, 9_000, &[settling_receipt("rcpt_s3", &j2, 25)]).expect("settle"));
    assert!(
        settle(&store, &elsewhere, 500, 9_000, &[settling_receipt("rcpt_s4", &elsewhere, 500)])
            .expect("settle")
    );

    let org = org_id("org_a");
    let within = |key: Option<&str>, from: i64, to: i64, r: &Receipt| {
        key.is_none_or(|k| r.key_id == k) && (from..to).contains(&r.started_at.0)
    };
    let truth = |key: Option<&str>, from: i64, to: i64, receipts: &[Receipt]| {
        Nanos(receipts.iter().filter(|r| within(key, from, to, r)).map(|r| r.cost_usd.0).sum())
    };
    let settlements = [
        settling_receipt("rcpt_s1", &j1, 40),
        settling_receipt("rcpt_s2", &j1, 60),
        settling_receipt("rcpt_s3", &j2, 25),
    ];
    let cuts = [
        i64::MIN,
        -DAY,
        0,
        DAY,
        DAY + 700,
        DAY + 1_000,
        DAY + 1_001,
        2 * DAY,
        2 * DAY + 15,
        3 * DAY,
        3 * DAY + 6,
        4 * DAY,
        i64::MAX,
    ];
    for key in [None, Some(a), Some(b)] {
        for &from in &cuts {
            for &to in cuts.iter().filter(|&&to| to > from) {
                let (from_t, to_t, key_id) = (Timestamp(from), Timestamp(to), key.map(key_id));
                let got =
                    store.counted_spend(&org, key_id.as_ref(), from_t, to_t, &[]).expect("counted spend");
                assert_eq!(got.spend, truth(key, from, to, &counted), "{key:?} [{from}, {to})");
                let all = store.spend(&org, key_id.as_ref(), from_t, to_t).expect("spend");
                assert_eq!(
                    Nanos(all.0 - got.spend.0),
                    truth(key, from, to, &settlements),
                    "{key:?} [{from}, {to})"
                );
                let latest = counted.iter().chain(&settlements).filter(|r| within(key, from, to, r));
                assert_eq!(got.last_start, latest.map(|r| r.started_at).max(), "{key:?} [{from}, {to})");
                // A node whose writers hold its receipts from `since` on: the ledger leaves those out.
                for since in [i64::MIN, 2 * DAY + 10, 2 * DAY + 11, 3 * DAY + 6] {
                    let held = [("node_b", Timestamp(since))];
                    let uncounted = store
                        .counted_spend(&org, key_id.as_ref(), from_t, to_t, &held)
                        .expect("counted spend")
                        .spend;
                    let not_held: Vec<Receipt> = counted
                        .iter()
                        .filter(|r| !(r.node_id == "node_b" && r.started_at.0 >= since))
                        .cloned()
                        .collect();
                    assert_eq!(
                        uncounted,
                        truth(key, from, to, &not_held),
                        "{key:?} [{from}, {to}) since {since}"
                    );
                    let ledger_alone = store
                        .spend_uncounted(&org, key_id.as_ref(), from_t, to_t, &held)
                        .expect("spend uncounted")
                        .spend;
                    let all_not_held: Vec<Receipt> = counted
                        .iter()
                        .chain(&settlements)
                        .filter(|r| !(r.node_id == "node_b" && r.started_at.0 >= since))
                        .cloned()
                        .collect();
                    assert_eq!(
                        ledger_alone,
                        truth(key, from, to, &all_not_held),
                        "{key:?} [{from}, {to}) since {since}"
                    );
                }
            }
        }
    }
    assert_eq!(
        store
            .counted_spend(&org_id("org_b"), None, Timestamp(i64::MIN), Timestamp(i64::MAX), &[])
            .expect("counted")
            .spend,
        Nanos(1_000)
    );
}

fn an_organizations_jobs_list_newest_first(db: &impl Backend) {
    let store = db.open();
    let jobs = [
        job("org_a", "openai", "batch_b", "key_a", 100),
        job("org_a", "openai", "batch_a", "key_a", 100),
        job("org_a", "anthropic", "batch_c", "key_a", 300),
        job("org_a", "openai", "batch_d", "key_b", 200),
        job("org_a", "openai", "batch_c", "key_a", 300),
        job("org_b", "openai", "batch_e", "key_x", 400),
    ];
    store.record_jobs(&jobs, &[]).expect("record");
    let list = |org: &str, limit: u32| job_ids(&store.jobs(&org_id(org), limit).expect("jobs"));
    assert_eq!(
        list("org_a", 10),
        [
            "org_a/openai/batch_c",
            "org_a/anthropic/batch_c",
            "org_a/openai/batch_d",
            "org_a/openai/batch_b",
            "org_a/openai/batch_a",
        ]
    );
    assert_eq!(list("org_a", 2), ["org_a/openai/batch_c", "org_a/anthropic/batch_c"]);
    assert_eq!(list("org_b", 10), ["org_b/openai/batch_e"]);
    assert!(list("org_c", 10).is_empty());
    assert_eq!(store.jobs(&org_id("org_a"), 1).expect("jobs"), vec![jobs[4].clone()]);
}

fn jobs_survive_reopening_and_are_shared_between_stores(db: &impl Backend) {
    let a = job("org_a", "openai", "batch_a", "key_a", DAY);
    let b = job("org_a", "openai", "batch_b", "key_a", DAY + 1);
    {
        let first = db.open();
        first.record_jobs(&[a.clone(), b.clone()], &[file("org_a", "file-a", 5)]).expect("record");
        let second = db.open();
        assert_eq!(second.jobs_version().expect("version"), 1, "the other store sees the change");
        assert_eq!(stored(&second, &a), Some(a.clone()));
        assert!(settle(&second, &a, 8, 2_000, &[settling_receipt("rcpt_s", &a, 8)]).expect("settle"));
        assert_eq!(first.jobs_version().expect("version"), 2);
        assert!(!settle(&first, &a, 8, 3_000, &[]).expect("settled on the other store"));
        let poll = JobPoll {
            org_id: &b.org_id,
            provider: &b.provider,
            job_id: &b.job_id,
            polls: 1,
            next_poll_at: Timestamp(4_000),
            error: None,
        };
        first.job_polled(&poll).expect("polled");
    }
    let reopened = db.open();
    assert_eq!(reopened.jobs_version().expect("version"), 2);
    let book = reopened.job_book(Timestamp(0), Timestamp(0), 0).expect("book");
    let settled = JobRecord { settled_at: Some(Timestamp(2_000)), cost: Some(Nanos(8)), ..a };
    let polled = JobRecord { polls: 1, next_poll_at: Timestamp(4_000), ..b };
    assert_eq!(
        book,
        BookRows {
            jobs: vec![settled, polled],
            files: vec![file("org_a", "file-a", 5)],
            spend: vec![(org_id("org_a"), key_id("key_a"), 1, Nanos(8))],
        }
    );
    assert!(!reopened.record_jobs(&[job("org_a", "openai", "batch_a", "key_a", 0)], &[]).expect("replay"));
}
