//! With the `cuda` feature: compiles every `cuda/*.cu` to PTX in OUT_DIR with nvcc, for the
//! compute capability in `CUDA_COMPUTE_CAP` (default 90), and that PTX to SASS for the same
//! GPU with ptxas (`<stem>.cubin`: loaded instead of JIT-compiling the PTX where the device
//! runs it; the `ARCH_SPECIFIC` modules for sm_90a where the capability is 90). Without it:
//! nothing.

use std::path::PathBuf;
use std::process::Command;

/// Modules that use an architecture's own features (`cuda/tmma_wg.cu`: Hopper's wgmma and
/// TMA), compiled for `compute_90a` / `sm_90a` when `CUDA_COMPUTE_CAP` is 90 (nvcc 12.0 or
/// newer); each guards its kernels so that a build for any other capability makes an empty
/// module.
const ARCH_SPECIFIC: &[&str] = &["tmma_wg"];

fn main() {
    println!("cargo:rerun-if-changed=cuda");
    println!("cargo:rerun-if-env-changed=CUDA_COMPUTE_CAP");
    println!("cargo:rerun-if-env-changed=NVCC");
    println!("cargo:rerun-if-env-changed=PTXAS");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    let cap = std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "90".into());
    let nvcc = std::env::var("NVCC").unwrap_or_else(|_| "nvcc".into());
    let mut sources: Vec<PathBuf> = std::fs::read_dir("cuda")
        .expect("cuda/ folder")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "cu"))
        .collect();
    sources.sort();
    // ptxas beside nvcc (or PTXAS, or PATH's).
    let ptxas = std::env::var("PTXAS").unwrap_or_else(|_| {
        let beside = std::path::Path::new(&nvcc).with_file_name("ptxas");
        if beside.parent().is_some_and(|d| !d.as_os_str().is_empty()) && beside.exists() {
            beside.display().to_string()
        } else {
            "ptxas".into()
        }
    });
    // The capability as digits ("90"): SASS and the runtime check need a plain number.
    let cap: u32 = cap.trim().parse().unwrap_or_else(|_| {
        panic!("CUDA_COMPUTE_CAP={cap:?}: expected the compute capability as digits, e.g. 90 for sm_90")
    });
    println!("cargo:rustc-env=TANDEM_CUBIN_CAP={cap}");
    let mut assembling = Vec::new();
    for src in sources {
        println!("cargo:rerun-if-changed={}", src.display());
        let stem = src.file_stem().and_then(|s| s.to_str()).expect("file name").to_string();
        let ptx = out.join(format!("{stem}.ptx"));
        // Modules of an architecture's own features (wgmma: sm_90a) are built for it where the
        // capability is that architecture's, and for the plain capability (empty) elsewhere.
        let arch =
            if ARCH_SPECIFIC.contains(&stem.as_str()) && cap == 90 { "90a".to_string() } else { cap.to_string() };
        let status = Command::new(&nvcc)
            .args(["--ptx", "-O3", "-std=c++17", "-Icuda"])
            .arg(format!("-arch=compute_{arch}"))
            .arg("-o")
            .arg(&ptx)
            .arg(&src)
            .status()
            .unwrap_or_else(|e| panic!("cannot run {nvcc} (set NVCC or put nvcc on PATH): {e}"));
        assert!(status.success(), "nvcc failed on {}", src.display());
        // The SASS, assembled while the next module compiles.
        let child = Command::new(&ptxas)
            .args(["-O3", &format!("-arch=sm_{arch}"), "-o"])
            .arg(out.join(format!("{stem}.cubin")))
            .arg(&ptx)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {ptxas} (set PTXAS or put ptxas on PATH): {e}"));
        assembling.push((stem, child));
    }
    for (stem, mut child) in assembling {
        let status = child.wait().expect("ptxas");
        assert!(status.success(), "ptxas failed on {stem}.ptx");
    }
}
