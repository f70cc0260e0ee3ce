//! The PostgreSQL schema and its migrations, recorded in `schema_migrations` and applied once each,
//! even when several control replicas start at the same moment.

use postgres::Client;

use super::backend;
use crate::Result;

/// Entry `i` is migration version `i + 1`. Append only: a migration applied somewhere never changes.
///
/// Text columns that are sorted or compared on (ids, names, models) use the `"C"` collation, so that
/// order is by bytes whatever the database's locale, as in SQLite.
pub(super) const MIGRATIONS: &[&str] = &[
    r#"
    CREATE TABLE orgs (
        id TEXT COLLATE "C" PRIMARY KEY,
        name TEXT NOT NULL,
        created_at BIGINT NOT NULL
    );
    CREATE TABLE keys (
        id TEXT COLLATE "C" PRIMARY KEY,
        org_id TEXT COLLATE "C" NOT NULL REFERENCES orgs(id),
        name TEXT NOT NULL,
        prefix TEXT NOT NULL,
        hash BYTEA NOT NULL UNIQUE,
        created_at BIGINT NOT NULL,
        expires_at BIGINT,
        revoked_at BIGINT,
        requests_per_minute BIGINT,
        tokens_per_minute BIGINT
    );
    CREATE INDEX keys_by_org ON keys(org_id);
    CREATE TABLE providers (
        org_id TEXT COLLATE "C" NOT NULL REFERENCES orgs(id),
        name TEXT COLLATE "C" NOT NULL,
        kind TEXT NOT NULL,
        base_url TEXT,
        sealed_key BYTEA NOT NULL,
        key_hint TEXT NOT NULL,
        updated_at BIGINT NOT NULL,
        PRIMARY KEY (org_id, name)
    );
    CREATE TABLE state_version (id INTEGER PRIMARY KEY CHECK (id = 1), version BIGINT NOT NULL);
    INSERT INTO state_version VALUES (1, 0);
    CREATE TABLE price_revisions (
        revision BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        model TEXT COLLATE "C" NOT NULL,
        price TEXT NOT NULL,
        created_at BIGINT NOT NULL
    );
    CREATE INDEX price_revisions_by_model ON price_revisions(model, revision);
    CREATE TABLE receipts (
        id TEXT COLLATE "C" PRIMARY KEY,
        org_id TEXT COLLATE "C" NOT NULL,
        key_id TEXT COLLATE "C" NOT NULL,
        started_at BIGINT NOT NULL,
        model TEXT COLLATE "C",
        input_tokens BIGINT NOT NULL,
        output_tokens BIGINT NOT NULL,
        cost_nanos BIGINT NOT NULL,
        body TEXT NOT NULL
    );
    CREATE INDEX receipts_by_org_time ON receipts(org_id, started_at, id);
    CREATE INDEX receipts_by_key_time ON receipts(key_id, started_at);
    CREATE TABLE caps (
        id TEXT COLLATE "C" PRIMARY KEY,
        org_id TEXT COLLATE "C" NOT NULL REFERENCES orgs(id),
        scope TEXT NOT NULL,
        key_id TEXT COLLATE "C" REFERENCES keys(id),
        cap_window TEXT NOT NULL,
        limit_nanos BIGINT NOT NULL,
        hard_stop BOOLEAN NOT NULL,
        alert_at TEXT NOT NULL,
        alert_webhook TEXT,
        created_at BIGINT NOT NULL
    );
    CREATE INDEX caps_by_org ON caps(org_id);
    CREATE TABLE alerts (
        id TEXT COLLATE "C" PRIMARY KEY,
        cap_id TEXT COLLATE "C" NOT NULL,
        org_id TEXT COLLATE "C" NOT NULL,
        window_start BIGINT NOT NULL,
        threshold_permille BIGINT NOT NULL,
        spend_nanos BIGINT NOT NULL,
        limit_nanos BIGINT NOT NULL,
        raised_at BIGINT NOT NULL,
        delivered_at BIGINT,
        attempts BIGINT NOT NULL DEFAULT 0,
        UNIQUE (cap_id, window_start, threshold_permille)
    );
    CREATE INDEX alerts_by_org ON alerts(org_id, raised_at);
"#,
    r#"
    CREATE TABLE nodes (
        id TEXT COLLATE "C" PRIMARY KEY,
        feed_version BIGINT,
        snapshot_age_ms BIGINT,
        counters_confirmed_at BIGINT,
        fail_open_total BIGINT NOT NULL,
        seen_at BIGINT NOT NULL
    );
"#,
    // Spend sums (cap alerts, rebuilds, reconciliation) read the indexes alone, not every
    // receipt's row: a window of millions of receipts was summed from the table.
    r#"
    DROP INDEX receipts_by_org_time;
    CREATE INDEX receipts_by_org_time ON receipts(org_id, started_at, id) INCLUDE (key_id, cost_nanos);
    DROP INDEX receipts_by_key_time;
    CREATE INDEX receipts_by_key_time ON receipts(key_id, started_at) INCLUDE (org_id, cost_nanos);
"#,
    // A revision may change many prices (an import), remove one (back to the built-in price), or
    // set a provider kind's fallback price. Rows of removed prices stay, with no price: the log
    // says what each revision held. Revisions are handed out under the state version's row lock.
    r#"
    CREATE TABLE price_log (
        revision BIGINT NOT NULL,
        target TEXT COLLATE "C" NOT NULL,
        name TEXT COLLATE "C" NOT NULL,
        kind TEXT,
        price TEXT,
        created_at BIGINT NOT NULL,
        PRIMARY KEY (target, name, revision)
    );
    INSERT INTO price_log SELECT revision, 'model', model, NULL, price, created_at FROM price_revisions;
    DROP TABLE price_revisions;
"#,
    // The audit log (issue 18): one row per admin change, written in the change's transaction.
    // Rows outlive what they describe, so no foreign key.
    r#"
    CREATE TABLE audit_log (
        id TEXT COLLATE "C" PRIMARY KEY,
        version BIGINT NOT NULL UNIQUE,
        at BIGINT NOT NULL,
        auth TEXT NOT NULL,
        client TEXT,
        action TEXT COLLATE "C" NOT NULL,
        object_kind TEXT COLLATE "C" NOT NULL,
        object_id TEXT COLLATE "C" NOT NULL,
        org_id TEXT COLLATE "C",
        before_json TEXT,
        after_json TEXT
    );
    CREATE INDEX audit_log_by_org ON audit_log(org_id, version);
"#,
    // Model allowlists of keys and organizations: a JSON array of patterns; NULL allows every model.
    // A receipt's attribution tags, as `core::tags::to_text` writes them (its body holds them too),
    // to filter and sum by; NULL: none.
    r#"
    ALTER TABLE orgs ADD COLUMN allowed_models TEXT;
    ALTER TABLE keys ADD COLUMN allowed_models TEXT;
    ALTER TABLE receipts ADD COLUMN tags TEXT;
"#,
    // Spend by UTC day (days since 1970-01-01, floored), key and model: the console's charts and
    // month to date, and cap windows' whole days, read a few hundred rows instead of grouping a
    // million receipts. `model_key` is '' for a receipt without a model and '+' then the model
    // otherwise: NULL would not be one key. A trigger keeps it, once per insert statement and from
    // the rows it actually inserted (a replayed receipt counts once), so that a control plane of
    // the previous version, still ingesting during a rolling upgrade, keeps it too. Inserts wait
    // on the table's lock until the trigger is in place and the table built.
    // One key's receipts are read by (org, key, time), not by the organization's time index.
    r#"
    LOCK TABLE receipts IN SHARE ROW EXCLUSIVE MODE;
    CREATE TABLE spend_daily (
        org_id TEXT COLLATE "C" NOT NULL,
        day BIGINT NOT NULL,
        key_id TEXT COLLATE "C" NOT NULL,
        model_key TEXT COLLATE "C" NOT NULL,
        requests BIGINT NOT NULL,
        input_tokens BIGINT NOT NULL,
        output_tokens BIGINT NOT NULL,
        cost_nanos BIGINT NOT NULL,
        PRIMARY KEY (org_id, day, key_id, model_key)
    );
    CREATE FUNCTION spend_daily_add() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        -- In key order: two inserts adding to the same rows lock them in one order.
        INSERT INTO spend_daily AS d
            (org_id, day, key_id, model_key, requests, input_tokens, output_tokens, cost_nanos)
        SELECT org_id, floor(started_at / 86400000.0)::BIGINT, key_id, COALESCE('+' || model, ''),
               COUNT(*), SUM(input_tokens), SUM(output_tokens), SUM(cost_nanos)
        FROM inserted GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4
        ON CONFLICT (org_id, day, key_id, model_key) DO UPDATE SET
            requests = d.requests + EXCLUDED.requests,
            input_tokens = d.input_tokens + EXCLUDED.input_tokens,
            output_tokens = d.output_tokens + EXCLUDED.output_tokens,
            cost_nanos = d.cost_nanos + EXCLUDED.cost_nanos;
        RETURN NULL;
    END
    $$;
    CREATE TRIGGER receipts_add_to_spend_daily AFTER INSERT ON receipts
        REFERENCING NEW TABLE AS inserted FOR EACH STATEMENT EXECUTE FUNCTION spend_daily_add();
    INSERT INTO spend_daily
        SELECT org_id, floor(started_at / 86400000.0)::BIGINT AS day, key_id,
            COALESCE('+' || model, '') AS model_key, COUNT(*), SUM(input_tokens), SUM(output_tokens),
            SUM(cost_nanos)
        FROM receipts GROUP BY 1, 2, 3, 4;
    DROP INDEX receipts_by_key_time;
    CREATE INDEX receipts_by_org_key_time ON receipts(org_id, key_id, started_at, id) INCLUDE (cost_nanos);
"#,
    // Deferred jobs (issue 31): the control plane's book of jobs, pending until settled once, and
    // the estimates of batch input files; each change to either bumps `jobs_version`, which
    // replicas poll. Keyed by organization, credential and the provider's id (unique within one
    // provider account only). Receipts keep their job fields in their JSON body. The book's
    // settled spend by day reads its own index alone; an organization's jobs are listed newest
    // first in the order of theirs. `job_poller` holds the one poller's lease.
    r#"
    CREATE TABLE jobs (
        org_id TEXT COLLATE "C" NOT NULL,
        provider TEXT COLLATE "C" NOT NULL,
        job_id TEXT COLLATE "C" NOT NULL,
        key_id TEXT COLLATE "C" NOT NULL,
        kind TEXT NOT NULL,
        endpoint TEXT NOT NULL,
        model TEXT,
        request_id TEXT NOT NULL,
        started_at BIGINT NOT NULL,
        held_nanos BIGINT NOT NULL,
        settled_at BIGINT,
        cost_nanos BIGINT,
        polls BIGINT NOT NULL DEFAULT 0,
        next_poll_at BIGINT NOT NULL,
        last_error TEXT,
        PRIMARY KEY (org_id, provider, job_id)
    );
    CREATE INDEX jobs_due ON jobs(next_poll_at) WHERE settled_at IS NULL;
    CREATE INDEX jobs_by_settled ON jobs(settled_at) WHERE settled_at IS NOT NULL;
    CREATE INDEX jobs_settled_by_time ON jobs(started_at) INCLUDE (org_id, key_id, cost_nanos)
        WHERE settled_at IS NOT NULL;
    CREATE INDEX jobs_by_org_time ON jobs(org_id, started_at, job_id, provider);
    CREATE TABLE batch_files (
        org_id TEXT COLLATE "C" NOT NULL,
        provider TEXT COLLATE "C" NOT NULL,
        file_id TEXT COLLATE "C" NOT NULL,
        created_at BIGINT NOT NULL,
        input TEXT NOT NULL,
        PRIMARY KEY (org_id, provider, file_id)
    );
    CREATE INDEX batch_files_by_time ON batch_files(created_at);
    CREATE TABLE jobs_version (id INTEGER PRIMARY KEY CHECK (id = 1), version BIGINT NOT NULL);
    INSERT INTO jobs_version VALUES (1, 0);
    ALTER TABLE providers ADD COLUMN price_namespace TEXT;
    ALTER TABLE providers ADD COLUMN fallback_input_nanos BIGINT;
    ALTER TABLE providers ADD COLUMN fallback_output_nanos BIGINT;
    ALTER TABLE nodes ADD COLUMN clock_offset_ms BIGINT;
    CREATE TABLE job_poller (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        holder TEXT NOT NULL,
        lease_until BIGINT NOT NULL
    );
"#,
    // Issue 34 (version 9): endpoint allowlists of keys and organizations, a JSON array of
    // patterns as `allowed_models` (NULL allows every endpoint), and their limits of requests in
    // flight (NULL: none).
    r#"
    ALTER TABLE orgs ADD COLUMN allowed_endpoints TEXT;
    ALTER TABLE orgs ADD COLUMN max_concurrent_requests BIGINT;
    ALTER TABLE keys ADD COLUMN allowed_endpoints TEXT;
    ALTER TABLE keys ADD COLUMN max_concurrent_requests BIGINT;
"#,
    // Issue 34 (version 10): node credentials: a token of its own for each node, stored as its hash, revoked
    // rather than deleted so that the audit log and node reports keep naming it. A node's report
    // names the credential it presented (`shared` for the shared node token).
    r#"
    CREATE TABLE node_credentials (
        id TEXT COLLATE "C" PRIMARY KEY,
        name TEXT NOT NULL,
        hash BYTEA NOT NULL UNIQUE,
        created_at BIGINT NOT NULL,
        revoked_at BIGINT
    );
    ALTER TABLE nodes ADD COLUMN credential_id TEXT;
    ALTER TABLE nodes ADD COLUMN credential_name TEXT;
"#,
    // Issue 35 (version 11): organization tokens, stored as the hash of their secret and revoked
    // rather than deleted, as node credentials are, so that the audit log keeps naming them. And
    // who made each change (`actor`, JSON): every row written before was the operator's, the one
    // identity there was, as is any row a control plane that predates actors writes.
    r#"
    CREATE TABLE org_tokens (
        id TEXT COLLATE "C" PRIMARY KEY,
        org_id TEXT COLLATE "C" NOT NULL REFERENCES orgs(id),
        name TEXT NOT NULL,
        role TEXT NOT NULL,
        prefix TEXT NOT NULL,
        hash BYTEA NOT NULL UNIQUE,
        created_at BIGINT NOT NULL,
        expires_at BIGINT,
        revoked_at BIGINT
    );
    CREATE INDEX org_tokens_by_org ON org_tokens(org_id, created_at, id);
    ALTER TABLE audit_log ADD COLUMN actor TEXT NOT NULL DEFAULT '{"type":"operator"}';
"#,
];

