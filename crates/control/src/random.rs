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

/// An endless source of secure random bytes, for minting ids and secrets.
pub fn random_byte() -> impl FnMut() -> u8 {
    let rng = SystemRandom::new();
    let mut buffer = [0u8; 64];
    let mut used = buffer.len();
    move || {
        if used == buffer.len() {
            // Continuing past a failed system generator with weaker bytes is not an option.
            rng.fill(&mut buffer).expect("the operating system's random generator failed");
            used = 0;
        }
        used += 1;
        buffer[used - 1]
    }
}
