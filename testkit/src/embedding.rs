//! Embedding servers for the remote embedder's tests.
//!
//! - [`EmbeddingServer`] is a real OpenAI-compatible server: llama.cpp's, from PyPI's
//!   `llama-cpp-python[server]`, serving all-MiniLM-L6-v2 from the same pinned weights as
//!   cairn's own model (`scripts/setup-embedding-server` installs both). Free loopback port,
//!   ready once `/v1/models` answers, stopped by PID.
//! - [`FaultyEmbeddingProxy`] is a fault injector, and only that: it sits in front of a real
//!   server and forwards every request unchanged, except the ones a test scripts to answer
//!   with a 429, an error status or a malformed body.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::ports::{answers, await_ready, free_ports, spawn_logged, stop_child};

/// The model name the test server serves under.
pub const SERVED_MODEL: &str = "all-MiniLM-L6-v2";

/// A real llama.cpp embedding server owned by a test. Dropping it stops the server.
#[derive(Debug)]
pub struct EmbeddingServer {
    directory: tempfile::TempDir,
    port: u16,
    child: Option<Child>,
}

fn venv() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.venv-embedding-server")
}

impl EmbeddingServer {
    /// Starts the server; returns once it answers.
    pub fn start() -> io::Result<EmbeddingServer> {
        let directory = tempfile::Builder::new()
            .prefix("cairn-embedding-")
            .tempdir()?;
        let [port] = free_ports()?;
        let mut server = EmbeddingServer {
            directory,
            port,
            child: None,
        };
        server.start_again()?;
        Ok(server)
    }

    /// Starts it again on the same port (after [`EmbeddingServer::kill`]).
    pub fn start_again(&mut self) -> io::Result<()> {
        let venv = venv();
        let python = venv.join("bin/python");
        let model = venv.join("all-MiniLM-L6-v2.gguf");
        if !python.is_file() || !model.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "the embedding server is not installed at {}; run scripts/setup-embedding-server",
                    venv.display()
                ),
            ));
        }
        let child = spawn_logged(
            Command::new(python)
                .args(["-m", "llama_cpp.server", "--model"])
                .arg(&model)
                .args([
                    "--embedding",
                    "true",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    &self.port.to_string(),
                    "--model_alias",
                    SERVED_MODEL,
                    "--n_ctx",
                    "512",
                    "--n_batch",
                    "512",
                    "--n_ubatch",
                    "512",
                    "--n_threads",
                    "1",
                    "--verbose",
                    "false",
                ])
                .current_dir(self.directory.path()),
            &self.directory.path().join("server.log"),
        )?;
        let mut child = Some(child);
        let started = await_ready(
            &mut child,
            "the embedding server",
            Duration::from_secs(60),
            Duration::from_millis(100),
            || answers(self.port, "/v1/models", 200),
            || self.log(),
        );
        self.child = child;
        started
    }

    /// The API's base URL (`http://127.0.0.1:PORT/v1`).
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Kills the server (`SIGKILL`) and waits: an outage.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            stop_child(&mut child, "KILL");
        }
    }

    /// What the server logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.directory.path().join("server.log")).unwrap_or_default()
    }
}

impl Drop for EmbeddingServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            stop_child(&mut child, "TERM");
        }
    }
}

/// A scripted answer of the fault injector.
#[derive(Debug, Clone)]
pub enum Fault {
    /// `429 Too Many Requests` with this `Retry-After` value (none when `None`).
    RateLimited(Option<String>),
    /// This status with this body.
    Status(u16, String),
    /// `200 OK` with this body (a malformed answer).
    Malformed(String),
}

