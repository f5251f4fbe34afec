//! The model backend: an OpenAI-compatible Chat Completions API with streaming and tool calling.
//!
//! Layout: [`config`] (flags and environment -> [`ModelConfig`]), [`client`] (HTTP, retries, errors), [`wire`] (request and chunk types, delta
//! accumulation, finish reasons), [`tools`] (the tools, one module each, and their list),
//! [`turn`] (the loop: request -> stream -> tool calls -> results -> next request), [`replay`]
//! (history -> session updates for `session/load`). Its sessions are saved ([`Store`]).

pub(crate) mod client;
pub(crate) mod config;
pub(crate) mod replay;
pub(crate) mod tools;
mod turn;
pub(crate) mod wire;

use std::sync::Arc;

use agent_client_protocol::v1::schema::{SessionUpdate, StopReason};
use futures::future::BoxFuture;

pub use self::client::ClientBuildError;
use self::client::ModelClient;
pub use self::config::{ConfigError, ModelConfig, ModelOptions};
use self::tools::Toolbox;
use super::children::Subagents;
use super::{Backend, Offers, Turn, TurnError};
use crate::session::Memory;
use crate::store::Store;
use crate::workspace::Workspace;

/// The backend used when a model is configured.
#[derive(Debug)]
pub(crate) struct Model {
    client: ModelClient,
    tools: Toolbox,
    /// What its turns may delegate to; `None`: subagents are not enabled.
    subagents: Option<Arc<Subagents>>,
    store: Arc<Store>,
}

impl Model {
    pub(crate) fn new(
        config: ModelConfig,
        subagents: Option<Arc<Subagents>>,
    ) -> Result<Self, ClientBuildError> {
        let tools = Toolbox::standard(config.command_timeout, subagents.is_some());
        let store = Arc::new(Store::new(config.state_dir.clone()));
        Ok(Self {
            client: ModelClient::new(Arc::new(config))?,
            tools,
            subagents,
            store,
        })
    }
}

impl Backend for Model {
    fn run_turn<'a>(&'a self, turn: &'a mut Turn) -> BoxFuture<'a, Result<StopReason, TurnError>> {
        Box::pin(turn::run(
            &self.client,
            &self.tools,
            self.subagents.as_ref(),
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

    fn offers(&self) -> Offers {
        let config = self.client.config();
        let mut models = vec![config.model.clone()];
        for model in &config.models {
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
