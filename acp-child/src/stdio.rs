//! The process's stdin and stdout as the ACP transport.
//!
//! When both are pipes or Unix stream sockets (how acp-host, Zed, Neovim (libuv hands a child
//! socketpairs) and most editors start an agent), they are read and written through the
//! runtime's epoll like any socket: no thread. tokio's own `stdin()` and `stdout()` hand every
//! read and write to a blocking thread, since a terminal or a regular file cannot be polled: two
//! threads started per process and a thread switch per frame (docs/benchmarks.md, "acp-child's
//! stdio through epoll"). Anything else (a terminal, a file, `/dev/null`) keeps tokio's.
//!
//! Polling needs `O_NONBLOCK`, a flag of the open file description, which every fd and process
//! holding that description shares. So it is set only where nothing else here writes through
//! the same description: never when stderr is the same pipe or socket as stdin or stdout
//! (`2>&1`: stderr's writes would fail with `EAGAIN` once the pipe is full); and the flags are put
//! back when serving ends. What this does not cover: another process that shares the
//! description (`{ acp-child; next; } | reader`) sees the flag while acp-child runs, and after
//! it if acp-child is killed before it could put the flag back.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::sys::socket::{SockType, UnixAddr, getsockname, getsockopt, sockopt};
use nix::sys::stat::{SFlag, fstat};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::UnixStream;
use tokio::net::unix::pipe;

/// What an end of the transport reads from or writes to.
pub(crate) type Reader = Box<dyn AsyncRead + Send + Unpin>;
pub(crate) type Writer = Box<dyn AsyncWrite + Send + Unpin>;

/// The transport over stdin and stdout: its two ends, and what puts the flags back once both
/// are dropped.
pub(crate) struct Stdio {
    pub(crate) reader: Reader,
    pub(crate) writer: Writer,
    pub(crate) restore: Restore,
}

/// Puts back, when dropped, the file status flags stdin and stdout had before they were made
/// non-blocking.
pub(crate) struct Restore(Option<(OFlag, OFlag)>);

/// How an fd can be polled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Fifo,
    UnixStream,
}

impl Stdio {
    /// The process's stdin and stdout, polled where [`pollable`] allows, else through tokio's
    /// blocking threads.
    pub(crate) fn take() -> Stdio {
        let (input, output, errors) = (io::stdin(), io::stdout(), io::stderr());
        match pollable(input.as_fd(), output.as_fd(), errors.as_fd()).and_then(polled) {
            Some(polled) => polled,
            None => Stdio {
                reader: Box::new(tokio::io::stdin()),
                writer: Box::new(tokio::io::stdout()),
                restore: Restore(None),
            },
        }
    }
}

impl Drop for Restore {
    fn drop(&mut self) {
        if let Some((stdin, stdout)) = self.0 {
            // Best effort: fds 0 and 1 stay open until the process exits.
            let _ = fcntl(io::stdin().as_fd(), FcntlArg::F_SETFL(stdin));
            let _ = fcntl(io::stdout().as_fd(), FcntlArg::F_SETFL(stdout));
        }
    }
}

/// Both ends polled, each through a copy of its fd (so fds 0 and 1 stay open until the process
/// exits, as before); `None` (nothing changed) if any step fails.
fn polled((input, output): (Kind, Kind)) -> Option<Stdio> {
    let (stdin, stdout) = (io::stdin(), io::stdout());
    let (stdin, stdout) = (stdin.as_fd(), stdout.as_fd());
    let flags = |fd: BorrowedFd<'_>| {
        fcntl(fd, FcntlArg::F_GETFL)
            .ok()
            .map(OFlag::from_bits_truncate)
    };
    // Taken before any step changes them: a step that fails leaves the ones before it put back.
    let restore = Restore(Some((flags(stdin)?, flags(stdout)?)));
    let built = (|| -> io::Result<(Reader, Writer)> {
        let reader: Reader = match input {
            Kind::Fifo => Box::new(pipe::Receiver::from_owned_fd(stdin.try_clone_to_owned()?)?),
            Kind::UnixStream => Box::new(stream(stdin.try_clone_to_owned()?)?),
        };
        let writer: Writer = match output {
            Kind::Fifo => Box::new(pipe::Sender::from_owned_fd(stdout.try_clone_to_owned()?)?),
            Kind::UnixStream => Box::new(stream(stdout.try_clone_to_owned()?)?),
        };
        Ok((reader, writer))
    })();
    match built {
        Ok((reader, writer)) => Some(Stdio {
            reader,
            writer,
            restore,
        }),
        Err(error) => {
            tracing::debug!(%error, "stdio not polled; through blocking threads");
            None
        }
    }
}

