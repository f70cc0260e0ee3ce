//! ID tokens checked as OpenID Connect Core 1.0 (section 3.1.3.7) asks, against the provider's keys
//! and a clock passed in: signature, issuer, audience and authorized party, times, nonce.
//!
//! Signatures are `ring`'s. Only asymmetric algorithms are taken, named by the token and matched
//! to a key of their own kind: no `none`, and no HMAC, whose key would be the client secret that
//! any holder of it could sign with.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::signature::{self, RsaPublicKeyComponents, UnparsedPublicKey};
use serde::Deserialize;
use serde_json::{Map, Value};

use super::flow::{printable, same_secret};

/// How far the provider's clock and ours may disagree: a token issued "in the future" by this
/// much, or expired by this much, still passes.
pub const LEEWAY: Duration = Duration::from_secs(60);
/// An ID token is a few KiB at most; anything longer is refused before it is decoded.
const MAX_TOKEN_BYTES: usize = 64 << 10;

/// The signature algorithms taken (RFC 7518, section 3.1; `Ed25519` as RFC 9864 names it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Algorithm {
    Rs256,
    Rs384,
    Rs512,
    Ps256,
    Ps384,
    Ps512,
    Es256,
    Es384,
    Ed25519,
}

impl Algorithm {
    fn named(name: &str) -> Option<Self> {
        Some(match name {
            "RS256" => Algorithm::Rs256,
            "RS384" => Algorithm::Rs384,
            "RS512" => Algorithm::Rs512,
            "PS256" => Algorithm::Ps256,
            "PS384" => Algorithm::Ps384,
            "PS512" => Algorithm::Ps512,
            "ES256" => Algorithm::Es256,
            "ES384" => Algorithm::Es384,
            "EdDSA" | "Ed25519" => Algorithm::Ed25519,
            _ => return None,
        })
    }

    /// Whether `key` verifies this algorithm's signatures, and if so, whether it does for these.
    fn verifies(self, key: &PublicKey, message: &[u8], signature: &[u8]) -> Option<bool> {
        let rsa = |params: &'static signature::RsaParameters| match key {
            PublicKey::Rsa { n, e } => {
                Some(RsaPublicKeyComponents { n, e }.verify(params, message, signature).is_ok())
            }
            _ => None,
        };
        let other = |algorithm: &'static dyn signature::VerificationAlgorithm, point: &[u8]| {
            Some(UnparsedPublicKey::new(algorithm, point).verify(message, signature).is_ok())
        };
        match (self, key) {
            (Algorithm::Rs256, _) => rsa(&signature::RSA_PKCS1_2048_8192_SHA256),
            (Algorithm::Rs384, _) => rsa(&signature::RSA_PKCS1_2048_8192_SHA384),
            (Algorithm::Rs512, _) => rsa(&signature::RSA_PKCS1_2048_8192_SHA512),
            (Algorithm::Ps256, _) => rsa(&signature::RSA_PSS_2048_8192_SHA256),
            (Algorithm::Ps384, _) => rsa(&signature::RSA_PSS_2048_8192_SHA384),
            (Algorithm::Ps512, _) => rsa(&signature::RSA_PSS_2048_8192_SHA512),
            (Algorithm::Es256, PublicKey::P256(point)) => other(&signature::ECDSA_P256_SHA256_FIXED, point),
            (Algorithm::Es384, PublicKey::P384(point)) => other(&signature::ECDSA_P384_SHA384_FIXED, point),
            (Algorithm::Ed25519, PublicKey::Ed25519(point)) => other(&signature::ED25519, point),
            (Algorithm::Es256 | Algorithm::Es384 | Algorithm::Ed25519, _) => None,
        }
    }
}

/// A provider's signing keys (its JWK Set), those of kinds we verify.
#[derive(Clone, Debug, Default)]
pub struct KeySet {
    keys: Vec<Jwk>,
}

#[derive(Clone, Debug)]
struct Jwk {
    kid: Option<String>,
    /// The one algorithm the key is for, when the provider says.
    alg: Option<String>,
    key: PublicKey,
}

