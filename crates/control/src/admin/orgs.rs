//! `/orgs` and `/orgs/{org}`: organizations, their allowlists and their limit of requests in flight.

use recovea_core::ids::OrgId;
use recovea_store::OrgRecord;
use recovea_store::audit::org_json;
use serde_json::{Value, json};

use crate::admin::access::{self, Scope};
use crate::admin::members::{allowed_endpoints, allowed_models, name_field, positive, rules_patch};
use crate::admin::requests::{NewOrg, OrgPatch};
use crate::admin::{Caller, Reply, created, new_id, no_org, now, ok};
use crate::{ApiError, Control};

impl Control {
    pub(crate) async fn create_org(&self, caller: Caller, body: NewOrg) -> Result<Reply, ApiError> {
        let org = OrgRecord {
            id: new_id(OrgId::PREFIX, OrgId::parse)?,
            name: name_field("name", body.name)?,
            created_at: now(),
            allowed_models: allowed_models(body.allowed_models)?,
            allowed_endpoints: allowed_endpoints(body.allowed_endpoints)?,
            max_concurrent_requests: positive("max_concurrent_requests", body.max_concurrent_requests)?,
        };
        let (row, audit) = (org.clone(), caller.audit()?);
        self.store(move |s| s.create_org(&row, &audit)).await?;
        created(org_json(&org))
    }

    /// The organizations `scope` reaches: every one, or its own alone.
    pub(crate) async fn list_orgs(&self, scope: &Scope) -> Result<Reply, ApiError> {
        let orgs = match scope {
            Scope::Everything => self.store(|s| s.list_orgs()).await?,
            Scope::Org(id) => {
                let id = id.clone();
                self.store(move |s| s.org(&id)).await?.into_iter().collect()
            }
        };
        ok(json!({ "orgs": orgs.iter().map(org_json).collect::<Vec<_>>() }))
    }

    pub(crate) async fn get_org(&self, id: OrgId) -> Result<Reply, ApiError> {
        ok(org_json(&self.require_org(&id).await?))
    }

    pub(crate) async fn update_org(
        &self,
        caller: Caller,
        scope: &Scope,
        id: OrgId,
        patch: OrgPatch<Value, Value>,
    ) -> Result<Reply, ApiError> {
        access::org_patch(scope, patch.max_concurrent_requests.is_some())?;
        let current = self.require_org(&id).await?;
        if patch.allowed_models.is_none()
            && patch.allowed_endpoints.is_none()
            && patch.max_concurrent_requests.is_none()
        {
            return ok(org_json(&current));
        }
        // Validated before anything is saved, so that a bad member changes nothing.
        let rules = rules_patch(
            current.rules(),
            patch.allowed_models,
            patch.allowed_endpoints,
            patch.max_concurrent_requests,
        )?;
        let missing = no_org(&id);
        let audit = caller.audit()?;
        let org = self.store(move |s| s.set_org_rules(&id, &rules, &audit)).await?.ok_or(missing)?;
        ok(org_json(&org))
    }
}
