//! Helpers shared by the CLI tests: the repository root and running the `tandem` binary with a
//! test-local `TANDEM_HOME`.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn tandem(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(args)
        .env("TANDEM_HOME", root().join("target/test-tandem-home"))
        .output()
        .expect("run tandem")
}
