//! Human-friendly sizes (`256MiB`, `4GiB`, `300MB`, `1.5GiB`, `65536`) and durations
//! (`3s`, `500ms`, `2m`) for command-line flags.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// A byte count parsed from a human-friendly string.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

/// A size or duration string that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} {input:?}: {why}")]
pub struct ParseError {
    what: &'static str,
    input: String,
    why: &'static str,
}

impl FromStr for ByteSize {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |why| ParseError {
            what: "size",
            input: s.to_string(),
            why,
        };
        // parse-size knows the SI (KB = 1000) and IEC (KiB = 1024) units,
        // fractions and overflow; a "300MB" eviction rate means 300e6 bytes.
        parse_size::parse_size(s.trim()).map(ByteSize).map_err(|e| {
            err(match e {
                parse_size::Error::Empty => "expected a number followed by an optional unit such as KiB, MiB or GiB",
                parse_size::Error::InvalidDigit => "unknown unit (use B, KB, MB, GB, or KiB, MiB, GiB, TiB)",
                parse_size::Error::PosOverflow => "size overflows 64 bits",
                _ => "not a size",
            })
        })
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [(&str, u64); 4] = [("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
        for (name, m) in UNITS {
            if self.0 >= m && self.0 % m == 0 {
                return write!(f, "{}{name}", self.0 / m);
            }
        }
        for (name, m) in UNITS {
            if self.0 >= m {
                return write!(f, "{:.1}{name}", self.0 as f64 / m as f64);
            }
        }
        write!(f, "{}B", self.0)
    }
}

/// Parses `3s`, `500ms`, `250us`, `2m` or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, ParseError> {
    let err = |why| ParseError {
        what: "duration",
        input: s.to_string(),
        why,
    };
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| err("expected a number followed by ms, s or m"))?;
    let secs = match unit.trim() {
        "" | "s" => n,
        "ms" => n / 1e3,
        "us" | "µs" => n / 1e6,
        "m" | "min" => n * 60.0,
        _ => return Err(err("unknown unit (use us, ms, s or m)")),
    };
    if !secs.is_finite() || !(0.0..=1e9).contains(&secs) {
        return Err(err("out of range"));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!("256MiB".parse::<ByteSize>().unwrap().0, 256 << 20);
        assert_eq!("4GiB".parse::<ByteSize>().unwrap().0, 4 << 30);
        assert_eq!("300MB".parse::<ByteSize>().unwrap().0, 300_000_000);
        assert_eq!("1.5KiB".parse::<ByteSize>().unwrap().0, 1536);
        assert_eq!("4096".parse::<ByteSize>().unwrap().0, 4096);
        assert!("".parse::<ByteSize>().is_err());
        assert!("12XB".parse::<ByteSize>().is_err());
        assert!("MiB".parse::<ByteSize>().is_err());
        assert!("99999999999TiB".parse::<ByteSize>().is_err());
        assert_eq!(ByteSize(3 << 30).to_string(), "3GiB");
        assert_eq!(ByteSize(1536).to_string(), "1.5KiB");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("3s").unwrap(), Duration::from_secs(3));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2").unwrap(), Duration::from_secs(2));
        assert!(parse_duration("fast").is_err());
        assert!(parse_duration("3h").is_err());
    }
}
