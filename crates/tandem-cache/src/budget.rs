//! Memory budgets as the command line gives them: a byte count (`8GiB`, `512M`, `1000000`)
//! or a fraction of physical RAM (`0.25`, `25%`).

use std::str::FromStr;

use crate::{CacheError, Result};

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MemoryBudget {
    Bytes(u64),
    /// A fraction of total RAM, in `(0, 1]`.
    FractionOfRam(f64),
}

impl MemoryBudget {
    /// The budget in bytes.
    pub fn bytes(&self) -> Result<u64> {
        match *self {
            MemoryBudget::Bytes(b) => Ok(b),
            MemoryBudget::FractionOfRam(f) => {
                let total = total_ram_bytes()
                    .ok_or_else(|| CacheError::Config("cannot read the RAM size; give the budget in bytes".into()))?;
                Ok((total as f64 * f) as u64)
            }
        }
    }
}

impl MemoryBudget {
    /// The budget in bytes for memory on a device with `device_free` bytes free: a fraction
    /// is of that free device memory (like vLLM's `--gpu-memory-utilization`); `None` (the
    /// CPU) means of RAM, as [`Self::bytes`].
    pub fn bytes_on(&self, device_free: Option<u64>) -> Result<u64> {
        match (*self, device_free) {
            (MemoryBudget::FractionOfRam(f), Some(free)) => Ok((free as f64 * f) as u64),
            _ => self.bytes(),
        }
    }
}

impl std::fmt::Display for MemoryBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MemoryBudget::Bytes(b) => write!(f, "{b} bytes"),
            MemoryBudget::FractionOfRam(x) => write!(f, "{:.1}% of RAM", x * 100.0),
        }
    }
}

impl FromStr for MemoryBudget {
    type Err = CacheError;

    fn from_str(s: &str) -> Result<Self> {
        let bad = || CacheError::Config(format!("`{s}` is not a memory size (try 8GiB, 512MiB, 0.25 or 25%)"));
        let t = s.trim();
        let fraction = |x: f64| {
            if x > 0.0 && x <= 1.0 {
                Ok(MemoryBudget::FractionOfRam(x))
            } else {
                Err(CacheError::Config(format!("a fraction of RAM must be in (0, 1], got `{s}`")))
            }
        };
        if let Some(p) = t.strip_suffix('%') {
            return fraction(p.trim().parse::<f64>().map_err(|_| bad())? / 100.0);
        }
        if t.contains('.') && t.chars().all(|c| c.is_ascii_digit() || c == '.') {
            return fraction(t.parse::<f64>().map_err(|_| bad())?);
        }
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let n: u64 = num.parse().map_err(|_| bad())?;
        let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kb" => 1000,
            "kib" => 1 << 10,
            "m" | "mb" => 1_000_000,
            "mib" => 1 << 20,
            "g" | "gb" => 1_000_000_000,
            "gib" => 1 << 30,
            "t" | "tb" => 1_000_000_000_000,
            "tib" => 1 << 40,
            _ => return Err(bad()),
        };
        n.checked_mul(mult).map(MemoryBudget::Bytes).ok_or_else(bad)
    }
}

/// Physical RAM from `/proc/meminfo` (Linux); `None` elsewhere.
pub fn total_ram_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sizes_and_fractions() {
        let p = |s: &str| s.parse::<MemoryBudget>();
        assert_eq!(p("1000"), Ok(MemoryBudget::Bytes(1000)));
        assert_eq!(p("8GiB"), Ok(MemoryBudget::Bytes(8 << 30)));
        assert_eq!(p("512 MiB"), Ok(MemoryBudget::Bytes(512 << 20)));
        assert_eq!(p("2g"), Ok(MemoryBudget::Bytes(2_000_000_000)));
        assert_eq!(p("0.25"), Ok(MemoryBudget::FractionOfRam(0.25)));
        assert_eq!(p("25%"), Ok(MemoryBudget::FractionOfRam(0.25)));
        for bad in ["", "abc", "1.5", "0%", "12XB", "-3", "99999999999999999999"] {
            assert!(p(bad).is_err(), "{bad}");
        }
        assert_eq!(MemoryBudget::Bytes(7).bytes(), Ok(7));
    }
}
