//! A real OAuth 2.1 / OpenID Connect authorization server for the sign-in tests: Debian's
//! `glewlwyd` (2.7.5, installed by `scripts/setup-oauth`), run from a temporary directory with
//! its own SQLite database, on a free loopback port, stopped by PID.
//!
//! [`AuthorizationServer::start`] brings up a bare server (its database made from the
//! package's own schema, with its stock `admin` user); the test provisions it through its
//! admin API (`tests/oauth/glewlwyd.py`), as an operator would through its admin pages.
//! Signing keys are real ECDSA P-256 keys made by `openssl` ([`AuthorizationServer::new_key`]).

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::ports::{answers, await_ready, free_ports, spawn_logged, stop_child};

/// The glewlwyd binary `scripts/setup-oauth` installs.
const BINARY: &str = "/usr/bin/glewlwyd";
/// The package's SQLite schema and stock data, gzipped.
const SCHEMA: &str = "/usr/share/doc/glewlwyd/database/init.sqlite3.sql.gz";
/// Where the package keeps its modules.
const MODULES: &str = "/usr/lib/glewlwyd";

/// A running glewlwyd owned by a test. Dropping it stops the server and removes its files.
#[derive(Debug)]
pub struct AuthorizationServer {
    directory: tempfile::TempDir,
    port: u16,
    child: Option<Child>,
}

impl AuthorizationServer {
    /// Makes its database and starts it; returns once its API answers.
    pub fn start() -> io::Result<AuthorizationServer> {
        for needed in [BINARY, SCHEMA] {
            if !Path::new(needed).exists() {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("{needed} is missing; run scripts/setup-oauth"),
                ));
            }
        }
        let directory = tempfile::Builder::new()
            .prefix("cairn-glewlwyd-")
            .tempdir()?;
        let database = directory.path().join("glewlwyd.db");
        // The package's schema, loaded by Python's sqlite3 (no sqlite3 binary is needed).
        let made = Command::new("python3")
            .args([
                "-c",
                "import gzip, sqlite3, sys\n\
                 db = sqlite3.connect(sys.argv[2])\n\
                 db.executescript(gzip.open(sys.argv[1], 'rt').read())\n\
                 db.commit()",
                SCHEMA,
            ])
            .arg(&database)
            .status()?;
        if !made.success() {
            return Err(io::Error::other(format!(
                "could not make glewlwyd's database: {made}"
            )));
        }
        let [port] = free_ports()?;
        let mut server = AuthorizationServer {
            directory,
            port,
            child: None,
        };
        server.write_config(&database)?;
        server.start_again()?;
        Ok(server)
    }

    fn write_config(&self, database: &Path) -> io::Result<()> {
        let port = self.port;
        let config = format!(
            "port={port}\nbind_address=\"127.0.0.1\"\nexternal_url=\"http://127.0.0.1:{port}\"\n\
             login_url=\"login.html\"\nstatic_files_path=\"/usr/share/glewlwyd/webapp/\"\n\
             api_prefix=\"api\"\nlog_mode=\"console\"\nlog_level=\"INFO\"\ncookie_secure=0\n\
             cookie_same_site=\"empty\"\nsession_expiration=3600\n\
             session_key=\"GLEWLWYD2_SESSION_ID\"\nadmin_session_authentication=\"cookie\"\n\
             profile_session_authentication=\"cookie\"\nallow_multiple_user_per_session=true\n\
             login_api_enabled=true\nadmin_scope=\"g_admin\"\nprofile_scope=\"g_profile\"\n\
             user_module_path=\"{MODULES}/user\"\nclient_module_path=\"{MODULES}/client\"\n\
             user_auth_scheme_module_path=\"{MODULES}/scheme\"\n\
             plugin_module_path=\"{MODULES}/plugin\"\nhash_algorithm=\"SHA512\"\n\
             database = {{ type = \"sqlite3\" path = \"{}\" }};\n",
            database.display()
        );
        std::fs::write(self.directory.path().join("glewlwyd.conf"), config)
    }

    /// Starts it again on the same port and database (after [`AuthorizationServer::kill`]).
    pub fn start_again(&mut self) -> io::Result<()> {
        let child = spawn_logged(
            Command::new(BINARY)
                .arg(format!(
                    "--config-file={}",
                    self.directory.path().join("glewlwyd.conf").display()
                ))
                .current_dir(self.directory.path()),
            &self.directory.path().join("server.log"),
        )?;
        let mut child = Some(child);
        let started = await_ready(
            &mut child,
            "glewlwyd",
            Duration::from_secs(30),
            Duration::from_millis(100),
            || answers(self.port, "/api/mod/plugin/", 401),
            || self.log(),
        );
        self.child = child;
        started
    }

    /// A new ECDSA P-256 signing key: the private key's and the public key's PEM files, under
    /// the server's directory.
    pub fn new_key(&self, name: &str) -> io::Result<(PathBuf, PathBuf)> {
        let private = self.directory.path().join(format!("{name}.pem"));
        let public = self.directory.path().join(format!("{name}.pub.pem"));
        let steps: [Vec<&std::ffi::OsStr>; 2] = [
            vec![
                "ecparam".as_ref(),
                "-genkey".as_ref(),
                "-name".as_ref(),
                "prime256v1".as_ref(),
                "-noout".as_ref(),
                "-out".as_ref(),
                private.as_os_str(),
            ],
            vec![
                "ec".as_ref(),
                "-in".as_ref(),
                private.as_os_str(),
                "-pubout".as_ref(),
                "-out".as_ref(),
                public.as_os_str(),
            ],
        ];
        for step in steps {
            let status = Command::new("openssl")
                .args(step)
                .stderr(Stdio::null())
                .status()?;
            if !status.success() {
                return Err(io::Error::other(format!("openssl failed: {status}")));
            }
        }
        Ok((private, public))
    }

    /// Its base URL (`http://127.0.0.1:PORT`).
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Its directory, for the test's own files.
    pub fn directory(&self) -> &Path {
        self.directory.path()
    }

    /// Kills the server (`SIGKILL`) and waits: the issuer is down.
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

impl Drop for AuthorizationServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            stop_child(&mut child, "TERM");
        }
    }
}
