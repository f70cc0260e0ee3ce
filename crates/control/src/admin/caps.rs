//! Caps (`/orgs/{org}/caps`, `/caps/{cap}`), the spend of their current windows, and their alerts.

use recovea_core::caps::{Cap, Scope, SpendView};
use recovea_core::ids::{CapId, KeyId, OrgId};
use recovea_core::money::Nanos;
use recovea_core::window::Window;
use recovea_counters::{CapWindow, Rebuilt, Unseeded};
use recovea_store::audit::{cap_json, permille_number};
use recovea_store::{AlertRecord, CapRecord};
use serde_json::{Number, Value, json};

use crate::admin::requests::{CapPatch, Change, NewCap};
use crate::admin::{Caller, Reply, created, no_cap, now, ok};
use crate::{ApiError, Control};

/// Alerts at half, four fifths and all of the limit unless told otherwise.
const DEFAULT_ALERT_AT: [u32; 3] = [500, 800, 1000];

impl Control {
    pub(crate) async fn create_cap(
        &self,
        caller: Caller,
        org_id: OrgId,
        body: NewCap,
    ) -> Result<Reply, ApiError> {
        self.require_org(&org_id).await?;
        let scope = Scope::parse(&body.scope)
            .ok_or_else(|| ApiError::bad_field("scope", "expected \"organization\" or \"key\""))?;
        let key_id = match (scope, body.key_id) {
            (Scope::Organization, None) => None,
            (Scope::Organization, Some(_)) => {
                return Err(ApiError::bad_field("key_id", "only a cap of scope \"key\" names a key"));
            }
            (Scope::Key, None) => {
                return Err(ApiError::bad_field("key_id", "a cap of scope \"key\" names its key"));
            }
            (Scope::Key, Some(text)) => {
                let key = KeyId::parse(&text).ok_or_else(|| ApiError::bad_field("key_id", "not a key id"))?;
                let owner = org_id.clone();
                let keys = self.store(move |s| s.list_keys(&owner)).await?;
                if !keys.iter().any(|k| k.id == key) {
                    return Err(ApiError::bad_field(
                        "key_id",
                        format_args!("{key} is not a key of {org_id}"),
                    ));
                }
                Some(key)
            }
        };
        let cap = Cap {
            id: self.new_id(CapId::PREFIX, CapId::parse)?,
            org_id,
            scope,
            key_id,
            window: Window::parse(&body.window)
                .ok_or_else(|| ApiError::bad_field("window", "expected \"day\", \"week\" or \"month\""))?,
            limit: limit(&body.limit_usd)?,
            hard_stop: body.hard_stop,
            alert_at_permille: body.alert_at.as_deref().map_or(Ok(DEFAULT_ALERT_AT.to_vec()), alert_at)?,
            alert_webhook: body.alert_webhook.map(|url| webhook(&url)).transpose()?,
        };
        let record = CapRecord { cap, created_at: now() };
        let (row, audit) = (record.clone(), caller.audit()?);
        self.store(move |s| s.create_cap(&row, &audit)).await?;
        self.seed_current_window(&record.cap).await?;
        created(cap_json(&record))
    }

    pub(crate) async fn list_caps(&self, org_id: OrgId) -> Result<Reply, ApiError> {
        self.require_org(&org_id).await?;
        let caps = self.store(move |s| s.caps(&org_id)).await?;
        ok(json!({ "caps": caps.iter().map(cap_json).collect::<Vec<_>>() }))
    }

    pub(crate) async fn get_cap(&self, id: CapId) -> Result<Reply, ApiError> {
        ok(cap_json(&self.require_cap(id).await?))
    }

    pub(crate) async fn update_cap(
        &self,
        caller: Caller,
        id: CapId,
        patch: CapPatch<Value>,
    ) -> Result<Reply, ApiError> {
        let mut record = self.require_cap(id).await?;
        let cap = &mut record.cap;
        if let Some(text) = patch.limit_usd {
            cap.limit = limit(&text)?;
        }
        if let Some(hard_stop) = patch.hard_stop {
            cap.hard_stop = hard_stop;
        }
        if let Some(values) = patch.alert_at {
            cap.alert_at_permille = alert_at(&values)?;
        }
        match patch.alert_webhook {
            None => {}
            Some(Change::Remove) => cap.alert_webhook = None,
            Some(Change::Set(Value::String(url))) => cap.alert_webhook = Some(webhook(&url)?),
            Some(Change::Set(_)) => {
                return Err(ApiError::bad_field("alert_webhook", "expected a URL or null"));
            }
        }
        let (row, audit) = (record.clone(), caller.audit()?);
        self.store(move |s| s.update_cap(&row, &audit)).await?;
        ok(cap_json(&record))
    }

    pub(crate) async fn delete_cap(&self, caller: Caller, id: CapId) -> Result<Reply, ApiError> {
        let (cap, audit) = (id.clone(), caller.audit()?);
        if !self.store(move |s| s.delete_cap(&cap, &audit)).await? {
            return Err(no_cap(&id));
        }
        ok(json!({ "id": id, "deleted": true }))
    }

