//! The model backend: an OpenAI-compatible Chat Completions API with streaming and tool calling.
//!
//! Layout: [`config`] (flags and environment -> [`ModelConfig`]), [`client`] (HTTP, retries, errors), [`wire`] (request and chunk types, delta
//! accumulation, finish reasons), [`tools`] (the tools, one module each, and their list),
//! [`turn`] (the loop: request -> stream -> tool calls -> results -> next request), [`replay`]
//! (history -> session updates for `session/load`). Its sessions are saved ([`Store`]).
//!
//! The models a session may select are `--model`, `--models`, then those the server lists
//! (`GET /v1/models`, at most `client::MAX_LISTED_MODELS`), fetched once per process at start
//! ([`Backend::warm_up`]); a server that cannot list them is logged at debug, never an error,
//! unless no model was given (`--base-url` alone): then the first model listed is the default
//! (the others are offered as the session's model option), and a server that lists none, or
//! cannot list them, stops acp-child before it serves (`Model::discovered`, a
//! [`DiscoveryError`] naming the URL and `--model`).

pub(crate) mod client;
pub(crate) mod config;
pub(crate) mod replay;
pub(crate) mod tools;
mod turn;
pub(crate) mod wire;

use std::sync::{Arc, OnceLock};

use agent_client_protocol::v1::schema::{SessionUpdate, StopReason};
use futures::FutureExt as _;
use futures::future::{BoxFuture, Shared};
use thiserror::Error;

pub use self::client::ClientBuildError;
use self::client::{ListedModel, ModelClient};
pub use self::config::{ConfigError, ModelConfig, ModelOptions};
use self::tools::Toolbox;
use super::children::Subagents;
use super::{Backend, Offers, Turn, TurnError};
use crate::session::Memory;
use crate::store::Store;
use crate::workspace::Workspace;

/// The backend used when a model is configured.
pub(crate) struct Model {
    client: ModelClient,
    tools: Toolbox,
    /// What its turns may delegate to; `None`: subagents are not enabled.
    subagents: Option<Arc<Subagents>>,
    store: Arc<Store>,
    /// The models the server lists, once fetched; `Err`: why they could not be listed.
    listed: Arc<OnceLock<Result<Vec<ListedModel>, String>>>,
    /// Fetches them, once per process however often it is awaited ([`Backend::warm_up`]).
    listing: Shared<BoxFuture<'static, ()>>,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("client", &self.client)
            .field("tools", &self.tools)
            .field("subagents", &self.subagents)
            .field("store", &self.store)
            .field("listed", &self.listed)
            .finish_non_exhaustive()
    }
}

impl Model {
    pub(crate) fn new(
        config: ModelConfig,
        subagents: Option<Arc<Subagents>>,
    ) -> Result<Self, ClientBuildError> {
        let tools = Toolbox::standard(
            config.command_timeout,
            &config.command_sandbox,
            config.background_commands,
            subagents.is_some(),
        );
        let store = Arc::new(Store::new(config.state_dir.clone()));
        let client = ModelClient::new(Arc::new(config))?;
        let listed = Arc::new(OnceLock::new());
        let listing = {
            let client = client.clone();
            let listed = Arc::clone(&listed);
            async move {
                let models = client.list_models().await;
                match &models {
                    Ok(models) => {
                        tracing::debug!(count = models.len(), "models listed by the server");
                    }
                    Err(error) => {
                        tracing::debug!(%error, "the model server lists no models");
                    }
                }
                let _ = listed.set(models);
            }
            .boxed()
            .shared()
        };
        Ok(Self {
            client,
            tools,
            subagents,
            store,
            listed,
            listing,
        })
    }
}

/// No model was given and none could be learnt from the server (`--base-url` alone).
#[derive(Debug, Error)]
pub enum DiscoveryError {
    #[error(
        "no --model given, and the model server at {url} lists no models; load a model on the server, or name one with --model NAME (or {})",
        config::MODEL_VAR
    )]
    NoneListed { url: String },
    #[error(
        "no --model given, and the model server's models cannot be listed ({reason}); check that the server at {base_url} is running, or name a model with --model NAME (or {})",
        config::MODEL_VAR
    )]
    CannotList { base_url: String, reason: String },
}

impl Model {
    /// The models the server listed (none while not listed yet, or when listing failed).
    fn listed(&self) -> &[ListedModel] {
        match self.listed.get() {
            Some(Ok(models)) => models,
            _ => &[],
        }
    }

    /// The model a session uses unless it selected another: `--model`, else the first the
    /// server lists (empty while it is not known).
    fn default_model(&self) -> &str {
        let config = self.client.config();
        if config.model.is_empty() {
            self.listed()
                .first()
                .map_or("", |listed| listed.id.as_str())
        } else {
            &config.model
        }
    }

    /// Whether the model to use is known, once the listing was awaited: always with `--model`;
    /// else the server must have listed one.
    fn discovered(&self) -> Result<(), DiscoveryError> {
        let config = self.client.config();
        if !config.model.is_empty() {
            return Ok(());
        }
        match self.listed.get() {
            Some(Ok(models)) if !models.is_empty() => Ok(()),
            Some(Err(reason)) => Err(DiscoveryError::CannotList {
                base_url: config.base_url.clone(),
                reason: reason.clone(),
            }),
            _ => Err(DiscoveryError::NoneListed {
                url: config.models_endpoint(),
            }),
        }
    }
}

impl Backend for Model {
    fn run_turn<'a>(&'a self, turn: &'a mut Turn) -> BoxFuture<'a, Result<StopReason, TurnError>> {
        Box::pin(turn::run(
            &self.client,
            &self.tools,
            self.subagents.as_ref(),
            (self.default_model(), self.listed()),
            turn,
        ))
    }

    fn title(&self) -> String {
        format!("acp-child ({})", self.default_model())
    }

    fn ready(&self) -> Result<(), DiscoveryError> {
        self.discovered()
    }

    fn store(&self) -> Option<&Arc<Store>> {
        Some(&self.store)
    }

    fn replay(&self, workspace: &Workspace, memory: &Memory) -> Vec<SessionUpdate> {
        replay::updates(&self.tools, &memory.history(), workspace, memory)
    }

    fn warm_up(&self) -> BoxFuture<'static, ()> {
        self.listing.clone().boxed()
    }

    fn offers(&self) -> Offers {
        let config = self.client.config();
        let mut models = Vec::new();
        let default = self.default_model();
        let listed = self.listed().iter().map(|listed| &listed.id);
        for model in std::iter::once(default)
            .chain(config.models.iter().map(String::as_str))
            .chain(listed.map(String::as_str))
        {
            if !model.is_empty() && !models.iter().any(|known| known == model) {
                models.push(model.to_owned());
            }
        }
        Offers {
            system_prompt: true,
            tools: self.tools.names(),
            models,
        }
    }
}
