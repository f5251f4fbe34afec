//! The HTTP side: one streamed Chat Completions request, with bounded retries and clear errors.
//!
//! Client choice: `reqwest` + `eventsource-stream` rather than `async-openai`. acp-child needs
//! (1) DeepSeek's `reasoning_content` deltas and vLLM/Ollama's `reasoning`, which async-openai's
//! typed deltas drop (its "byot" escape hatch means declaring the types anyway); (2) exact control
//! of status handling: a 401 must fail at once naming the key variable, a 429 must honour
//! `Retry-After` a bounded number of times, and async-openai's built-in exponential backoff
//! retries for minutes; (3) a lean build. The wire types are a few serde structs
//! ([`super::wire`]); HTTP and SSE framing stay with the crates that do them well.
//!
//! Invariants: the API key is sent only as the `Authorization` header and never logged or put in
//! an error; every wait (a request, a backoff sleep) races the turn's cancellation, and the caller
//! races it while reading the stream, so `session/cancel` is prompt; a retry happens only for 429
//! and 5xx, at most `max_retries` times, each waiting `Retry-After` (capped at
//! [`MAX_RETRY_AFTER`]) or `retry_base * 2^n`.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use eventsource_stream::{Event, EventStreamError, Eventsource as _};
use futures::Stream;
use protocol::report::describe;
use reqwest::StatusCode;
use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderValue, RETRY_AFTER};
use thiserror::Error;
use tokio_util::sync::CancellationToken;

use super::config::{ApiKey, KEY_VARIABLES, ModelConfig};
use super::wire::{ChatRequest, ErrorBody};

/// The longest `Retry-After` honoured; a server asking for more gets this.
pub(crate) const MAX_RETRY_AFTER: Duration = Duration::from_mins(1);
/// Connecting must succeed within this.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// A streamed response may be silent this long (reasoning models pause, but servers send
/// keep-alive comments) before the turn fails rather than hangs.
pub(crate) const READ_TIMEOUT: Duration = Duration::from_mins(5);
/// How much of an error body is quoted in a message.
const MAX_QUOTED_BODY: usize = 500;

#[derive(Debug, Error)]
pub(crate) enum ModelError {
    #[error(
        "model server rejected the API key (HTTP {status}): set {own} (or {others}) to a valid key; with acp-host forward it with --env {own} ({key_state})",
        own = KEY_VARIABLES[0],
        others = KEY_VARIABLES[1..].join(" / ")
    )]
    BadKey { status: u16, key_state: String },
    #[error("cannot reach the model server at {base_url}")]
    Unreachable {
        base_url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error(
        "the model server is rate limiting requests (HTTP 429), still after {retries} retries: {message}; wait and try again, or raise --max-retries"
    )]
    RateLimited { retries: u32, message: String },
    #[error(
        "the model server failed (HTTP {status}), still after {retries} retries: {message}; try again later"
    )]
    ServerFailed {
        status: u16,
        retries: u32,
        message: String,
    },
    #[error(
        "the model server refused the request (HTTP {status}): {message}; check the model name ({model}) and the base URL ({base_url})"
    )]
    Refused {
        status: u16,
        message: String,
        model: String,
        base_url: String,
    },
    #[error("the model's response stream from {base_url} broke off")]
    Stream {
        base_url: String,
        #[source]
        source: EventStreamError<reqwest::Error>,
    },
    #[error("the model server reported an error mid-stream: {message}")]
    InStream { message: String },
    #[error("the model server sent data that is not a chat completion chunk: {data}")]
    BadChunk {
        data: String,
        #[source]
        source: serde_json::Error,
    },
}

/// A response being streamed: its server-sent events.
pub(crate) type Events =
    Pin<Box<dyn Stream<Item = Result<Event, EventStreamError<reqwest::Error>>> + Send>>;

/// One model the server lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ListedModel {
    pub(crate) id: String,
    /// Its context window in tokens, when the listing says.
    pub(crate) context_window: Option<u64>,
}

/// The most models taken from the server's list (`list_models`).
pub(crate) const MAX_LISTED_MODELS: usize = 100;

/// How long listing the server's models may take in all.
const LIST_TIMEOUT: Duration = Duration::from_secs(10);

/// Sends Chat Completions requests for one model configuration.
#[derive(Debug, Clone)]
pub(crate) struct ModelClient {
    http: reqwest::Client,
    config: Arc<ModelConfig>,
}

