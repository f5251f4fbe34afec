//! The model backend: an OpenAI-compatible Chat Completions API with streaming and tool calling.
//!
//! Layout: [`config`] (flags and environment -> [`ModelConfig`]), [`client`] (HTTP, retries, errors), [`wire`] (request and chunk types, delta
//! accumulation, finish reasons), [`tools`] (the tools, one module each, and their list),
//! [`turn`] (the loop: request -> stream -> tool calls -> results -> next request), [`replay`]
//! (history -> session updates for `session/load`). Its sessions are saved ([`Store`]).
//!
//! The models a session may select are `--model`, `--models`, then those the server lists
//! (`GET /v1/models`, at most `client::MAX_LISTED_MODELS`), fetched once per process at start
//! ([`Backend::warm_up`]); a server that cannot list them is logged at debug, never an error.

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
    /// The models the server lists, once fetched (empty when it lists none or failed).
    listed: Arc<OnceLock<Vec<ListedModel>>>,
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
                let models = client.list_models().await.unwrap_or_else(|error| {
                    tracing::debug!(%error, "the model server lists no models");
                    Vec::new()
                });
                tracing::debug!(count = models.len(), "models listed by the server");
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

impl Backend for Model {
    fn run_turn<'a>(&'a self, turn: &'a mut Turn) -> BoxFuture<'a, Result<StopReason, TurnError>> {
        Box::pin(turn::run(
            &self.client,
            &self.tools,
            self.subagents.as_ref(),
            self.listed.get().map_or(&[], Vec::as_slice),
            turn,
        ))
    }

    fn title(&self) -> String {
        format!("acp-child ({})", self.client.config().model)
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
        let mut models = vec![config.model.clone()];
        let listed = self.listed.get().into_iter().flatten();
        for model in config.models.iter().chain(listed.map(|listed| &listed.id)) {
            if !models.contains(model) {
                models.push(model.clone());
            }
        }
        Offers {
            system_prompt: true,
            tools: self.tools.names(),
            models,
        }
    }
}
