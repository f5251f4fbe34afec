//! The drift test's rewrite of `schemas/` (`ACP_UPDATE_SCHEMAS=1`): a developer's step, run by
//! hand after changing an output type, never by CI. Left out of the coverage figure
//! (`scripts/coverage`, docs/coverage.md): a run that measures has no stale schema to write.

use std::path::Path;

/// Writes the `stale` schemas (file name, generated text) under `dir` when `ACP_UPDATE_SCHEMAS=1`
/// and returns what is still stale: nothing after a rewrite, else `stale` itself.
pub(super) fn rewrite_when_asked<'a>(dir: &Path, stale: Vec<(&'a str, String)>) -> Vec<&'a str> {
    let update = std::env::var_os(crate::env_vars::ACP_UPDATE_SCHEMAS).is_some_and(|v| v == "1");
    if !update {
        return stale.into_iter().map(|(file, _)| file).collect();
    }
    std::fs::create_dir_all(dir).unwrap();
    for (file, want) in stale {
        std::fs::write(dir.join(file), want).unwrap();
    }
    Vec::new()
}
