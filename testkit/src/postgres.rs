//! A real PostgreSQL server for tests: Debian's `postgresql` package (15), initialised in a
//! temporary directory, listening on a free loopback port, stopped by PID. PostgreSQL refuses
//! to run as root, so when the tests run as root (CI) the server runs as an unprivileged user
//! (`postgres`, which the package creates, else `nobody`) through `setpriv`, which execs in
//! place: the PID the test holds is the server's own.
//!
//! [`PostgresServer::start_on`] runs it on a test host instead ([`crate::netns`]): in the
//! host's network namespace, on the host's address and PostgreSQL's own port, 5432.
//!
//! The server runs with `fsync=off`: tests prove semantics, not the disk (a clean stop still
//! writes everything). The benchmarks run against servers with the default durability.

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::ports::{await_ready, free_ports, stop_child};

/// A PostgreSQL server owned by a test. Dropping it stops the server and removes its files.
#[derive(Debug)]
pub struct PostgresServer {
    directory: tempfile::TempDir,
    bin: PathBuf,
    user: Option<String>,
    /// Where it listens: loopback, or its test host's address.
    ip: std::net::Ipv4Addr,
    /// The test host (network namespace) it runs in, if any.
    namespace: Option<String>,
    port: u16,
    child: Option<Child>,
}

/// The directory holding `initdb` and `postgres`: `CAIRN_PG_BIN`, else the newest
/// `/usr/lib/postgresql/*/bin`, else whatever `PATH` finds.
fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CAIRN_PG_BIN") {
        return PathBuf::from(dir);
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin).unwrap_or_default()
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|output| output.stdout.starts_with(b"0\n"))
        .unwrap_or(false)
}

