//! A scriptable mock of an OpenAI-compatible Chat Completions server on loopback, for the
//! end-to-end tests of `acp-child`'s model backend.
//!
//! [`MockLlm`] binds `127.0.0.1:0` and serves on its own tokio runtime, so plain synchronous
//! `#[test]`s can use it. Every request is recorded ([`MockLlm::requests`]). Each
//! `POST /v1/chat/completions` consumes the next [`Reply`] of the script, in order; a request
//! beyond the script gets 500 with "mock script exhausted", any other path 404, so a misrouted
//! or extra request fails the test loudly instead of hanging it. With a required key, a request
//! whose `Authorization` is not `Bearer <key>` gets 401 and consumes nothing.
//!
//! A reply's usage chunk (sent when the request asks with `stream_options.include_usage`)
//! reports the figures the script gives ([`MockLlmBuilder::reply_with_usage`]), zeros otherwise;
//! [`MockLlmBuilder::no_usage`] never sends one, as llama.cpp's servers ignore the option.
//!
//! `GET /v1/models` lists the builder's [`MockLlmBuilder::models`] (none by default) as
//! `{"data": [{"id": ...}]}` (each with `context_length` when [`MockLlmBuilder::context_window`]
//! is set), or fails with 500 ([`MockLlmBuilder::models_fail`]) or another status
//! ([`MockLlmBuilder::models_status`]: 404 as a server without the route); it consumes
//! nothing and is counted apart ([`MockLlm::model_listings`]), not among [`MockLlm::requests`],
//! since an agent lists models on its own at start.
//!
//! Streams are SSE framed exactly as OpenAI-compatible servers frame them
//! (`data: <chunk>\n\n` ... `data: [DONE]\n\n`, no comments, no keep-alives). When a client
//! leaves mid-stream, the connection drops the stream at its next write, so the mock stops
//! writing promptly; how every stream ended is recorded ([`MockLlm::stream_ends`]). Dropping the
//! [`MockLlm`] stops its runtime: the port is closed and hanging replies are abandoned.

mod record;
mod script;

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use futures::stream::{self, Stream};
use serde_json::Value;

pub use record::{RecordedRequest, StreamEnd, message_text};
pub use script::{DONE, Finish, Reply, Usage, split};

use script::Completion;

/// The only path that consumes the script.
pub const CHAT_PATH: &str = "/v1/chat/completions";

/// Where the models are listed (`GET`).
pub const MODELS_PATH: &str = "/v1/models";

/// Bodies larger than this are refused (413): a runaway client must not exhaust memory.
const BODY_LIMIT: usize = 16 * 1024 * 1024;

