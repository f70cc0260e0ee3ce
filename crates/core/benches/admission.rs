//! The admission decision at scale: what the request path computes for every request, against a
//! snapshot of one million keys (100,000 organizations, each with a provider credential and an
//! armed cap). `bench/run` runs it; `cargo bench -p recovea-core --bench admission` alone does too.
//! `ADMISSION_BENCH_KEYS=N` sets another size (`bench/run --smoke` runs it once, as a test, on a
//! small one).
//!
//! Keys are presented in a shuffled order over all million, so that lookups miss the caches as they
//! would with real traffic spread over many keys.

use std::sync::LazyLock;

use divan::{Bencher, black_box};
use recovea_core::caps::{self, Cap, CapSpend, Scope, SpendView};
use recovea_core::ids::{CapId, KeyId, OrgId};
use recovea_core::keys::{self, KeyHash};
use recovea_core::money::Nanos;
use recovea_core::snapshot::{ProviderCredential, ProviderKind, Snapshot, SnapshotBuilder};
use recovea_core::window::Window;
use recovea_core::{Credential, CredentialHeader, Decision, Timestamp, admit};

// The allocator of the `recovea` binary, so that an admission's allocations cost what they do there.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    println!("admission benchmarks over {} keys", *KEYS);
    // Built before any timing, so that no sample includes them and divan sizes its samples right.
    // The secrets first: allocated on a fresh heap they lie in the order they are read, whatever
    // the snapshot's build leaves freed (else the secrets' own cache misses vary with it).
    LazyLock::force(&SECRETS);
    LazyLock::force(&SNAPSHOT);
    divan::main();
}

static KEYS: LazyLock<usize> = LazyLock::new(|| {
    std::env::var("ADMISSION_BENCH_KEYS").ok().and_then(|n| n.parse().ok()).unwrap_or(1_000_000).max(1)
});
const KEYS_PER_ORG: usize = 10;
const NOW: Timestamp = Timestamp(1_773_748_800_000);

fn secret(i: usize) -> String {
    format!("rk_{i:043}")
}

struct Rows {
    keys: Vec<(KeyHash, String, usize)>,
    orgs: usize,
}

static ROWS: LazyLock<Rows> = LazyLock::new(|| Rows {
    keys: (0..*KEYS)
        .map(|i| (keys::hash_secret(&secret(i)), format!("key_{i:020}"), i / KEYS_PER_ORG))
        .collect(),
    orgs: KEYS.div_ceil(KEYS_PER_ORG),
});

/// What the control plane does with the rows read from its store.
fn build(rows: &Rows) -> Snapshot {
    let mut b = SnapshotBuilder::new(1);
    let orgs: Vec<OrgId> =
        (0..rows.orgs).map(|j| OrgId::parse(&format!("org_{j:020}")).expect("org id")).collect();
    for (j, org) in orgs.iter().enumerate() {
        b.org(org.clone());
        b.provider(
            org,
            ProviderCredential::new("openai".into(), ProviderKind::OpenAi, None, format!("sk-proj-{j:048}")),
        );
        b.cap(Cap {
            id: CapId::parse(&format!("cap_{j:020}")).expect("cap id"),
            org_id: org.clone(),
            scope: Scope::Organization,
            key_id: None,
            window: Window::Month,
            limit: Nanos(1_000_000_000_000_000),
            hard_stop: true,
            alert_at_permille: vec![500, 800, 1000],
            alert_webhook: None,
        });
    }
    for (hash, id, org) in &rows.keys {
        b.key(*hash, KeyId::parse(id).expect("key id"), orgs[*org].clone(), None);
    }
    b.build()
}

static SNAPSHOT: LazyLock<Snapshot> = LazyLock::new(|| build(&ROWS));

