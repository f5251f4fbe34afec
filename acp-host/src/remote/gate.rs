//! `acp-host serve`'s connections before they made an authenticated request: each has
//! `header_timeout` from its accept to make one, and at most [`MAX_UNAUTHENTICATED`] are open at
//! once (a new one closes the oldest). Without this, sockets that never finish their headers
//! (half-open, slow) hold a descriptor each for as long as their client likes, and enough of them
//! starve the server of descriptors: every client, `/health` included, times out.
//!
//! Invariants:
//! - every accepted connection is admitted ([`Gate::admit`]) before anything reads from it, and
//!   counts until a request on it passed the token check ([`Admission::authenticated`]; under
//!   `--insecure-no-auth`, the browser check), or it ended;
//! - an admitted connection that is still waiting when its timeout passes, or is the oldest of
//!   too many, fails its next read or write (and one it is parked in: its waker is registered), so
//!   hyper closes it; an authenticated connection is never closed here;
//! - what decides is one atomic phase per connection: a connection is authenticated or closed,
//!   never both, however the two race.

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::connect_info::Connected;
use axum::serve::{IncomingStream, Listener};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

/// Connections without an authenticated request open at once, at most: far below the default
/// descriptor limit (1024), far above what honest clients hold while they send their headers.
pub(super) const MAX_UNAUTHENTICATED: usize = 128;

const WAITING: u8 = 0;
const AUTHENTICATED: u8 = 1;
const CLOSED: u8 = 2;

/// One connection's standing, shared by its IO and its requests (as their connect info).
#[derive(Debug, Clone)]
pub(super) struct Admission(Arc<State>);

#[derive(Debug, Default)]
struct State {
    phase: AtomicU8,
    /// Cancelled when the connection is closed for being the oldest of too many.
    evicted: CancellationToken,
}

impl Admission {
    /// A request on this connection passed the check: it is no longer timed or counted. False
    /// when the connection was closed first (its request is answered to nobody).
    pub(super) fn authenticated(&self) -> bool {
        self.settle(AUTHENTICATED) || self.0.phase.load(Ordering::SeqCst) == AUTHENTICATED
    }

