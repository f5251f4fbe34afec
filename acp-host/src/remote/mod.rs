//! Remote agents over ACP's Streamable HTTP / WebSocket transport (`agent-client-protocol-http`,
//! from the SDK's own repository), on both ends, off the run path:
//!
//! - [`bridge`]: the body of the hidden `acp-host bridge URL`, which `acp-host run --agent
//!   ws://...` spawns as an ordinary agent process. It joins the SDK's HTTP client (over
//!   `http://`) or its own WebSocket client (`bridge_ws`, bounded: one frame at a time) to its
//!   own stdin/stdout, so the run drives a remote agent exactly as a local one (handshake,
//!   permissions, cancel, timeouts, exit codes, the watchdog and teardown are the run's own); it
//!   ends, closing the connection, when its stdin closes or the server ends the connection.
//! - [`serve`]: `acp-host serve`, the other end for any stdio agent. Each connection gets its own
//!   agent process, owned as `acp-host run` owns one ([`crate::process::AgentProcess`]: scrubbed
//!   environment, own process group, watchdog, the EOF -> TERM -> KILL ladder over its tree), and
//!   frames are relayed both ways; a bearer token guards every request, and a bound on live agents
//!   refuses connections past it. What waits for a client is bounded ([`backlog`] over `http://`,
//!   one frame at a time over WebSocket, relayed by `websocket`): a slow client slows its agent.
//!
//! The decisions (which `--agent` is a URL, token rules, who may listen without a token) are
//! `protocol::remote`'s.

mod agent;
pub mod backlog;
pub mod bridge;
mod bridge_ws;
mod failure;
mod gate;
pub mod serve;
mod websocket;
