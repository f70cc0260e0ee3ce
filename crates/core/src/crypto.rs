//! Sealing provider keys under the master key (AES-256-GCM), at rest and on the wire.

use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};

/// The 32-byte key that seals every provider key. Its `Debug` never shows it.
#[derive(Clone)]
pub struct MasterKey([u8; 32]);

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MasterKeyError {
    /// Not 64 hexadecimal characters.
    BadFormat,
}

impl std::fmt::Display for MasterKeyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the master key must be 64 hexadecimal characters (32 bytes)")
    }
}

impl std::error::Error for MasterKeyError {}

/// A sealed value could not be opened: wrong master key, or tampered with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenError;

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a sealed secret could not be opened with this master key")
    }
}

impl std::error::Error for OpenError {}

impl std::fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MasterKey(..)")
    }
}

impl MasterKey {
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    pub fn parse_hex(hex: &str) -> Result<Self, MasterKeyError> {
        let hex = hex.trim();
        if hex.len() != 64 {
            return Err(MasterKeyError::BadFormat);
        }
        let mut out = [0u8; 32];
        for (i, pair) in hex.as_bytes().chunks(2).enumerate() {
            let high = hex_value(pair[0]).ok_or(MasterKeyError::BadFormat)?;
            let low = hex_value(pair[1]).ok_or(MasterKeyError::BadFormat)?;
            out[i] = high << 4 | low;
        }
        Ok(Self(out))
    }

    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn aead_key(&self) -> LessSafeKey {
        // AES-256 takes exactly 32 bytes, which is what we hold.
        LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &self.0).expect("a 32-byte key is valid for AES-256"))
    }

    /// Seals `plaintext`, bound to `context` (for instance the owner's id and the credential name) so
    /// that a sealed value moved to another row does not open there. Output: nonce, then ciphertext
    /// and tag. The nonce must never repeat under one key: pass 12 random bytes.
    pub fn seal(&self, nonce: [u8; NONCE_LEN], context: &[u8], plaintext: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(NONCE_LEN + plaintext.len() + AES_256_GCM.tag_len());
        out.extend_from_slice(&nonce);
        let mut body = plaintext.to_vec();
        self.aead_key()
            .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::from(context), &mut body)
            .expect("AES-GCM sealing fails only for inputs over 64 GiB");
        out.extend_from_slice(&body);
        out
    }

    pub fn open(&self, context: &[u8], sealed: &[u8]) -> Result<Vec<u8>, OpenError> {
        if sealed.len() < NONCE_LEN {
            return Err(OpenError);
        }
        let (nonce, body) = sealed.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| OpenError)?;
        let mut body = body.to_vec();
        let plain =
            self.aead_key().open_in_place(nonce, Aad::from(context), &mut body).map_err(|_| OpenError)?;
        Ok(plain.to_vec())
    }
}

fn hex_value(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// What may be shown of a provider key: its last four characters.
pub fn key_hint(api_key: &str) -> String {
    let chars: Vec<char> = api_key.chars().collect();
    if chars.len() < 12 {
        return "...".to_owned();
    }
    let tail: String = chars[chars.len() - 4..].iter().collect();
    format!("...{tail}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> MasterKey {
        MasterKey::parse_hex(&"ab".repeat(32)).expect("valid hex")
    }

    #[test]
    fn sealed_values_open_only_in_their_context() {
        let sealed = key().seal([1; 12], b"org_a/openai", b"sk-secret");
        assert!(!sealed.windows(9).any(|w| w == b"sk-secret"));
        assert_eq!(key().open(b"org_a/openai", &sealed), Ok(b"sk-secret".to_vec()));
        assert_eq!(key().open(b"org_b/openai", &sealed), Err(OpenError));
        let other = MasterKey::from_bytes([9; 32]);
        assert_eq!(other.open(b"org_a/openai", &sealed), Err(OpenError));
        assert_eq!(key().open(b"org_a/openai", &sealed[..5]), Err(OpenError));
    }

    #[test]
    fn master_key_hex_round_trips_and_rejects_junk() {
        assert_eq!(key().to_hex(), "ab".repeat(32));
        assert_eq!(MasterKey::parse_hex("ab").err(), Some(MasterKeyError::BadFormat));
        assert_eq!(MasterKey::parse_hex(&"zz".repeat(32)).err(), Some(MasterKeyError::BadFormat));
        assert_eq!(format!("{:?}", key()), "MasterKey(..)");
    }

    #[test]
    fn hints_show_only_the_tail() {
        assert_eq!(key_hint("sk-proj-abcdefghijklmnop"), "...mnop");
        assert_eq!(key_hint("short"), "...");
    }
}
