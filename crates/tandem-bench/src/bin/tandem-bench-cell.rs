//! Runs one sweep cell (`<spec JSON>`) or the baseline probe (`probe`) in this process and
//! prints the result as one JSON line: the same protocol as `tandem bench cell`, without the
//! CLI, so this crate's tests can measure cells in child processes of their own.

fn main() {
    let arg = std::env::args().nth(1).unwrap_or_default();
    if let Ok(spec) = serde_json::from_str::<tandem_bench::sweep::CellSpec>(&arg) {
        if spec.threads > 0 {
            std::env::set_var("RAYON_NUM_THREADS", spec.threads.to_string());
        }
    }
    println!("{}", tandem_bench::sweep::child_main(&arg));
}
