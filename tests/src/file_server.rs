//! A loopback HTTP server of fixed files, for the ACP Registry suites: `registry.json` and agent
//! archives served from `127.0.0.1`, keyless and offline.
//!
//! [`FileServer`] binds `127.0.0.1:0` and serves on its own tokio runtime, so plain synchronous
//! `#[test]`s can use it. `GET` of a known path answers its bytes; any other path 404. Every
//! request's path is recorded ([`FileServer::requests`]), so a test can tell a download from a
//! run served by the cache. Dropping the server stops its runtime and closes the port, which is
//! how a test makes "the network" go away.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// How long dropping a [`FileServer`] waits for its tasks to stop.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

#[derive(Debug, Default)]
struct Shared {
    files: BTreeMap<String, Vec<u8>>,
    requests: Mutex<Vec<String>>,
}

/// A running file server; stops when dropped.
#[derive(Debug)]
pub struct FileServer {
    runtime: Option<tokio::runtime::Runtime>,
    addr: SocketAddr,
    shared: Arc<Shared>,
}

impl FileServer {
    /// Serves `files` (path, starting with `/` -> bytes). Panics when loopback cannot be bound.
    #[must_use]
    pub fn start(files: BTreeMap<String, Vec<u8>>) -> FileServer {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("file server: a tokio runtime");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("file server: bind");
        listener
            .set_nonblocking(true)
            .expect("file server: nonblocking");
        let addr = listener.local_addr().expect("file server: address");
        let listener = {
            let _context = runtime.enter();
            tokio::net::TcpListener::from_std(listener).expect("file server: listener")
        };
        let shared = Arc::new(Shared {
            files,
            requests: Mutex::default(),
        });
        let app = axum::Router::new()
            .fallback(serve)
            .with_state(Arc::clone(&shared));
        runtime.spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FileServer {
            runtime: Some(runtime),
            addr,
            shared,
        }
    }

    /// `http://127.0.0.1:PORT` + `path`.
    #[must_use]
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// The paths requested so far, in order.
    #[must_use]
    pub fn requests(&self) -> Vec<String> {
        self.shared
            .requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

async fn serve(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let path = request.uri().path().to_owned();
    shared
        .requests
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(path.clone());
    match shared.files.get(&path) {
        Some(bytes) => bytes.clone().into_response(),
        None => (StatusCode::NOT_FOUND, format!("no file {path}")).into_response(),
    }
}

impl Drop for FileServer {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_timeout(SHUTDOWN_GRACE);
        }
    }
}