    /// Moves a waiting connection to `phase`; false when it had left waiting already.
    fn settle(&self, phase: u8) -> bool {
        self.0
            .phase
            .compare_exchange(WAITING, phase, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }

    fn waiting(&self) -> bool {
        self.0.phase.load(Ordering::SeqCst) == WAITING
    }
}

/// The connections still waiting, oldest first.
#[derive(Debug, Default)]
struct Gate {
    waiting: Mutex<VecDeque<Admission>>,
}

impl Gate {
    /// Admits a new connection, closing the oldest waiting ones past [`MAX_UNAUTHENTICATED`].
    fn admit(&self) -> Admission {
        let admission = Admission(Arc::default());
        let mut waiting = crate::lock(&self.waiting);
        waiting.retain(Admission::waiting);
        while waiting.len() >= MAX_UNAUTHENTICATED {
            if let Some(oldest) = waiting.pop_front()
                && oldest.settle(CLOSED)
            {
                oldest.0.evicted.cancel();
                tracing::debug!(
                    "closed the oldest connection without an authenticated request: \
                     {MAX_UNAUTHENTICATED} are open"
                );
            }
        }
        waiting.push_back(admission.clone());
        admission
    }
}

/// The server's listener: TCP, each connection admitted, with `TCP_NODELAY` and keepalive.
pub(super) struct Gated {
    listener: TcpListener,
    gate: Arc<Gate>,
    header_timeout: Duration,
    keepalive: socket2::TcpKeepalive,
}

impl Gated {
    pub(super) fn new(
        listener: TcpListener,
        header_timeout: Duration,
        keepalive: socket2::TcpKeepalive,
    ) -> Gated {
        Gated {
            listener,
            gate: Arc::default(),
            header_timeout,
            keepalive,
        }
    }
}

impl Listener for Gated {
    type Io = GatedIo;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (GatedIo, SocketAddr) {
        loop {
            match self.listener.accept().await {
                Ok((tcp, addr)) => {
                    // Frames are small and interactive: without TCP_NODELAY an update followed
                    // by its answer waits out the client's delayed ACK (40 ms a turn).
                    if let Err(err) = tcp.set_nodelay(true) {
                        tracing::debug!("cannot set TCP_NODELAY: {err}");
                    }
                    if let Err(err) =
                        socket2::SockRef::from(&tcp).set_tcp_keepalive(&self.keepalive)
                    {
                        tracing::debug!("cannot set TCP keepalive: {err}");
                    }
                    let admission = self.gate.admit();
                    return (GatedIo::new(tcp, admission, self.header_timeout), addr);
                }
                Err(err)
                    if matches!(
                        err.kind(),
                        io::ErrorKind::ConnectionRefused
                            | io::ErrorKind::ConnectionAborted
                            | io::ErrorKind::ConnectionReset
                    ) => {}
                Err(err) => {
                    // Out of descriptors, most likely: some will be closed (the gate's timeouts
                    // among them); as axum's own listener does, wait a little and try again.
                    tracing::error!("accept error: {err}");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }
}

impl Connected<IncomingStream<'_, Gated>> for Admission {
    fn connect_info(stream: IncomingStream<'_, Gated>) -> Self {
        stream.io().admission.clone()
    }
}

type Timeout = Pin<Box<tokio::time::Sleep>>;
type Evicted = Pin<Box<WaitForCancellationFutureOwned>>;

/// A connection's socket, failing once its admission was closed.
pub(super) struct GatedIo {
    tcp: TcpStream,
    admission: Admission,
    /// While waiting: the timeout and the eviction, both polled with the socket.
    timers: Option<(Timeout, Evicted)>,
}

impl GatedIo {
    fn new(tcp: TcpStream, admission: Admission, timeout: Duration) -> GatedIo {
        let evicted = Box::pin(admission.0.evicted.clone().cancelled_owned());
        GatedIo {
            tcp,
            admission,
            timers: Some((Box::pin(tokio::time::sleep(timeout)), evicted)),
        }
    }

    /// An error once the gate closed the connection; while it waits, its timers are polled
    /// with `cx` (so a connection parked in a read is woken when it is closed).
    fn check(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        let Some((timeout, evicted)) = &mut self.timers else {
            return Ok(());
        };
        if self.admission.waiting() {
            // An eviction shows in the phase; this registers the waker.
            let _ = evicted.as_mut().poll(cx);
            if timeout.as_mut().poll(cx).is_ready() && self.admission.settle(CLOSED) {
                tracing::debug!("closed a connection that made no authenticated request in time");
            }
        }
        match self.admission.0.phase.load(Ordering::SeqCst) {
            AUTHENTICATED => {
                self.timers = None;
                Ok(())
            }
            CLOSED => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "closed: no authenticated request in time (acp-host serve --header-timeout), or \
                 the oldest of too many without one",
            )),
            _ => Ok(()),
        }
    }
}

impl Drop for GatedIo {
    fn drop(&mut self) {
        // An ended connection no longer counts.
        self.admission.settle(CLOSED);
    }
}

impl AsyncRead for GatedIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.check(cx)?;
        Pin::new(&mut self.tcp).poll_read(cx, buf)
    }
}

impl AsyncWrite for GatedIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.check(cx)?;
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.check(cx)?;
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.check(cx)?;
        Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_waiting_connection_is_closed_past_the_cap_never_an_authenticated_one() {
        let gate = Gate::default();
        let first = gate.admit();
        assert!(first.authenticated(), "a waiting connection authenticates");
        let admitted: Vec<Admission> = (0..MAX_UNAUTHENTICATED).map(|_| gate.admit()).collect();
        assert!(
            admitted.iter().all(Admission::waiting),
            "the authenticated one did not count"
        );
        let next = gate.admit();
        assert!(!admitted[0].waiting() && admitted[0].0.evicted.is_cancelled());
        assert!(
            !admitted[0].authenticated(),
            "closed first: never authenticated"
        );
        assert!(admitted[1..].iter().all(Admission::waiting) && next.waiting());
        assert!(first.authenticated() && !first.0.evicted.is_cancelled());
    }
}
