//! Replays every committed input of `fuzz/corpus/<target>/` through the function the fuzz target
//! calls, so that what the fuzzer found stays tested where cargo-fuzz is not installed.

use std::fs;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use stormguard_fuzz_checks::{Check, TARGETS};

/// `fuzz/corpus/`, from this crate's directory (`crates/fuzz-checks`).
fn corpus_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus")
}

/// Every file of a target's corpus, in name order.
fn inputs(target: &str) -> Vec<PathBuf> {
    let dir = corpus_root().join(target);
    let entries = fs::read_dir(&dir).unwrap_or_else(|error| panic!("{}: {error}", dir.display()));
    let mut files: Vec<PathBuf> = entries
        .map(|entry| entry.expect("a readable corpus entry").path())
        .filter(|path| path.is_file())
        .collect();
    files.sort();
    files
}

/// Runs `check` on every file of the target's corpus and returns how many inputs it replayed;
/// a failing input is named in the panic.
fn replay(target: &str, check: Check) -> usize {
    let files = inputs(target);
    let mut replayed = 0;
    for file in &files {
        let data = fs::read(file).unwrap_or_else(|error| panic!("{}: {error}", file.display()));
        if panic::catch_unwind(AssertUnwindSafe(|| check(&data))).is_err() {
            panic!("{target}: the input {} fails its check", file.display());
        }
        replayed += 1;
    }
    assert!(replayed > 0, "{target}: an empty corpus");
    assert_eq!(replayed, files.len());
    eprintln!("{target}: {replayed} inputs replayed");
    replayed
}

/// The check `TARGETS` lists for a target.
fn check_of(target: &str) -> Check {
    TARGETS
        .iter()
        .find(|(name, _)| *name == target)
        .map(|(_, check)| *check)
        .unwrap_or_else(|| panic!("{target} is not in TARGETS"))
}

macro_rules! replays {
    ($($target:ident),* $(,)?) => {
        $(
            #[test]
            fn $target() {
                replay(stringify!($target), check_of(stringify!($target)));
            }
        )*
    };
}

replays!(
    attempt_count,
    grpc_timeout,
    llm_body,
    llm_deadline,
    rate_limit,
    retry_after,
    service_config,
    splice,
    sse,
);

/// The fuzz targets `fuzz/Cargo.toml` declares (the `name` of each `[[bin]]`), in name order.
fn declared_targets() -> Vec<String> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/Cargo.toml");
    let manifest = fs::read_to_string(&manifest)
        .unwrap_or_else(|error| panic!("{}: {error}", manifest.display()));
    let mut names: Vec<String> = manifest
        .split("[[bin]]")
        .skip(1)
        .filter_map(|bin| {
            let line = bin.lines().find(|line| line.starts_with("name = "))?;
            Some(
                line.trim_start_matches("name = ")
                    .trim_matches('"')
                    .to_owned(),
            )
        })
        .collect();
    names.sort();
    names
}

/// Each corpus directory and each target `fuzz/Cargo.toml` declares is a target listed here: a
/// new target, or its corpus, cannot go unreplayed.
#[test]
fn every_target_and_corpus_is_listed() {
    let mut corpora: Vec<String> = fs::read_dir(corpus_root())
        .expect("fuzz/corpus")
        .map(|entry| entry.expect("a readable corpus entry"))
        .filter(|entry| entry.path().is_dir())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect();
    corpora.sort();
    let targets: Vec<&str> = TARGETS.iter().map(|(name, _)| *name).collect();
    assert_eq!(corpora, targets);
    assert_eq!(declared_targets(), targets);
}
