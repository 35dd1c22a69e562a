//! Pre-tokenizer regexes for byte-level BPE vocabularies loaded from GGUF.
//!
//! GGUF stores the pre-tokenizer only as a name (`tokenizer.ggml.pre`); the regexes below are
//! the ones llama.cpp applies for each name (llama-vocab.cpp), so that ids match llama.cpp
//! exactly. Each entry is a list of regexes applied one after the other, every match (and every
//! gap between matches) becoming its own piece, exactly like llama.cpp's `unicode_regex_split`.

/// GPT-2's regex (llama.cpp drops the trailing `|\s+`; gaps become pieces anyway).
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";

const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

const QWEN35: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

const DEEPSEEK3_MAIN: &str = r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##;

/// How a named GGUF pre-tokenizer splits text, and the BPE options that go with it.
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::SplitDelimiterBehavior;

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PreTokenizerSpec {
    /// Regexes applied in sequence.
    pub regexes: Vec<&'static str>,
    /// Whole pieces found in the vocabulary skip the merges (llama.cpp `ignore_merges`).
    pub ignore_merges: bool,
    /// Default for `add_bos_token` when the GGUF does not say.
    pub add_bos_default: bool,
    /// Whether the name was recognised (an unknown name falls back to GPT-2).
    pub known: bool,
}

/// The split rules llama.cpp uses for `tokenizer.ggml.pre` = `name`.
pub(crate) fn spec_for(name: &str) -> PreTokenizerSpec {
    let spec = |regexes: Vec<&'static str>, ignore_merges: bool, add_bos: bool| PreTokenizerSpec {
        regexes,
        ignore_merges,
        add_bos_default: add_bos,
        known: true,
    };
    match name {
        "default" | "gpt2" | "gpt-2" | "phi-2" | "mpt" | "olmo" | "jais" | "trillion" | "roberta-bpe" => {
            spec(vec![GPT2], false, false)
        }
        "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva" => {
            spec(vec![r"\p{N}", GPT2], false, false)
        }
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0" | "lfm2" => {
            spec(vec![LLAMA3], true, true)
        }
        "dbrx" | "smaug-bpe" | "chatglm-bpe" | "glm4" => spec(vec![LLAMA3], false, false),
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "stablelm2" | "hunyuan" => spec(vec![QWEN2], false, false),
        "qwen35" => spec(vec![QWEN35], false, false),
        "tekken" => spec(vec![TEKKEN], true, true),
        "gpt-4o" | "minimax-m2" => spec(vec![GPT4O], false, false),
        "deepseek-v3" | "hunyuan-dense" => spec(vec![r"\p{N}{1,3}", "[一-龥぀-ゟ゠-ヿ]+", DEEPSEEK3_MAIN], false, false),
        _ => PreTokenizerSpec { known: false, ..spec(vec![GPT2], false, false) },
    }
}

impl PreTokenizerSpec {
    /// The `tokenizers` pre-tokenizer: the regex splits, then the byte-to-unicode mapping.
    pub fn pre_tokenizer(&self) -> tokenizers::Result<PreTokenizerWrapper> {
        let mut steps: Vec<PreTokenizerWrapper> = Vec::new();
        for re in &self.regexes {
            let pattern = SplitPattern::Regex(re.to_string());
            steps.push(Split::new(pattern, SplitDelimiterBehavior::Isolated, false)?.into());
        }
        steps.push(ByteLevel::new(false, false, false).into());
        Ok(Sequence::new(steps).into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};

    fn splits(name: &str, text: &str) -> Vec<String> {
        let pre = spec_for(name).pre_tokenizer().unwrap();
        let mut s = PreTokenizedString::from(text);
        pre.pre_tokenize(&mut s).unwrap();
        s.get_splits(OffsetReferential::Original, OffsetType::Byte)
            .into_iter()
            .map(|(piece, _, _)| piece.replace('\u{120}', " ").replace('\u{10a}', "\n"))
            .collect()
    }

    const SAMPLE: &str = "Hello'Ve world 123\n\n  foo";

    #[test]
    fn splits_follow_llamacpp_rules() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(splits("qwen2", SAMPLE), s(&["Hello", "'Ve", " world", " ", "1", "2", "3", "\n\n", " ", " foo"]));
        assert_eq!(splits("llama-bpe", SAMPLE), s(&["Hello", "'Ve", " world", " ", "123", "\n\n", " ", " foo"]));
        assert_eq!(splits("llama-bpe", "x 12345"), s(&["x", " ", "123", "45"]));
        assert_eq!(
            splits("smollm", "x = [i**2 for i in range(10)]"),
            s(&["x", " =", " [", "i", "**", "2", " for", " i", " in", " range", "(", "1", "0", ")]"])
        );
        assert_eq!(splits("gpt2", "it's  ok"), s(&["it", "'s", " ", " ok"]));
    }

    #[test]
    fn every_regex_compiles_with_the_tokenizers_backend() {
        for name in [
            "gpt2",
            "smollm",
            "llama-bpe",
            "dbrx",
            "qwen2",
            "qwen35",
            "tekken",
            "gpt-4o",
            "deepseek-v3",
            "something-new",
        ] {
            assert!(spec_for(name).pre_tokenizer().is_ok(), "{name}");
        }
        assert!(!spec_for("something-new").known);
        assert!(spec_for("llama-bpe").ignore_merges);
    }
}
