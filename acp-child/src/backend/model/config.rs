//! The model backend's configuration, resolved from command-line values and the environment.
//!
//! The rules (the CLI contract, documented in `--help` and docs/acp-child.md) have one home here:
//! - the model backend is on iff a model name is given (`--model` or `ACP_CHILD_MODEL`) or a base
//!   URL is (`--base-url` or `ACP_CHILD_BASE_URL`); with a base URL alone the model is left empty,
//!   to be discovered: the first the server lists (`super::Model::discovered`);
//! - the API key comes from the first set variable of [`KEY_VARIABLES`]; none is fine (local
//!   servers), then no `Authorization` header is sent;
//! - the base URL (including `/v1`) comes from `--base-url`, else `ACP_CHILD_BASE_URL`, else the
//!   provider the key belongs to: DeepSeek for `DEEPSEEK_API_KEY`, OpenAI otherwise;
//! - the state directory is `--state-dir`, else `ACP_CHILD_STATE_DIR`, else
//!   `$XDG_STATE_HOME/acp-child/sessions`, else `~/.local/state/acp-child/sessions`.
//!
//! Pure: the environment is read through a lookup function, so every rule is unit-tested. Empty
//! values count as unset. The key is never printed: [`ApiKey`]'s `Debug` redacts it.

use std::path::PathBuf;
use std::time::Duration;

use protocol::env_vars;
use protocol::usage::Pricing;
use thiserror::Error;

use crate::persona::{Persona, PersonaError};

pub(crate) const MODEL_VAR: &str = env_vars::ACP_CHILD_MODEL;
pub(crate) const BASE_URL_VAR: &str = env_vars::ACP_CHILD_BASE_URL;
pub(crate) const STATE_DIR_VAR: &str = env_vars::ACP_CHILD_STATE_DIR;
/// Where the API key is looked for, in order.
pub const KEY_VARIABLES: [&str; 3] = [
    env_vars::ACP_CHILD_API_KEY,
    env_vars::DEEPSEEK_API_KEY,
    env_vars::OPENAI_API_KEY,
];
/// Where sessions are saved inside the state home (`$XDG_STATE_HOME`).
pub const STATE_SUBDIR: &str = env_vars::ACP_CHILD_SESSIONS;
/// DeepSeek's OpenAI-compatible API.
pub const DEEPSEEK_BASE_URL: &str = "https://api.deepseek.com/v1";
pub const OPENAI_BASE_URL: &str = "https://api.openai.com/v1";

/// Default for `--max-turn-requests`.
pub const DEFAULT_MAX_TURN_REQUESTS: u32 = 25;
/// Default for `--command-timeout`, in seconds.
pub const DEFAULT_COMMAND_TIMEOUT_SECS: u64 = 120;
/// Default for `--max-retries`.
pub const DEFAULT_MAX_RETRIES: u32 = 3;
/// Default for `--retry-base-ms`.
pub const DEFAULT_RETRY_BASE_MS: u64 = 200;

/// What the command line said; `None` means "not given" (the environment or a default decides).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ModelOptions {
    pub model: Option<String>,
    /// Further models a session may select (`--models`), besides `model`.
    pub models: Vec<String>,
    pub base_url: Option<String>,
    pub persona: Option<PathBuf>,
    pub max_turn_requests: Option<u32>,
    pub state_dir: Option<PathBuf>,
    pub command_timeout_secs: Option<u64>,
    pub max_retries: Option<u32>,
    pub retry_base_ms: Option<u64>,
    /// `--context-window`: the `size` of usage updates.
    pub context_window: Option<u64>,
    /// `--price-input`, `--price-output`, `--price-currency`: what a reported cost is priced at.
    pub pricing: Option<Pricing>,
    /// `--command-sandbox`, `--command-network`: `run_command`'s sandbox, when the person chose.
    pub command_sandbox: Option<protocol::sandbox::Mode>,
    pub command_network: Option<protocol::sandbox::Network>,
    /// `--no-background`: `run_command` has no `run_in_background`.
    pub no_background: bool,
}

/// An API key and the variable it came from.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey {
    /// The variable it was read from (one of [`KEY_VARIABLES`]).
    pub variable: &'static str,
    pub(crate) value: String,
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiKey")
            .field("variable", &self.variable)
            .field("value", &"<redacted>")
            .finish()
    }
}

