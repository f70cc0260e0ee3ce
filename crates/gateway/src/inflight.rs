//! Requests in flight on this node, by key and by organization, for `max_concurrent_requests`: a
//! [`Slot`] taken once a request is admitted and given back when it is dropped (the answer's last
//! byte, its client leaving, a refusal, a Realtime session's close). The rule is
//! `core::concurrency::check`; only keys and organizations with a limit are counted.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use recovea_core::Admitted;
use recovea_core::concurrency::{self, Holder};
use recovea_core::ids::{KeyId, OrgId};
use recovea_upstream::ResponseBody;

/// The counts of this node's requests in flight, of the keys and organizations that have a limit.
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    counts: Mutex<Counts>,
}

#[derive(Debug, Default)]
struct Counts {
    keys: HashMap<KeyId, u32>,
    orgs: HashMap<OrgId, u32>,
}

/// A request's place among those in flight; given back on drop.
#[derive(Debug)]
pub(crate) struct Slot {
    in_flight: Arc<InFlight>,
    key: Option<KeyId>,
    org: Option<OrgId>,
}

/// Why a slot was refused: which limit, and its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Full {
    pub(crate) holder: Holder,
    pub(crate) limit: u32,
}

impl InFlight {
    /// A slot for `admitted`, or which limit is full. `None`: neither the key nor its
    /// organization has a limit, and nothing is counted.
    pub(crate) fn take(self: &Arc<Self>, admitted: &Admitted) -> Result<Option<Slot>, Full> {
        let (key_limit, org_limit) = (admitted.max_concurrent_requests, admitted.org.max_concurrent_requests);
        if key_limit.is_none() && org_limit.is_none() {
            return Ok(None);
        }
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        let key_now = counts.keys.get(&admitted.key_id).copied().unwrap_or(0);
        let org_now = counts.orgs.get(&admitted.org.id).copied().unwrap_or(0);
        concurrency::check(key_now, key_limit, org_now, org_limit).map_err(|holder| Full {
            holder,
            limit: match holder {
                Holder::Key => key_limit,
                Holder::Organization => org_limit,
            }
            .unwrap_or(0),
        })?;
        let key = key_limit.map(|_| admitted.key_id.clone());
        let org = org_limit.map(|_| admitted.org.id.clone());
        if let Some(key) = &key {
            *counts.keys.entry(key.clone()).or_default() += 1;
        }
        if let Some(org) = &org {
            *counts.orgs.entry(org.clone()).or_default() += 1;
        }
        Ok(Some(Slot { in_flight: Arc::clone(self), key, org }))
    }

    /// How many requests of `key` are counted in flight (0 when it has no limit).
    #[cfg(test)]
    fn of_key(&self, key: &KeyId) -> u32 {
        self.counts.lock().unwrap_or_else(PoisonError::into_inner).keys.get(key).copied().unwrap_or(0)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut counts = self.in_flight.counts.lock().unwrap_or_else(PoisonError::into_inner);
        fn release<K: std::hash::Hash + Eq>(map: &mut HashMap<K, u32>, id: Option<&K>) {
            let Some(id) = id else { return };
            if let Some(n) = map.get_mut(id) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    map.remove(id);
                }
            }
        }
        release(&mut counts.keys, self.key.as_ref());
        release(&mut counts.orgs, self.org.as_ref());
    }
}

/// `body` holding `slot` until it ends, fails or is dropped.
pub(crate) fn held_by(body: ResponseBody, slot: Option<Slot>) -> ResponseBody {
    match slot {
        None => body,
        Some(slot) => recovea_upstream::on_end(body, move |_| drop(slot)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use recovea_core::credential::CredentialHeader;
    use recovea_core::snapshot::Org;

    fn admitted(key: &str, key_limit: Option<u32>, org: &Arc<Org>) -> Admitted {
        Admitted {
            key_id: KeyId::parse(key).expect("id"),
            org: Arc::clone(org),
            credential_header: CredentialHeader::AuthorizationBearer,
            limits: Default::default(),
            allowed_models: None,
            allowed_endpoints: None,
            max_concurrent_requests: key_limit,
        }
    }

    fn org(limit: Option<u32>) -> Arc<Org> {
        Arc::new(Org {
            id: OrgId::parse("org_a").expect("id"),
            providers: Box::default(),
            caps: Box::default(),
            allowed_models: None,
            allowed_endpoints: None,
            max_concurrent_requests: limit,
        })
    }

    #[test]
    fn slots_are_given_back_on_drop_and_counted_per_key_and_organization() {
        let in_flight = Arc::new(InFlight::default());
        let org = org(Some(3));
        let (a, b) = (admitted("key_a", Some(2), &org), admitted("key_b", None, &org));
        let first = in_flight.take(&a).expect("room").expect("counted");
        let second = in_flight.take(&a).expect("room").expect("counted");
        assert_eq!(in_flight.take(&a).err(), Some(Full { holder: Holder::Key, limit: 2 }));
        let third = in_flight.take(&b).expect("room for the organization's third");
        assert_eq!(in_flight.take(&b).err(), Some(Full { holder: Holder::Organization, limit: 3 }));
        drop(first);
        assert_eq!(in_flight.of_key(&a.key_id), 1);
        assert!(in_flight.take(&b).is_ok_and(|slot| slot.is_some()), "a slot given back is free again");
        drop((second, third));
        let counts = in_flight.counts.lock().expect("lock");
        assert!(counts.keys.is_empty() && counts.orgs.is_empty(), "nothing is kept of idle keys");
    }

    #[test]
    fn nothing_is_counted_without_a_limit() {
        let in_flight = Arc::new(InFlight::default());
        let free = admitted("key_a", None, &org(None));
        assert!(in_flight.take(&free).expect("no limit").is_none());
        assert!(in_flight.counts.lock().expect("lock").keys.is_empty());
    }
}
