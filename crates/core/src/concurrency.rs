//! Requests in flight: the rule for `max_concurrent_requests` on a key and on an organization.
//! The counting is the node's (`gateway::inflight`): the limit holds per node, not across nodes.

/// Which limit refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holder {
    Key,
    Organization,
}

/// Whether one more request may start, given how many of the key's and of its organization's are
/// in flight now and their limits (`None`: no limit). The key's limit is checked first.
pub fn check(
    key_in_flight: u32,
    key_limit: Option<u32>,
    org_in_flight: u32,
    org_limit: Option<u32>,
) -> Result<(), Holder> {
    if key_limit.is_some_and(|limit| key_in_flight >= limit) {
        return Err(Holder::Key);
    }
    if org_limit.is_some_and(|limit| org_in_flight >= limit) {
        return Err(Holder::Organization);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_limit_admits_that_many_and_refuses_the_next() {
        assert_eq!(check(0, Some(2), 0, None), Ok(()));
        assert_eq!(check(1, Some(2), 1, None), Ok(()));
        assert_eq!(check(2, Some(2), 2, None), Err(Holder::Key));
        assert_eq!(check(0, None, 3, Some(3)), Err(Holder::Organization));
        assert_eq!(check(5, Some(1), 5, Some(1)), Err(Holder::Key), "the key's limit is named first");
        assert_eq!(check(0, Some(0), 0, None), Err(Holder::Key), "zero admits nothing");
        assert_eq!(check(u32::MAX, None, u32::MAX, None), Ok(()), "no limit, no refusal");
    }

    proptest! {
        #[test]
        fn admitted_exactly_when_both_are_below_their_limits(
            key in 0u32..10, key_limit in prop::option::of(0u32..10),
            org in 0u32..10, org_limit in prop::option::of(0u32..10),
        ) {
            let below = |n: u32, limit: Option<u32>| limit.is_none_or(|l| n < l);
            prop_assert_eq!(check(key, key_limit, org, org_limit).is_ok(), below(key, key_limit) && below(org, org_limit));
        }
    }
}