    /// Each cap's current window and what was spent in it: the sum of that window's receipts.
    pub(crate) async fn spend(&self, org_id: OrgId) -> Result<Reply, ApiError> {
        self.require_org(&org_id).await?;
        let owner = org_id.clone();
        let caps = self.store(move |s| s.caps(&owner)).await?;
        let at = now();
        let mut rows = Vec::with_capacity(caps.len());
        for record in caps {
            let cap = record.cap;
            let (start, end) = (cap.window.start(at), cap.window.end(at));
            let (org, key) = (org_id.clone(), cap.key_id.clone());
            let spent = self.ledger(move |l| l.spend(&org, key.as_ref(), start, end)).await?;
            let mut row = json!({
                "cap_id": cap.id,
                "scope": cap.scope.as_str(),
                "key_id": cap.key_id,
                "window": cap.window.as_str(),
                "window_start": start,
                "window_end": end,
                "spend_usd": spent,
                "limit_usd": cap.limit,
                "hard_stop": cap.hard_stop,
                "held_usd": self.inner.jobs.get().map_or(Nanos::ZERO, |jobs| jobs.held(&cap, at)),
            });
            // Reconciliation: the counters are a cache of the ledger; receipts still on their way
            // from the spool make a small, passing drift.
            if let Some(counters) = self.inner.counters.get() {
                let counted = counters.spend(&cap.org_id, &cap.id, start).spent;
                row["counter_usd"] = json!(counted);
                row["drift_usd"] = json!(format_signed(Nanos(counted.0.saturating_sub(spent.0))));
            }
            rows.push(row);
        }
        ok(json!({ "spend": rows }))
    }

    pub(crate) async fn list_alerts(&self, org_id: OrgId) -> Result<Reply, ApiError> {
        self.require_org(&org_id).await?;
        let alerts = self.store(move |s| s.alerts(&org_id)).await?;
        ok(json!({ "alerts": alerts.iter().map(alert_json).collect::<Vec<_>>() }))
    }

    /// A new cap counts the spend already made in its window: its counter starts from the ledger
    /// before any request can reserve on it (the cap is published after this).
    async fn seed_current_window(&self, cap: &Cap) -> Result<(), ApiError> {
        let Some(counters) = self.inner.counters.get() else { return Ok(()) };
        let at = now();
        let window = CapWindow {
            org: cap.org_id.clone(),
            cap: cap.id.clone(),
            start: cap.window.start(at),
            end: cap.window.end(at),
        };
        let sources = self.spend_sources();
        let unseeded = Unseeded::fresh(window.clone());
        let rebuilt = self
            .off_thread(move || crate::rebuild::rebuild_window(&sources, &window.cap, window.span(), &[]))
            .await?;
        counters.seed(&unseeded, rebuilt.unwrap_or(Rebuilt { total: Nanos::ZERO, last_start: None }));
        Ok(())
    }

    async fn require_cap(&self, id: CapId) -> Result<CapRecord, ApiError> {
        let missing = no_cap(&id);
        self.store(move |s| s.cap(&id)).await?.ok_or(missing)
    }

    fn new_id<T>(&self, prefix: &str, parse: fn(&str) -> Option<T>) -> Result<T, ApiError> {
        crate::admin::new_id(prefix, parse)
    }
}

/// A signed amount as a decimal string: "-0.0015" when the counters are behind the ledger.
fn format_signed(amount: Nanos) -> String {
    if amount.0 < 0 {
        format!("-{}", Nanos(amount.0.saturating_neg()).to_usd_string())
    } else {
        amount.to_usd_string()
    }
}

fn limit(text: &str) -> Result<Nanos, ApiError> {
    Nanos::parse_usd(text).map_err(|e| ApiError::bad_field("limit_usd", e))
}

/// Thresholds as fractions of the limit (`0.8`), kept as exact thousandths.
fn alert_at(values: &[Number]) -> Result<Vec<u32>, ApiError> {
    let bad = || ApiError::bad_field("alert_at", "expected fractions of the limit such as [0.5, 0.8, 1.0]");
    let mut permille = values
        .iter()
        .map(|n| {
            // The number's own digits, so that 0.8 is exactly 800 thousandths.
            let text = n.to_string();
            let (whole, fraction) = text.split_once('.').unwrap_or((&text, ""));
            if fraction.len() > 3 || whole.starts_with('-') || text.contains(['e', 'E']) {
                return Err(bad());
            }
            let whole: u32 = whole.parse().map_err(|_| bad())?;
            let fraction: u32 = format!("{fraction:0<3}").parse().map_err(|_| bad())?;
            let value = whole.checked_mul(1000).and_then(|w| w.checked_add(fraction)).ok_or_else(bad)?;
            if value == 0 || value > 10_000 { Err(bad()) } else { Ok(value) }
        })
        .collect::<Result<Vec<u32>, ApiError>>()?;
    permille.sort_unstable();
    permille.dedup();
    Ok(permille)
}

fn webhook(url: &str) -> Result<String, ApiError> {
    crate::admin::outbound_url(url)
        .map(|_| url.trim().to_owned())
        .map_err(|why| ApiError::bad_field("alert_webhook", why))
}

pub(crate) fn alert_json(alert: &AlertRecord) -> Value {
    json!({
        "id": alert.id,
        "cap_id": alert.cap_id,
        "org_id": alert.org_id,
        "window_start": alert.window_start,
        "threshold": permille_number(alert.threshold_permille),
        "spend_usd": alert.spend,
        "limit_usd": alert.limit,
        "raised_at": alert.raised_at,
        "delivered_at": alert.delivered_at,
        "delivery_attempts": alert.attempts,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn numbers(text: &str) -> Vec<Number> {
        serde_json::from_str(text).expect("numbers")
    }

    #[test]
    fn thresholds_are_exact_thousandths() {
        assert_eq!(alert_at(&numbers("[1.0, 0.5, 0.8, 0.8]")).ok(), Some(vec![500, 800, 1000]));
        assert_eq!(alert_at(&numbers("[0.125, 2]")).ok(), Some(vec![125, 2000]));
        for bad in ["[0]", "[-0.5]", "[0.0001]", "[11]"] {
            assert!(alert_at(&numbers(bad)).is_err(), "{bad}");
        }
        assert_eq!(permille_number(800), json!(0.8));
        assert_eq!(permille_number(1000), json!(1.0));
    }
}