/// The client could not be built (the TLS set-up failed).
#[derive(Debug, Error)]
#[error("cannot set up the HTTP client for the model server")]
pub struct ClientBuildError(#[source] reqwest::Error);

impl ModelClient {
    pub(crate) fn new(config: Arc<ModelConfig>) -> Result<Self, ClientBuildError> {
        // reqwest is built without a default crypto provider (see the workspace manifest);
        // installing one twice is harmless, so the error is ignored.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .read_timeout(READ_TIMEOUT)
            .user_agent(concat!("acp-child/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(ClientBuildError)?;
        Ok(Self { http, config })
    }

    #[must_use]
    pub(crate) fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Sends a streamed request and returns its events once the server accepted it; `Ok(None)`
    /// when `cancel` fired first. Retries 429 and 5xx answers (see the module docs).
    pub(crate) async fn stream(
        &self,
        request: &ChatRequest<'_>,
        cancel: &CancellationToken,
    ) -> Result<Option<Events>, ModelError> {
        // Serialising plain structs and a JSON value cannot fail.
        let body = serde_json::to_vec(request).unwrap_or_default();
        let mut retries = 0;
        loop {
            let sent = self
                .http
                .post(self.config.endpoint())
                .headers(self.headers())
                .body(body.clone())
                .send();
            let response = tokio::select! {
                biased;
                () = cancel.cancelled() => return Ok(None),
                response = sent => response.map_err(|source| ModelError::Unreachable {
                    base_url: self.config.base_url.clone(),
                    source,
                })?,
            };
            let status = response.status();
            if status.is_success() {
                return Ok(Some(Box::pin(response.bytes_stream().eventsource())));
            }
            let retry_after = retry_after(response.headers());
            let message = error_message(response).await;
            match classify(status, retries, self.config.max_retries) {
                Outcome::Retry => {
                    let delay = backoff(self.config.retry_base, retries, retry_after);
                    tracing::warn!(
                        status = status.as_u16(),
                        retry = retries + 1,
                        delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                        %message,
                        "model request failed; retrying"
                    );
                    tokio::select! {
                        biased;
                        () = cancel.cancelled() => return Ok(None),
                        () = tokio::time::sleep(delay) => {}
                    }
                    retries += 1;
                }
                Outcome::Fail => {
                    return Err(self.failure(status, retries, message, request.model));
                }
            }
        }
    }

    /// The models the server lists (`GET /v1/models`, `{"data": [{"id": ...}]}`), at most
    /// [`MAX_LISTED_MODELS`], in its order, with the context window an entry gives
    /// (`context_length` on `OpenRouter` and LM Studio's `OpenAI` API, `max_model_len` on vLLM,
    /// `context_window` elsewhere); `Err` says why not, for a debug log (a server that lists
    /// nothing is not an error of this agent).
    pub(crate) async fn list_models(&self) -> Result<Vec<ListedModel>, String> {
        #[derive(serde::Deserialize)]
        struct Listing {
            data: Vec<Listed>,
        }
        #[derive(serde::Deserialize)]
        struct Listed {
            id: String,
            #[serde(default)]
            context_length: Option<serde_json::Value>,
            #[serde(default)]
            max_model_len: Option<serde_json::Value>,
            #[serde(default)]
            context_window: Option<serde_json::Value>,
        }
        let url = self.config.models_endpoint();
        let mut headers = self.headers();
        headers.insert(ACCEPT, HeaderValue::from_static("application/json"));
        headers.remove(CONTENT_TYPE);
        let response = self
            .http
            .get(&url)
            .headers(headers)
            .timeout(LIST_TIMEOUT)
            .send()
            .await
            .map_err(|error| format!("GET {url}: {}", describe(&error)))?;
        let status = response.status();
        if !status.is_success() {
            return Err(format!("GET {url}: HTTP {}", status.as_u16()));
        }
        let body = response
            .bytes()
            .await
            .map_err(|error| format!("GET {url}: {}", describe(&error)))?;
        let listing: Listing = serde_json::from_slice(&body)
            .map_err(|error| format!("GET {url}: not a model list ({error})"))?;
        let mut models: Vec<ListedModel> = Vec::new();
        for listed in listing.data {
            if models.len() == MAX_LISTED_MODELS {
                break;
            }
            if listed.id.trim().is_empty() || models.iter().any(|m| m.id == listed.id) {
                continue;
            }
            let context_window = [
                listed.context_length,
                listed.max_model_len,
                listed.context_window,
            ]
            .into_iter()
            .flatten()
            .find_map(|value| value.as_u64().filter(|size| *size > 0));
            models.push(ListedModel {
                id: listed.id,
                context_window,
            });
        }
        Ok(models)
    }

    fn headers(&self) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(ACCEPT, HeaderValue::from_static("text/event-stream"));
        if let Some(key) = &self.config.api_key
            && let Ok(mut value) = HeaderValue::from_str(&format!("Bearer {}", key.value))
        {
            value.set_sensitive(true);
            headers.insert(AUTHORIZATION, value);
        }
        headers
    }

    fn failure(
        &self,
        status: StatusCode,
        retries: u32,
        message: String,
        model: &str,
    ) -> ModelError {
        match status.as_u16() {
            401 | 403 => ModelError::BadKey {
                status: status.as_u16(),
                key_state: key_state(self.config.api_key.as_ref()),
            },
            429 => ModelError::RateLimited { retries, message },
            code if status.is_server_error() => ModelError::ServerFailed {
                status: code,
                retries,
                message,
            },
            code => ModelError::Refused {
                status: code,
                message,
                model: model.to_owned(),
                base_url: self.config.base_url.clone(),
            },
        }
    }
}

/// What to do with a failed answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Retry,
    Fail,
}

/// Rate limits (429) and server errors (5xx) are retried while retries remain; anything else
/// (a bad key, a bad request) would fail the same way again.
#[must_use]
pub(crate) fn classify(status: StatusCode, retries_done: u32, max_retries: u32) -> Outcome {
    let transient = status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error();
    if transient && retries_done < max_retries {
        Outcome::Retry
    } else {
        Outcome::Fail
    }
}

/// The delay before retry number `retries_done + 1`: the server's `Retry-After` (capped), else
/// `base * 2^retries_done`.
#[must_use]
pub(crate) fn backoff(
    base: Duration,
    retries_done: u32,
    retry_after: Option<Duration>,
) -> Duration {
    retry_after.map_or_else(
        || base.saturating_mul(2_u32.saturating_pow(retries_done)),
        |after| after.min(MAX_RETRY_AFTER),
    )
}

/// `Retry-After` in seconds (the HTTP-date form is rare for APIs and is ignored).
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let text = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    text.parse::<f64>()
        .ok()
        .filter(|secs| secs.is_finite() && *secs >= 0.0)
        .map(Duration::from_secs_f64)
}