#[derive(Clone, Debug)]
enum PublicKey {
    Rsa {
        n: Vec<u8>,
        e: Vec<u8>,
    },
    /// Uncompressed points, `04 || x || y`.
    P256(Vec<u8>),
    P384(Vec<u8>),
    Ed25519(Vec<u8>),
}

/// A JWK as RFC 7517 writes it; only the members we read.
#[derive(Deserialize)]
struct JwkText {
    kty: String,
    kid: Option<String>,
    #[serde(rename = "use")]
    usage: Option<String>,
    key_ops: Option<Vec<String>>,
    alg: Option<String>,
    crv: Option<String>,
    n: Option<String>,
    e: Option<String>,
    x: Option<String>,
    y: Option<String>,
}

impl KeySet {
    /// Reads a JWK Set (`{"keys": [...]}`). Keys for encryption, and keys of kinds or curves we do
    /// not verify, are left out rather than refused: providers publish both.
    pub fn parse(json: &[u8]) -> Result<Self, String> {
        #[derive(Deserialize)]
        struct Set {
            keys: Vec<Value>,
        }
        let set: Set = serde_json::from_slice(json).map_err(|e| format!("not a JWK Set: {e}"))?;
        let keys = set
            .keys
            .into_iter()
            .filter_map(|key| serde_json::from_value::<JwkText>(key).ok())
            .filter_map(JwkText::into_signing_key)
            .collect();
        Ok(Self { keys })
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

impl JwkText {
    fn into_signing_key(self) -> Option<Jwk> {
        if self.usage.as_deref().is_some_and(|usage| usage != "sig")
            || self.key_ops.as_ref().is_some_and(|ops| !ops.iter().any(|op| op == "verify"))
        {
            return None;
        }
        let bytes = |member: &Option<String>| member.as_deref().and_then(decode);
        let point = |len: usize| {
            let (x, y) = (bytes(&self.x)?, bytes(&self.y)?);
            (x.len() == len && y.len() == len).then(|| [&[4u8][..], &x, &y].concat())
        };
        let key = match (self.kty.as_str(), self.crv.as_deref()) {
            ("RSA", _) => PublicKey::Rsa {
                n: without_leading_zeros(bytes(&self.n)?),
                e: without_leading_zeros(bytes(&self.e)?),
            },
            ("EC", Some("P-256")) => PublicKey::P256(point(32)?),
            ("EC", Some("P-384")) => PublicKey::P384(point(48)?),
            ("OKP", Some("Ed25519")) => PublicKey::Ed25519(bytes(&self.x).filter(|x| x.len() == 32)?),
            _ => return None,
        };
        Some(Jwk { kid: self.kid, alg: self.alg, key })
    }
}

/// Some libraries write an RSA modulus with a leading zero byte (RFC 7518, section 6.3.1.1 warns
/// of it); `ring` wants none.
fn without_leading_zeros(mut bytes: Vec<u8>) -> Vec<u8> {
    let zeros = bytes.iter().take_while(|&&b| b == 0).count();
    bytes.drain(..zeros);
    bytes
}

/// base64url without padding (RFC 7515, section 2), tolerating the padding some write anyway.
fn decode(text: &str) -> Option<Vec<u8>> {
    URL_SAFE_NO_PAD.decode(text.trim_end_matches('=')).ok()
}

/// What the token must say to be ours.
#[derive(Clone, Copy, Debug)]
pub struct Expected<'a> {
    /// The configured issuer, compared byte for byte.
    pub issuer: &'a str,
    pub client_id: &'a str,
    /// The nonce of the login attempt the token answers.
    pub nonce: &'a str,
}

/// Why an ID token is refused. The texts are for the log: they hold no part of the token but its
/// algorithm's and key's names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TokenError {
    Malformed(&'static str),
    UnsupportedAlgorithm(String),
    /// No key of the set has this id (or, without one, fits the algorithm): the provider may have
    /// rotated its keys since we read them.
    UnknownKey {
        kid: Option<String>,
    },
    BadSignature,
    WrongIssuer,
    WrongAudience,
    WrongAuthorizedParty,
    Expired,
    IssuedInTheFuture,
    NotYetValid,
    WrongNonce,
    MissingClaim(&'static str),
}

impl fmt::Display for TokenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TokenError::Malformed(why) => write!(f, "the ID token is malformed: {why}"),
            TokenError::UnsupportedAlgorithm(alg) => {
                write!(f, "the ID token's algorithm {alg:?} is not taken")
            }
            TokenError::UnknownKey { kid: Some(kid) } => {
                write!(f, "no key of the provider has the id {kid:?}")
            }
            TokenError::UnknownKey { kid: None } => f.write_str("no key of the provider fits the ID token"),
            TokenError::BadSignature => f.write_str("the ID token's signature does not verify"),
            TokenError::WrongIssuer => f.write_str("the ID token is from another issuer"),
            TokenError::WrongAudience => f.write_str("the ID token is not for this client"),
            TokenError::WrongAuthorizedParty => f.write_str("the ID token was issued to another party (azp)"),
            TokenError::Expired => f.write_str("the ID token has expired"),
            TokenError::IssuedInTheFuture => f.write_str("the ID token is issued in the future"),
            TokenError::NotYetValid => f.write_str("the ID token is not valid yet (nbf)"),
            TokenError::WrongNonce => f.write_str("the ID token answers another login (nonce)"),
            TokenError::MissingClaim(claim) => write!(f, "the ID token has no {claim} claim"),
        }
    }
}

