//! A loopback HTTP stub for tests: answers each connection with the next scripted response and
//! records the requests it saw. One request per connection (`Connection: close`), so the client
//! under test opens a new connection per attempt and no keep-alive state leaks between answers.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;

/// A scripted answer.
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: String,
}

impl Answer {
    /// A 200 SSE answer made of `data:` events.
    pub fn sse(events: &[&str]) -> Self {
        let mut body = String::new();
        for data in events {
            let _ = write!(body, "data: {data}\n\n");
        }
        Self {
            status: 200,
            headers: vec![("Content-Type", "text/event-stream".to_owned())],
            body,
        }
    }

    /// An error answer with a JSON error body.
    pub fn error(status: u16, message: &str) -> Self {
        Self {
            status,
            headers: vec![("Content-Type", "application/json".to_owned())],
            body: serde_json::json!({"error": {"message": message}}).to_string(),
        }
    }
}

/// A request the stub received: its head (request line and headers) and body.
#[derive(Debug, Clone)]
pub struct Seen {
    pub head: String,
    pub body: String,
}

/// Serves `answers` in order on a loopback port; returns the base URL (with `/v1`) and the log.
pub async fn serve(answers: Vec<Answer>) -> (String, Arc<Mutex<Vec<Seen>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/v1", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    tokio::spawn(async move {
        for answer in answers {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let mut data = Vec::new();
            let mut buffer = [0_u8; 4096];
            let (head, body) = loop {
                let read = socket.read(&mut buffer).await.unwrap_or(0);
                if read == 0 {
                    break (String::from_utf8_lossy(&data).into_owned(), String::new());
                }
                data.extend_from_slice(&buffer[..read]);
                let text = String::from_utf8_lossy(&data).into_owned();
                if let Some(end) = text.find("\r\n\r\n") {
                    let head = text[..end].to_owned();
                    let length: usize = head
                        .lines()
                        .find_map(|line| {
                            let (name, value) = line.split_once(':')?;
                            name.eq_ignore_ascii_case("content-length")
                                .then(|| value.trim().parse().ok())?
                        })
                        .unwrap_or(0);
                    if data.len() >= end + 4 + length {
                        let body =
                            String::from_utf8_lossy(&data[end + 4..end + 4 + length]).into_owned();
                        break (head, body);
                    }
                }
            };
            log.lock().unwrap().push(Seen { head, body });
            let mut response = format!(
                "HTTP/1.1 {} X\r\nConnection: close\r\nContent-Length: {}\r\n",
                answer.status,
                answer.body.len()
            );
            for (name, value) in &answer.headers {
                let _ = write!(response, "{name}: {value}\r\n");
            }
            response.push_str("\r\n");
            response.push_str(&answer.body);
            let _ = socket.write_all(response.as_bytes()).await;
            let _ = socket.shutdown().await;
        }
    });
    (base, seen)
}