/// How long dropping a [`MockLlm`] waits for its tasks to stop.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// Why the mock could not start.
#[derive(Debug, thiserror::Error)]
pub enum MockLlmError {
    /// The runtime could not be built (threads or the I/O driver).
    #[error("mock llm: cannot start its tokio runtime (check thread and file limits)")]
    Runtime(#[source] std::io::Error),
    /// The loopback listener could not be set up.
    #[error("mock llm: cannot listen on 127.0.0.1:0 (check that loopback is up)")]
    Bind(#[source] std::io::Error),
}

/// Configures a [`MockLlm`] before it starts.
#[derive(Debug, Default)]
pub struct MockLlmBuilder {
    script: Vec<(Reply, Usage)>,
    required_key: Option<String>,
    models: Vec<String>,
    context_window: Option<u64>,
    /// `GET /v1/models` answers this error status instead of the list.
    models_fail: Option<u16>,
    no_usage: bool,
}

impl MockLlmBuilder {
    /// Never sends a usage chunk, asked or not (as llama.cpp's servers do).
    #[must_use]
    pub fn no_usage(mut self) -> Self {
        self.no_usage = true;
        self
    }

    /// Appends one reply to the script.
    #[must_use]
    pub fn reply(mut self, reply: Reply) -> Self {
        self.script.push((reply, Usage::default()));
        self
    }

    /// Appends one reply whose usage chunk (sent when the request asks for one) reports `usage`.
    #[must_use]
    pub fn reply_with_usage(mut self, reply: Reply, usage: Usage) -> Self {
        self.script.push((reply, usage));
        self
    }

    /// Appends replies to the script.
    #[must_use]
    pub fn replies(mut self, replies: impl IntoIterator<Item = Reply>) -> Self {
        self.script
            .extend(replies.into_iter().map(|reply| (reply, Usage::default())));
        self
    }

    /// Each listed model's entry says `context_length: size` (as `OpenRouter`'s listing does).
    #[must_use]
    pub fn context_window(mut self, size: u64) -> Self {
        self.context_window = Some(size);
        self
    }

    /// Answers 401 (consuming no reply) unless `Authorization` is `Bearer <key>`; `None` accepts
    /// any or no key.
    #[must_use]
    pub fn require_key(mut self, key: Option<&str>) -> Self {
        self.required_key = key.map(str::to_owned);
        self
    }

    /// The models `GET /v1/models` lists, in order.
    #[must_use]
    pub fn models<S: Into<String>>(mut self, models: impl IntoIterator<Item = S>) -> Self {
        self.models = models.into_iter().map(Into::into).collect();
        self
    }

    /// `GET /v1/models` answers 500, as a server that cannot list its models.
    #[must_use]
    pub fn models_fail(self) -> Self {
        self.models_status(500)
    }

    /// `GET /v1/models` answers `status` (an error) instead of the list: 404 is a server without
    /// the route.
    #[must_use]
    pub fn models_status(mut self, status: u16) -> Self {
        self.models_fail = Some(status);
        self
    }

    /// Binds and starts serving.
    pub fn try_start(self) -> Result<MockLlm, MockLlmError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("mock-llm")
            .enable_all()
            .build()
            .map_err(MockLlmError::Runtime)?;
        // Bound synchronously so the port is known, and a failure reported, before returning.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(MockLlmError::Bind)?;
        listener.set_nonblocking(true).map_err(MockLlmError::Bind)?;
        let addr = listener.local_addr().map_err(MockLlmError::Bind)?;
        let listener = {
            let _context = runtime.enter();
            tokio::net::TcpListener::from_std(listener).map_err(MockLlmError::Bind)?
        };
        let shared = Arc::new(Shared {
            required_key: self.required_key,
            models: match self.models_fail {
                None => Ok(self.models),
                Some(status) => Err(status),
            },
            context_window: self.context_window,
            no_usage: self.no_usage,
            state: Mutex::new(Log {
                script: self.script.into(),
                ..Log::default()
            }),
        });
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(Arc::clone(&shared));
        runtime.spawn(async move {
            // Serving only ends with the runtime; an accept error has nobody to report to, and
            // shows up as the test's requests never arriving.
            let _ = axum::serve(listener, app).await;
        });
        Ok(MockLlm {
            runtime: Some(runtime),
            addr,
            shared,
        })
    }

    /// Binds and starts serving; panics (failing the test) when loopback is unusable.
    #[must_use]
    pub fn start(self) -> MockLlm {
        self.try_start().unwrap_or_else(|err| {
            let cause = std::error::Error::source(&err).map(ToString::to_string);
            panic!("{err}: {}", cause.unwrap_or_default())
        })
    }
}

/// A running mock model server; stops when dropped. See the module docs.
#[derive(Debug)]
pub struct MockLlm {
    runtime: Option<tokio::runtime::Runtime>,
    addr: SocketAddr,
    shared: Arc<Shared>,
}

impl MockLlm {
    /// A builder, for a required key or a script assembled step by step.
    #[must_use]
    pub fn builder() -> MockLlmBuilder {
        MockLlmBuilder::default()
    }

    /// Starts a mock that answers with `script`, accepting any key.
    #[must_use]
    pub fn start(script: Vec<Reply>) -> MockLlm {
        MockLlm::builder().replies(script).start()
    }

    /// The listening address.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The OpenAI-style base URL, `/v1` included: `http://127.0.0.1:PORT/v1`.
    #[must_use]
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Every request received so far, in arrival order.
    #[must_use]
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared.log().requests.clone()
    }

    /// How every stream that ended so far ended, in the order they ended.
    #[must_use]
    pub fn stream_ends(&self) -> Vec<StreamEnd> {
        self.shared.log().stream_ends.clone()
    }

