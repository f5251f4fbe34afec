//! `acp-host serve`: any stdio agent behind ACP's Streamable HTTP / WebSocket transport.
//!
//! Over `http://` the SDK's server (`AcpHttpServer`) calls our factory once per connection; the
//! component it returns (`ServedAgent`) spawns the agent when the connection starts and relays
//! frames between the connection and the agent's pipes. A WebSocket upgrade never reaches the
//! SDK: `super::websocket` relays it itself, so that a client that stops reading slows its agent
//! down (the SDK's per-connection queues are unbounded). Around the SDK's router sit two layers
//! of ours: the bearer token, checked on every request (401, nothing spawned), and a fast
//! refusal (503) of a new connection while `max_connections` agents are
//! alive (where WebSocket upgrades are taken aside). Before them all, on every route (`/health`
//! too), a web page's request is refused (403, `protocol::remote::check_browser`): one with an
//! `Origin`, and, on a server without a token, one naming a host that is not loopback (a page
//! after DNS rebinding). Beneath them all, `super::gate` times and caps the connections that have
//! made no authenticated request yet.
//!
//! Invariants:
//! - each connection's agent is an [`crate::process::AgentProcess`] spawned with the environment `acp-host run`
//!   would give it (scrubbed, with the server's delegation standing), in its own process group
//!   under the watchdog; at most `max_connections` are alive at once (a semaphore's permit is
//!   held from before the spawn until the agent's teardown has ended, so the bound holds even
//!   against connections racing past the 503 check: those are refused without a spawn);
//! - every ending tears the agent's tree down: the agent exiting (its stdout ends), the client
//!   closing or vanishing (the SDK drops the component; its guard runs the ladder on a tracked
//!   task; over HTTP, where a vanished client sends nothing, a connection without an open event
//!   stream for `stream_grace` is ended by us: the SDK would keep it for a reconnect), the server
//!   stopping (every component ends, and [`Server::run`] waits for the
//!   teardowns before it returns);
//! - a frame of the agent's stdout longer than `max_frame_bytes` ends its connection (and the
//!   agent) instead of growing a buffer; one that is not UTF-8 is decoded with replacement
//!   characters, as `acp-host run` decodes it; frames from a client are bounded by the SDK (POST
//!   bodies) and by `super::websocket` (messages);
//! - over `http://`, a client's POST goes on to the transport only while its connection's
//!   inbound backlog has room (a frame counts until the agent's stdin queue took it); one that
//!   finds none for `stall_timeout` is refused (503), so a client cannot queue without a bound;
//! - over `http://`, the agent's next frame is handed to the transport only while its
//!   connection's backlog (`super::backlog`) has room (a frame counts until its event left on an
//!   event stream, or, for the `initialize` answer, its POST's response); a client that takes
//!   none of it for `stall_timeout` ends the connection;
//! - the token is compared in constant time and never logged.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, Weak};
use std::time::Duration;

use agent_client_protocol::{Agent, Client, ConnectTo, Lines};
use agent_client_protocol_http::{AcpHttpServer, ServerOptions};
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use futures::{SinkExt as _, StreamExt as _, TryStreamExt as _};
use protocol::remote::Token;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use super::agent::ServeConfig;
use super::agent::{Agents, agent_frames, at_capacity, start_agent};
use super::backlog::Backlog;
use super::gate::Admission;

/// The endpoint path: the transport's default, which a client given a bare `ws://HOST:PORT`
/// targets.
pub const ENDPOINT: &str = "/acp";

/// The server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen on {addr}: {source} (is another server there? pick another --listen)")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("the server failed: {0}")]
    Serve(#[source] std::io::Error),
}

/// A bound server, not yet accepting.
#[derive(Debug)]
pub struct Server {
    listener: TcpListener,
    config: Arc<ServeConfig>,
}

