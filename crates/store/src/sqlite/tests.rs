//! What only SQLite has to show: its own migrations from earlier schemas, and receipts kept as
//! columns reading back whole. The shared suite (`tests/store_suite.rs`) covers the rest.

use recovea_core::ids::OrgId;
use recovea_core::money::Nanos;
use recovea_core::receipt::{Receipt, SerializedReceipt};
use recovea_core::timestamp::Timestamp;
use recovea_core::usage::UsageSource;
use rusqlite::{Connection, params};

use super::SqliteStore;
use super::migrate::MIGRATIONS;
use crate::rows::saturating_i64;
use crate::{AuditActor, AuditAuth, AuditContext, ControlStore, ReceiptLedger, ReceiptQuery};

/// Every field set to something other than `Receipt::example`'s, so that a field lost or
/// swapped on the way shows.
fn unusual(id: &str, started_at: i64) -> Receipt {
    Receipt {
        provider: "groq".into(),
        model: None,
        endpoint: "/v1/messages".into(),
        status: 499,
        stream: true,
        input_tokens: 1_000_001,
        output_tokens: 2,
        cached_input_tokens: 3,
        cache_write_input_tokens: 4,
        reasoning_tokens: 5,
        cost_usd: Nanos(123_456_789),
        usage_source: UsageSource::Estimated,
        priced: false,
        price_revision: 7,
        priced_as: Some("fallback:anthropic".into()),
        started_at: Timestamp(started_at),
        finished_at: Timestamp(started_at + 1_234),
        node_id: "node_x".into(),
        audio_input_tokens: 6,
        cached_audio_input_tokens: 2,
        audio_output_tokens: 1,
        job_id: Some("batch_x".into()),
        held_usd: Some(Nanos(42)),
        batch_input: Some(recovea_core::receipt::BatchFile {
            file_id: "file-x".into(),
            input: {
                let mut input = recovea_core::jobs::BatchInput::default();
                input.add(Some("gpt-4o"), 7, None);
                input
            },
        }),
        tags: [("team".to_owned(), "search".to_owned())].into(),
        ..Receipt::example(id)
    }
}

