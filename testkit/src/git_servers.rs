//! Git remotes on loopback, from Debian's packages: [`GitDaemon`] (`git daemon`, the `git://`
//! protocol) and [`GitHttp`] (`git http-backend`, the smart HTTP protocol, run as a CGI
//! program behind a small HTTP server that asks for one `Authorization` value), from `git`;
//! [`SshServer`] (`sshd`, from `openssh-server`), whose user's shell runs `git-upload-pack`.
//! Each stops when dropped.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{HeaderMap, Method, Response, StatusCode, Uri};

use crate::ports;

/// `git daemon` serving the repositories under a folder.
#[derive(Debug)]
pub struct GitDaemon {
    child: Child,
    port: u16,
}

impl GitDaemon {
    /// Starts `git daemon --export-all` over `base` on a free loopback port, ready when it
    /// accepts connections.
    pub fn start(base: &Path) -> io::Result<GitDaemon> {
        let [port] = ports::free_ports::<1>()?;
        let child = Command::new(debian_git())
            .arg("daemon")
            .arg("--export-all")
            .arg("--reuseaddr")
            .arg("--listen=127.0.0.1")
            .arg(format!("--port={port}"))
            .arg(format!("--base-path={}", base.display()))
            .arg(base)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let mut daemon = GitDaemon { child, port };
        let started = Instant::now();
        while !ports::listens(port) {
            if started.elapsed() > Duration::from_secs(10) {
                ports::kill_child(&mut daemon.child);
                return Err(io::Error::other(format!(
                    "git daemon did not listen on port {port} within 10 s"
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(daemon)
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The `git://` URL of the repository `name` under the base folder.
    pub fn url(&self, name: &str) -> String {
        format!("git://127.0.0.1:{}/{name}", self.port)
    }
}

impl Drop for GitDaemon {
    fn drop(&mut self) {
        ports::stop_child(&mut self.child, "TERM");
    }
}

/// `git http-backend` behind an HTTP server that answers 401 unless the request carries the
/// expected `Authorization` header.
#[derive(Debug)]
pub struct GitHttp {
    address: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

/// What the server needs per request.
#[derive(Debug, Clone)]
struct Backend {
    base: PathBuf,
    authorization: String,
}

/// Largest request body read (a fetch's negotiation is small).
const MAX_BODY: usize = 16 << 20;

impl GitHttp {
    /// Serves the repositories under `base` on a free loopback port; every request must carry
    /// `Authorization: <authorization>` (for example `Basic …` or `Bearer …`). Call inside a
    /// tokio runtime.
    pub async fn start(base: &Path, authorization: &str) -> io::Result<GitHttp> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let backend = Backend {
            base: base.to_path_buf(),
            authorization: authorization.to_owned(),
        };
        let app = axum::Router::new().fallback(
            move |method: Method, uri: Uri, headers: HeaderMap, body: Body| {
                let backend = backend.clone();
                async move { serve(backend, method, uri, headers, body).await }
            },
        );
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await;
        });
        Ok(GitHttp {
            address,
            stop: Some(stop),
        })
    }

    /// The `http://` URL of the repository `name` under the base folder.
    pub fn url(&self, name: &str) -> String {
        format!("http://{}/{name}", self.address)
    }
}

impl Drop for GitHttp {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

fn answer(status: StatusCode, text: &str) -> Response<Body> {
    let mut response = Response::new(Body::from(text.to_owned()));
    *response.status_mut() = status;
    response
}

/// One request: the credential checked, then `git http-backend` run as CGI.
async fn serve(
    backend: Backend,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response<Body> {
    let given = headers
        .get("authorization")
        .and_then(|value| value.to_str().ok());
    if given != Some(backend.authorization.as_str()) {
        let mut response = answer(StatusCode::UNAUTHORIZED, "credentials required");
        response.headers_mut().insert(
            "www-authenticate",
            axum::http::HeaderValue::from_static("Basic realm=\"cairn test\""),
        );
        return response;
    }
    let Ok(body) = axum::body::to_bytes(body, MAX_BODY).await else {
        return answer(StatusCode::PAYLOAD_TOO_LARGE, "body too large");
    };
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|value| value.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    let mut command = tokio::process::Command::new(debian_git());
    command
        .arg("http-backend")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("GIT_PROJECT_ROOT", &backend.base)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("REQUEST_METHOD", method.as_str())
        .env("PATH_INFO", uri.path())
        .env("QUERY_STRING", uri.query().unwrap_or(""))
        .env("CONTENT_TYPE", header("content-type"))
        .env("CONTENT_LENGTH", body.len().to_string())
        .env("HTTP_CONTENT_ENCODING", header("content-encoding"))
        .env("GIT_PROTOCOL", header("git-protocol"))
        .env("REMOTE_USER", "test")
        .env("REMOTE_ADDR", "127.0.0.1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let Ok(mut child) = command.spawn() else {
        return answer(
            StatusCode::INTERNAL_SERVER_ERROR,
            "git http-backend did not start",
        );
    };
    if let Some(mut stdin) = child.stdin.take() {
        use tokio::io::AsyncWriteExt;
        let _ = stdin.write_all(&body).await;
    }
    let Ok(output) = child.wait_with_output().await else {
        return answer(StatusCode::INTERNAL_SERVER_ERROR, "git http-backend failed");
    };
    cgi_response(&output.stdout)
}

/// A CGI program's output as an HTTP response: headers up to the first blank line (`Status:`
/// sets the status), the rest the body.
fn cgi_response(output: &[u8]) -> Response<Body> {
    let split = output
        .windows(4)
        .position(|window| window == b"\r\n\r\n")
        .map(|at| (at, 4))
        .or_else(|| {
            output
                .windows(2)
                .position(|window| window == b"\n\n")
                .map(|at| (at, 2))
        });
    let Some((at, gap)) = split else {
        return answer(
            StatusCode::BAD_GATEWAY,
            "git http-backend answered no headers",
        );
    };
    let mut response = Response::new(Body::from(output[at + gap..].to_vec()));
    for line in String::from_utf8_lossy(&output[..at]).lines() {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("status") {
            let code = value
                .split_whitespace()
                .next()
                .and_then(|code| code.parse::<u16>().ok())
                .and_then(|code| StatusCode::from_u16(code).ok());
            if let Some(code) = code {
                *response.status_mut() = code;
            }
        } else if let (Ok(name), Ok(value)) = (
            axum::http::HeaderName::from_bytes(name.trim().as_bytes()),
            axum::http::HeaderValue::from_str(value),
        ) {
            response.headers_mut().append(name, value);
        }
    }
    response
}

/// Debian's `git` (`/usr/bin/git`) where it is installed, else the first `git` on `PATH`.
fn debian_git() -> &'static str {
    if Path::new("/usr/bin/git").is_file() {
        "/usr/bin/git"
    } else {
        "git"
    }
}

/// Debian's OpenSSH server on a loopback port, for this machine's current user, with a host
/// key and an authorized client key of its own (made by `ssh-keygen`), serving git over SSH
/// through the user's shell (`git-upload-pack`).
#[derive(Debug)]
pub struct SshServer {
    child: Child,
    port: u16,
    user: String,
    directory: tempfile::TempDir,
}

/// Runs `ssh-keygen` for a new ed25519 key at `path` (and `path.pub`).
pub fn ssh_key(path: &Path) -> io::Result<()> {
    let status = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "cairn-test", "-f"])
        .arg(path)
        .stdin(Stdio::null())
        .status()?;
    if status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "ssh-keygen failed for {}",
            path.display()
        )))
    }
}

