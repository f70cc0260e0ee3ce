//! `GET /prices` and `PUT /prices/{model}`: the effective price table and its revisions.

use std::collections::BTreeMap;
use std::sync::Arc;

use recovea_core::pricing::{Price, PriceWire};
use serde_json::json;

use crate::admin::{Reply, created, now, ok};
use crate::{ApiError, Control};

impl Control {
    pub(crate) fn list_prices(&self) -> Result<Reply, ApiError> {
        let prices = self.inner.prices.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone();
        let table: BTreeMap<&str, PriceWire> =
            prices.table.iter().map(|(model, price)| (model, PriceWire::from(price))).collect();
        ok(json!({ "revision": prices.revision, "prices": table }))
    }

    pub(crate) async fn put_price(&self, model: &str, wire: PriceWire) -> Result<Reply, ApiError> {
        let model = model.trim();
        if model.is_empty() || model.len() > 200 {
            return Err(ApiError::BadRequest("model: expected 1 to 200 characters".into()));
        }
        Price::try_from(&wire).map_err(|e| ApiError::BadRequest(e.to_string()))?;
        let (row_model, row_wire) = (model.to_owned(), wire.clone());
        let store = Arc::clone(&self.inner.store);
        let revision = tokio::task::spawn_blocking(move || store.put_price(&row_model, &row_wire, now()))
            .await
            .map_err(ApiError::internal)??;
        let mut body = serde_json::to_value(&wire).map_err(ApiError::internal)?;
        body["model"] = json!(model);
        body["revision"] = json!(revision);
        let mut reply = created(body)?;
        reply.status = http::StatusCode::OK;
        Ok(reply)
    }
}
