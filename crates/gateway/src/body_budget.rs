//! The node's memory for request bodies (`--body-memory`): a body is buffered whole before it is
//! read, and one tenant sending many large bodies slowly must not take a shared node's memory.
//!
//! A body that did not come whole with its head holds room for its length before the gateway
//! reads on (room for what has come so far, and then for what comes, when it does not say its
//! length). Room is held from two pools at once: the node's, and its organization's share of it
//! (half the node's), so that one organization can never hold it all. A body that finds no room
//! waits without being read (the client's sending is held back by TCP, or HTTP/2's flow control)
//! until room is freed or its time to be read runs out. The room is freed with the last copy of
//! the body's bytes ([`Bytes::from_owner`]), so a body held on to after the request is read
//! (sent to the provider, kept for a retry) is counted as long as it lives.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use recovea_core::ids::OrgId;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// What the budget counts in: a permit a KiB, so that a `u32` of permits covers any body.
const UNIT: u64 = 1024;

/// The organization's share of the node's budget: one part in this many.
const SHARE_DIVISOR: u64 = 2;

/// The budget of one node.
pub(crate) struct BodyBudget {
    node: Arc<Semaphore>,
    share_units: u32,
    /// Each organization's pool, made at its first large body; `None`: requests passed through
    /// unadmitted (fail-open), which share one. Bounded by the organizations the operator made.
    tenants: Mutex<HashMap<Option<OrgId>, Arc<Semaphore>, foldhash::fast::RandomState>>,
}

/// Room held for one body: freed when dropped.
pub(crate) struct Room {
    node: OwnedSemaphorePermit,
    tenant: OwnedSemaphorePermit,
}

impl BodyBudget {
    /// A budget of `bytes`, at least one KiB.
    pub(crate) fn new(bytes: u64) -> Self {
        let units = units(bytes).max(1);
        Self {
            node: Arc::new(Semaphore::new(units as usize)),
            share_units: (units / SHARE_DIVISOR as u32).max(1),
            tenants: Mutex::default(),
        }
    }

    /// Room for `bytes` of `tenant`'s body, once there is some.
    pub(crate) async fn hold(&self, tenant: Option<&OrgId>, bytes: u64) -> Room {
        let want = units(bytes).min(self.share_units);
        let pool = self.pool(tenant);
        // The tenant's share first: a tenant waiting for its own share holds none of the node's.
        let tenant = pool.acquire_many_owned(want).await.expect("the budget's semaphores are never closed");
        let node = Arc::clone(&self.node).acquire_many_owned(want).await.expect("never closed");
        Room { node, tenant }
    }

    fn pool(&self, tenant: Option<&OrgId>) -> Arc<Semaphore> {
        let mut tenants = self.tenants.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let pool = tenants
            .entry(tenant.cloned())
            .or_insert_with(|| Arc::new(Semaphore::new(self.share_units as usize)));
        Arc::clone(pool)
    }
}

impl Room {
    /// One room for what `self` and `more` held.
    pub(crate) fn merge(&mut self, more: Room) {
        self.node.merge(more.node);
        self.tenant.merge(more.tenant);
    }

    /// How many bytes it holds room for.
    pub(crate) fn bytes(&self) -> u64 {
        self.node.num_permits() as u64 * UNIT
    }

    /// `body`, with this room freed when its last copy is dropped.
    pub(crate) fn keep(self, body: Vec<u8>) -> Bytes {
        Bytes::from_owner(Held { body, _room: self })
    }
}

/// A body and the room it holds.
struct Held {
    body: Vec<u8>,
    _room: Room,
}

impl AsRef<[u8]> for Held {
    fn as_ref(&self) -> &[u8] {
        &self.body
    }
}

fn units(bytes: u64) -> u32 {
    u32::try_from(bytes.div_ceil(UNIT)).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn org(id: &str) -> OrgId {
        OrgId::parse(id).expect("id")
    }

    #[tokio::test]
    async fn one_organization_holds_half_and_another_gets_the_rest() {
        let budget = BodyBudget::new(8 * UNIT);
        let greedy = org("org_greedy");
        let first = budget.hold(Some(&greedy), 4 * UNIT).await;
        assert_eq!(first.bytes(), 4 * UNIT);
        let more = tokio::time::timeout(Duration::from_millis(50), budget.hold(Some(&greedy), UNIT)).await;
        assert!(more.is_err(), "past its share, an organization waits");
        let other =
            tokio::time::timeout(Duration::from_millis(50), budget.hold(Some(&org("org_other")), 4 * UNIT))
                .await
                .expect("the other half is the other organization's to take");
        drop(first);
        let again =
            tokio::time::timeout(Duration::from_millis(50), budget.hold(Some(&greedy), 4 * UNIT)).await;
        assert!(again.is_ok(), "room freed is room again");
        drop(other);
    }

    #[tokio::test]
    async fn room_is_freed_with_the_last_copy_of_the_body() {
        let budget = BodyBudget::new(2 * UNIT);
        let room = budget.hold(None, UNIT).await;
        let body = room.keep(vec![7; 1024]);
        let copy = body.clone();
        drop(body);
        let waiting = tokio::time::timeout(Duration::from_millis(50), budget.hold(None, UNIT)).await;
        assert!(waiting.is_err(), "a copy still lives: the room is still held");
        assert_eq!(&copy[..3], &[7, 7, 7]);
        drop(copy);
        let held = tokio::time::timeout(Duration::from_millis(50), budget.hold(None, UNIT)).await;
        assert!(held.is_ok());
    }

    #[tokio::test]
    async fn a_growing_body_holds_what_it_grew_by() {
        let budget = BodyBudget::new(8 * UNIT);
        let tenant = org("org_a");
        let mut room = budget.hold(Some(&tenant), UNIT).await;
        room.merge(budget.hold(Some(&tenant), 2 * UNIT + 1).await);
        assert_eq!(room.bytes(), 4 * UNIT);
        assert_eq!(budget.node.available_permits(), 4);
    }
}
