//! A real graph server for tests: ArcadeDB with its Bolt 4.4 plugin, from the PyPI wheel
//! `arcadedb-embedded` that `scripts/setup-graph` installs (its bundled Java runtime runs the
//! server; `CAIRN_ARCADEDB_HOME` overrides where), on free loopback ports with a temporary
//! directory, stopped by PID.

use std::io;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::ports::{answers, free_ports, signal, stop_child};

/// An ArcadeDB server with the Bolt plugin, owned by a test. Dropping it stops the server and
/// removes its files.
#[derive(Debug)]
pub struct GraphServer {
    directory: tempfile::TempDir,
    http_port: u16,
    bolt_port: u16,
    https_port: u16,
    child: Option<Child>,
}

/// The root password the test servers use.
pub const GRAPH_PASSWORD: &str = "cairn-test-graph";
/// The database the test servers create.
pub const GRAPH_DATABASE: &str = "cairn";

/// Where `scripts/setup-graph` installed ArcadeDB.
pub fn arcadedb_home() -> io::Result<PathBuf> {
    let home = match std::env::var_os("CAIRN_ARCADEDB_HOME") {
        Some(home) => PathBuf::from(home),
        None => {
            let cache = std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")))
                .unwrap_or_else(|| PathBuf::from("/tmp"));
            cache.join("cairn-arcadedb")
        }
    };
    let package = home.join("site/arcadedb_embedded");
    if package.join("jre/bin/java").is_file() {
        Ok(package)
    } else {
        Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "ArcadeDB is not installed at {}: run scripts/setup-graph",
                home.display()
            ),
        ))
    }
}

impl GraphServer {
    /// Starts a server with an empty database; returns once it is ready.
    pub fn start() -> io::Result<GraphServer> {
        let directory = tempfile::Builder::new().prefix("cairn-graph-").tempdir()?;
        let [http_port, bolt_port, https_port] = free_ports()?;
        let mut server = GraphServer {
            directory,
            http_port,
            bolt_port,
            https_port,
            child: None,
        };
        server.start_again()?;
        Ok(server)
    }

    /// Starts the server again on the same ports and files; returns once it is ready.
    pub fn start_again(&mut self) -> io::Result<()> {
        let package = arcadedb_home()?;
        let root = self.directory.path();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(root.join("arcadedb.out"))?;
        let property = |name: &str, value: &str| format!("-Darcadedb.{name}={value}");
        let mut command = Command::new(package.join("jre/bin/java"));
        command
            .current_dir(root)
            .arg("-Xms64m")
            .arg("-Xmx384m")
            .arg("-XX:+UseSerialGC")
            .arg("-cp")
            .arg(format!("{}/jars/*", package.display()))
            .arg(property("server.rootPath", &root.to_string_lossy()))
            .arg(property(
                "server.databaseDirectory",
                &root.join("databases").to_string_lossy(),
            ))
            .arg(property("server.rootPassword", GRAPH_PASSWORD))
            .arg(property(
                "server.defaultDatabases",
                &format!("{GRAPH_DATABASE}[root]"),
            ))
            .arg(property(
                "server.plugins",
                "Bolt:com.arcadedb.bolt.BoltProtocolPlugin",
            ))
            .arg(property("bolt.host", "127.0.0.1"))
            .arg(property("bolt.port", &self.bolt_port.to_string()))
            .arg(property("server.httpIncomingHost", "127.0.0.1"))
            .arg(property(
                "server.httpIncomingPort",
                &self.http_port.to_string(),
            ))
            .arg(property(
                "server.httpsIncomingPort",
                &self.https_port.to_string(),
            ))
            .arg("com.arcadedb.server.ArcadeDBServer")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        self.child = Some(command.spawn()?);
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(90) {
            if let Some(child) = self.child.as_mut() {
                if let Some(status) = child.try_wait()? {
                    self.child = None;
                    return Err(io::Error::other(format!(
                        "ArcadeDB exited at start ({status}): {}",
                        self.log()
                    )));
                }
            }
            // The Bolt port opens before the database exists: readiness is the HTTP answer.
            if answers(self.http_port, "/api/v1/ready", 204) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(io::Error::other(format!(
            "ArcadeDB did not become ready in 90 s: {}",
            self.log()
        )))
    }

    /// Stops the server by PID (`SIGTERM`, a clean stop) and waits.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            stop_child(&mut child, "TERM");
        }
    }

    /// Pauses the server (`SIGSTOP`).
    pub fn pause(&self) {
        if let Some(child) = &self.child {
            signal(child.id(), "STOP");
        }
    }

    /// Resumes a paused server (`SIGCONT`).
    pub fn resume(&self) {
        if let Some(child) = &self.child {
            signal(child.id(), "CONT");
        }
    }

    /// The Bolt URL (what `graph.url` takes).
    pub fn bolt_url(&self) -> String {
        format!("bolt://127.0.0.1:{}", self.bolt_port)
    }

    /// Options for a graph store on this server (the root user, the test database).
    pub fn options(&self) -> gateways::BoltOptions {
        gateways::BoltOptions::new(&self.bolt_url(), "root", GRAPH_PASSWORD, GRAPH_DATABASE)
    }

    /// The server's output so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.directory.path().join("arcadedb.out")).unwrap_or_default()
    }
}

impl Drop for GraphServer {
    fn drop(&mut self) {
        self.stop();
    }
}
