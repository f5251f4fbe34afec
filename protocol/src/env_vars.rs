//! One home for the environment variables the workspace reads, and for the rules that turn them
//! into paths (the XDG state directory).
//!
//! Invariants: no crate spells one of these names as a literal elsewhere; the functions here are
//! pure (the caller looks the values up), so every rule is unit-tested in this file. An empty value
//! counts as unset, and a relative `XDG_STATE_HOME` is ignored, as the XDG base-directory
//! specification asks.

use std::path::{Path, PathBuf};

/// The user's home folder: sync's targets and the default state directory live under it.
pub const HOME: &str = "HOME";
/// Where installed agents are looked for (and the agent process's own PATH).
pub const PATH: &str = "PATH";
/// The XDG state directory (backups, sessions); default `~/.local/state`.
pub const XDG_STATE_HOME: &str = "XDG_STATE_HOME";
/// The XDG cache directory (agents downloaded from the ACP Registry); default `~/.cache`.
pub const XDG_CACHE_HOME: &str = "XDG_CACHE_HOME";
/// acp-host's log filter (`tracing` `EnvFilter` syntax).
pub const ACP_HOST_LOG: &str = "ACP_HOST_LOG";
/// acp-child's log filter (`tracing` `EnvFilter` syntax).
pub const ACP_CHILD_LOG: &str = "ACP_CHILD_LOG";

