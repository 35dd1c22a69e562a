//! How CUDA's bf16 tensor-core matmuls (`cuda_tmma`) carry f32 activations: the process's one
//! choice, set by the CLI's `--bf16-activations` (or `TANDEM_BF16_ACTIVATIONS`). Outside CUDA
//! builds it is kept but changes nothing.

/// How the tensor-core kernels carry f32 activations against bf16 weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Bf16Activations {
    /// Two bf16 halves, hi + lo (~16 significant bits, two products each): the default.
    #[default]
    Split,
    /// Rounded to bf16 (8 significant bits, one product each): half the GEMMs' tensor-core work.
    Bf16,
}

impl std::str::FromStr for Bf16Activations {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "split" => Ok(Self::Split),
            "bf16" => Ok(Self::Bf16),
            _ => Err(format!("bf16 activations `{s}`: expected split or bf16")),
        }
    }
}

/// 0: not decided yet; 1: split; 2: bf16.
static ACTIVATIONS: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Sets how this process's bf16 tensor-core matmuls carry activations (the CLI's
/// `--bf16-activations`). Call it before the first matmul: a row's bits depend on it, so a
/// process keeps one choice (the prefix cache and speculation compare bits across calls).
pub fn set_activations(mode: Bf16Activations) {
    let v = match mode {
        Bf16Activations::Split => 1,
        Bf16Activations::Bf16 => 2,
    };
    ACTIVATIONS.store(v, std::sync::atomic::Ordering::Relaxed);
}

/// The process's choice: [`set_activations`]'s, else `TANDEM_BF16_ACTIVATIONS` (`split` or
/// `bf16`), else [`Bf16Activations::Split`]; fixed at the first call.
pub fn activations() -> Bf16Activations {
    use std::sync::atomic::Ordering;
    let v = ACTIVATIONS.load(Ordering::Relaxed);
    if v == 0 {
        let mode = std::env::var("TANDEM_BF16_ACTIVATIONS").ok().and_then(|s| s.parse().ok()).unwrap_or_default();
        set_activations(mode);
        return mode;
    }
    if v == 2 {
        Bf16Activations::Bf16
    } else {
        Bf16Activations::Split
    }
}

#[cfg(test)]
mod tests {
    use super::Bf16Activations;

    #[test]
    fn parses_the_two_modes_and_refuses_others() {
        assert_eq!("split".parse::<Bf16Activations>(), Ok(Bf16Activations::Split));
        assert_eq!("BF16".parse::<Bf16Activations>(), Ok(Bf16Activations::Bf16));
        assert!("fp8".parse::<Bf16Activations>().unwrap_err().contains("split or bf16"));
        assert_eq!(Bf16Activations::default(), Bf16Activations::Split);
    }
}