fn all_of_org_a(store: &SqliteStore) -> Vec<Receipt> {
    let query = ReceiptQuery {
        org_id: OrgId::parse("org_a").expect("org id"),
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
    store.receipts(&query).expect("receipts")
}

#[test]
fn receipts_stored_as_json_text_become_columns() {
    // The schema before migration 7 (at index 6) made receipts columns.
    let conn = Connection::open_in_memory().expect("open");
    for sql in &MIGRATIONS[..6] {
        conn.execute_batch(sql).expect("an earlier migration");
    }
    conn.pragma_update(None, "user_version", 6).expect("version");
    // Receipts of that time had no `priced_as`, nor tags, nor jobs.
    let old = [
        Receipt {
            priced_as: None,
            tags: Default::default(),
            job_id: None,
            held_usd: None,
            batch_input: None,
            audio_input_tokens: 0,
            cached_audio_input_tokens: 0,
            audio_output_tokens: 0,
            ..unusual("rcpt_old1", 1_764_591_691_722)
        },
        Receipt {
            started_at: Timestamp(5),
            finished_at: Timestamp(9),
            priced_as: None,
            ..Receipt::example("rcpt_old2")
        },
    ];
    for r in &old {
        conn.execute(
            "INSERT INTO receipts
             (id, org_id, key_id, started_at, model, input_tokens, output_tokens, cost_nanos, body)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            params![
                r.id,
                r.org_id,
                r.key_id,
                r.started_at.0,
                r.model,
                saturating_i64(r.input_tokens),
                saturating_i64(r.output_tokens),
                r.cost_usd.0,
                r.to_json()
            ],
        )
        .expect("a receipt as stored before");
    }
    let store = SqliteStore::with_connection(conn).expect("migrated");
    assert_eq!(all_of_org_a(&store), [old[1].clone(), old[0].clone()]);
    let org = OrgId::parse("org_a").expect("org id");
    assert_eq!(
        store.spend(&org, None, Timestamp(0), Timestamp(i64::MAX)).expect("spend"),
        Nanos(123_456_789)
    );
    let new = unusual("rcpt_new", 6);
    store.insert_receipts(&[SerializedReceipt::new(new.clone())]).expect("insert");
    assert_eq!(all_of_org_a(&store), [old[1].clone(), new, old[0].clone()]);
}

#[test]
fn price_revisions_become_the_price_log() {
    let conn = Connection::open_in_memory().expect("open");
    for sql in &MIGRATIONS[..7] {
        conn.execute_batch(sql).expect("an earlier migration");
    }
    conn.pragma_update(None, "user_version", 7).expect("version");
    for (model, input, at) in [("m", "1", 1), ("m", "2", 2), ("n", "3", 3)] {
        let price = format!(r#"{{"input_per_mtok_usd":"{input}","output_per_mtok_usd":"1"}}"#);
        conn.execute(
            "INSERT INTO price_revisions (model, price, created_at) VALUES (?1, ?2, ?3)",
            params![model, price, at],
        )
        .expect("a price as stored before");
    }
    let store = SqliteStore::with_connection(conn).expect("migrated");
    let state = store.state().expect("state");
    assert_eq!(state.price_revision, 3);
    let kept: Vec<(String, String, u64)> = state
        .price_overrides
        .iter()
        .map(|o| (format!("{:?}", o.target), o.price.input_per_mtok_usd.clone(), o.revision))
        .collect();
    assert_eq!(kept, [(r#"Model("m")"#.into(), "2".into(), 2), (r#"Model("n")"#.into(), "3".into(), 3)]);
    let audit = AuditContext {
        id: "aud_a".into(),
        at: Timestamp(4),
        auth: AuditAuth::AdminToken,
        actor: AuditActor::Operator,
        client: None,
    };
    assert_eq!(store.put_price("n", &state.price_overrides[0].price, Timestamp(4), &audit).expect("put"), 4);
}

#[test]
fn a_receipt_reads_back_field_for_field() {
    let store = SqliteStore::in_memory().expect("open");
    let receipt = unusual("rcpt_a", 1_764_591_691_722);
    store.insert_receipts(&[SerializedReceipt::new(receipt.clone())]).expect("insert");
    assert_eq!(all_of_org_a(&store), [receipt]);
}

#[test]
fn the_daily_spend_is_built_from_the_receipts_already_stored() {
    // The schema before migration 11 (at index 10) kept the daily spend.
    let conn = Connection::open_in_memory().expect("open");
    for sql in &MIGRATIONS[..10] {
        conn.execute_batch(sql).expect("an earlier migration");
    }
    conn.pragma_update(None, "user_version", 10).expect("version");
    let day = 86_400_000;
    let old = [
        unusual("rcpt_old1", 2 * day + 5),
        Receipt { started_at: Timestamp(2 * day + 9), ..unusual("rcpt_old2", 0) },
        Receipt { started_at: Timestamp(-5_000), ..Receipt::example("rcpt_old3") },
        Receipt { started_at: Timestamp(day + 1), ..Receipt::example("rcpt_old4") },
    ];
    for r in &old {
        conn.execute(
            "INSERT INTO receipts
             (id, org_id, key_id, started_at, model, input_tokens, output_tokens, cost_nanos, request_id,
              provider, endpoint, status, stream, cached_input_tokens, cache_write_input_tokens,
              reasoning_tokens, usage_source, priced, price_revision, finished_at, node_id)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, 0, 0, 0, ?14, 1, 0, ?4, 'node')",
            params![
                r.id,
                r.org_id,
                r.key_id,
                r.started_at.0,
                r.model,
                saturating_i64(r.input_tokens),
                saturating_i64(r.output_tokens),
                r.cost_usd.0,
                r.request_id,
                r.provider,
                r.endpoint,
                r.status,
                r.stream,
                r.usage_source.as_str(),
            ],
        )
        .expect("a receipt as stored before");
    }
    let store = SqliteStore::with_connection(conn).expect("migrated");
    let org = OrgId::parse("org_a").expect("org id");
    let from_rollup = store.spend_summary(&org, None, None, None).expect("summary");
    let from_receipts = store.spend_summary(&org, None, Some(Timestamp(-day + 1)), None).expect("summary");
    assert_eq!(from_rollup, from_receipts);
    assert_eq!(from_rollup.len(), 3, "{from_rollup:?}");
    assert_eq!((from_rollup[2].requests, from_rollup[2].cost), (2, Nanos(2 * 123_456_789)));
    assert_eq!(from_rollup[0].day, "1969-12-31", "a day before 1970 is floored");
    // Receipts inserted after the migration add to the rows it built.
    store.insert_receipts(&[SerializedReceipt::new(unusual("rcpt_new", 2 * day + 7))]).expect("insert");
    let after =
        store.spend_summary(&org, None, Some(Timestamp(2 * day)), Some(Timestamp(3 * day))).expect("summary");
    assert_eq!((after.len(), after[0].requests, after[0].cost), (1, 3, Nanos(3 * 123_456_789)));
}

#[test]
fn audit_rows_from_before_actors_are_the_operators() {
    // The schema before migration 16 (at index 15) had no `actor`: every change was the operator's.
    let conn = Connection::open_in_memory().expect("open");
    for sql in &MIGRATIONS[..15] {
        conn.execute_batch(sql).expect("an earlier migration");
    }
    conn.pragma_update(None, "user_version", 15).expect("version");
    conn.execute(
        "INSERT INTO audit_log (id, version, at, auth, client, action, object_kind, object_id, org_id, before_json, after_json)
         VALUES ('aud_old', 1, 5, 'admin_token', '10.0.0.1:5', 'create', 'org', 'org_a', 'org_a', NULL, '{}')",
        [],
    )
    .expect("a row as written before");
    let store = SqliteStore::with_connection(conn).expect("migrated");
    let rows = store.audit_log(&crate::AuditQuery { limit: 10, ..Default::default() }).expect("audit log");
    assert_eq!(rows.len(), 1);
    assert_eq!((rows[0].auth, &rows[0].actor), (AuditAuth::AdminToken, &AuditActor::Operator));
}
