//! The agents of `acp-host serve`'s connections: what the server was asked to serve
//! ([`ServeConfig`]), the slots that bound live agents, each agent's spawn ([`start_agent`]: its
//! sandbox, its stderr to the log) and its ownership until teardown ([`Owned`]), and its stdout
//! as frames. Both transports point down at it: `serve` (HTTP, and the router) and `websocket`.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::TryStreamExt as _;
use protocol::remote::Token;
use protocol::request::AgentCommand;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::codec::{AnyDelimiterCodec, AnyDelimiterCodecError, FramedRead};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tokio_util::task::task_tracker::TaskTrackerToken;

use crate::process::{AgentPipes, AgentProcess, Graces, SpawnSpec, StderrSink};
use crate::run::{DEFAULT_MAX_FRAME_BYTES, DEFAULT_STDERR_TAIL_BYTES, Prepared};

/// What `acp-host serve` serves, validated by the caller (`protocol::remote::check_listen`).
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// The agent each connection gets, resolved.
    pub agent: AgentCommand,
    /// The agents' working directory (absolute).
    pub cwd: PathBuf,
    /// The agents' environment and delegation standing, computed once (`run::prepare`).
    pub prepared: Prepared,
    /// `None` only with `--insecure-no-auth` on loopback.
    pub token: Option<Token>,
    /// Agents alive at once, at most.
    pub max_connections: usize,
    /// The teardown ladder of each agent.
    pub graces: Graces,
    /// Over HTTP, how long a connection may have no event stream open before its agent is torn
    /// down: an HTTP client that vanishes sends no `DELETE`, and the transport keeps such a
    /// connection for a reconnect that never comes.
    pub stream_grace: Duration,
    /// How long the agent's output may wait for a client that takes none of it before the
    /// client is taken for dead and its connection and agent end.
    pub stall_timeout: Duration,
    /// How long a connection may go without an authenticated request before it is closed (a
    /// client that sends its headers slowly, or never; see `gate`).
    pub header_timeout: Duration,
}

/// What every connection's agent shares, over HTTP and WebSocket alike.
pub(super) struct Agents {
    pub(super) config: Arc<ServeConfig>,
    /// One permit per live agent, held until its teardown has ended.
    slots: Arc<Semaphore>,
    /// Teardowns of agents whose connection went away; awaited when the server stops.
    pub(super) teardowns: TaskTracker,
    pub(super) stop: CancellationToken,
    /// Connection numbers for the log.
    next_id: AtomicU64,
}

impl Agents {
    pub(super) fn new(config: Arc<ServeConfig>, stop: CancellationToken) -> Agents {
        Agents {
            slots: Arc::new(Semaphore::new(config.max_connections)),
            config,
            teardowns: TaskTracker::new(),
            stop,
            next_id: AtomicU64::new(1),
        }
    }

    /// Agents that may start before `max_connections` are alive.
    pub(super) fn free_slots(&self) -> usize {
        self.slots.available_permits()
    }
}

/// The refusal a client gets while every slot is taken.
pub(super) fn at_capacity(agents: &Agents) -> String {
    format!(
        "acp-host serve: {} agents are running already (--max-connections {}); try again later\n",
        agents.config.max_connections, agents.config.max_connections
    )
}

/// The agent's stdout ended a connection: a line past the frame limit, or a read error.
#[derive(Debug, thiserror::Error)]
#[error("the agent's stdout: {0} (frames are at most {DEFAULT_MAX_FRAME_BYTES} bytes)")]
pub(super) struct BadOutput(AnyDelimiterCodecError);

/// The agent's stdout as frames (lines without their line break). A frame that is not UTF-8 is
/// decoded with replacement characters, as `acp-host run` decodes it, rather than ending the
/// connection.
pub(super) fn agent_frames(
    stdout: tokio::net::unix::pipe::Receiver,
    id: u64,
) -> impl futures::Stream<Item = Result<String, BadOutput>> + Send + Unpin + 'static {
    FramedRead::new(
        stdout,
        AnyDelimiterCodec::new_with_max_length(b"\n".to_vec(), Vec::new(), DEFAULT_MAX_FRAME_BYTES),
    )
    .map_err(BadOutput)
    .map_ok(move |line| {
        let line = line.strip_suffix(b"\r").unwrap_or(&line);
        if let Ok(text) = std::str::from_utf8(line) {
            text.to_owned()
        } else {
            tracing::warn!(
                connection = id,
                "the agent sent a frame that is not valid UTF-8; relayed it with replacement characters"
            );
            String::from_utf8_lossy(line).into_owned()
        }
    })
}