impl SshServer {
    /// Starts `/usr/sbin/sshd` (Debian's openssh-server) in the foreground on a free loopback
    /// port; ready when it accepts connections. As root it needs `/run/sshd`, which it makes.
    pub fn start() -> io::Result<SshServer> {
        let directory = tempfile::tempdir()?;
        let path = directory.path();
        ssh_key(&path.join("host_key"))?;
        ssh_key(&path.join("client_key"))?;
        std::fs::copy(path.join("client_key.pub"), path.join("authorized_keys"))?;
        let user = String::from_utf8_lossy(&Command::new("id").arg("-un").output()?.stdout)
            .trim()
            .to_owned();
        let root = user == "root";
        if root {
            std::fs::create_dir_all("/run/sshd")?;
        }
        let [port] = ports::free_ports::<1>()?;
        let config = format!(
            "Port {port}\nListenAddress 127.0.0.1\nHostKey {dir}/host_key\nPidFile {dir}/sshd.pid\n\
             AuthorizedKeysFile {dir}/authorized_keys\nPasswordAuthentication no\n\
             KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nAllowUsers {user}\n\
             PermitRootLogin {permit}\nLogLevel VERBOSE\n",
            dir = path.display(),
            permit = if root { "prohibit-password" } else { "no" },
        );
        std::fs::write(path.join("sshd_config"), config)?;
        let log = std::fs::File::create(path.join("sshd.log"))?;
        let child = Command::new("/usr/sbin/sshd")
            .args(["-D", "-e", "-f"])
            .arg(path.join("sshd_config"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()?;
        let mut server = SshServer {
            child,
            port,
            user,
            directory,
        };
        let started = Instant::now();
        while !ports::listens(port) {
            if started.elapsed() > Duration::from_secs(10) || server.child.try_wait()?.is_some() {
                let log = server.log();
                ports::kill_child(&mut server.child);
                return Err(io::Error::other(format!(
                    "sshd did not listen on port {port} within 10 s: {log}"
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(server)
    }

    /// The `ssh://` URL of the repository at the absolute path `repository`.
    pub fn url(&self, repository: &Path) -> String {
        format!(
            "ssh://{}@127.0.0.1:{}{}",
            self.user,
            self.port,
            repository.display()
        )
    }

    /// The client key sshd authorizes (its private half).
    pub fn client_key(&self) -> PathBuf {
        self.directory.path().join("client_key")
    }

    /// A `known_hosts` line that names this server's host key.
    pub fn known_hosts_line(&self) -> io::Result<String> {
        let public = std::fs::read_to_string(self.directory.path().join("host_key.pub"))?;
        let mut parts = public.split_whitespace();
        let (kind, key) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        Ok(format!("[127.0.0.1]:{} {kind} {key}\n", self.port))
    }

    /// What sshd logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.directory.path().join("sshd.log")).unwrap_or_default()
    }
}

impl Drop for SshServer {
    fn drop(&mut self) {
        ports::stop_child(&mut self.child, "TERM");
    }
}