/// Every key's secret, in a fixed pseudo-random order (so that the lookups of successive
/// iterations land far apart).
static SECRETS: LazyLock<Vec<String>> = LazyLock::new(|| {
    let mut order: Vec<usize> = (0..*KEYS).collect();
    let mut state = 0x9E37_79B9_7F4A_7C15_u64;
    for i in (1..order.len()).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let j = usize::try_from(state % (i as u64 + 1)).expect("fits");
        order.swap(i, j);
    }
    order.into_iter().map(secret).collect()
});

fn bearer(secret: &str) -> Option<Credential<'_>> {
    Some(Credential { secret, header: CredentialHeader::AuthorizationBearer })
}

/// Cycles through the shuffled secrets, one per iteration.
fn next_secret(i: &mut usize) -> &'static str {
    *i = (*i + 1) % *KEYS;
    &SECRETS[*i]
}

/// `admit` for a known key: well-formedness, SHA-256 of the secret, the lookup, the expiry check.
#[divan::bench(sample_count = 200, sample_size = 1000)]
fn admit_known_key(bencher: Bencher) {
    let snapshot = &*SNAPSHOT;
    let mut i = 0;
    bencher.bench_local(|| {
        let decision = admit(Some(snapshot), bearer(black_box(next_secret(&mut i))), NOW);
        assert!(matches!(decision, Decision::Admit(_)));
        decision
    });
}

/// `admit` for a well-formed key that is not in the snapshot (the refusal path).
#[divan::bench(sample_count = 200, sample_size = 1000)]
fn admit_unknown_key(bencher: Bencher) {
    let snapshot = &*SNAPSHOT;
    let unknown = "rk_unknownunknownunknownunknownunknownunknow";
    bencher.bench_local(|| admit(Some(snapshot), bearer(black_box(unknown)), NOW));
}

/// Fresh counters with nothing spent: every armed cap lets the request through.
struct Fresh;

impl SpendView for Fresh {
    fn spend(&self, _org: &OrgId, _cap: &CapId, _window_start: Timestamp) -> CapSpend {
        CapSpend { spent: Nanos(0), reserved: Nanos(0), confirmed_at: Some(NOW) }
    }
}

/// `admit`, then the organization's armed cap checked against fresh counters: the whole decision
/// before a request is forwarded (the reservation itself lives in the gateway's counters).
#[divan::bench(sample_count = 200, sample_size = 1000)]
fn admit_and_check_caps(bencher: Bencher) {
    let snapshot = &*SNAPSHOT;
    let mut i = 0;
    bencher.bench_local(|| {
        let Decision::Admit(admitted) = admit(Some(snapshot), bearer(black_box(next_secret(&mut i))), NOW)
        else {
            panic!("every benchmark key is known");
        };
        let verdict =
            caps::check_caps(&admitted.org.caps, &admitted.org.id, &admitted.key_id, &Fresh, NOW, 60_000);
        assert!(verdict.is_ok());
        admitted
    });
}

/// SHA-256 of a secret alone (the part of admission that does not depend on the snapshot's size).
#[divan::bench(sample_count = 200, sample_size = 1000)]
fn hash_secret(bencher: Bencher) {
    let mut i = 0;
    bencher.bench_local(|| keys::hash_secret(black_box(next_secret(&mut i))));
}

/// The table lookup alone, by a precomputed hash.
#[divan::bench(sample_count = 200, sample_size = 1000)]
fn lookup_by_hash(bencher: Bencher) {
    let snapshot = &*SNAPSHOT;
    let hashes: Vec<KeyHash> = SECRETS.iter().map(|s| keys::hash_secret(s)).collect();
    let mut i = 0;
    bencher.bench_local(|| {
        i = (i + 1) % hashes.len();
        snapshot.key(black_box(&hashes[i])).is_some()
    });
}

/// Building the snapshot from the rows the store would return.
#[divan::bench(sample_count = 3, sample_size = 1)]
fn build_snapshot(bencher: Bencher) {
    let rows = &*ROWS;
    bencher.bench_local(|| build(rows));
}