impl Server {
    /// Binds `addr` (port 0: the system picks one; see [`Server::local_addr`]).
    pub async fn bind(addr: SocketAddr, config: ServeConfig) -> Result<Server, ServeError> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| ServeError::Bind { addr, source })?;
        Ok(Server {
            listener,
            config: Arc::new(config),
        })
    }

    /// Where it listens.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `stop` is cancelled, then ends every connection, tears every agent down and
    /// returns once they are all gone.
    ///
    /// Agents are spawned on the thread that polls their connection: run this on a
    /// current-thread runtime whose thread outlives the server (`acp-host serve` uses the main
    /// thread). Where the watchdog is unavailable an agent is spawned with a parent-death signal,
    /// which follows the spawning thread, not the process.
    pub async fn run(self, stop: CancellationToken) -> Result<(), ServeError> {
        let shared = Arc::new(Shared {
            agents: Arc::new(Agents::new(Arc::clone(&self.config), stop.clone())),
            links: Mutex::new(HashMap::new()),
        });
        let factory = {
            let shared = Arc::clone(&shared);
            move || ServedAgent {
                shared: Arc::clone(&shared),
                // Set for a connection started by an `initialize` POST (see `admit_connection`).
                link: PENDING_LINK.try_with(Arc::clone).ok(),
            }
        };
        let acp = AcpHttpServer::new(factory)
            .with_options(
                ServerOptions::default()
                    .with_path(ENDPOINT)
                    .with_health_endpoint(false),
            )
            .into_router()
            .layer(middleware::from_fn_with_state(
                Arc::clone(&shared),
                admit_connection,
            ))
            .layer(middleware::from_fn_with_state(
                Arc::clone(&shared),
                authenticate,
            ));
        // `/health` answers without the token: a load balancer's probe reveals nothing else.
        let app = acp
            .merge(axum::Router::new().route("/health", axum::routing::get(health)))
            .layer(middleware::from_fn_with_state(
                Arc::clone(&shared),
                refuse_browsers,
            ));
        let listener = super::gate::Gated::new(
            self.listener,
            shared.agents.config.header_timeout,
            keepalive(shared.agents.config.stall_timeout),
        );
        let app = app.into_make_service_with_connect_info::<Admission>();
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(stop.clone().cancelled_owned())
            .await;
        // Connections upgraded to WebSocket outlive axum's graceful shutdown; each of their
        // components has seen `stop` and is tearing its agent down.
        shared.agents.teardowns.close();
        shared.agents.teardowns.wait().await;
        served.map_err(ServeError::Serve)
    }
}

/// TCP keepalive for every connection: a client that vanished without closing (its machine gone,
/// a NAT that forgot the flow) sends nothing and reads nothing, so on an idle connection no
/// timeout of ours fires and it would hold its slot for good. The kernel probes a connection
/// quiet for `stall` (`--stall-timeout`), four times at a quarter of it (at least a second
/// apart); unanswered, the connection fails and its agent is torn down: about twice `stall`.
fn keepalive(stall: Duration) -> socket2::TcpKeepalive {
    let interval = (stall / 4).max(Duration::from_secs(1));
    socket2::TcpKeepalive::new()
        .with_time(stall.max(Duration::from_secs(1)))
        .with_interval(interval)
        .with_retries(4)
}

async fn health() -> &'static str {
    "ok"
}

pub(super) struct Shared {
    /// The agents of every connection, HTTP or WebSocket.
    pub(super) agents: Arc<Agents>,
    /// HTTP connections by the transport's `Acp-Connection-Id`: their event streams are counted.
    links: Mutex<HashMap<String, Weak<Link>>>,
}

tokio::task_local! {
    /// The link of the connection an `initialize` POST is creating: the SDK calls the factory in
    /// the request's own task, inside `admit_connection`'s scope.
    static PENDING_LINK: Arc<Link>;
}