    /// How many times `GET /v1/models` was asked.
    #[must_use]
    pub fn model_listings(&self) -> usize {
        self.shared.log().listings
    }

    /// Script replies not consumed yet.
    #[must_use]
    pub fn remaining(&self) -> usize {
        self.shared.log().script.len()
    }

    /// Waits until at least `n` requests arrived; `false` if not within `timeout`.
    #[must_use]
    pub fn wait_for_requests(&self, n: usize, timeout: Duration) -> bool {
        crate::wait_until(timeout, || self.shared.log().requests.len() >= n)
    }

    /// Waits until at least `n` streams ended; `false` if not within `timeout`.
    #[must_use]
    pub fn wait_for_stream_ends(&self, n: usize, timeout: Duration) -> bool {
        crate::wait_until(timeout, || self.shared.log().stream_ends.len() >= n)
    }
}

impl Drop for MockLlm {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            // Waiting is not allowed inside an async context; there, let the tasks stop alone.
            if tokio::runtime::Handle::try_current().is_ok() {
                runtime.shutdown_background();
            } else {
                runtime.shutdown_timeout(SHUTDOWN_GRACE);
            }
        }
    }
}

/// State shared by the handle and the server's tasks.
#[derive(Debug)]
struct Shared {
    required_key: Option<String>,
    /// What `GET /v1/models` lists; `Err`: the status it fails with.
    models: Result<Vec<String>, u16>,
    /// The `context_length` of each listed model, when set.
    context_window: Option<u64>,
    /// No usage chunk is ever sent.
    no_usage: bool,
    state: Mutex<Log>,
}

#[derive(Debug, Default)]
struct Log {
    script: VecDeque<(Reply, Usage)>,
    /// Chat requests answered so far, for the chunks' ids.
    completions: usize,
    requests: Vec<RecordedRequest>,
    stream_ends: Vec<StreamEnd>,
    /// `GET /v1/models` requests, not recorded among `requests`.
    listings: usize,
}

