//! Byte sizes on the command line: `1048576`, `512KiB`, `32MiB`, `1GiB` (and `KB`/`MB`/`GB`).

pub(crate) fn parse_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let number: u64 = digits.parse().map_err(|_| format!("{text:?} is not a size such as 32MiB"))?;
    let multiplier: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        other => return Err(format!("unknown size unit {other:?}: use B, KiB, MiB or GiB")),
    };
    number.checked_mul(multiplier).filter(|n| *n > 0).ok_or_else(|| format!("{text:?} is out of range"))
}

#[cfg(test)]
mod tests {
    use super::parse_bytes;

    #[test]
    fn sizes() {
        assert_eq!(parse_bytes("32MiB"), Ok(32 << 20));
        assert_eq!(parse_bytes("1000"), Ok(1000));
        assert_eq!(parse_bytes("2 KB"), Ok(2000));
        assert!(parse_bytes("0").is_err());
        assert!(parse_bytes("12 parsecs").is_err());
        assert!(parse_bytes("MiB").is_err());
        assert!(parse_bytes("99999999999999GiB").is_err());
    }
}
