//! Byte sizes as users write them: `4096`, `64K`, `512M`, `4G`, `1T`, `4GiB`, `1.5G`.
//! Suffixes are powers of 1024.

/// Why a size did not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SizeError {
    #[error("empty size")]
    Empty,
    #[error("{0:?} is not a size (expected a number with an optional K, M, G or T suffix)")]
    Invalid(String),
    #[error("{0:?} is too large")]
    Overflow(String),
}

/// Parse a size with an optional K/M/G/T suffix (also `KB`, `KiB`, ...), powers of 1024.
pub fn parse_size(s: &str) -> Result<u64, SizeError> {
    let t = s.trim();
    if t.is_empty() {
        return Err(SizeError::Empty);
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, suffix) = t.split_at(split);
    let mult: u64 = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return Err(SizeError::Invalid(s.into())),
    };
    if num.is_empty() {
        return Err(SizeError::Invalid(s.into()));
    }
    if let Ok(n) = num.parse::<u64>() {
        return n
            .checked_mul(mult)
            .ok_or_else(|| SizeError::Overflow(s.into()));
    }
    let f: f64 = num.parse().map_err(|_| SizeError::Invalid(s.into()))?;
    let v = f * mult as f64;
    if !(v.is_finite() && v < u64::MAX as f64) {
        return Err(SizeError::Overflow(s.into()));
    }
    Ok(v as u64)
}

/// Format bytes for people: `4 KiB`, `1.5 GiB`, `17 B`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 || v.fract() == 0.0 {
        format!("{} {}", v as u64, UNITS[u])
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_suffixes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(65536));
        assert_eq!(parse_size("512m"), Ok(512 << 20));
        assert_eq!(parse_size("4GiB"), Ok(4 << 30));
        assert_eq!(parse_size(" 1T "), Ok(1 << 40));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert!(parse_size("").is_err());
        assert!(parse_size("G").is_err());
        assert!(parse_size("12X").is_err());
        assert!(parse_size("99999999999T").is_err());
    }

    #[test]
    fn formats() {
        assert_eq!(format_size(17), "17 B");
        assert_eq!(format_size(4096), "4 KiB");
        assert_eq!(format_size(3 << 29), "1.5 GiB");
    }
}