/// The unprivileged user the server runs as when the tests run as root.
fn server_user() -> String {
    if let Ok(user) = std::env::var("CAIRN_PG_USER") {
        return user;
    }
    let postgres = Command::new("id")
        .args(["-u", "postgres"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|status| status.success())
        .unwrap_or(false);
    if postgres { "postgres" } else { "nobody" }.to_owned()
}

impl PostgresServer {
    /// Initialises and starts a server; returns once it accepts connections.
    pub fn start() -> io::Result<PostgresServer> {
        Self::start_placed(None)
    }

    /// Initialises and starts a server on `host` of `network`, listening on the host's
    /// address, port 5432.
    pub fn start_on(network: &crate::netns::Network, host: &str) -> io::Result<PostgresServer> {
        let host = network.host(host);
        Self::start_placed(Some((host.namespace.clone(), host.ip)))
    }

    fn start_placed(host: Option<(String, std::net::Ipv4Addr)>) -> io::Result<PostgresServer> {
        let directory = tempfile::Builder::new().prefix("cairn-pg-").tempdir()?;
        let user = is_root().then(server_user);
        if let Some(user) = &user {
            let status = Command::new("chown")
                .arg(user)
                .arg(directory.path())
                .status()?;
            if !status.success() {
                return Err(io::Error::other(format!("chown {user} failed")));
            }
        }
        let mut server = PostgresServer {
            bin: bin_dir(),
            user,
            ip: host.as_ref().map_or(crate::ports::LOOPBACK, |(_, ip)| *ip),
            port: if host.is_some() {
                5432
            } else {
                free_ports::<1>()?[0]
            },
            namespace: host.map(|(namespace, _)| namespace),
            child: None,
            directory,
        };
        let data = server.data_dir();
        let output = server
            .command("initdb")
            .arg("-D")
            .arg(&data)
            .args([
                "-U",
                "cairn",
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C",
                "-N",
            ])
            .output()?;
        if !output.status.success() {
            return Err(io::Error::other(format!(
                "initdb failed: {}",
                String::from_utf8_lossy(&output.stderr)
            )));
        }
        if server.namespace.is_some() {
            // Clients reach a server on a test host over the bridge, from 10.x addresses.
            use std::io::Write;
            std::fs::OpenOptions::new()
                .append(true)
                .open(data.join("pg_hba.conf"))?
                .write_all(b"host all all 10.0.0.0/8 trust\n")?;
        }
        // A free port can be taken by another process (a server another test starts) before
        // postgres binds it: postgres then exits. Start again on a new port.
        let mut attempts = 0;
        loop {
            match server.start_again() {
                Err(_) if server.log().contains("Address already in use") && attempts < 4 => {
                    attempts += 1;
                    [server.port] = free_ports()?;
                }
                result => return result.map(|()| server),
            }
        }
    }

    fn data_dir(&self) -> PathBuf {
        self.directory.path().join("data")
    }

    /// Whether this server's `postmaster.pid` names its port and says `ready` (its 4th and 8th
    /// lines).
    fn postmaster_ready(&self) -> bool {
        let Ok(text) = std::fs::read_to_string(self.data_dir().join("postmaster.pid")) else {
            return false;
        };
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        lines.get(3) == Some(&self.port.to_string().as_str()) && lines.get(7) == Some(&"ready")
    }

    fn command(&self, program: &str) -> Command {
        let program = self.bin.join(program);
        let mut command = self.user_command(&program);
        if let Some(namespace) = &self.namespace {
            use std::os::unix::process::CommandExt;
            let mut inside = Command::new("ip");
            inside
                .args(["netns", "exec", namespace])
                .arg(command.get_program())
                .args(command.get_args())
                .process_group(0);
            command = inside;
        }
        command
    }

    fn user_command(&self, program: &Path) -> Command {
        match &self.user {
            Some(user) => {
                let mut command = Command::new("setpriv");
                command
                    .arg(format!("--reuid={user}"))
                    .arg(format!("--regid={user}"))
                    .arg("--clear-groups")
                    .arg("--")
                    .arg(program);
                command
            }
            None => Command::new(program),
        }
    }

    /// Starts the server (again, after [`PostgresServer::stop`]) on the same port and data.
    pub fn start_again(&mut self) -> io::Result<()> {
        if self.child.is_some() {
            return Ok(());
        }
        let log = std::fs::File::create(self.directory.path().join("server.log"))?;
        let child = self
            .command("postgres")
            .arg("-D")
            .arg(self.data_dir())
            .arg("-p")
            .arg(self.port.to_string())
            .arg("-k")
            .arg(self.directory.path())
            .arg("-c")
            .arg(format!("listen_addresses={}", self.ip))
            .args(["-c", "fsync=off"])
            .args(["-c", "max_connections=200", "-c", "shared_buffers=64MB"])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        let mut child = Some(child);
        // Ready is this server's own word (its `postmaster.pid` says `ready` on this port),
        // not just an answer on the port, which could come from another server.
        let ready = || {
            self.postmaster_ready()
                && Command::new(self.bin.join("pg_isready"))
                    .args([
                        "-h",
                        &self.ip.to_string(),
                        "-p",
                        &self.port.to_string(),
                        "-q",
                    ])
                    .status()
                    .map(|status| status.success())
                    .unwrap_or(false)
        };
        let started = await_ready(
            &mut child,
            "postgres",
            Duration::from_secs(30),
            Duration::from_millis(50),
            ready,
            || self.log(),
        );
        self.child = child;
        started
    }

    /// Stops the server by PID with a fast shutdown (`SIGINT`: open transactions are rolled
    /// back, committed ones are on disk) and waits for it to exit.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            stop_child(&mut child, "INT");
        }
    }

    /// The server's PID, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The URL of `database` on this server.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://cairn@{}:{}/{database}", self.ip, self.port)
    }

    /// `psql` connected to this server as `cairn`, as a client outside cairn would be.
    fn psql_client(&self) -> Command {
        let mut command = Command::new(self.bin.join("psql"));
        command.args([
            "-h",
            &self.ip.to_string(),
            "-p",
            &self.port.to_string(),
            "-U",
            "cairn",
        ]);
        command
    }

    /// Creates a database and returns its URL.
    pub fn create_database(&self, name: &str) -> io::Result<String> {
        let output = self
            .psql_client()
            .args(["-d", "postgres", "-v", "ON_ERROR_STOP=1", "-q", "-c"])
            .arg(format!("CREATE DATABASE \"{name}\""))
            .output()?;
        if !output.status.success() {
            return Err(io::Error::other(format!(
                "CREATE DATABASE failed: {}",
                String::from_utf8_lossy(&output.stderr)
            )));
        }
        Ok(self.url(name))
    }

    /// Runs SQL with `psql` as a client outside cairn would (raw writes in tests).
    pub fn psql(&self, database: &str, sql: &str) -> io::Result<String> {
        let output = self
            .psql_client()
            .args([
                "-d",
                database,
                "-v",
                "ON_ERROR_STOP=1",
                "-q",
                "-At",
                "-c",
                sql,
            ])
            .output()?;
        if !output.status.success() {
            return Err(io::Error::other(
                String::from_utf8_lossy(&output.stderr).into_owned(),
            ));
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.directory.path().join("server.log")).unwrap_or_default()
    }

    /// The server's directory (data and log).
    pub fn path(&self) -> &Path {
        self.directory.path()
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        self.stop();
    }
}