/// The resolved model backend configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// The model name sent in each request, unless a session selected another of `models`;
    /// empty: none was given, the server's listing decides ([`ModelConfig::discovers`]).
    pub model: String,
    /// Further models a session may select (the `model` config option).
    pub models: Vec<String>,
    /// The base URL including `/v1`, without a trailing slash.
    pub base_url: String,
    pub api_key: Option<ApiKey>,
    /// The system prompt template.
    pub(crate) persona: Persona,
    /// The most model requests one prompt turn may make.
    pub(crate) max_turn_requests: u32,
    /// Where sessions are saved.
    pub state_dir: PathBuf,
    /// How long `run_command` may run.
    pub(crate) command_timeout: Duration,
    /// How many times a rate-limited (429) or failed (5xx) request is retried.
    pub(crate) max_retries: u32,
    /// The first retry's delay; each further retry doubles it (unless the server sends
    /// `Retry-After`).
    pub(crate) retry_base: Duration,
    /// The model's context window, when given (else the server's listing may say).
    pub(crate) context_window: Option<u64>,
    /// What a cost is priced at; `None`: no cost is reported.
    pub(crate) pricing: Option<Pricing>,
    /// The sandbox `run_command` runs in ([`command_sandbox`]).
    pub(crate) command_sandbox: protocol::sandbox::Policy,
    /// `run_command` may run a command in the background (no `--no-background`).
    pub(crate) background_commands: bool,
}

/// `run_command`'s sandbox: what the person chose (`--command-sandbox`, `--command-network`; held
/// strictly: a kernel that cannot enforce it refuses the command), else `workspace-write` with
/// the network off, run with what the kernel enforces (a default nobody chose must not make
/// every command fail on an older kernel; the tool result says what did not hold).
#[must_use]
pub(crate) fn command_sandbox(
    mode: Option<protocol::sandbox::Mode>,
    network: Option<protocol::sandbox::Network>,
) -> protocol::sandbox::Policy {
    protocol::sandbox::Policy {
        best_effort: mode.is_none() && network.is_none(),
        mode: mode.unwrap_or(protocol::sandbox::Mode::WorkspaceWrite),
        network: network.unwrap_or(protocol::sandbox::Network::Off),
        ..protocol::sandbox::Policy::default()
    }
}

