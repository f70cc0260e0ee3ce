//! The flags of a key's or an organization's rules, as the admin API's members: allowlists and
//! limits.

use recovea_control::requests::Change;

/// `--allowed-models a,b*` (or `--allowed-endpoints /v1/a,/v1/b*`) as the admin API's list; `""` is
/// the empty list (nothing).
pub(super) fn list(text: &str) -> Vec<String> {
    text.split(',').map(str::trim).filter(|m| !m.is_empty()).map(str::to_owned).collect()
}

/// An allowlist member of a patch (`allowed_models`, `allowed_endpoints`): a list, removed
/// (everything) with its `--allow-all-...` flag, or left out.
pub(super) fn list_change(list_given: Option<String>, allow_all: bool) -> Option<Change<Vec<String>>> {
    if allow_all { Some(Change::Remove) } else { list_given.map(|text| Change::Set(list(&text))) }
}

/// A limit to set, or `none` to remove it.
pub(super) fn limit_or_none(text: &str) -> Result<Change<u32>, String> {
    if text == "none" {
        return Ok(Change::Remove);
    }
    text.parse::<u32>().map(Change::Set).map_err(|_| format!("{text:?}: expected a number, or none"))
}