/// What the HTTP side knows of one connection: its open event streams, and how to end it.
#[derive(Default)]
struct Link {
    end: CancellationToken,
    /// The agent's frames the transport holds for this connection's event streams.
    backlog: Arc<Backlog>,
    /// The client's frames (POSTs) the transport holds for the agent's stdin: a POST past the
    /// bound waits for room (the client is slowed down), and is refused after `stall_timeout`.
    inbound: Arc<Backlog>,
    streams: AtomicUsize,
    /// Bumped on every stream opened or closed: a grace timer armed before acts on nothing.
    generation: AtomicU64,
}

impl Shared {
    /// Ends `link`'s connection unless an event stream is open again within the grace.
    fn arm_grace(self: &Arc<Self>, link: &Arc<Link>) {
        let generation = link.generation.load(Ordering::SeqCst);
        let (link, grace) = (Arc::downgrade(link), self.agents.config.stream_grace);
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            let Some(link) = link.upgrade() else { return };
            if link.streams.load(Ordering::SeqCst) == 0
                && link.generation.load(Ordering::SeqCst) == generation
            {
                tracing::info!(
                    "an HTTP connection had no event stream for {grace:?}: ending it and its agent"
                );
                link.end.cancel();
            }
        });
    }

    fn link(&self, connection_id: &str) -> Option<Arc<Link>> {
        crate::lock(&self.links)
            .get(connection_id)
            .and_then(Weak::upgrade)
    }
}

/// An open event stream of a connection; its end (the client gone, or done) may end the
/// connection after the grace.
struct StreamGuard {
    shared: Arc<Shared>,
    link: Arc<Link>,
}

impl StreamGuard {
    fn open(shared: Arc<Shared>, link: Arc<Link>) -> StreamGuard {
        link.streams.fetch_add(1, Ordering::SeqCst);
        link.generation.fetch_add(1, Ordering::SeqCst);
        StreamGuard { shared, link }
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.link.generation.fetch_add(1, Ordering::SeqCst);
        if self.link.streams.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.shared.arm_grace(&self.link);
        }
    }
}

/// A web page's request is refused before anything else (`protocol::remote::check_browser`).
async fn refuse_browsers(
    State(shared): State<Arc<Shared>>,
    request: Request,
    next: Next,
) -> Response {
    let host = request
        .headers()
        .get(header::HOST)
        .map(axum::http::HeaderValue::as_bytes)
        .or_else(|| request.uri().authority().map(|a| a.as_str().as_bytes()));
    let has_origin = request.headers().contains_key(header::ORIGIN);
    match protocol::remote::check_browser(host, has_origin, shared.agents.config.token.is_none()) {
        Ok(()) => {
            // Without a token, a request that passed is as authenticated as any.
            if shared.agents.config.token.is_none() {
                admitted(&request);
            }
            next.run(request).await
        }
        Err(refusal) => {
            tracing::info!("refused a request: {refusal}");
            (
                StatusCode::FORBIDDEN,
                format!("acp-host serve: {refusal}\n"),
            )
                .into_response()
        }
    }
}

/// Every request needs `Authorization: Bearer TOKEN` (unless there is no token at all: loopback
/// with `--insecure-no-auth`).
async fn authenticate(State(shared): State<Arc<Shared>>, request: Request, next: Next) -> Response {
    let Some(token) = &shared.agents.config.token else {
        return next.run(request).await;
    };
    if bearer_matches(request.headers(), token) {
        admitted(&request);
        return next.run(request).await;
    }
    tracing::info!("refused a request without the right bearer token");
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer")],
        "acp-host serve: missing or wrong bearer token (send `Authorization: Bearer TOKEN`; \
         acp-host run takes it from --token-file or --token-env)\n",
    )
        .into_response()
}

/// A request passed the check: its connection is no longer timed or counted by the gate.
fn admitted(request: &Request) {
    if let Some(ConnectInfo(admission)) = request.extensions().get::<ConnectInfo<Admission>>() {
        admission.authenticated();
    }
}

fn bearer_matches(headers: &HeaderMap, token: &Token) -> bool {
    use subtle::ConstantTimeEq as _;
    let Some(given) = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.as_bytes().strip_prefix(b"Bearer "))
    else {
        return false;
    };
    given.ct_eq(token.expose().as_bytes()).into()
}

