//! Secure randomness for ids, secrets and nonces, from the operating system.

use ring::rand::{SecureRandom, SystemRandom};

#[derive(Debug)]
pub struct RandomUnavailable;

impl std::fmt::Display for RandomUnavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the operating system's random generator failed")
    }
}

impl std::error::Error for RandomUnavailable {}

pub fn bytes<const N: usize>() -> Result<[u8; N], RandomUnavailable> {
    let mut out = [0u8; N];
    SystemRandom::new().fill(&mut out).map_err(|_| RandomUnavailable)?;
    Ok(out)
}

/// `prefix` followed by `len` random base62 characters: ids, key secrets, tokens.
pub fn token(prefix: &str, len: usize) -> Result<String, RandomUnavailable> {
    let mut out = String::with_capacity(prefix.len() + len);
    out.push_str(prefix);
    let target = prefix.len() + len;
    while out.len() < target {
        for c in bytes::<64>()?.into_iter().filter_map(recovea_core::ids::base62_char) {
            if out.len() == target {
                break;
            }
            out.push(c);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_have_the_prefix_and_length_asked_for() {
        let a = token("rk_", 43).expect("random");
        let b = token("rk_", 43).expect("random");
        assert_eq!(a.len(), 46);
        assert!(recovea_core::keys::is_well_formed(&a));
        assert_ne!(a, b);
    }
}