impl std::error::Error for TokenError {}

/// The token's claims, once its signature verifies with a key of `keys` and its claims meet
/// `expected` at `now`.
pub fn verify(
    token: &str,
    keys: &KeySet,
    expected: &Expected<'_>,
    now: SystemTime,
) -> Result<Map<String, Value>, TokenError> {
    if token.len() > MAX_TOKEN_BYTES {
        return Err(TokenError::Malformed("too long"));
    }
    let mut parts = token.split('.');
    let (Some(header), Some(payload), Some(signature), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(TokenError::Malformed("not three parts (an encrypted ID token is not taken)"));
    };
    let header = object(header).ok_or(TokenError::Malformed("the header is not a JSON object"))?;
    // Extensions the issuer says we must understand: we understand none.
    if header.contains_key("crit") {
        return Err(TokenError::Malformed("a critical header extension"));
    }
    let alg_name = header.get("alg").and_then(Value::as_str).ok_or(TokenError::Malformed("no alg"))?;
    let algorithm =
        Algorithm::named(alg_name).ok_or_else(|| TokenError::UnsupportedAlgorithm(printable(alg_name)))?;
    let kid = match header.get("kid") {
        None => None,
        Some(Value::String(kid)) => Some(kid.as_str()),
        Some(_) => return Err(TokenError::Malformed("kid is not a string")),
    };
    let signature = decode(signature).ok_or(TokenError::Malformed("the signature is not base64url"))?;
    let signed = &token.as_bytes()[..header_and_payload_len(token)];
    let mut fitting = keys
        .keys
        .iter()
        .filter(|jwk| kid.is_none_or(|kid| jwk.kid.as_deref() == Some(kid)))
        .filter(|jwk| jwk.alg.as_deref().is_none_or(|alg| alg == alg_name))
        .filter_map(|jwk| algorithm.verifies(&jwk.key, signed, &signature))
        .peekable();
    if fitting.peek().is_none() {
        return Err(TokenError::UnknownKey { kid: kid.map(printable) });
    }
    if !fitting.any(|verified| verified) {
        return Err(TokenError::BadSignature);
    }
    let claims = object(payload).ok_or(TokenError::Malformed("the payload is not a JSON object"))?;
    check_claims(&claims, expected, now)?;
    Ok(claims)
}

/// The length of `header.payload`, the signed part.
fn header_and_payload_len(token: &str) -> usize {
    token.rfind('.').unwrap_or(0)
}

fn object(part: &str) -> Option<Map<String, Value>> {
    match serde_json::from_slice(&decode(part)?) {
        Ok(Value::Object(map)) => Some(map),
        _ => None,
    }
}

