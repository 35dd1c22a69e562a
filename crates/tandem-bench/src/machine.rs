//! Facts about this process and machine from `/proc`: current and peak resident memory,
//! available memory, CPU model and core count. Everything degrades to `None` off Linux.

use serde::{Deserialize, Serialize};

/// Reads a `kB` field (`VmRSS`, `VmHWM`, `MemAvailable`, ...) from a `/proc` status-style text.
pub fn parse_kib_field(text: &str, field: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(field)?.strip_prefix(':')?;
        let num = rest.split_whitespace().next()?;
        num.parse::<u64>().ok().map(|kib| kib * 1024)
    })
}

fn proc_field(file: &str, field: &str) -> Option<u64> {
    parse_kib_field(&std::fs::read_to_string(file).ok()?, field)
}

/// Resident memory of this process now, in bytes.
pub fn current_rss_bytes() -> Option<u64> {
    proc_field("/proc/self/status", "VmRSS")
}

/// Peak resident memory of this process so far (`VmHWM`), in bytes.
pub fn peak_rss_bytes() -> Option<u64> {
    proc_field("/proc/self/status", "VmHWM")
}

/// Memory the kernel reports as available for new allocations, in bytes.
pub fn mem_available_bytes() -> Option<u64> {
    proc_field("/proc/meminfo", "MemAvailable")
}

/// Total RAM, in bytes.
pub fn mem_total_bytes() -> Option<u64> {
    proc_field("/proc/meminfo", "MemTotal")
}

/// The machine a result was measured on.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MachineInfo {
    pub cpu_model: String,
    pub logical_cores: usize,
    pub mem_total_bytes: u64,
    pub os: String,
    /// Load average over the last minute when the run started.
    pub load_average_1m: Option<f64>,
}

impl MachineInfo {
    /// Describes the current machine.
    pub fn current() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name").and_then(|r| r.split_once(':')).map(|(_, v)| v.trim()))
            .unwrap_or("unknown")
            .to_string();
        let load_average_1m = std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()));
        Self {
            cpu_model,
            logical_cores: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            mem_total_bytes: mem_total_bytes().unwrap_or(0),
            os: std::env::consts::OS.to_string(),
            load_average_1m,
        }
    }

    /// One line for report headers.
    pub fn describe(&self) -> String {
        format!(
            "{}, {} logical cores, {:.1} GiB RAM{}",
            self.cpu_model,
            self.logical_cores,
            self.mem_total_bytes as f64 / (1u64 << 30) as f64,
            self.load_average_1m.map(|l| format!(", load {l:.2} at start")).unwrap_or_default()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_status_fields() {
        let s = "Name:\ttandem\nVmHWM:\t  123456 kB\nVmRSS:\t   1000 kB\n";
        assert_eq!(parse_kib_field(s, "VmHWM"), Some(123456 * 1024));
        assert_eq!(parse_kib_field(s, "VmRSS"), Some(1000 * 1024));
        assert_eq!(parse_kib_field(s, "VmSwap"), None);
        assert_eq!(parse_kib_field("VmRSS: x kB", "VmRSS"), None);
    }
}
