//! The SQLite schema and its migrations, counted by `PRAGMA user_version` and applied once each,
//! even when several processes open one fresh file at the same moment.

use rusqlite::Connection;

use super::backend;
use crate::Result;

/// Each entry migrates the schema from its index to the next; `PRAGMA user_version` records how far.
pub(super) const MIGRATIONS: &[&str] = &[
    r"
    CREATE TABLE orgs (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        created_at INTEGER NOT NULL
    );
    CREATE TABLE keys (
        id TEXT PRIMARY KEY,
        org_id TEXT NOT NULL REFERENCES orgs(id),
        name TEXT NOT NULL,
        prefix TEXT NOT NULL,
        hash BLOB NOT NULL UNIQUE,
        created_at INTEGER NOT NULL,
        expires_at INTEGER,
        revoked_at INTEGER
    );
    CREATE INDEX keys_by_org ON keys(org_id);
    CREATE TABLE providers (
        org_id TEXT NOT NULL REFERENCES orgs(id),
        name TEXT NOT NULL,
        kind TEXT NOT NULL,
        base_url TEXT,
        sealed_key BLOB NOT NULL,
        key_hint TEXT NOT NULL,
        updated_at INTEGER NOT NULL,
        PRIMARY KEY (org_id, name)
    );
    CREATE TABLE state_version (id INTEGER PRIMARY KEY CHECK (id = 1), version INTEGER NOT NULL);
    INSERT INTO state_version VALUES (1, 0);
",
    r"
    CREATE TABLE price_revisions (
        revision INTEGER PRIMARY KEY AUTOINCREMENT,
        model TEXT NOT NULL,
        price TEXT NOT NULL,
        created_at INTEGER NOT NULL
    );
    CREATE TABLE receipts (
        id TEXT PRIMARY KEY,
        org_id TEXT NOT NULL,
        key_id TEXT NOT NULL,
        started_at INTEGER NOT NULL,
        model TEXT,
        input_tokens INTEGER NOT NULL,
        output_tokens INTEGER NOT NULL,
        cost_nanos INTEGER NOT NULL,
        body TEXT NOT NULL
    );
    CREATE INDEX receipts_by_org_time ON receipts(org_id, started_at, id);
",
    r"
    CREATE TABLE caps (
        id TEXT PRIMARY KEY,
        org_id TEXT NOT NULL REFERENCES orgs(id),
        scope TEXT NOT NULL,
        key_id TEXT REFERENCES keys(id),
        window TEXT NOT NULL,
        limit_nanos INTEGER NOT NULL,
        hard_stop INTEGER NOT NULL,
        alert_at TEXT NOT NULL,
        alert_webhook TEXT,
        created_at INTEGER NOT NULL
    );
    CREATE INDEX caps_by_org ON caps(org_id);
    CREATE TABLE alerts (
        id TEXT PRIMARY KEY,
        cap_id TEXT NOT NULL,
        org_id TEXT NOT NULL,
        window_start INTEGER NOT NULL,
        threshold_permille INTEGER NOT NULL,
        spend_nanos INTEGER NOT NULL,
        limit_nanos INTEGER NOT NULL,
        raised_at INTEGER NOT NULL,
        delivered_at INTEGER,
        attempts INTEGER NOT NULL DEFAULT 0,
        UNIQUE (cap_id, window_start, threshold_permille)
    );
    CREATE INDEX alerts_by_org ON alerts(org_id, raised_at);
    CREATE INDEX receipts_by_key_time ON receipts(key_id, started_at);
",
    r"
    ALTER TABLE keys ADD COLUMN requests_per_minute INTEGER;
    ALTER TABLE keys ADD COLUMN tokens_per_minute INTEGER;
",
    r"
    CREATE TABLE nodes (
        id TEXT PRIMARY KEY,
        feed_version INTEGER,
        snapshot_age_ms INTEGER,
        counters_confirmed_at INTEGER,
        fail_open_total INTEGER NOT NULL,
        seen_at INTEGER NOT NULL
    );
",
    // Spend sums (cap alerts, rebuilds, reconciliation) read the indexes alone, not every
    // receipt's row: a window of millions of receipts was summed from the table.
    r"
    DROP INDEX receipts_by_org_time;
    CREATE INDEX receipts_by_org_time ON receipts(org_id, started_at, id, key_id, cost_nanos);
    DROP INDEX receipts_by_key_time;
    CREATE INDEX receipts_by_key_time ON receipts(key_id, started_at, org_id, cost_nanos);
",
    // A receipt is its columns, no longer its JSON text beside a few of them: rows of about 200
    // bytes instead of 660, and those bytes (written to the WAL, then again by its checkpoint) were
    // most of what a ledger insert cost.
    r"
    CREATE TABLE receipts_by_column (
        id TEXT PRIMARY KEY,
        org_id TEXT NOT NULL,
        key_id TEXT NOT NULL,
        started_at INTEGER NOT NULL,
        model TEXT,
        input_tokens INTEGER NOT NULL,
        output_tokens INTEGER NOT NULL,
        cost_nanos INTEGER NOT NULL,
        request_id TEXT NOT NULL,
        provider TEXT NOT NULL,
        endpoint TEXT NOT NULL,
        status INTEGER NOT NULL,
        stream INTEGER NOT NULL,
        cached_input_tokens INTEGER NOT NULL,
        cache_write_input_tokens INTEGER NOT NULL,
        reasoning_tokens INTEGER NOT NULL,
        usage_source TEXT NOT NULL,
        priced INTEGER NOT NULL,
        price_revision INTEGER NOT NULL,
        finished_at INTEGER NOT NULL,
        node_id TEXT NOT NULL
    );
    INSERT INTO receipts_by_column
        SELECT id, org_id, key_id, started_at, model, input_tokens, output_tokens, cost_nanos,
            body ->> '$.request_id', body ->> '$.provider', body ->> '$.endpoint', body ->> '$.status',
            body ->> '$.stream', body ->> '$.cached_input_tokens',
            body ->> '$.cache_write_input_tokens', body ->> '$.reasoning_tokens',
            body ->> '$.usage_source', body ->> '$.priced', body ->> '$.price_revision',
            CAST(round(unixepoch(body ->> '$.finished_at', 'subsec') * 1000) AS INTEGER),
            body ->> '$.node_id'
        FROM receipts ORDER BY rowid;
    DROP TABLE receipts;
    ALTER TABLE receipts_by_column RENAME TO receipts;
    CREATE INDEX receipts_by_org_time ON receipts(org_id, started_at, id, key_id, cost_nanos);
    CREATE INDEX receipts_by_key_time ON receipts(key_id, started_at, org_id, cost_nanos);
",
    // A revision may change many prices (an import), remove one (back to the built-in price), or
    // set a provider kind's fallback price; a receipt says which price it was costed at. Rows of
    // removed prices stay, with no price: the log says what each revision held.
    r"
    CREATE TABLE price_log (
        revision INTEGER NOT NULL,
        target TEXT NOT NULL,
        name TEXT NOT NULL,
        kind TEXT,
        price TEXT,
        created_at INTEGER NOT NULL,
        PRIMARY KEY (target, name, revision)
    );
    INSERT INTO price_log SELECT revision, 'model', model, NULL, price, created_at FROM price_revisions;
    DROP TABLE price_revisions;
    ALTER TABLE receipts ADD COLUMN priced_as TEXT;
",
    // The audit log (issue 18): one row per admin change, written in the change's transaction.
    // Rows outlive what they describe, so no foreign key.
    r"
    CREATE TABLE audit_log (
        id TEXT PRIMARY KEY,
        version INTEGER NOT NULL UNIQUE,
        at INTEGER NOT NULL,
        auth TEXT NOT NULL,
        client TEXT,
        action TEXT NOT NULL,
        object_kind TEXT NOT NULL,
        object_id TEXT NOT NULL,
        org_id TEXT,
        before_json TEXT,
        after_json TEXT
    );
    CREATE INDEX audit_log_by_org ON audit_log(org_id, version);
",
    // Model allowlists of keys and organizations: a JSON array of patterns; NULL allows every model.
    // A receipt's attribution tags, as `core::tags::to_text` writes them; NULL: none.
    r"
    ALTER TABLE orgs ADD COLUMN allowed_models TEXT;
    ALTER TABLE keys ADD COLUMN allowed_models TEXT;
    ALTER TABLE receipts ADD COLUMN tags TEXT;
",
    // Spend by UTC day (days since 1970-01-01, floored), key and model, kept by each receipt
    // insert in its transaction: the console's charts and month to date, and cap windows' whole
    // days, read a few hundred rows instead of grouping a million receipts. `model_key` is '' for a
    // receipt without a model and '+' then the model otherwise: NULL would not be one key.
    // One key's receipts are read by (org, key, time), not by the organization's time index.
    r"
    CREATE TABLE spend_daily (
        org_id TEXT NOT NULL,
        day INTEGER NOT NULL,
        key_id TEXT NOT NULL,
        model_key TEXT NOT NULL,
        requests INTEGER NOT NULL,
        input_tokens INTEGER NOT NULL,
        output_tokens INTEGER NOT NULL,
        cost_nanos INTEGER NOT NULL,
        PRIMARY KEY (org_id, day, key_id, model_key)
    ) WITHOUT ROWID;
    INSERT INTO spend_daily
        SELECT org_id, (started_at - ((started_at % 86400000) + 86400000) % 86400000) / 86400000 AS day,
            key_id, COALESCE('+' || model, '') AS model_key, COUNT(*), SUM(input_tokens),
            SUM(output_tokens), SUM(cost_nanos)
        FROM receipts GROUP BY 1, 2, 3, 4;
    DROP INDEX receipts_by_key_time;
    CREATE INDEX receipts_by_org_key_time ON receipts(org_id, key_id, started_at, id, cost_nanos);
",
    // Deferred jobs (issue 31): a receipt names the job its request created (and what the job
    // holds) or settled, or the batch input file it uploaded; Realtime's audio tokens; and, in one
    // JSON column, the quantities few receipts have (hour-long cache writes, image tokens,
    // characters, seconds, images, tool calls, a tier). `jobs` is the control plane's book:
    // pending until settled once; `batch_files` the estimates of batch input files; each change
    // to either bumps `jobs_version`, which replicas poll. Job rows are keyed by organization,
    // credential and the provider's id, as providers' ids are unique within one account only.
    // The book's settled spend by day reads its own index alone; an organization's jobs are
    // listed newest first in the order of theirs. `job_poller` holds the one poller's lease.
    r"
    ALTER TABLE receipts ADD COLUMN job_id TEXT;
    ALTER TABLE receipts ADD COLUMN held_nanos INTEGER;
    ALTER TABLE receipts ADD COLUMN batch_input TEXT;
    ALTER TABLE receipts ADD COLUMN audio_input_tokens INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE receipts ADD COLUMN cached_audio_input_tokens INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE receipts ADD COLUMN audio_output_tokens INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE receipts ADD COLUMN quantities TEXT;
    CREATE TABLE jobs (
        org_id TEXT NOT NULL,
        provider TEXT NOT NULL,
        job_id TEXT NOT NULL,
        key_id TEXT NOT NULL,
        kind TEXT NOT NULL,
        endpoint TEXT NOT NULL,
        model TEXT,
        request_id TEXT NOT NULL,
        started_at INTEGER NOT NULL,
        held_nanos INTEGER NOT NULL,
        settled_at INTEGER,
        cost_nanos INTEGER,
        polls INTEGER NOT NULL DEFAULT 0,
        next_poll_at INTEGER NOT NULL,
        last_error TEXT,
        PRIMARY KEY (org_id, provider, job_id)
    ) WITHOUT ROWID;
    CREATE INDEX jobs_due ON jobs(next_poll_at) WHERE settled_at IS NULL;
    CREATE INDEX jobs_by_settled ON jobs(settled_at) WHERE settled_at IS NOT NULL;
    CREATE INDEX jobs_settled_by_time ON jobs(started_at, org_id, key_id, cost_nanos, settled_at)
        WHERE settled_at IS NOT NULL;
    CREATE INDEX jobs_by_org_time ON jobs(org_id, started_at, job_id, provider);
    CREATE TABLE batch_files (
        org_id TEXT NOT NULL,
        provider TEXT NOT NULL,
        file_id TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        input TEXT NOT NULL,
        PRIMARY KEY (org_id, provider, file_id)
    ) WITHOUT ROWID;
    CREATE INDEX batch_files_by_time ON batch_files(created_at);
    CREATE TABLE jobs_version (id INTEGER PRIMARY KEY CHECK (id = 1), version INTEGER NOT NULL);
    INSERT INTO jobs_version VALUES (1, 0);
    ALTER TABLE providers ADD COLUMN price_namespace TEXT;
    ALTER TABLE providers ADD COLUMN fallback_input_nanos INTEGER;
    ALTER TABLE providers ADD COLUMN fallback_output_nanos INTEGER;
    ALTER TABLE nodes ADD COLUMN clock_offset_ms INTEGER;
    CREATE TABLE job_poller (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        holder TEXT NOT NULL,
        lease_until INTEGER NOT NULL
    );
",
    // Issue 34 (user_version 13): endpoint allowlists of keys and organizations, a JSON array of
    // patterns as `allowed_models` (NULL allows every endpoint), and their limits of requests in
    // flight (NULL: none).
    r"
    ALTER TABLE orgs ADD COLUMN allowed_endpoints TEXT;
    ALTER TABLE orgs ADD COLUMN max_concurrent_requests INTEGER;
    ALTER TABLE keys ADD COLUMN allowed_endpoints TEXT;
    ALTER TABLE keys ADD COLUMN max_concurrent_requests INTEGER;
",
    // Issue 34 (user_version 14): who paid the provider, `managed` or `client`; NULL on receipts
    // written before it was recorded.
    r"
    ALTER TABLE receipts ADD COLUMN provider_key TEXT;
",
    // Issue 34 (user_version 15): node credentials: a token of its own for each node, stored as its hash, revoked
    // rather than deleted so that the audit log and node reports keep naming it. A node's report
    // names the credential it presented (`shared` for the shared node token).
    r"
    CREATE TABLE node_credentials (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        hash BLOB NOT NULL UNIQUE,
        created_at INTEGER NOT NULL,
        revoked_at INTEGER
    );
    ALTER TABLE nodes ADD COLUMN credential_id TEXT;
    ALTER TABLE nodes ADD COLUMN credential_name TEXT;
",
    // Issue 35 (user_version 16): organization tokens, stored as the hash of their secret and
    // revoked rather than deleted, as node credentials are, so that the audit log keeps naming
    // them. And who made each change (`actor`, JSON): every row written before was the operator's,
    // the one identity there was, as is any row a control plane that predates actors writes.
    r#"
    CREATE TABLE org_tokens (
        id TEXT PRIMARY KEY,
        org_id TEXT NOT NULL REFERENCES orgs(id),
        name TEXT NOT NULL,
        role TEXT NOT NULL,
        prefix TEXT NOT NULL,
        hash BLOB NOT NULL UNIQUE,
        created_at INTEGER NOT NULL,
        expires_at INTEGER,
        revoked_at INTEGER
    );
    CREATE INDEX org_tokens_by_org ON org_tokens(org_id, created_at, id);
    ALTER TABLE audit_log ADD COLUMN actor TEXT NOT NULL DEFAULT '{"type":"operator"}';
"#,
];

/// Applies each missing migration in a write transaction that reads the version itself, so that
/// several processes opening one fresh file at once apply each migration exactly once.
pub(super) fn migrate(conn: &mut Connection) -> Result<()> {
    loop {
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate).map_err(backend)?;
        let current: usize = tx.pragma_query_value(None, "user_version", |r| r.get(0)).map_err(backend)?;
        let Some(sql) = MIGRATIONS.get(current) else { return Ok(()) };
        tx.execute_batch(sql).map_err(backend)?;
        tx.pragma_update(None, "user_version", current + 1).map_err(backend)?;
        tx.commit().map_err(backend)?;
    }
}