/// The advisory lock that serializes migrations across every process on the database ("recovea!").
const MIGRATION_LOCK: i64 = 0x7265_636f_7665_6121;

/// Applies the migrations not yet recorded, each in its own transaction under the migration lock:
/// a replica that waited on the lock sees the other's record once it gets it, and skips.
pub(super) fn migrate(client: &mut Client) -> Result<()> {
    for (index, sql) in MIGRATIONS.iter().enumerate() {
        let version = i64::try_from(index + 1).unwrap_or(i64::MAX);
        let mut tx = client.transaction().map_err(backend)?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK]).map_err(backend)?;
        tx.batch_execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations (
                version BIGINT PRIMARY KEY,
                applied_at BIGINT NOT NULL DEFAULT (extract(epoch FROM now()) * 1000)::BIGINT
            )",
        )
        .map_err(backend)?;
        let applied = tx
            .query_opt("SELECT 1 FROM schema_migrations WHERE version = $1", &[&version])
            .map_err(backend)?
            .is_some();
        if !applied {
            tx.batch_execute(sql).map_err(backend)?;
            tx.execute("INSERT INTO schema_migrations (version) VALUES ($1)", &[&version])
                .map_err(backend)?;
        }
        tx.commit().map_err(backend)?;
    }
    Ok(())
}