/// A fault injector in front of a real embedding server: each request takes the next scripted
/// [`Fault`] if there is one, and is forwarded to the real server otherwise. Counts both.
#[derive(Debug)]
pub struct FaultyEmbeddingProxy {
    port: u16,
    faults: Arc<Mutex<VecDeque<Fault>>>,
    injected: Arc<AtomicUsize>,
    forwarded: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl FaultyEmbeddingProxy {
    /// Listens on a free loopback port, forwarding to `upstream_port`.
    pub fn start(upstream_port: u16) -> io::Result<FaultyEmbeddingProxy> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        listener.set_nonblocking(true)?;
        let proxy = FaultyEmbeddingProxy {
            port,
            faults: Arc::default(),
            injected: Arc::default(),
            forwarded: Arc::default(),
            stop: Arc::default(),
        };
        let (faults, injected, forwarded, stop) = (
            proxy.faults.clone(),
            proxy.injected.clone(),
            proxy.forwarded.clone(),
            proxy.stop.clone(),
        );
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let (faults, injected, forwarded) =
                            (faults.clone(), injected.clone(), forwarded.clone());
                        std::thread::spawn(move || {
                            let _ = serve(stream, upstream_port, &faults, &injected, &forwarded);
                        });
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Ok(proxy)
    }

    /// The API's base URL.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    /// Scripts the next answers.
    pub fn inject(&self, faults: impl IntoIterator<Item = Fault>) {
        if let Ok(mut queue) = self.faults.lock() {
            queue.extend(faults);
        }
    }

    /// Answers scripted so far.
    pub fn injected(&self) -> usize {
        self.injected.load(Ordering::SeqCst)
    }

    /// Requests forwarded to the real server so far.
    pub fn forwarded(&self) -> usize {
        self.forwarded.load(Ordering::SeqCst)
    }
}

impl Drop for FaultyEmbeddingProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Reads one HTTP/1.1 request (headers and a `Content-Length` body).
fn read_request(stream: &mut TcpStream) -> io::Result<Vec<u8>> {
    let mut request = Vec::new();
    let mut buffer = [0u8; 8192];
    loop {
        let read = stream.read(&mut buffer)?;
        if read == 0 {
            return Ok(request);
        }
        request.extend_from_slice(&buffer[..read]);
        if let Some(end) = request.windows(4).position(|window| window == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&request[..end]).to_ascii_lowercase();
            let length: usize = head
                .lines()
                .find_map(|line| line.strip_prefix("content-length:"))
                .and_then(|value| value.trim().parse().ok())
                .unwrap_or(0);
            if request.len() >= end + 4 + length {
                return Ok(request);
            }
        }
    }
}

fn serve(
    mut stream: TcpStream,
    upstream_port: u16,
    faults: &Mutex<VecDeque<Fault>>,
    injected: &AtomicUsize,
    forwarded: &AtomicUsize,
) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let request = read_request(&mut stream)?;
    if request.is_empty() {
        return Ok(());
    }
    let fault = faults.lock().ok().and_then(|mut queue| queue.pop_front());
    let answer = match fault {
        Some(fault) => {
            injected.fetch_add(1, Ordering::SeqCst);
            let (status, extra, body) = match fault {
                Fault::RateLimited(after) => (
                    429,
                    after.map_or(String::new(), |after| format!("Retry-After: {after}\r\n")),
                    r#"{"error":{"message":"rate limited (injected)"}}"#.to_owned(),
                ),
                Fault::Status(status, body) => (status, String::new(), body),
                Fault::Malformed(body) => (200, String::new(), body),
            };
            format!(
                "HTTP/1.1 {status} Injected\r\nContent-Type: application/json\r\n{extra}\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )
            .into_bytes()
        }
        None => {
            forwarded.fetch_add(1, Ordering::SeqCst);
            // Forwarded with `Connection: close`, so the upstream's answer ends at EOF.
            let mut upstream = TcpStream::connect(("127.0.0.1", upstream_port))?;
            let text = String::from_utf8_lossy(&request).into_owned();
            let text = text.replacen("\r\n", "\r\nConnection: close\r\n", 1);
            upstream.write_all(text.as_bytes())?;
            let mut answer = Vec::new();
            upstream.read_to_end(&mut answer)?;
            answer
        }
    };
    stream.write_all(&answer)?;
    stream.flush()
}