/// A request that would start a connection (an `initialize` POST, a WebSocket upgrade) while
/// every slot is taken is refused here, before the SDK sees it.
async fn admit_connection(
    State(shared): State<Arc<Shared>>,
    request: Request,
    next: Next,
) -> Response {
    let starts = starts_connection(&request);
    if starts && shared.agents.free_slots() == 0 {
        tracing::warn!(
            max = shared.agents.config.max_connections,
            "refused a connection: every slot is taken"
        );
        return (StatusCode::SERVICE_UNAVAILABLE, at_capacity(&shared.agents)).into_response();
    }
    if starts && is_upgrade(&request) {
        return super::websocket::upgrade(Arc::clone(&shared.agents), request).await;
    }
    if starts && request.method() == axum::http::Method::POST {
        let link = Arc::new(Link::default());
        let response = PENDING_LINK
            .scope(Arc::clone(&link), next.run(request))
            .await;
        if let Some(id) = connection_id(response.headers()) {
            // The answer to `initialize` is the one frame a POST's response carries.
            link.backlog.delivered();
            let mut links = crate::lock(&shared.links);
            links.retain(|_, link| link.strong_count() > 0);
            links.insert(id.to_owned(), Arc::downgrade(&link));
            drop(links);
            // Until the client opens its event stream.
            shared.arm_grace(&link);
        }
        return response;
    }
    if request.method() == axum::http::Method::POST
        && let Some(link) = connection_id(request.headers()).and_then(|id| shared.link(id))
    {
        return admit_post(&shared, &link, request, next).await;
    }
    let stream = request.method() == axum::http::Method::GET
        && request.headers().get(header::ACCEPT).is_some_and(|accept| {
            accept
                .as_bytes()
                .windows(17)
                .any(|w| w == b"text/event-stream")
        });
    let link = stream
        .then(|| connection_id(request.headers()).and_then(|id| shared.link(id)))
        .flatten();
    let response = next.run(request).await;
    match link {
        Some(link) if response.status().is_success() => {
            let guard = StreamGuard::open(Arc::clone(&shared), link);
            response.map(|body| {
                axum::body::Body::from_stream(body.into_data_stream().map(move |chunk| {
                    // One chunk is one event; an event with data is one of the agent's frames
                    // (the others are keep-alive comments).
                    if let Ok(chunk) = &chunk
                        && chunk.starts_with(b"data:")
                    {
                        guard.link.backlog.delivered();
                    }
                    chunk
                }))
            })
        }
        _ => response,
    }
}

/// A client's frame for its agent: it goes on once the agent's stdin has room for it (the
/// transport would queue it without a bound, answering 202 at once); a client that keeps
/// sending while its agent reads nothing for `stall_timeout` is refused (503) instead.
async fn admit_post(shared: &Shared, link: &Link, request: Request, next: Next) -> Response {
    let bytes = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok()?.parse::<usize>().ok())
        .unwrap_or(0);
    let stall = shared.agents.config.stall_timeout;
    if link.inbound.admit(bytes, stall).await.is_err() {
        tracing::warn!(
            "refused a POST: the agent took none of its client's messages for {}s",
            stall.as_secs_f64()
        );
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "1")],
            format!(
                "acp-host serve: the agent read none of this connection's messages for {}s; \
                 send fewer at once\n",
                stall.as_secs_f64()
            ),
        )
            .into_response();
    }
    let response = next.run(request).await;
    // Only an accepted POST becomes a frame on the agent's stdin (which counts it out).
    if response.status() != StatusCode::ACCEPTED {
        link.inbound.delivered();
    }
    response
}

fn connection_id(headers: &HeaderMap) -> Option<&str> {
    headers
        .get("acp-connection-id")
        .and_then(|value| value.to_str().ok())
}