/// The log filter of both binaries when neither `--verbose` nor their log variable says
/// otherwise: our warnings, but only the ACP SDK's errors. Its warnings are about a peer's frames
/// (a `Method not found` answered to an optional method the peer does not implement), which are
/// no fault of the person running us and would crowd a failed run's stderr tail.
pub const DEFAULT_LOG_FILTER: &str = "warn,agent_client_protocol=error";
/// acp-child: the model name; setting it turns the model backend on.
pub const ACP_CHILD_MODEL: &str = "ACP_CHILD_MODEL";
/// acp-child: the model server's base URL.
pub const ACP_CHILD_BASE_URL: &str = "ACP_CHILD_BASE_URL";
/// acp-child: where sessions are saved.
pub const ACP_CHILD_STATE_DIR: &str = "ACP_CHILD_STATE_DIR";
/// Where acp-child saves sessions inside the state home (`$XDG_STATE_HOME`) when
/// [`ACP_CHILD_STATE_DIR`] is not set; acp-host's sandbox keeps other runs' sessions unreadable
/// there.
pub const ACP_CHILD_SESSIONS: &str = "acp-child/sessions";
/// acp-child: its own API key variable, looked at before the provider ones.
pub const ACP_CHILD_API_KEY: &str = "ACP_CHILD_API_KEY";
/// DeepSeek's API key; also selects DeepSeek's base URL when no other is given.
pub const DEEPSEEK_API_KEY: &str = "DEEPSEEK_API_KEY";
/// OpenAI's API key.
pub const OPENAI_API_KEY: &str = "OPENAI_API_KEY";
/// The delegation depth of the agent that holds it (0: started by a person). Set by acp-host on
/// every agent it starts, never taken from a forwarded value (see `depth`).
pub const ACP_HOST_DEPTH: &str = "ACP_HOST_DEPTH";
/// The deepest an agent of this chain may run; set by acp-host beside [`ACP_HOST_DEPTH`].
pub const ACP_HOST_MAX_DEPTH: &str = "ACP_HOST_MAX_DEPTH";
/// The most tokens the agent that holds it may spend, as it reports them (`--token-budget`, a
/// child's budget); set by acp-host on every agent it starts with a token budget, removed
/// otherwise. An agent delegating through acp-host gives its children at most what is left of it
/// (`crate::usage::child_budget`).
pub const ACP_HOST_TOKEN_BUDGET: &str = "ACP_HOST_TOKEN_BUDGET";
/// The sandbox the agent that holds it runs in (`protocol::sandbox::Standing`, as JSON); set by
/// acp-host on every sandboxed agent it starts, removed otherwise, never taken from a forwarded
/// value. An agent starting another gives it at most this.
pub const ACP_HOST_SANDBOX: &str = "ACP_HOST_SANDBOX";
/// Whether a sandboxed agent gets user and mount namespaces of its own, where its denied paths
/// are masked (`1`), or is confined by Landlock alone (`0`); unset, acp-host decides from what
/// the machine allows. Read from acp-host's own environment (docs/sandbox.md).
pub const ACP_HOST_SANDBOX_NAMESPACES: &str = "ACP_HOST_SANDBOX_NAMESPACES";
/// The W3C trace parent a process continues (OpenTelemetry's environment carrier); acp-host's
/// `--traceparent` takes precedence. Never passed on to an agent as given: an agent gets the
/// context over ACP's `_meta` (`crate::trace`).
pub const TRACEPARENT: &str = "TRACEPARENT";
/// The W3C trace state beside [`TRACEPARENT`].
pub const TRACESTATE: &str = "TRACESTATE";
/// OpenTelemetry: the collector's base URL (OTLP/HTTP, `/v1/traces` appended); set (non-empty),
/// it or [`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`] turns trace export on (docs/observability.md).
pub const OTEL_EXPORTER_OTLP_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
/// OpenTelemetry: the traces endpoint, used as given (it wins over the base URL).
pub const OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
/// OpenTelemetry: headers sent to the collector (`key=value,...`), often credentials: withheld
/// from every agent (`crate::env_scrub`) and never printed.
pub const OTEL_EXPORTER_OTLP_HEADERS: &str = "OTEL_EXPORTER_OTLP_HEADERS";
/// OpenTelemetry: the traces' own headers (beside [`OTEL_EXPORTER_OTLP_HEADERS`]); withheld too.
pub const OTEL_EXPORTER_OTLP_TRACES_HEADERS: &str = "OTEL_EXPORTER_OTLP_TRACES_HEADERS";
/// OpenTelemetry: the exported `service.name` (default: the binary's name).
pub const OTEL_SERVICE_NAME: &str = "OTEL_SERVICE_NAME";
/// OpenTelemetry: the sampler (`always_on`, `parentbased_traceidratio`, ...; the SDK reads it,
/// with `OTEL_TRACES_SAMPLER_ARG`).
pub const OTEL_TRACES_SAMPLER: &str = "OTEL_TRACES_SAMPLER";
/// The OTLP/JSON lines file acp-child appends its spans to (what `acp-host run --trace-out`
/// sets for its agent, so every level of a tree writes to one file).
pub const ACP_TRACE_OUT: &str = "ACP_TRACE_OUT";
/// `1`: acp-child puts tool arguments and results into its spans (what `acp-host run
/// --trace-content` sets for its agent).
pub const ACP_TRACE_CONTENT: &str = "ACP_TRACE_CONTENT";

/// Whether trace export to a collector is wanted: an OTLP endpoint variable is set and
/// non-empty (`lookup` reads the environment).
pub fn otlp_export_wanted(lookup: impl Fn(&str) -> Option<String>) -> bool {
    [
        OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
        OTEL_EXPORTER_OTLP_ENDPOINT,
    ]
    .iter()
    .any(|name| lookup(name).is_some_and(|value| !value.trim().is_empty()))
}

/// Kubernetes: an Indexed Job's pod index (0-based). Read only when `acp-host batch
/// --shard-from-env` names it; the help's example.
pub const JOB_COMPLETION_INDEX: &str = "JOB_COMPLETION_INDEX";
/// Slurm: a job array task's index. Read only when `acp-host batch --shard-from-env` names it.
pub const SLURM_ARRAY_TASK_ID: &str = "SLURM_ARRAY_TASK_ID";
/// Slurm: how many tasks the job array has. Read only when `--shard-from-env` names it.
pub const SLURM_ARRAY_TASK_COUNT: &str = "SLURM_ARRAY_TASK_COUNT";
/// Tests: `1` rewrites the checked-in JSON Schemas (`schemas/`) instead of failing on drift.
pub const ACP_UPDATE_SCHEMAS: &str = "ACP_UPDATE_SCHEMAS";
/// Test hook of `acp-host sync`, `<point>:<dir>`: the first time the sync reaches `<point>`
/// (`locked`: the sync lock is held, nothing read yet; `writing`: backups made, no target
/// written yet) it creates `<dir>/<point>.ready` and waits until `<dir>/<point>.go` exists. Lets a
/// test drive two real processes through a race deterministically; unset, it costs nothing.
pub const ACP_HOST_SYNC_PAUSE: &str = "ACP_HOST_SYNC_PAUSE";

