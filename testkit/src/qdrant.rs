//! A real Qdrant server for tests: the official Qdrant v1.18.3 binary from `../shared/qdrant/`
//! (`CAIRN_QDRANT_SERVER` overrides the path), on free loopback ports with a temporary
//! directory, ready once its readiness endpoint says so, stopped by PID. The launcher `exec`s
//! the server, so the PID held here is the server's own; tests may also pause it (`SIGSTOP`)
//! and resume it to play a hung server.

use std::io;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::ports::{answers, free_ports, listens, signal, stop_child};

/// A Qdrant server owned by a test. Dropping it stops the server and removes its storage.
#[derive(Debug)]
pub struct QdrantServer {
    directory: tempfile::TempDir,
    http_port: u16,
    grpc_port: u16,
    api_key: Option<String>,
    child: Option<Child>,
}

/// Where the launcher is: `CAIRN_QDRANT_SERVER`, else `shared/qdrant/qdrant-server` beside or
/// inside the repository.
pub fn server_binary() -> io::Result<PathBuf> {
    if let Some(path) = std::env::var_os("CAIRN_QDRANT_SERVER") {
        return Ok(PathBuf::from(path));
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    [
        root.join("../shared/qdrant/qdrant-server"),
        root.join("shared/qdrant/qdrant-server"),
    ]
    .into_iter()
    .find(|path| path.is_file())
    .ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            "the Qdrant server launcher is not at ../shared/qdrant/qdrant-server; set \
             CAIRN_QDRANT_SERVER",
        )
    })
}

impl QdrantServer {
    /// Starts a server; returns once it is ready.
    pub fn start() -> io::Result<QdrantServer> {
        Self::start_with_key(None)
    }

    /// Starts a server that requires `api_key` (when given).
    pub fn start_with_key(api_key: Option<&str>) -> io::Result<QdrantServer> {
        let directory = tempfile::Builder::new().prefix("cairn-qdrant-").tempdir()?;
        let [http_port, grpc_port] = free_ports()?;
        let mut server = QdrantServer {
            directory,
            http_port,
            grpc_port,
            api_key: api_key.map(str::to_owned),
            child: None,
        };
        // A free port can be taken by another process (a server another test starts) before
        // qdrant binds it: qdrant then serves HTTP without gRPC. Start again on new ports.
        let mut attempts = 0;
        loop {
            match server.start_again() {
                Err(error) if error.kind() == io::ErrorKind::AddrInUse && attempts < 4 => {
                    attempts += 1;
                    [server.http_port, server.grpc_port] = free_ports()?;
                }
                result => return result.map(|()| server),
            }
        }
    }

    /// Starts the server again on the same ports and storage (after [`QdrantServer::stop`] or
    /// [`QdrantServer::kill`]); returns once it is ready.
    pub fn start_again(&mut self) -> io::Result<()> {
        let root = self.directory.path();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(root.join("qdrant.log"))?;
        // What this start writes to the log comes after what earlier starts wrote.
        let logged_before = log.metadata()?.len();
        let mut command = Command::new(server_binary()?);
        command
            .current_dir(root)
            .env("QDRANT__STORAGE__STORAGE_PATH", root.join("storage"))
            .env("QDRANT__STORAGE__SNAPSHOTS_PATH", root.join("snapshots"))
            .env("QDRANT__SERVICE__HOST", "127.0.0.1")
            .env("QDRANT__SERVICE__HTTP_PORT", self.http_port.to_string())
            .env("QDRANT__SERVICE__GRPC_PORT", self.grpc_port.to_string())
            .env("QDRANT__TELEMETRY_DISABLED", "true")
            .env("QDRANT__LOG_LEVEL", "WARN")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        if let Some(key) = &self.api_key {
            command.env("QDRANT__SERVICE__API_KEY", key);
        }
        self.child = Some(command.spawn()?);
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(60) {
            if let Some(child) = self.child.as_mut() {
                if let Some(status) = child.try_wait()? {
                    self.child = None;
                    return Err(io::Error::other(format!(
                        "qdrant exited at start ({status}): {}",
                        self.log()
                    )));
                }
            }
            if self.ready() {
                return Ok(());
            }
            if self
                .log_since(logged_before)
                .contains("Error while starting gRPC server")
            {
                self.kill();
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("qdrant could not serve gRPC on port {}", self.grpc_port),
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(io::Error::other(format!(
            "qdrant did not become ready in 60 s: {}",
            self.log()
        )))
    }

    /// Whether `GET /readyz` answers 200 and the gRPC port (the one the store uses) accepts
    /// connections.
    pub fn ready(&self) -> bool {
        answers(self.http_port, "/readyz", 200) && listens(self.grpc_port)
    }

    /// Stops the server by PID (`SIGTERM`, a clean stop; `SIGKILL` after 20 s) and waits.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            stop_child(&mut child, "TERM");
        }
    }

    /// Kills the server (`SIGKILL`) and waits: a crash.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Pauses the server (`SIGSTOP`): connections stay open and nothing answers.
    pub fn pause(&self) {
        if let Some(pid) = self.pid() {
            signal(pid, "STOP");
        }
    }

    /// Resumes a paused server (`SIGCONT`).
    pub fn resume(&self) {
        if let Some(pid) = self.pid() {
            signal(pid, "CONT");
        }
    }

    /// The server's PID, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The gRPC URL (what `qdrant-client` and `vectors.url` take).
    pub fn grpc_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.grpc_port)
    }

    /// The REST port.
    pub fn http_port(&self) -> u16 {
        self.http_port
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        self.log_since(0)
    }

    /// The server's log from byte `offset` on.
    fn log_since(&self, offset: u64) -> String {
        let bytes = std::fs::read(self.directory.path().join("qdrant.log")).unwrap_or_default();
        let start = usize::try_from(offset)
            .unwrap_or(usize::MAX)
            .min(bytes.len());
        String::from_utf8_lossy(&bytes[start..]).into_owned()
    }
}

impl Drop for QdrantServer {
    fn drop(&mut self) {
        self.stop();
    }
}
