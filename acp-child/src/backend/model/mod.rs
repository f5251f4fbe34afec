//! The model backend: an OpenAI-compatible Chat Completions API with streaming and tool calling.
//!
//! Layout: [`config`] (flags and environment -> [`ModelConfig`]), [`client`] (HTTP, retries,
//! errors), [`wire`] (request and chunk types, delta accumulation, finish reasons), [`tools`] (the
//! six tools and their permission rules), [`turn`] (the loop: request -> stream -> tool calls ->
//! results -> next request), [`replay`] (history -> session updates for `session/load`).

pub mod client;
pub mod config;
pub mod replay;
#[cfg(test)]
pub(crate) mod stub;
pub mod tools;
pub mod turn;
pub mod wire;

use std::sync::Arc;

use agent_client_protocol::v1::schema::StopReason;
use futures::future::BoxFuture;

pub use self::client::{ClientBuildError, ModelClient, ModelError};
pub use self::config::{ConfigError, ModelConfig, ModelOptions};
use super::{Backend, Turn, TurnError};

/// The backend used when a model is configured.
#[derive(Debug, Clone)]
pub struct Model {
    client: ModelClient,
    tools: Arc<serde_json::Value>,
}

impl Model {
    /// A backend for `config`.
    pub fn new(config: ModelConfig) -> Result<Self, ClientBuildError> {
        Ok(Self {
            client: ModelClient::new(Arc::new(config))?,
            tools: Arc::new(tools::definitions()),
        })
    }

    /// The configuration.
    #[must_use]
    pub fn config(&self) -> &ModelConfig {
        self.client.config()
    }
}

impl Backend for Model {
    fn run_turn<'a>(&'a self, turn: &'a mut Turn) -> BoxFuture<'a, Result<StopReason, TurnError>> {
        Box::pin(turn::run(&self.client, &self.tools, turn))
    }

    fn title(&self) -> String {
        format!("acp-child ({})", self.config().model)
    }
}