#[derive(Debug, Error)]
pub enum ConfigError {
    #[error(
        "invalid base URL {url:?} ({reason}); give the server's OpenAI-compatible base URL including /v1, e.g. http://localhost:11434/v1"
    )]
    BaseUrl { url: String, reason: String },
    #[error(
        "no state directory: set --state-dir or {STATE_DIR_VAR} (or XDG_STATE_HOME / HOME) to where sessions should be saved"
    )]
    NoStateDir,
    #[error("{what} must be at least 1")]
    Zero { what: &'static str },
    #[error(transparent)]
    Persona(#[from] PersonaError),
}

impl ModelConfig {
    /// Resolves the configuration; `Ok(None)` when no model is configured (the offline backend
    /// applies). `env` looks a variable up.
    pub fn resolve(
        options: ModelOptions,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Self>, ConfigError> {
        let lookup = |name: &str| env(name).filter(|value| !value.trim().is_empty());
        let given_url = options
            .base_url
            .filter(|url| !url.trim().is_empty())
            .or_else(|| lookup(BASE_URL_VAR));
        let model = match options
            .model
            .filter(|model| !model.trim().is_empty())
            .or_else(|| lookup(MODEL_VAR))
        {
            Some(model) => model,
            // A local server named alone: its listing says which model it serves.
            None if given_url.is_some() => String::new(),
            None => return Ok(None),
        };
        let api_key = KEY_VARIABLES.iter().find_map(|&variable| {
            lookup(variable).map(|value| ApiKey {
                variable,
                value: value.trim().to_owned(),
            })
        });
        let base_url = match given_url {
            Some(url) => check_base_url(&url)?,
            None if api_key
                .as_ref()
                .is_some_and(|key| key.variable == env_vars::DEEPSEEK_API_KEY) =>
            {
                DEEPSEEK_BASE_URL.to_owned()
            }
            None => OPENAI_BASE_URL.to_owned(),
        };
        let state_dir = match options.state_dir {
            Some(dir) => dir,
            None => default_state_dir(&lookup).ok_or(ConfigError::NoStateDir)?,
        };
        let persona = match options.persona {
            Some(path) => Persona::load(&path)?,
            None => Persona::default(),
        };
        let max_turn_requests = options
            .max_turn_requests
            .unwrap_or(DEFAULT_MAX_TURN_REQUESTS);
        if max_turn_requests == 0 {
            return Err(ConfigError::Zero {
                what: "--max-turn-requests",
            });
        }
        Ok(Some(Self {
            model: model.trim().to_owned(),
            models: options
                .models
                .iter()
                .map(|m| m.trim().to_owned())
                .filter(|m| !m.is_empty())
                .collect(),
            base_url,
            api_key,
            persona,
            max_turn_requests,
            state_dir,
            command_timeout: Duration::from_secs(
                options
                    .command_timeout_secs
                    .unwrap_or(DEFAULT_COMMAND_TIMEOUT_SECS),
            ),
            max_retries: options.max_retries.unwrap_or(DEFAULT_MAX_RETRIES),
            retry_base: Duration::from_millis(
                options.retry_base_ms.unwrap_or(DEFAULT_RETRY_BASE_MS),
            ),
            context_window: options.context_window.filter(|size| *size > 0),
            pricing: options.pricing,
            command_sandbox: command_sandbox(options.command_sandbox, options.command_network),
            background_commands: !options.no_background,
        }))
    }

    /// No model was given: the server's listing decides (`--base-url` alone).
    #[must_use]
    pub fn discovers(&self) -> bool {
        self.model.is_empty()
    }

    #[must_use]
    pub(crate) fn endpoint(&self) -> String {
        format!("{}/chat/completions", self.base_url)
    }

    /// Where the server lists its models (`GET`).
    pub(crate) fn models_endpoint(&self) -> String {
        format!("{}/models", self.base_url)
    }
}

fn check_base_url(url: &str) -> Result<String, ConfigError> {
    let trimmed = url.trim().trim_end_matches('/');
    let invalid = |reason: String| ConfigError::BaseUrl {
        url: url.to_owned(),
        reason,
    };
    let parsed = reqwest::Url::parse(trimmed).map_err(|error| invalid(error.to_string()))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(invalid(format!(
            "scheme {} is not http or https",
            parsed.scheme()
        )));
    }
    Ok(trimmed.to_owned())
}

fn default_state_dir(lookup: &impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
    if let Some(dir) = lookup(STATE_DIR_VAR) {
        return Some(PathBuf::from(dir));
    }
    let home = lookup(env_vars::HOME).map(PathBuf::from);
    let xdg = lookup(env_vars::XDG_STATE_HOME).map(PathBuf::from);
    let state = env_vars::state_home(home.as_deref(), xdg.as_deref())?;
    Some(state.join(STATE_SUBDIR))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn resolve(
        options: ModelOptions,
        vars: &[(&str, &str)],
    ) -> Result<Option<ModelConfig>, ConfigError> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
            .collect();
        ModelConfig::resolve(options, |name| vars.get(name).cloned())
    }

    #[test]
    fn commands_default_to_workspace_write_without_network_best_effort() {
        use protocol::sandbox::{Mode, Network};
        let default = command_sandbox(None, None);
        assert_eq!(
            (default.mode, &default.network, default.best_effort),
            (Mode::WorkspaceWrite, &Network::Off, true)
        );
        let chosen = command_sandbox(Some(Mode::ReadOnly), None);
        assert_eq!(
            (chosen.mode, &chosen.network, chosen.best_effort),
            (Mode::ReadOnly, &Network::Off, false)
        );
        let open = command_sandbox(Some(Mode::Off), Some(Network::On));
        assert!(!open.is_active());
    }

    fn with_model() -> ModelOptions {
        ModelOptions {
            model: Some("m".into()),
            ..ModelOptions::default()
        }
    }

    #[test]
    fn a_base_url_alone_discovers_the_model() {
        let flag = resolve(
            ModelOptions {
                base_url: Some("http://127.0.0.1:8080/v1".into()),
                ..ModelOptions::default()
            },
            &[("HOME", "/h")],
        )
        .unwrap()
        .unwrap();
        assert!(flag.discovers());
        assert_eq!(flag.models_endpoint(), "http://127.0.0.1:8080/v1/models");
        let env = resolve(
            ModelOptions::default(),
            &[(BASE_URL_VAR, "http://localhost:11434/v1"), ("HOME", "/h")],
        )
        .unwrap()
        .unwrap();
        assert!(env.discovers());
        assert!(
            !resolve(with_model(), &[("HOME", "/h")])
                .unwrap()
                .unwrap()
                .discovers()
        );
    }

    #[test]
    fn no_model_means_offline() {
        assert_eq!(
            resolve(ModelOptions::default(), &[("DEEPSEEK_API_KEY", "k")]).unwrap(),
            None
        );
        assert_eq!(
            resolve(
                ModelOptions {
                    base_url: Some(" ".into()),
                    ..ModelOptions::default()
                },
                &[("HOME", "/h")]
            )
            .unwrap(),
            None
        );
        assert_eq!(
            resolve(ModelOptions::default(), &[(MODEL_VAR, " ")]).unwrap(),
            None
        );
        let from_env = resolve(
            ModelOptions::default(),
            &[(MODEL_VAR, "deepseek-chat"), ("HOME", "/h")],
        )
        .unwrap()
        .unwrap();
        assert_eq!(from_env.model, "deepseek-chat");
    }

    #[test]
    fn key_order_and_base_url_defaults() {
        let config = |vars: &[(&str, &str)]| resolve(with_model(), vars).unwrap().unwrap();
        let deepseek = config(&[
            ("DEEPSEEK_API_KEY", "d"),
            ("OPENAI_API_KEY", "o"),
            ("HOME", "/h"),
        ]);
        assert_eq!(
            deepseek.api_key.as_ref().unwrap().variable,
            "DEEPSEEK_API_KEY"
        );
        assert_eq!(deepseek.base_url, DEEPSEEK_BASE_URL);
        let own = config(&[
            ("ACP_CHILD_API_KEY", "a"),
            ("DEEPSEEK_API_KEY", "d"),
            ("HOME", "/h"),
        ]);
        assert_eq!(own.api_key.as_ref().unwrap().value, "a");
        assert_eq!(own.base_url, OPENAI_BASE_URL);
        let none = config(&[("HOME", "/h")]);
        assert_eq!(
            (none.api_key, none.base_url.as_str()),
            (None, OPENAI_BASE_URL)
        );
        let local = config(&[
            (BASE_URL_VAR, "http://127.0.0.1:8080/v1/"),
            ("DEEPSEEK_API_KEY", "d"),
            ("HOME", "/h"),
        ]);
        assert_eq!(local.base_url, "http://127.0.0.1:8080/v1");
        assert_eq!(
            local.endpoint(),
            "http://127.0.0.1:8080/v1/chat/completions"
        );
        let flag = resolve(
            ModelOptions {
                base_url: Some("http://localhost:11434/v1".into()),
                ..with_model()
            },
            &[(BASE_URL_VAR, "http://ignored/v1"), ("HOME", "/h")],
        )
        .unwrap()
        .unwrap();
        assert_eq!(flag.base_url, "http://localhost:11434/v1");
    }

    #[test]
    fn bad_base_urls_are_explained() {
        let error = resolve(
            ModelOptions {
                base_url: Some("ftp://x/v1".into()),
                ..with_model()
            },
            &[("HOME", "/h")],
        )
        .unwrap_err();
        assert_eq!(
            error.to_string(),
            "invalid base URL \"ftp://x/v1\" (scheme ftp is not http or https); give the server's OpenAI-compatible base URL including /v1, e.g. http://localhost:11434/v1"
        );
        assert!(matches!(
            resolve(
                ModelOptions {
                    base_url: Some("not a url".into()),
                    ..with_model()
                },
                &[("HOME", "/h")]
            ),
            Err(ConfigError::BaseUrl { .. })
        ));
    }

    #[test]
    fn state_dir_order() {
        let dir = |options: ModelOptions, vars: &[(&str, &str)]| {
            resolve(options, vars).unwrap().unwrap().state_dir
        };
        assert_eq!(
            dir(with_model(), &[("HOME", "/h")]),
            PathBuf::from("/h/.local/state/acp-child/sessions")
        );
        assert_eq!(
            dir(with_model(), &[("HOME", "/h"), ("XDG_STATE_HOME", "/x")]),
            PathBuf::from("/x/acp-child/sessions")
        );
        assert_eq!(
            dir(with_model(), &[("HOME", "/h"), (STATE_DIR_VAR, "/s")]),
            PathBuf::from("/s")
        );
        assert_eq!(
            dir(
                ModelOptions {
                    state_dir: Some("/flag".into()),
                    ..with_model()
                },
                &[(STATE_DIR_VAR, "/s")]
            ),
            PathBuf::from("/flag")
        );
        assert!(matches!(
            resolve(with_model(), &[]),
            Err(ConfigError::NoStateDir)
        ));
    }

    #[test]
    fn defaults_and_the_key_never_shows_in_debug() {
        let config = resolve(
            with_model(),
            &[("OPENAI_API_KEY", "sk-secret"), ("HOME", "/h")],
        )
        .unwrap()
        .unwrap();
        assert_eq!(config.max_turn_requests, 25);
        assert_eq!(config.command_timeout, Duration::from_mins(2));
        assert_eq!(config.max_retries, 3);
        assert_eq!(config.retry_base, Duration::from_millis(200));
        assert!(!format!("{config:?}").contains("sk-secret"));
        assert!(matches!(
            resolve(
                ModelOptions {
                    max_turn_requests: Some(0),
                    ..with_model()
                },
                &[("HOME", "/h")]
            ),
            Err(ConfigError::Zero { .. })
        ));
    }
}