/// The user's state directory: `xdg_state_home` when it is set, non-empty and absolute, else
/// `home/.local/state`; `None` when neither is usable (no home either).
#[must_use]
pub fn state_home(home: Option<&Path>, xdg_state_home: Option<&Path>) -> Option<PathBuf> {
    xdg_state_home
        .filter(|dir| dir.is_absolute())
        .map(Path::to_path_buf)
        .or_else(|| {
            home.filter(|home| !home.as_os_str().is_empty())
                .map(|home| home.join(".local/state"))
        })
}

/// The user's cache directory: `xdg_cache_home` when it is set, non-empty and absolute, else
/// `home/.cache`; `None` when neither is usable. The same rule as [`state_home`].
#[must_use]
pub fn cache_home(home: Option<&Path>, xdg_cache_home: Option<&Path>) -> Option<PathBuf> {
    xdg_cache_home
        .filter(|dir| dir.is_absolute())
        .map(Path::to_path_buf)
        .or_else(|| {
            home.filter(|home| !home.as_os_str().is_empty())
                .map(|home| home.join(".cache"))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(home: Option<&str>, xdg: Option<&str>) -> Option<PathBuf> {
        state_home(home.map(Path::new), xdg.map(Path::new))
    }

    #[test]
    fn an_absolute_xdg_state_home_wins() {
        assert_eq!(state(Some("/h"), Some("/x")), Some(PathBuf::from("/x")));
        assert_eq!(state(None, Some("/x")), Some(PathBuf::from("/x")));
    }

    #[test]
    fn a_relative_or_empty_xdg_state_home_is_ignored() {
        let fallback = Some(PathBuf::from("/h/.local/state"));
        assert_eq!(state(Some("/h"), Some("rel/state")), fallback);
        assert_eq!(state(Some("/h"), Some("")), fallback);
        assert_eq!(state(Some("/h"), None), fallback);
    }

    #[test]
    fn no_home_and_no_xdg_state_home_is_no_state_directory() {
        assert_eq!(state(None, None), None);
        assert_eq!(state(Some(""), Some("relative")), None);
    }

    #[test]
    fn an_otlp_endpoint_turns_export_on() {
        let with = |pairs: &'static [(&'static str, &'static str)]| {
            otlp_export_wanted(move |name| {
                pairs
                    .iter()
                    .find_map(|(key, value)| (*key == name).then(|| (*value).to_owned()))
            })
        };
        assert!(!with(&[]));
        assert!(!with(&[(OTEL_EXPORTER_OTLP_ENDPOINT, " ")]));
        assert!(!with(&[(OTEL_SERVICE_NAME, "x")]));
        assert!(with(&[(
            OTEL_EXPORTER_OTLP_ENDPOINT,
            "http://localhost:4318"
        )]));
        assert!(with(&[(
            OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
            "http://c/v1/traces"
        )]));
    }

    #[test]
    fn the_cache_directory_follows_the_same_rule() {
        let cache = |home: Option<&str>, xdg: Option<&str>| {
            cache_home(home.map(Path::new), xdg.map(Path::new))
        };
        assert_eq!(cache(Some("/h"), Some("/x")), Some(PathBuf::from("/x")));
        assert_eq!(
            cache(Some("/h"), Some("rel")),
            Some(PathBuf::from("/h/.cache"))
        );
        assert_eq!(cache(None, None), None);
    }
}