impl Shared {
    /// Answers `GET /v1/models`: the configured list, 401 without the required key, or 500.
    fn list_models(&self, request: &RecordedRequest) -> Response {
        self.log().listings += 1;
        let authorized = self
            .required_key
            .as_deref()
            .is_none_or(|key| request.authorization() == Some(format!("Bearer {key}").as_str()));
        if !authorized {
            return error(StatusCode::UNAUTHORIZED, "Incorrect API key provided.");
        }
        let models = match &self.models {
            Ok(models) => models,
            Err(status) => {
                return error(
                    StatusCode::from_u16(*status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                    "mock llm: listing models fails (models_fail, models_status)",
                );
            }
        };
        let data: Vec<Value> = models
            .iter()
            .map(|id| {
                let mut entry =
                    serde_json::json!({"id": id, "object": "model", "owned_by": "mock"});
                if let Some(size) = self.context_window {
                    entry["context_length"] = size.into();
                }
                entry
            })
            .collect();
        let body = serde_json::json!({"object": "list", "data": data}).to_string();
        (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            Body::from(body),
        )
            .into_response()
    }

    /// The log, even if a panicking test thread poisoned the lock: records stay readable.
    fn log(&self) -> MutexGuard<'_, Log> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records `request` and, if it is a well-formed, authorized chat request, hands it the next
    /// reply: its index among all requests, the reply, and the completion's identity. Otherwise
    /// the error status and message to answer with. Synchronous, so the lock is never held across an await.
    fn admit(
        &self,
        request: RecordedRequest,
        is_chat: bool,
    ) -> Result<(usize, Reply, Completion), (StatusCode, String)> {
        let authorized = self
            .required_key
            .as_deref()
            .is_none_or(|key| request.authorization() == Some(format!("Bearer {key}").as_str()));
        let model = request.body["model"]
            .as_str()
            .unwrap_or("mock-model")
            .to_owned();
        let include_usage =
            !self.no_usage && request.body["stream_options"]["include_usage"] == true;
        let not_json = request.body.is_null();
        let not_chat = format!(
            "mock llm serves only POST {CHAT_PATH}, not {} {}",
            request.method, request.path
        );

        let mut log = self.log();
        let index = log.requests.len();
        log.requests.push(request);
        if !is_chat {
            return Err((StatusCode::NOT_FOUND, not_chat));
        }
        if !authorized {
            return Err((
                StatusCode::UNAUTHORIZED,
                "Incorrect API key provided. You can find your API key at the provider's \
                 dashboard."
                    .to_owned(),
            ));
        }
        if not_json {
            return Err((
                StatusCode::BAD_REQUEST,
                "mock llm: the request body is not JSON".to_owned(),
            ));
        }
        let Some((reply, usage)) = log.script.pop_front() else {
            return Err((
                StatusCode::INTERNAL_SERVER_ERROR,
                format!(
                    "mock script exhausted: request #{} to {CHAT_PATH} has no scripted reply",
                    log.completions + 1
                ),
            ));
        };
        log.completions += 1;
        let completion = Completion {
            id: format!("chatcmpl-mock-{}", log.completions),
            model,
            include_usage,
            usage,
        };
        Ok((index, reply, completion))
    }
}

async fn handle(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let bytes = match axum::body::to_bytes(body, BODY_LIMIT).await {
        Ok(bytes) => bytes,
        Err(err) => {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                &format!("mock llm: cannot read the request body: {err}"),
            );
        }
    };
    let raw_body = String::from_utf8_lossy(&bytes).into_owned();
    let recorded = RecordedRequest {
        method: parts.method.to_string(),
        path: parts
            .uri
            .path_and_query()
            .map_or_else(|| parts.uri.path().to_owned(), ToString::to_string),
        headers: parts
            .headers
            .iter()
            .map(|(name, value)| {
                let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
                (name.as_str().to_owned(), value)
            })
            .collect(),
        body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        raw_body,
    };
    if parts.method == Method::GET && parts.uri.path() == MODELS_PATH {
        return shared.list_models(&recorded);
    }
    let is_chat = parts.method == Method::POST && parts.uri.path() == CHAT_PATH;
    let (index, reply, completion) = match shared.admit(recorded, is_chat) {
        Ok(admitted) => admitted,
        Err((status, message)) => return error(status, &message),
    };
    match &reply {
        Reply::Status { status, message } => match StatusCode::from_u16(*status) {
            Ok(status) => error(status, message),
            Err(_) => error(
                StatusCode::INTERNAL_SERVER_ERROR,
                &format!("mock script error: {status} is not an HTTP status"),
            ),
        },
        Reply::StatusRetryAfter {
            status,
            message,
            seconds,
        } => {
            let status = StatusCode::from_u16(*status).unwrap_or(StatusCode::TOO_MANY_REQUESTS);
            let mut response = error(status, message);
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from(*seconds));
            response
        }
        Reply::Hang => {
            // Dropped with the connection or the runtime, whichever goes first.
            let never: Infallible = std::future::pending().await;
            match never {}
        }
        _ => {
            let frames = script::stream(&reply, &completion).unwrap_or_default();
            Sse::new(feed(shared, index, frames)).into_response()
        }
    }
}

/// The events of one stream, each after its delay. The end is recorded when the stream is
/// dropped: after the last event, or earlier when the connection fails to write (client gone).
fn feed(
    shared: Arc<Shared>,
    request: usize,
    frames: Vec<(Duration, String)>,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let end = EndGuard {
        shared,
        end: StreamEnd {
            request,
            sent: 0,
            total: frames.len(),
        },
    };
    stream::unfold(
        (VecDeque::from(frames), end),
        |(mut frames, mut end)| async move {
            let (delay, data) = frames.pop_front()?;
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            end.end.sent += 1;
            Some((Ok(Event::default().data(data)), (frames, end)))
        },
    )
}

/// Records a stream's end when the stream is dropped, however it ends.
struct EndGuard {
    shared: Arc<Shared>,
    end: StreamEnd,
}

impl Drop for EndGuard {
    fn drop(&mut self) {
        self.shared.log().stream_ends.push(self.end);
    }
}

fn error(status: StatusCode, message: &str) -> Response {
    let body = script::error_body(status.as_u16(), message).to_string();
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        Body::from(body),
    )
        .into_response()
}
