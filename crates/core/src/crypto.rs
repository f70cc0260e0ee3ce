//! Sealing provider keys under the master key (AES-256-GCM), at rest and on the wire.

use ring::aead::{AES_256_GCM, Aad, LessSafeKey, Nonce, UnboundKey};

/// The length of the random nonce every sealing takes.
pub const NONCE_LEN: usize = ring::aead::NONCE_LEN;

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
        crate::hex::decode(hex.trim())
            .and_then(|bytes| <[u8; 32]>::try_from(bytes).ok())
            .map(Self)
            .ok_or(MasterKeyError::BadFormat)
    }

    pub fn to_hex(&self) -> String {
        crate::hex::encode(&self.0)
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

/// What a sealed provider key is bound to: its owner and name, so it opens only in its own row.
pub fn provider_key_context(org_id: &str, name: &str) -> Vec<u8> {
    format!("provider-key/{org_id}/{name}").into_bytes()
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

/// What may be shown of a URL an operator gave (a credential's `base_url`): its credentials, if
/// it carries any (`https://user:password@host/`), replaced by `***`.
pub fn url_shown(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_owned() };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://***{}", &rest[at..]),
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_urls_credentials_are_never_shown() {
        assert_eq!(url_shown("https://llm.internal:8443/v1"), "https://llm.internal:8443/v1");
        assert_eq!(url_shown("https://user:hunter2@llm.internal/v1"), "https://***@llm.internal/v1");
        assert_eq!(url_shown("https://tok3n@llm.internal"), "https://***@llm.internal");
        assert_eq!(url_shown("https://a:b@c@llm.internal/p@q?x=@y"), "https://***@llm.internal/p@q?x=@y");
        assert_eq!(url_shown("not a url"), "not a url");
    }

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