fn stream(fd: OwnedFd) -> io::Result<UnixStream> {
    let stream = std::os::unix::net::UnixStream::from(fd);
    stream.set_nonblocking(true)?;
    UnixStream::from_std(stream)
}

/// Whether stdin and stdout can be polled: each a pipe or a Unix stream socket, and neither the
/// same file as stderr.
fn pollable(
    stdin: BorrowedFd<'_>,
    stdout: BorrowedFd<'_>,
    stderr: BorrowedFd<'_>,
) -> Option<(Kind, Kind)> {
    let (input, in_file) = kind(stdin)?;
    let (output, out_file) = kind(stdout)?;
    if let Ok(err) = fstat(stderr)
        && [in_file, out_file].contains(&(err.st_dev, err.st_ino))
    {
        return None;
    }
    Some((input, output))
}

/// How `fd` can be polled, if it can, and which file it is (device and inode).
fn kind(fd: BorrowedFd<'_>) -> Option<(Kind, (nix::libc::dev_t, nix::libc::ino_t))> {
    let stat = fstat(fd).ok()?;
    let file = (stat.st_dev, stat.st_ino);
    let format = SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT;
    if format == SFlag::S_IFIFO {
        return Some((Kind::Fifo, file));
    }
    let stream = format == SFlag::S_IFSOCK
        && getsockopt(&fd, sockopt::SockType).ok()? == SockType::Stream
        && getsockname::<UnixAddr>(fd.as_raw_fd()).is_ok();
    stream.then_some((Kind::UnixStream, file))
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixStream;

    use super::*;

    fn pipe() -> (OwnedFd, OwnedFd) {
        nix::unistd::pipe().unwrap()
    }

    #[test]
    fn pipes_and_unix_stream_sockets_are_polled() {
        let (input, _writer) = pipe();
        let (_reader, output) = pipe();
        let (_err_reader, err) = pipe();
        assert_eq!(
            pollable(input.as_fd(), output.as_fd(), err.as_fd()),
            Some((Kind::Fifo, Kind::Fifo))
        );
        let (socket, _peer) = UnixStream::pair().unwrap();
        assert_eq!(
            pollable(socket.as_fd(), socket.as_fd(), err.as_fd()),
            Some((Kind::UnixStream, Kind::UnixStream))
        );
    }

    #[test]
    fn stderr_on_the_same_pipe_or_socket_keeps_blocking_io() {
        let (input, _writer) = pipe();
        let (_reader, output) = pipe();
        let err = output.try_clone().unwrap();
        assert_eq!(pollable(input.as_fd(), output.as_fd(), err.as_fd()), None);
        let (socket, _peer) = UnixStream::pair().unwrap();
        let (_other, output) = pipe();
        assert_eq!(
            pollable(socket.as_fd(), output.as_fd(), socket.as_fd()),
            None
        );
    }

    #[test]
    fn terminals_files_and_other_sockets_keep_blocking_io() {
        let (_reader, output) = pipe();
        let (_err_reader, err) = pipe();
        let file = tempfile::tempfile().unwrap();
        assert_eq!(pollable(file.as_fd(), output.as_fd(), err.as_fd()), None);
        let null = std::fs::File::open("/dev/null").unwrap();
        assert_eq!(pollable(null.as_fd(), output.as_fd(), err.as_fd()), None);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let tcp = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        assert_eq!(pollable(tcp.as_fd(), output.as_fd(), err.as_fd()), None);
        let datagram = std::os::unix::net::UnixDatagram::unbound().unwrap();
        assert_eq!(
            pollable(datagram.as_fd(), output.as_fd(), err.as_fd()),
            None
        );
    }
}