/// Takes a slot and spawns a connection's agent: `Ok(None)` when the server is stopping, `Err`
/// (the client's message, already logged) when every slot is taken or the spawn failed.
///
/// On the thread polling the connection, waiting (briefly: the watchdog's word that the agent
/// started) as `acp-host run` does; see [`super::serve::Server::run`] for which thread that is.
pub(super) fn start_agent(shared: &Arc<Agents>) -> Result<Option<(Owned, AgentPipes)>, String> {
    // Counted before anything else, so a stopping server waits for this connection too.
    let tracked = shared.teardowns.token();
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    let Ok(slot) = Arc::clone(&shared.slots).try_acquire_owned() else {
        tracing::warn!(connection = id, "refused a connection: every slot is taken");
        return Err(at_capacity(shared));
    };
    if shared.stop.is_cancelled() {
        return Ok(None);
    }
    let config = &shared.config;
    let mut env = config.prepared.agent_env().env.clone();
    let sandbox = confine(id, &config.prepared, &mut env)?;
    let spec = SpawnSpec {
        program: config.agent.program.clone(),
        args: config.agent.args.clone(),
        cwd: config.cwd.clone(),
        env,
        stderr_tail_bytes: DEFAULT_STDERR_TAIL_BYTES,
        stderr_lines: Some(stderr_log(id, &config.prepared)),
        sandbox: sandbox.clone(),
    };
    let (process, pipes) = match AgentProcess::spawn(&spec) {
        Ok(spawned) => spawned,
        Err(err) => {
            tracing::error!(connection = id, "{}", protocol::report::describe(&err));
            return Err(format!("acp-host serve: {err}"));
        }
    };
    tracing::info!(connection = id, pid = process.pid(), "agent started");
    let owned = Owned {
        process: Some(process),
        slot: Some(slot),
        shared: Arc::clone(shared),
        id,
        tracked: Some(tracked),
        _sandbox: sandbox,
    };
    Ok(Some((owned, pipes)))
}

/// Connection `id`'s sandbox (`None` when the server was asked for none), its temporary folder
/// made the agent's `TMPDIR`; `Err` is the client's message (already logged).
fn confine(
    id: u64,
    prepared: &Prepared,
    env: &mut std::collections::BTreeMap<std::ffi::OsString, std::ffi::OsString>,
) -> Result<Option<Arc<crate::sandbox::Confinement>>, String> {
    if !prepared.sandbox().is_active() {
        return Ok(None);
    }
    let place = crate::sandbox::Place {
        env,
        sessions: Vec::new(),
    };
    let confinement = crate::sandbox::confine(prepared.sandbox(), &place).map_err(|err| {
        tracing::error!(connection = id, "{}", protocol::report::describe(&err));
        format!("acp-host serve: {err}")
    })?;
    if let Some(temp) = confinement.temp_dir() {
        env.insert("TMPDIR".into(), temp.into());
    }
    tracing::info!(connection = id, "{}", confinement.report().describe());
    Ok(Some(Arc::new(confinement)))
}

/// The agent's stderr goes to the server's log (debug), credential values redacted; it does not
/// cross the connection.
fn stderr_log(id: u64, prepared: &Prepared) -> StderrSink {
    let redactor = prepared.redactor().clone();
    Arc::new(move |line: &str| {
        tracing::debug!(connection = id, "agent stderr: {}", redactor.redact(line));
    })
}

/// A connection's agent and its slot: torn down in place when the relay ends, or on a tracked
/// task when the SDK drops the connection (a client gone, a `DELETE`).
pub(super) struct Owned {
    process: Option<AgentProcess>,
    slot: Option<OwnedSemaphorePermit>,
    shared: Arc<Agents>,
    pub(super) id: u64,
    /// Keeps [`super::serve::Server::run`] waiting until the teardown has ended.
    tracked: Option<TaskTrackerToken>,
    /// The agent's sandbox, kept while the agent runs: its temporary folder goes with the
    /// connection, after the agent's teardown.
    _sandbox: Option<Arc<crate::sandbox::Confinement>>,
}

impl Owned {
    pub(super) async fn tear_down(&mut self) {
        if let Some(process) = self.process.take() {
            finish(process, self.shared.config.graces, self.id).await;
        }
        self.slot.take();
        self.tracked.take();
    }
}

async fn finish(mut process: AgentProcess, graces: Graces, id: u64) {
    let teardown = process.shutdown(graces).await;
    tracing::info!(
        connection = id,
        pid = process.pid(),
        ended_by = teardown.rung.as_str(),
        "agent ended"
    );
}

impl Drop for Owned {
    fn drop(&mut self) {
        let Some(process) = self.process.take() else {
            return;
        };
        let (graces, id) = (self.shared.config.graces, self.id);
        let (slot, tracked) = (self.slot.take(), self.tracked.take());
        // Outside a runtime (it is shutting down) the process's own drop kills its tree.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            self.shared.teardowns.spawn_on(
                async move {
                    finish(process, graces, id).await;
                    drop((slot, tracked));
                },
                &runtime,
            );
        }
    }
}