/// A WebSocket upgrade (whatever its headers: every upgrade is a new connection, and none may
/// reach the SDK's unbounded relay), or a POST without a connection id (`initialize`).
fn starts_connection(request: &Request) -> bool {
    is_upgrade(request)
        || (request.method() == axum::http::Method::POST
            && !request.headers().contains_key("acp-connection-id"))
}

fn is_upgrade(request: &Request) -> bool {
    request
        .headers()
        .get(header::UPGRADE)
        .is_some_and(|value| value.as_bytes().eq_ignore_ascii_case(b"websocket"))
}

/// One connection's agent: spawned when the SDK connects it, torn down when it ends.
struct ServedAgent {
    shared: Arc<Shared>,
    /// The HTTP side's hold on the connection (`None` over WebSocket, whose close is seen).
    link: Option<Arc<Link>>,
}

impl ConnectTo<Client> for ServedAgent {
    async fn connect_to(
        self,
        client: impl ConnectTo<Agent>,
    ) -> Result<(), agent_client_protocol::Error> {
        // Over http:// the link counts what the client took; without one (not a connection
        // started by a POST) nothing can be counted, and the frames are not held back.
        let backlog = self.link.as_ref().map(|link| Arc::clone(&link.backlog));
        let (shared, link) = (self.shared, self.link.unwrap_or_default());
        let (mut guard, pipes) = match start_agent(&shared.agents) {
            Ok(Some(started)) => started,
            Ok(None) => return Ok(()),
            Err(message) => {
                return Err(agent_client_protocol::Error::internal_error().data(message));
            }
        };
        let id = guard.id;
        let stall = shared.agents.config.stall_timeout;
        // Each frame waits for room in the connection's backlog before the transport (whose
        // queues are unbounded) takes it: the agent then blocks on its own full pipe.
        let stdout = agent_frames(pipes.stdout, id)
            .map_err(|err| std::io::Error::other(err.to_string()))
            .and_then(move |line| {
                let backlog = backlog.clone();
                async move {
                    if let Some(backlog) = backlog {
                        backlog.admit(line.len(), stall).await.map_err(|stalled| {
                            tracing::warn!(connection = id, "{stalled}: ending it and its agent");
                            std::io::Error::other(stalled.to_string())
                        })?;
                    }
                    Ok(line)
                }
            })
            .boxed();
        // A frame leaves the connection's inbound backlog once the agent's stdin (its queue of
        // 64 frames, then the pipe) takes it.
        let inbound = Arc::clone(&link.inbound);
        let stdin = pipes.stdin.with(move |line: String| {
            inbound.delivered();
            futures::future::ready(Ok::<_, std::io::Error>(line))
        });
        let relay = ConnectTo::<Client>::connect_to(Lines::new(stdin, stdout), client);
        let result = tokio::select! {
            result = relay => result,
            () = shared.agents.stop.cancelled() => Ok(()),
            () = link.end.cancelled() => Ok(()),
        };
        if let Err(err) = &result {
            tracing::info!(connection = id, "connection ended: {err}");
        }
        guard.tear_down().await;
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(method: &str, headers: &[(&str, &str)]) -> Request {
        let mut builder = axum::http::Request::builder().method(method).uri(ENDPOINT);
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        builder.body(axum::body::Body::empty()).unwrap()
    }

    #[test]
    fn every_websocket_upgrade_starts_a_connection_of_ours() {
        let upgrade = ("upgrade", "WebSocket");
        assert!(starts_connection(&request("GET", &[upgrade])));
        // A connection id does not send an upgrade to the SDK's own (unbounded) relay.
        assert!(starts_connection(&request(
            "GET",
            &[upgrade, ("acp-connection-id", "x")]
        )));
        assert!(starts_connection(&request("POST", &[])));
        assert!(!starts_connection(&request(
            "POST",
            &[("acp-connection-id", "x")]
        )));
        assert!(!starts_connection(&request(
            "GET",
            &[("accept", "text/event-stream"), ("acp-connection-id", "x")]
        )));
    }
}