/// Says where the key came from, without the key.
fn key_state(key: Option<&ApiKey>) -> String {
    match key {
        Some(key) => format!("the key sent came from {}", key.variable),
        None => "no key was set, so none was sent".to_owned(),
    }
}

/// The server's explanation: `error.message` from a JSON body, else the body's start.
async fn error_message(response: reqwest::Response) -> String {
    let status = response.status();
    let body = response.text().await.unwrap_or_default();
    explain_body(status, &body)
}

/// The server's explanation from an error body (pure, for tests).
#[must_use]
pub(crate) fn explain_body(status: StatusCode, body: &str) -> String {
    let from_json = serde_json::from_str::<ErrorBody>(body)
        .ok()
        .and_then(|body| body.error)
        .and_then(|error| error.message);
    let text = from_json.unwrap_or_else(|| body.trim().to_owned());
    if text.is_empty() {
        return status
            .canonical_reason()
            .unwrap_or("no explanation given")
            .to_owned();
    }
    match text.char_indices().nth(MAX_QUOTED_BODY) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_rate_limits_and_server_errors_are_retried_and_boundedly() {
        let retry = |code: u16, done| classify(StatusCode::from_u16(code).unwrap(), done, 3);
        assert_eq!(retry(429, 0), Outcome::Retry);
        assert_eq!(retry(503, 2), Outcome::Retry);
        assert_eq!(retry(429, 3), Outcome::Fail);
        for code in [400, 401, 403, 404] {
            assert_eq!(retry(code, 0), Outcome::Fail, "{code}");
        }
    }

    #[test]
    fn backoff_doubles_and_honours_retry_after() {
        let base = Duration::from_millis(200);
        assert_eq!(backoff(base, 0, None), Duration::from_millis(200));
        assert_eq!(backoff(base, 2, None), Duration::from_millis(800));
        assert_eq!(
            backoff(base, 2, Some(Duration::from_secs(1))),
            Duration::from_secs(1)
        );
        assert_eq!(
            backoff(base, 0, Some(Duration::from_hours(1))),
            MAX_RETRY_AFTER
        );
        let mut headers = HeaderMap::new();
        headers.insert(RETRY_AFTER, HeaderValue::from_static("2"));
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(2)));
        headers.insert(
            RETRY_AFTER,
            HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        );
        assert_eq!(retry_after(&headers), None);
    }

    #[test]
    fn error_bodies_are_quoted_briefly() {
        assert_eq!(
            explain_body(
                StatusCode::NOT_FOUND,
                r#"{"error":{"message":"model x does not exist","type":"invalid_request_error"}}"#
            ),
            "model x does not exist"
        );
        assert_eq!(
            explain_body(StatusCode::BAD_GATEWAY, "  upstream down \n"),
            "upstream down"
        );
        assert_eq!(
            explain_body(StatusCode::SERVICE_UNAVAILABLE, ""),
            "Service Unavailable"
        );
        assert_eq!(
            explain_body(StatusCode::BAD_REQUEST, &"x".repeat(600))
                .chars()
                .count(),
            MAX_QUOTED_BODY + 1
        );
    }

    #[test]
    fn a_bad_key_names_the_variables_never_the_key() {
        let error = ModelError::BadKey {
            status: 401,
            key_state: key_state(Some(&ApiKey {
                variable: "DEEPSEEK_API_KEY",
                value: "sk-secret".into(),
            })),
        };
        assert_eq!(
            error.to_string(),
            "model server rejected the API key (HTTP 401): set ACP_CHILD_API_KEY (or DEEPSEEK_API_KEY / OPENAI_API_KEY) to a valid key; with acp-host forward it with --env ACP_CHILD_API_KEY (the key sent came from DEEPSEEK_API_KEY)"
        );
    }
}
