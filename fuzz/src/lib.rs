//! What the fuzz targets share: cutting one input into pieces, the way a network might.

/// Cuts `input` at points drawn from a generator seeded by the input itself, so that any file (a
/// fixture, a recorded answer) is a valid seed and each mutation is cut differently.
pub fn pieces(input: &[u8]) -> Vec<&[u8]> {
    // FNV-1a, then splitmix64 steps.
    let mut state = input
        .iter()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    let mut next = move || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let longest = (next() % 64 + 1) as usize;
    let mut pieces = Vec::new();
    let mut rest = input;
    while !rest.is_empty() {
        let len = (next() as usize % longest + 1).min(rest.len());
        let (piece, tail) = rest.split_at(len);
        pieces.push(piece);
        rest = tail;
    }
    pieces
}