/// OpenID Connect Core 1.0, section 3.1.3.7, items 2 to 4 and 9 to 11.
fn check_claims(
    claims: &Map<String, Value>,
    expected: &Expected<'_>,
    now: SystemTime,
) -> Result<(), TokenError> {
    if claims.get("iss").and_then(Value::as_str) != Some(expected.issuer) {
        return Err(TokenError::WrongIssuer);
    }
    let audiences: Vec<&str> = match claims.get("aud") {
        Some(Value::String(one)) => vec![one],
        Some(Value::Array(many)) => many.iter().filter_map(Value::as_str).collect(),
        _ => return Err(TokenError::WrongAudience),
    };
    if !audiences.contains(&expected.client_id) {
        return Err(TokenError::WrongAudience);
    }
    // With other audiences beside us, the token must say it was issued to us.
    match claims.get("azp").map(Value::as_str) {
        Some(Some(azp)) if azp == expected.client_id => {}
        None if audiences.len() == 1 => {}
        _ => return Err(TokenError::WrongAuthorizedParty),
    }
    let now = now.duration_since(UNIX_EPOCH).map_or(0.0, |since| since.as_secs_f64());
    let leeway = LEEWAY.as_secs_f64();
    let time = |name: &'static str| -> Result<Option<f64>, TokenError> {
        match claims.get(name) {
            None => Ok(None),
            Some(value) => {
                value.as_f64().filter(|t| t.is_finite()).map(Some).ok_or(TokenError::Malformed(name))
            }
        }
    };
    let expires = time("exp")?.ok_or(TokenError::MissingClaim("exp"))?;
    if now >= expires + leeway {
        return Err(TokenError::Expired);
    }
    let issued = time("iat")?.ok_or(TokenError::MissingClaim("iat"))?;
    if issued > now + leeway {
        return Err(TokenError::IssuedInTheFuture);
    }
    if time("nbf")?.is_some_and(|not_before| not_before > now + leeway) {
        return Err(TokenError::NotYetValid);
    }
    match claims.get("nonce").and_then(Value::as_str) {
        Some(nonce) if same_secret(nonce, expected.nonce) => {}
        _ => return Err(TokenError::WrongNonce),
    }
    match claims.get("sub").and_then(Value::as_str) {
        Some(subject) if !subject.is_empty() => Ok(()),
        _ => Err(TokenError::MissingClaim("sub")),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use proptest::prelude::*;
    use ring::rand::SystemRandom;
    use ring::signature::{EcdsaKeyPair, Ed25519KeyPair, KeyPair, RsaKeyPair};
    use serde_json::json;

    use super::*;

    /// A 2048-bit RSA key made for these tests alone (PKCS#8): `ring` cannot generate one.
    const TEST_RSA_KEY: &[u8] = include_bytes!("testdata/rsa-2048-test-key.pk8");

    pub(crate) const ISSUER: &str = "https://login.example.com";
    pub(crate) const CLIENT: &str = "recovea";
    pub(crate) const NONCE: &str = "n-0S6_WzA2Mj";

    fn b64(bytes: &[u8]) -> String {
        URL_SAFE_NO_PAD.encode(bytes)
    }

    /// A signing key and the JWK that publishes it.
    pub(crate) enum Signer {
        Ec(EcdsaKeyPair),
        Rsa(RsaKeyPair),
        Ed(Ed25519KeyPair),
    }

    impl Signer {
        pub(crate) fn es256() -> Self {
            let rng = SystemRandom::new();
            let alg = &signature::ECDSA_P256_SHA256_FIXED_SIGNING;
            let pkcs8 = EcdsaKeyPair::generate_pkcs8(alg, &rng).expect("key");
            Signer::Ec(EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref(), &rng).expect("key"))
        }

        fn rsa() -> Self {
            Signer::Rsa(RsaKeyPair::from_pkcs8(TEST_RSA_KEY).expect("the test key"))
        }

        fn ed25519() -> Self {
            let pkcs8 = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).expect("key");
            Signer::Ed(Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).expect("key"))
        }

        pub(crate) fn jwk(&self, kid: &str) -> Value {
            match self {
                Signer::Ec(pair) => {
                    let point = pair.public_key().as_ref();
                    json!({"kty": "EC", "crv": "P-256", "kid": kid, "use": "sig",
                        "x": b64(&point[1..33]), "y": b64(&point[33..])})
                }
                Signer::Rsa(pair) => {
                    let components: RsaPublicKeyComponents<Vec<u8>> = pair.public().into();
                    json!({"kty": "RSA", "kid": kid, "n": b64(&components.n), "e": b64(&components.e)})
                }
                Signer::Ed(pair) => {
                    json!({"kty": "OKP", "crv": "Ed25519", "kid": kid, "x": b64(pair.public_key().as_ref())})
                }
            }
        }

        /// `claims` signed as `alg` under `header`'s other members.
        pub(crate) fn sign(&self, alg: &str, header: Value, claims: &Value) -> String {
            let mut header = header;
            header["alg"] = json!(alg);
            let input =
                format!("{}.{}", b64(header.to_string().as_bytes()), b64(claims.to_string().as_bytes()));
            let rng = SystemRandom::new();
            let signature = match self {
                Signer::Ec(pair) => pair.sign(&rng, input.as_bytes()).expect("signs").as_ref().to_vec(),
                Signer::Rsa(pair) => {
                    let padding: &'static dyn signature::RsaEncoding = match alg {
                        "PS256" => &signature::RSA_PSS_SHA256,
                        _ => &signature::RSA_PKCS1_SHA256,
                    };
                    let mut out = vec![0; pair.public().modulus_len()];
                    pair.sign(padding, &rng, input.as_bytes(), &mut out).expect("signs");
                    out
                }
                Signer::Ed(pair) => pair.sign(input.as_bytes()).as_ref().to_vec(),
            };
            format!("{input}.{}", b64(&signature))
        }
    }

    pub(crate) fn set(jwks: &[Value]) -> KeySet {
        KeySet::parse(json!({"keys": jwks}).to_string().as_bytes()).expect("a set")
    }

    pub(crate) fn now() -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_800_000_000)
    }

    pub(crate) fn claims() -> Value {
        json!({"iss": ISSUER, "aud": CLIENT, "sub": "248289761001", "nonce": NONCE,
            "iat": 1_800_000_000u64 - 5, "exp": 1_800_000_000u64 + 300, "email": "jane@example.com"})
    }

    fn expected() -> Expected<'static> {
        Expected { issuer: ISSUER, client_id: CLIENT, nonce: NONCE }
    }

    fn with(change: impl FnOnce(&mut Value)) -> Value {
        let mut claims = claims();
        change(&mut claims);
        claims
    }

    #[test]
    fn tokens_signed_with_each_algorithm_verify() {
        let (ec, rsa, ed) = (Signer::es256(), Signer::rsa(), Signer::ed25519());
        let keys = set(&[ec.jwk("ec"), rsa.jwk("rsa"), ed.jwk("ed")]);
        assert_eq!(keys.len(), 3);
        for (signer, alg, kid) in [
            (&ec, "ES256", "ec"),
            (&rsa, "RS256", "rsa"),
            (&rsa, "PS256", "rsa"),
            (&ed, "EdDSA", "ed"),
            (&ed, "Ed25519", "ed"),
        ] {
            let token = signer.sign(alg, json!({"kid": kid, "typ": "JWT"}), &claims());
            let verified = verify(&token, &keys, &expected(), now()).unwrap_or_else(|e| panic!("{alg}: {e}"));
            assert_eq!(verified.get("email"), Some(&json!("jane@example.com")));
        }
    }

    #[test]
    fn without_a_kid_every_key_of_the_algorithms_kind_is_tried() {
        let (first, second) = (Signer::es256(), Signer::es256());
        let keys = set(&[first.jwk("a"), second.jwk("b")]);
        let token = second.sign("ES256", json!({}), &claims());
        assert!(verify(&token, &keys, &expected(), now()).is_ok());
        let stranger = Signer::es256().sign("ES256", json!({}), &claims());
        assert_eq!(verify(&stranger, &keys, &expected(), now()), Err(TokenError::BadSignature));
    }

    #[test]
    fn an_unknown_kid_asks_for_the_keys_again_and_a_forged_signature_does_not_pass() {
        let (provider, forger) = (Signer::es256(), Signer::es256());
        let keys = set(&[provider.jwk("k1")]);
        let forged = forger.sign("ES256", json!({"kid": "k2"}), &claims());
        assert_eq!(
            verify(&forged, &keys, &expected(), now()),
            Err(TokenError::UnknownKey { kid: Some("k2".into()) })
        );
        let forged = forger.sign("ES256", json!({"kid": "k1"}), &claims());
        assert_eq!(verify(&forged, &keys, &expected(), now()), Err(TokenError::BadSignature));
    }

    #[test]
    fn none_hmac_and_mismatched_key_kinds_are_refused() {
        let ec = Signer::es256();
        let keys = set(&[ec.jwk("k1")]);
        let valid = ec.sign("ES256", json!({"kid": "k1"}), &claims());
        let (_, rest) = valid.split_once('.').expect("three parts");
        for alg in ["none", "HS256"] {
            let header = b64(json!({"alg": alg, "kid": "k1"}).to_string().as_bytes());
            let token = format!("{header}.{rest}");
            assert_eq!(
                verify(&token, &keys, &expected(), now()),
                Err(TokenError::UnsupportedAlgorithm(alg.into()))
            );
        }
        // An EC key never verifies an RSA signature, even under its kid.
        let rsa = Signer::rsa().sign("RS256", json!({"kid": "k1"}), &claims());
        assert_eq!(
            verify(&rsa, &keys, &expected(), now()),
            Err(TokenError::UnknownKey { kid: Some("k1".into()) })
        );
        // A key published for one algorithm verifies no other.
        let mut jwk = Signer::rsa().jwk("r");
        jwk["alg"] = json!("PS256");
        let token = Signer::rsa().sign("RS256", json!({"kid": "r"}), &claims());
        assert_eq!(
            verify(&token, &set(&[jwk]), &expected(), now()),
            Err(TokenError::UnknownKey { kid: Some("r".into()) })
        );
    }

    #[test]
    fn encryption_keys_and_unknown_kinds_are_left_out_of_the_set() {
        let ec = Signer::es256();
        let mut encryption = ec.jwk("enc");
        encryption["use"] = json!("enc");
        let mut wrapping = ec.jwk("wrap");
        wrapping["use"] = Value::Null;
        wrapping["key_ops"] = json!(["wrapKey"]);
        let symmetric = json!({"kty": "oct", "kid": "hmac", "k": "c2VjcmV0"});
        let bad_point = json!({"kty": "EC", "crv": "P-256", "kid": "short", "x": "AQ", "y": "AQ"});
        let keys = set(&[encryption, wrapping, symmetric, bad_point, json!({"kid": 7}), ec.jwk("sig")]);
        assert_eq!(keys.len(), 1);
        assert!(KeySet::parse(b"[]").is_err());
        assert!(KeySet::parse(b"{\"keys\":{}}").is_err());
    }

    #[test]
    fn each_claim_check_refuses_with_its_own_reason() {
        let ec = Signer::es256();
        let keys = set(&[ec.jwk("k")]);
        let check = |claims: Value| {
            verify(&ec.sign("ES256", json!({"kid": "k"}), &claims), &keys, &expected(), now())
        };
        let cases: Vec<(Value, TokenError)> = vec![
            (with(|c| c["iss"] = json!("https://login.example.com/")), TokenError::WrongIssuer),
            (with(|c| c["aud"] = json!("other-client")), TokenError::WrongAudience),
            (with(|c| c["aud"] = json!(["other", "more"])), TokenError::WrongAudience),
            (with(|c| c["aud"] = json!([CLIENT, "other"])), TokenError::WrongAuthorizedParty),
            (with(|c| c["azp"] = json!("other")), TokenError::WrongAuthorizedParty),
            (with(|c| c["exp"] = json!(1_800_000_000u64 - 61)), TokenError::Expired),
            (with(|c| c["iat"] = json!(1_800_000_000u64 + 61)), TokenError::IssuedInTheFuture),
            (with(|c| c["nbf"] = json!(1_800_000_000u64 + 61)), TokenError::NotYetValid),
            (with(|c| c["nonce"] = json!("another")), TokenError::WrongNonce),
            (with(|c| c.as_object_mut().map(|o| o.remove("nonce")).map_or((), drop)), TokenError::WrongNonce),
            (
                with(|c| c.as_object_mut().map(|o| o.remove("exp")).map_or((), drop)),
                TokenError::MissingClaim("exp"),
            ),
            (
                with(|c| c.as_object_mut().map(|o| o.remove("iat")).map_or((), drop)),
                TokenError::MissingClaim("iat"),
            ),
            (with(|c| c["sub"] = json!("")), TokenError::MissingClaim("sub")),
            (with(|c| c["exp"] = json!("soon")), TokenError::Malformed("exp")),
        ];
        for (claims, error) in cases {
            assert_eq!(check(claims.clone()), Err(error), "{claims}");
        }
        // Within the leeway both ways, and with us among several audiences as the named party.
        assert!(check(with(|c| c["exp"] = json!(1_800_000_000u64 - 59))).is_ok());
        assert!(check(with(|c| c["iat"] = json!(1_800_000_000u64 + 59))).is_ok());
        assert!(
            check(with(|c| {
                c["aud"] = json!([CLIENT, "other"]);
                c["azp"] = json!(CLIENT);
            }))
            .is_ok()
        );
        assert!(check(with(|c| c["exp"] = json!(1_800_000_300.5))).is_ok(), "a fractional NumericDate");
    }

    #[test]
    fn malformed_tokens_are_refused_before_any_key_is_looked_at() {
        let keys = set(&[Signer::es256().jwk("k")]);
        for token in ["", "a.b", "a.b.c.d.e", "!!.e30.AA", "e30.e30.AA", "W10.e30.AA"] {
            assert!(
                matches!(verify(token, &keys, &expected(), now()), Err(TokenError::Malformed(_))),
                "{token}"
            );
        }
        let critical = Signer::es256().sign("ES256", json!({"crit": ["exp"]}), &claims());
        assert_eq!(
            verify(&critical, &keys, &expected(), now()),
            Err(TokenError::Malformed("a critical header extension"))
        );
        let long = "a".repeat(MAX_TOKEN_BYTES + 1);
        assert_eq!(verify(&long, &keys, &expected(), now()), Err(TokenError::Malformed("too long")));
    }

    #[test]
    fn an_rsa_modulus_with_a_leading_zero_still_verifies() {
        let rsa = Signer::rsa();
        let mut jwk = rsa.jwk("r");
        let n = URL_SAFE_NO_PAD.decode(jwk["n"].as_str().expect("n")).expect("b64");
        jwk["n"] = json!(b64(&[&[0u8][..], &n].concat()));
        let token = rsa.sign("RS256", json!({"kid": "r"}), &claims());
        assert!(verify(&token, &set(&[jwk]), &expected(), now()).is_ok());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Changing any one byte of a signed token (header, claims or signature) never yields a
        /// token that passes.
        #[test]
        fn no_single_byte_change_passes(at in any::<prop::sample::Index>(), to in any::<u8>()) {
            let ec = Signer::es256();
            let keys = set(&[ec.jwk("k")]);
            let token = ec.sign("ES256", json!({"kid": "k"}), &claims());
            let mut bytes = token.clone().into_bytes();
            let at = at.index(bytes.len());
            prop_assume!(bytes[at] != to);
            bytes[at] = to;
            // base64url decoding is strict (no stray bits in the last character), so another
            // text is another signature or none.
            let changed = String::from_utf8_lossy(&bytes).into_owned();
            prop_assert!(verify(&changed, &keys, &expected(), now()).is_err());
        }

        #[test]
        fn any_text_is_refused_without_a_panic(token in ".{0,300}") {
            let keys = set(&[Signer::es256().jwk("k")]);
            prop_assert!(verify(&token, &keys, &expected(), now()).is_err());
        }
    }
}
