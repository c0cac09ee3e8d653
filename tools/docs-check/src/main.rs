//! `docs-check [ROOT]`: checks the docs of the tree at ROOT (the current
//! directory by default) and lists every name that does not hold; exits 1
//! if there is one. See the library's docs for the rules.

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> anyhow::Result<ExitCode> {
    let root = std::env::args_os()
        .nth(1)
        .map_or_else(|| PathBuf::from("."), PathBuf::from);
    let problems = ccm_docs_check::check(&root)?;
    for problem in &problems {
        eprintln!("{problem}");
    }
    if problems.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!(
        "docs-check: {} name(s) in the docs do not hold (rules: tools/docs-check/src/lib.rs)",
        problems.len()
    );
    Ok(ExitCode::FAILURE)
}
