//! Remote git repositories: a git connector whose location is a URL (`https://`, `http://`,
//! `ssh://`, `git@host:org/repo`, `git://`) reads a bare mirror that cairn keeps under its data
//! directory, fetched with `gix` at the start of every run ([`fetch`]). The listing then reads
//! the mirror as it reads a local repository ([`crate::git`]).
//!
//! ## Invariants
//! - A remote is read only when its host is in `connectors.remote_hosts` (empty by default:
//!   every remote is refused), checked when the connector is created and at every run.
//! - Credentials never come from the URL: a URL with a password, or an HTTP URL with a user
//!   name, is refused. They come from a file named by the connector in the workers'
//!   credentials folder, or from the environment; the ledger holds only the file's name, and
//!   no error quotes the file's content.
//! - An SSH remote is reached only with a `known_hosts` file: an unknown host key is refused,
//!   never accepted on first use.
//! - The ref is fetched alone, into `refs/cairn/head`, forced (a rewritten history is read as
//!   a force-push is), shallow to the configured depth. A fetch that fails, times out or
//!   brings more than the configured bytes changes nothing the run removes: the listing only
//!   starts after a fetch that succeeded.

use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Deserialize;
use uuid::Uuid;

/// The ref a mirror holds the last accepted fetch's commit under: the listing reads it.
pub const MIRROR_REF: &str = "refs/cairn/head";
/// The ref a fetch writes; it becomes [`MIRROR_REF`] only once the fetch is within its limits.
const INCOMING_REF: &str = "refs/cairn/incoming";
/// Largest credentials file read.
const MAX_CREDENTIALS_BYTES: u64 = 64 * 1024;
/// How often a fetch's received bytes are measured.
const WATCH_EVERY: Duration = Duration::from_millis(50);

/// What a worker needs to read remotes.
#[derive(Clone, PartialEq, Eq)]
pub struct RemoteSettings {
    /// Hosts connectors may fetch from (`host` or `host:port`); empty: none.
    pub hosts: Vec<String>,
    /// Where mirrors are kept (`<data_dir>/connectors/mirrors`).
    pub mirrors: PathBuf,
    /// Where credentials files are read from (`connectors.credentials_dir`).
    pub credentials_dir: PathBuf,
    /// History fetched: `0` the whole history, else this many commits from the ref.
    pub depth: u32,
    /// Most bytes one fetch may write to the mirror.
    pub max_fetch_bytes: u64,
    /// Longest one fetch may take.
    pub fetch_timeout: Duration,
    /// Credentials used when a connector names no file (`CAIRN_GIT_*`).
    pub environment: Credentials,
}

impl std::fmt::Debug for RemoteSettings {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("RemoteSettings")
            .field("hosts", &self.hosts)
            .field("mirrors", &self.mirrors)
            .field("credentials_dir", &self.credentials_dir)
            .field("depth", &self.depth)
            .field("max_fetch_bytes", &self.max_fetch_bytes)
            .field("fetch_timeout", &self.fetch_timeout)
            .field("environment", &self.environment)
            .finish()
    }
}

impl RemoteSettings {
    /// Settings that refuse every remote (no host allowed), keeping mirrors under `data_dir`.
    pub fn none(data_dir: &Path) -> RemoteSettings {
        RemoteSettings {
            hosts: Vec::new(),
            mirrors: data_dir.join("connectors").join("mirrors"),
            credentials_dir: data_dir.join("credentials"),
            depth: 1,
            max_fetch_bytes: DEFAULT_MAX_FETCH_BYTES,
            fetch_timeout: DEFAULT_FETCH_TIMEOUT,
            environment: Credentials::default(),
        }
    }
}

/// Default limit on the bytes one fetch writes (1 GiB).
pub const DEFAULT_MAX_FETCH_BYTES: u64 = 1 << 30;
/// Default limit on one fetch's time (5 minutes).
pub const DEFAULT_FETCH_TIMEOUT: Duration = Duration::from_secs(300);

/// Credentials for a remote: HTTP basic credentials or a bearer token, an SSH key and the
/// `known_hosts` file its host key must be in. `Debug` never shows a secret.
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Credentials {
    /// The HTTP user name (with `password` or `token`; default `x-access-token` for a token).
    #[serde(default)]
    pub username: Option<String>,
    /// The HTTP password.
    #[serde(default)]
    pub password: Option<String>,
    /// An HTTP token, sent as basic credentials' password (GitHub, GitLab, Gitea, Forgejo
    /// all take a token so).
    #[serde(default)]
    pub token: Option<String>,
    /// An HTTP token sent as `Authorization: Bearer`.
    #[serde(default)]
    pub bearer: Option<String>,
    /// The SSH private key's path (relative paths are inside the credentials folder).
    #[serde(default)]
    pub ssh_key: Option<PathBuf>,
    /// The `known_hosts` file the SSH host key must be in.
    #[serde(default)]
    pub known_hosts: Option<PathBuf>,
    /// The secret push hooks to this connector are verified with ([`crate::hooks`]).
    #[serde(default)]
    pub hook_secret: Option<String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let set = |value: &Option<String>| value.as_ref().map(|_| "<set>");
        formatter
            .debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &set(&self.password))
            .field("token", &set(&self.token))
            .field("bearer", &set(&self.bearer))
            .field("ssh_key", &self.ssh_key)
            .field("known_hosts", &self.known_hosts)
            .field("hook_secret", &set(&self.hook_secret))
            .finish()
    }
}

impl Credentials {
    fn http(&self) -> Option<gix::sec::identity::Credentials> {
        if let Some(bearer) = &self.bearer {
            return Some(gix::sec::identity::Credentials::Encoded {
                authtype: "Bearer".to_owned(),
                credential: bearer.clone(),
                oauth_refresh_token: None,
            });
        }
        let password = self.token.as_ref().or(self.password.as_ref())?;
        let username = self
            .username
            .clone()
            .unwrap_or_else(|| "x-access-token".to_owned());
        Some(gix::sec::identity::Credentials::UsernamePassword {
            username,
            password: password.clone(),
            oauth_refresh_token: None,
        })
    }
}

/// Why a remote could not be read. Each has a stable code ([`RemoteError::code`]).
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// The location or its host is refused (not allowed, credentials in the URL).
    #[error("{0}")]
    Refused(String),
    /// The credentials file is missing, unreadable or not valid.
    #[error("{0}")]
    Credentials(String),
    /// The remote could not be reached, or broke off.
    #[error("the remote {location} is unavailable: {message}; nothing was changed")]
    Unavailable {
        /// The URL.
        location: String,
        /// What went wrong.
        message: String,
    },
    /// The remote refused the credentials (or asked for some and none were given).
    #[error("the remote {location} refused the credentials: {message}; nothing was changed")]
    Authentication {
        /// The URL.
        location: String,
        /// What it said.
        message: String,
    },
    /// The remote has no such ref (deleted, or never there).
    #[error("`{reference}` names nothing on {location}; nothing was changed")]
    UnknownRef {
        /// The URL.
        location: String,
        /// The ref.
        reference: String,
    },
    /// The fetch brought more than the limit.
    #[error("fetching {location} wrote more than {limit} bytes (connectors.max_fetch_bytes); nothing was changed")]
    TooLarge {
        /// The URL.
        location: String,
        /// The limit.
        limit: u64,
    },
    /// The fetch took longer than the limit.
    #[error("fetching {location} took longer than {seconds} s (connectors.fetch_timeout_s); nothing was changed")]
    Timeout {
        /// The URL.
        location: String,
        /// The limit.
        seconds: u64,
    },
    /// The mirror could not be created or written.
    #[error("the mirror at {path} cannot be used: {message}")]
    Mirror {
        /// Its path.
        path: String,
        /// What went wrong.
        message: String,
    },
}

impl RemoteError {
    /// The stable code a run fails with.
    pub fn code(&self) -> &'static str {
        match self {
            RemoteError::Refused(_) => "location_refused",
            RemoteError::Credentials(_) => "credentials_invalid",
            RemoteError::Unavailable { .. } => "remote_unavailable",
            RemoteError::Authentication { .. } => "remote_auth_failed",
            RemoteError::UnknownRef { .. } => "unknown_ref",
            RemoteError::TooLarge { .. } => "fetch_too_large",
            RemoteError::Timeout { .. } => "fetch_timeout",
            RemoteError::Mirror { .. } => "mirror_unavailable",
        }
    }

    /// Whether running again may succeed without an operator changing anything.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            RemoteError::Unavailable { .. }
                | RemoteError::Timeout { .. }
                | RemoteError::UnknownRef { .. }
                | RemoteError::Mirror { .. }
        )
    }
}

/// Whether `location` names a remote (a URL with a scheme, or `user@host:path`) rather than
/// a local path.
pub fn is_remote(location: &str) -> bool {
    if location.contains("://") {
        return true;
    }
    // scp-like: `[user@]host:path`, where the part before the first `:` has no `/`.
    !location.starts_with('/')
        && location
            .split_once(':')
            .is_some_and(|(host, _)| !host.is_empty() && !host.contains('/'))
}

/// A remote's URL, checked: a scheme cairn fetches over, a host, and no credentials.
#[derive(Debug, Clone)]
pub struct RemoteUrl {
    url: gix::Url,
    /// `host` or `host:port`, as the allowlist names it.
    host: String,
}

impl RemoteUrl {
    /// Parses and checks `location`.
    pub fn parse(location: &str) -> Result<RemoteUrl, RemoteError> {
        let refused = |message: String| RemoteError::Refused(message);
        let url = gix::url::parse(gix::bstr::BStr::new(location))
            .map_err(|error| refused(format!("`{location}` is not a git URL: {error}")))?;
        let scheme = url.scheme.clone();
        use gix::url::Scheme;
        if !matches!(
            scheme,
            Scheme::Http | Scheme::Https | Scheme::Ssh | Scheme::Git
        ) {
            return Err(refused(format!(
                "`{}` remotes are not fetched: use https://, http://, ssh://, user@host:path or \
                 git:// (a local repository is named by its path)",
                scheme.as_str()
            )));
        }
        if url.password().is_some() {
            return Err(refused(
                "a URL with credentials is refused: name a credentials file (--credentials) or \
                 set CAIRN_GIT_TOKEN"
                    .to_owned(),
            ));
        }
        if matches!(scheme, Scheme::Http | Scheme::Https) && url.user().is_some() {
            return Err(refused(
                "an HTTP URL with a user name is refused: credentials come from a credentials \
                 file (--credentials) or the environment"
                    .to_owned(),
            ));
        }
        let Some(host) = url.host() else {
            return Err(refused(format!("`{location}` names no host")));
        };
        let host = match url.port {
            Some(port) => format!("{}:{port}", host.to_ascii_lowercase()),
            None => host.to_ascii_lowercase(),
        };
        Ok(RemoteUrl { url, host })
    }

    /// `host` or `host:port`.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// Whether its host is this machine (`localhost`, `127.0.0.0/8`, `::1`).
    pub fn is_loopback(&self) -> bool {
        let host = self.url.host().unwrap_or_default();
        host.eq_ignore_ascii_case("localhost")
            || host
                .trim_matches(['[', ']'])
                .parse::<std::net::IpAddr>()
                .is_ok_and(|address| address.is_loopback())
    }

    /// Whether it is reached over SSH.
    pub fn is_ssh(&self) -> bool {
        self.url.scheme == gix::url::Scheme::Ssh
    }

    /// Whether `hosts` (the allowlist) admits it: an entry `host` admits every port of the
    /// host, `host:port` that port only.
    pub fn admitted_by(&self, hosts: &[String]) -> bool {
        let bare = self
            .host
            .rsplit_once(':')
            .filter(|_| self.url.port.is_some())
            .map_or(self.host.as_str(), |(host, _)| host);
        hosts.iter().any(|entry| {
            let entry = entry.trim().to_ascii_lowercase();
            entry == self.host || entry == bare
        })
    }
}

/// Checks a remote location against the allowlist (when a connector is created, and at every
/// run).
pub fn admit(settings: &RemoteSettings, location: &str) -> Result<RemoteUrl, RemoteError> {
    let url = RemoteUrl::parse(location)?;
    if !url.admitted_by(&settings.hosts) {
        return Err(RemoteError::Refused(format!(
            "the host `{}` is not in connectors.remote_hosts ({})",
            url.host(),
            if settings.hosts.is_empty() {
                "empty: no remote is allowed".to_owned()
            } else {
                settings.hosts.join(", ")
            }
        )));
    }
    Ok(url)
}

/// Where the mirror of connector `id` is kept.
pub fn mirror_path(settings: &RemoteSettings, id: Uuid) -> PathBuf {
    settings.mirrors.join(format!("{id}.git"))
}

/// The credentials for a connector: its file when it names one, else the environment's.
pub fn credentials(
    settings: &RemoteSettings,
    name: Option<&str>,
) -> Result<Credentials, RemoteError> {
    let Some(name) = name else {
        return Ok(settings.environment.clone());
    };
    let invalid = |message: String| RemoteError::Credentials(message);
    if name.contains(['/', '\\']) || name == ".." || name == "." || name.is_empty() {
        return Err(invalid(format!(
            "credentials `{name}` must be a file name in connectors.credentials_dir"
        )));
    }
    let path = settings.credentials_dir.join(name);
    let shown = path.display().to_string();
    let metadata = std::fs::symlink_metadata(&path).map_err(|error| {
        invalid(format!(
            "the credentials file {shown} cannot be read: {error}"
        ))
    })?;
    if !metadata.is_file() {
        return Err(invalid(format!(
            "the credentials file {shown} is not a plain file (links are not followed)"
        )));
    }
    if metadata.len() > MAX_CREDENTIALS_BYTES {
        return Err(invalid(format!(
            "the credentials file {shown} is larger than {MAX_CREDENTIALS_BYTES} bytes"
        )));
    }
    let text = std::fs::read_to_string(&path).map_err(|error| {
        invalid(format!(
            "the credentials file {shown} cannot be read: {error}"
        ))
    })?;
    // The parser's message quotes the offending line, which may hold a secret: only the line
    // number is told.
    let mut parsed: Credentials = toml::from_str(&text).map_err(|error| {
        let line = error
            .span()
            .map(|span| text[..span.start.min(text.len())].matches('\n').count() + 1);
        invalid(format!(
            "the credentials file {shown} is not valid{}: it takes username, password, token, \
             bearer, ssh_key, known_hosts and hook_secret (TOML)",
            line.map(|line| format!(" (line {line})"))
                .unwrap_or_default()
        ))
    })?;
    for path in [&mut parsed.ssh_key, &mut parsed.known_hosts]
        .into_iter()
        .flatten()
    {
        if path.is_relative() {
            *path = settings.credentials_dir.join(&*path);
        }
    }
    Ok(parsed)
}

/// What a fetch brought.
#[derive(Debug, Clone)]
pub struct Fetched {
    /// The mirror it wrote.
    pub mirror: PathBuf,
    /// The commit the ref names now.
    pub commit: String,
    /// Whether new objects came (a no-change fetch brings none).
    pub changed: bool,
    /// Bytes written to the mirror's packs.
    pub bytes: u64,
    /// How long it took.
    pub elapsed: Duration,
}

/// Quotes `path` for the shell that runs `core.sshCommand`.
fn shell_quoted(path: &Path) -> Result<String, RemoteError> {
    let text = path.to_str().ok_or_else(|| {
        RemoteError::Credentials(format!("the path {} is not UTF-8", path.display()))
    })?;
    if text.contains('\'') || text.chars().any(char::is_control) {
        return Err(RemoteError::Credentials(format!(
            "the path {text} holds a quote or a control character"
        )));
    }
    Ok(format!("'{text}'"))
}

/// The `ssh` command for an SSH remote: batch mode, the host key checked against the
/// credentials' `known_hosts` only (never accepted on first use), the key alone.
fn ssh_command(credentials: &Credentials, timeout: Duration) -> Result<String, RemoteError> {
    let known_hosts = credentials.known_hosts.as_ref().ok_or_else(|| {
        RemoteError::Credentials(
            "an SSH remote needs a known_hosts file in its credentials (known_hosts = \"…\", or \
             CAIRN_GIT_KNOWN_HOSTS): an unknown host key is never accepted"
                .to_owned(),
        )
    })?;
    let mut command = format!(
        "ssh -F /dev/null -o BatchMode=yes -o StrictHostKeyChecking=yes \
         -o UserKnownHostsFile={} -o GlobalKnownHostsFile=/dev/null -o ConnectTimeout={}",
        shell_quoted(known_hosts)?,
        timeout.as_secs().clamp(1, 60)
    );
    if let Some(key) = &credentials.ssh_key {
        command.push_str(&format!(
            " -o IdentitiesOnly=yes -o IdentityAgent=none -i {}",
            shell_quoted(key)?
        ));
    }
    Ok(command)
}

/// Total size of the files under `folder` (the mirror's packs, temporary ones included).
fn folder_bytes(folder: &Path) -> u64 {
    walkdir::WalkDir::new(folder)
        .into_iter()
        .filter_map(Result::ok)
        .filter_map(|entry| entry.metadata().ok())
        .filter(|metadata| metadata.is_file())
        .map(|metadata| metadata.len())
        .sum()
}

/// The names of the files in the mirror's pack folder.
fn pack_files(packs: &Path) -> std::collections::BTreeSet<std::ffi::OsString> {
    std::fs::read_dir(packs)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|entry| entry.file_name())
                .collect()
        })
        .unwrap_or_default()
}

/// Points [`MIRROR_REF`] at the commit a fetch within its limits brought.
fn accept_incoming(repository: &gix::Repository, commit: &str) -> Result<(), String> {
    let id = gix::ObjectId::from_hex(commit.as_bytes()).map_err(|error| error.to_string())?;
    repository
        .reference(
            MIRROR_REF,
            id,
            gix::refs::transaction::PreviousValue::Any,
            "cairn: fetched within its limits",
        )
        .map(|_| ())
        .map_err(|error| error.to_string())
}

/// Opens the mirror of connector `id`, creating it (bare) on first use.
fn open_mirror(path: &Path, overrides: Vec<String>) -> Result<gix::Repository, RemoteError> {
    let mirror_error = |message: String| RemoteError::Mirror {
        path: path.display().to_string(),
        message,
    };
    if !path.join("HEAD").exists() {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|error| mirror_error(error.to_string()))?;
        }
        gix::init_bare(path).map_err(|error| mirror_error(error.to_string()))?;
    }
    let options = gix::open::Options::isolated().config_overrides(overrides);
    gix::open_opts(path, options).map_err(|error| mirror_error(error.to_string()))
}

/// What `ssh` said, for a failed SSH fetch: the reason it gave replaces the transport's
/// "failed to fill whole buffer", and decides the code.
fn with_ssh_log(error: RemoteError, log: &Path) -> RemoteError {
    let Ok(text) = std::fs::read_to_string(log) else {
        return error;
    };
    let said: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('@'))
        .collect();
    let refused = [
        "Host key verification failed",
        "Permission denied",
        "No ED25519 host key is known",
        "REMOTE HOST IDENTIFICATION HAS CHANGED",
    ];
    let reason = said
        .iter()
        .find(|line| refused.iter().any(|needle| line.contains(needle)))
        .or(said.last());
    match (error, reason) {
        (RemoteError::Unavailable { location, .. }, Some(reason))
        | (RemoteError::Authentication { location, .. }, Some(reason)) => {
            let message = format!("ssh: {}", reason.chars().take(300).collect::<String>());
            classify(&location, message)
        }
        (error, _) => error,
    }
}

/// An error and every cause under it, on one line.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let said = cause.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        source = cause.source();
    }
    text
}

/// Sorts a fetch's failure by what the transport said.
fn classify(location: &str, message: String) -> RemoteError {
    let lower = message.to_ascii_lowercase();
    let authentication = [
        "401",
        "403",
        "authentication",
        "permission denied",
        "credentials",
        "host key verification failed",
        "host key is known",
        "remote host identification has changed",
    ]
    .iter()
    .any(|needle| lower.contains(needle));
    if authentication {
        RemoteError::Authentication {
            location: location.to_owned(),
            message,
        }
    } else {
        RemoteError::Unavailable {
            location: location.to_owned(),
            message,
        }
    }
}

/// Fetches `reference` from the remote `location` into the mirror of connector `id`, within
/// the settings' time and size limits. Blocking: run it on its own thread.
pub fn fetch(
    settings: &RemoteSettings,
    id: Uuid,
    location: &str,
    reference: &str,
    credentials_name: Option<&str>,
) -> Result<Fetched, RemoteError> {
    let started = Instant::now();
    // gix's HTTP transport builds its TLS client from the process's default provider; cairn
    // uses ring everywhere (an `Err` here means one is installed already).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let url = admit(settings, location)?;
    let credentials = credentials(settings, credentials_name)?;
    if url.url.scheme == gix::url::Scheme::Http
        && credentials.http().is_some()
        && !url.is_loopback()
    {
        return Err(RemoteError::Credentials(format!(
            "credentials are never sent in clear text: use https:// for {} (plain http carries \
             credentials to loopback hosts only)",
            url.host()
        )));
    }
    let mut overrides = vec![
        // The remote's own settings never reach cairn's process: no helpers, no proxies
        // from a user's configuration (the mirror is opened isolated), and a bounded connect.
        format!(
            "http.connectTimeout={}",
            settings.fetch_timeout.as_millis().min(60_000)
        ),
        "http.lowSpeedLimit=1".to_owned(),
        format!(
            "http.lowSpeedTime={}",
            settings.fetch_timeout.as_secs().clamp(1, 300)
        ),
    ];
    let path = mirror_path(settings, id);
    // `ssh` tells why it failed on its standard error only; that goes to a file in the mirror
    // (not to cairn's own log stream), read back to name the failure.
    let ssh_log = path.join("cairn-ssh.log");
    if url.is_ssh() {
        if let Some(parent) = ssh_log.parent() {
            std::fs::create_dir_all(parent).map_err(|error| RemoteError::Mirror {
                path: path.display().to_string(),
                message: error.to_string(),
            })?;
        }
        let _ = std::fs::remove_file(&ssh_log);
        overrides.push(format!(
            "core.sshCommand={} 2>>{}",
            ssh_command(&credentials, settings.fetch_timeout)?,
            shell_quoted(&ssh_log)?
        ));
        overrides.push("ssh.variant=ssh".to_owned());
    }
    let repository = open_mirror(&path, overrides)?;
    let packs = path.join("objects").join("pack");
    let before = folder_bytes(&packs);
    let packs_before = pack_files(&packs);
    let shallow_before = std::fs::read(path.join("shallow")).ok();

    let interrupt = Arc::new(AtomicBool::new(false));
    let too_large = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (interrupt, too_large, done) = (interrupt.clone(), too_large.clone(), done.clone());
        let (packs, limit, timeout) = (
            packs.clone(),
            settings.max_fetch_bytes,
            settings.fetch_timeout,
        );
        std::thread::Builder::new()
            .name("cairn-fetch-watch".to_owned())
            .spawn(move || {
                while !done.load(Ordering::Relaxed) {
                    if started.elapsed() > timeout {
                        interrupt.store(true, Ordering::Relaxed);
                        return;
                    }
                    if folder_bytes(&packs).saturating_sub(before) > limit {
                        too_large.store(true, Ordering::Relaxed);
                        interrupt.store(true, Ordering::Relaxed);
                        return;
                    }
                    std::thread::sleep(WATCH_EVERY);
                }
            })
            .map_err(|error| RemoteError::Mirror {
                path: path.display().to_string(),
                message: format!("cannot watch the fetch: {error}"),
            })?
    };
    let result = fetch_into(
        &repository,
        &url,
        location,
        reference,
        &credentials,
        settings.depth,
        &interrupt,
    );
    done.store(true, Ordering::Relaxed);
    let _ = watcher.join();
    let bytes = folder_bytes(&packs).saturating_sub(before);
    // A fetch that finished between two of the watcher's looks is measured once more here.
    if too_large.load(Ordering::Relaxed) || bytes > settings.max_fetch_bytes {
        // What it wrote is taken out again, so that the next fetch measures the same pack
        // (the incoming ref never became the mirror's).
        for file in pack_files(&packs).difference(&packs_before) {
            let _ = std::fs::remove_file(packs.join(file));
        }
        // The refs and the shallow boundary it moved go back to what they were.
        if let Ok(incoming) = repository.find_reference(INCOMING_REF) {
            let _ = incoming.delete();
        }
        match &shallow_before {
            Some(bytes) => drop(std::fs::write(path.join("shallow"), bytes)),
            None => drop(std::fs::remove_file(path.join("shallow"))),
        }
        return Err(RemoteError::TooLarge {
            location: location.to_owned(),
            limit: settings.max_fetch_bytes,
        });
    }
    if interrupt.load(Ordering::Relaxed) {
        return Err(RemoteError::Timeout {
            location: location.to_owned(),
            seconds: settings.fetch_timeout.as_secs(),
        });
    }
    let (commit, changed) = result.map_err(|error| match url.is_ssh() {
        true => with_ssh_log(error, &ssh_log),
        false => error,
    })?;
    accept_incoming(&repository, &commit).map_err(|message| RemoteError::Mirror {
        path: path.display().to_string(),
        message,
    })?;
    Ok(Fetched {
        mirror: path,
        commit,
        changed,
        bytes,
        elapsed: started.elapsed(),
    })
}

/// The fetch itself: the ref alone, forced into [`MIRROR_REF`].
fn fetch_into(
    repository: &gix::Repository,
    url: &RemoteUrl,
    location: &str,
    reference: &str,
    credentials: &Credentials,
    depth: u32,
    interrupt: &AtomicBool,
) -> Result<(String, bool), RemoteError> {
    let unavailable = |error: &dyn std::error::Error| classify(location, chain(error));
    let spec = format!("+{reference}:{INCOMING_REF}");
    let remote = repository
        .remote_at(url.url.clone())
        .map_err(|error| unavailable(&error))?
        .with_fetch_tags(gix::remote::fetch::Tags::None)
        .with_refspecs([spec.as_str()], gix::remote::Direction::Fetch)
        .map_err(|error| {
            RemoteError::Refused(format!(
                "`{reference}` is not a ref cairn can fetch: {error}"
            ))
        })?;
    let connection = remote
        .connect(gix::remote::Direction::Fetch)
        .map_err(|error| unavailable(&error))?;
    let http = credentials.http();
    // Only the connector's credentials are offered: no helper, no prompt, nothing from the
    // user's configuration. None set: the remote's 401 fails the fetch.
    let connection = connection.with_credentials(move |action| match (action, &http) {
        (gix::credentials::helper::Action::Get(context), Some(credentials)) => {
            Ok(Some(gix::credentials::protocol::Outcome {
                credentials: credentials.clone(),
                next: context.into(),
            }))
        }
        _ => Ok(None),
    });
    let prepare = connection
        .prepare_fetch(gix::progress::Discard, Default::default())
        .map_err(|error| unavailable(&error))?;
    if prepare.ref_map().mappings.is_empty() {
        return Err(RemoteError::UnknownRef {
            location: location.to_owned(),
            reference: reference.to_owned(),
        });
    }
    let mut prepare = prepare;
    if let Some(depth) = NonZeroU32::new(depth) {
        prepare = prepare.with_shallow(gix::remote::fetch::Shallow::DepthAtRemote(depth));
    }
    let outcome = prepare
        .receive(gix::progress::Discard, interrupt)
        .map_err(|error| unavailable(&error))?;
    let changed = matches!(outcome.status, gix::remote::fetch::Status::Change { .. });
    let commit = repository
        .find_reference(INCOMING_REF)
        .map_err(|error| unavailable(&error))?
        .into_fully_peeled_id()
        .map_err(|error| unavailable(&error))?
        .detach()
        .to_string();
    Ok((commit, changed))
}

/// Opens a mirror a fetch wrote, for listing.
pub fn open_fetched(mirror: &Path) -> Result<gix::ThreadSafeRepository, RemoteError> {
    gix::open_opts(mirror, gix::open::Options::isolated())
        .map(gix::ThreadSafeRepository::from)
        .map_err(|error| RemoteError::Mirror {
            path: mirror.display().to_string(),
            message: error.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remotes_and_local_paths_are_told_apart() {
        for remote in [
            "https://github.com/org/repo.git",
            "ssh://git@host:2222/org/repo",
            "git@github.com:org/repo.git",
            "git://127.0.0.1:9418/repo.git",
        ] {
            assert!(is_remote(remote), "{remote}");
        }
        for local in ["/srv/repo", "/srv/a:b", "relative/path"] {
            assert!(!is_remote(local), "{local}");
        }
    }

    #[test]
    fn credentials_in_a_url_and_other_schemes_are_refused() {
        for refused in [
            "https://user:secret@github.com/org/repo.git",
            "https://token@github.com/org/repo.git",
            "ssh://git:secret@host/org/repo",
            "file:///srv/repo.git",
            "ext::sh -c touch% /tmp/pwned",
        ] {
            let error = RemoteUrl::parse(refused).expect_err(refused);
            assert_eq!(error.code(), "location_refused", "{refused}");
            assert!(!error.to_string().contains("secret"), "{error}");
        }
        let scp = RemoteUrl::parse("git@GitHub.com:org/repo.git").expect("scp-like");
        assert!(scp.is_ssh());
        assert_eq!(scp.host(), "github.com");
    }

    #[test]
    fn the_allowlist_names_a_host_or_one_of_its_ports() {
        let url = RemoteUrl::parse("https://git.example.org:8443/org/repo.git").expect("url");
        assert_eq!(url.host(), "git.example.org:8443");
        assert!(url.admitted_by(&["git.example.org".to_owned()]));
        assert!(url.admitted_by(&["git.example.org:8443".to_owned()]));
        assert!(!url.admitted_by(&["git.example.org:443".to_owned()]));
        assert!(!url.admitted_by(&["example.org".to_owned()]));
        assert!(!url.admitted_by(&[]));
        let settings = RemoteSettings::none(Path::new("/var/lib/cairn"));
        let error = admit(&settings, "https://github.com/org/repo.git").expect_err("none allowed");
        assert_eq!(error.code(), "location_refused");
    }

    #[test]
    fn secrets_stay_out_of_debug_output() {
        let credentials = Credentials {
            token: Some("ghp_secret".to_owned()),
            password: Some("hunter2".to_owned()),
            ..Credentials::default()
        };
        let shown = format!("{credentials:?}");
        assert!(
            !shown.contains("ghp_secret") && !shown.contains("hunter2"),
            "{shown}"
        );
    }

    #[test]
    fn an_ssh_remote_needs_known_hosts_and_quotes_its_paths() {
        let none = ssh_command(&Credentials::default(), Duration::from_secs(5));
        assert_eq!(
            none.expect_err("no known_hosts").code(),
            "credentials_invalid"
        );
        let credentials = Credentials {
            ssh_key: Some(PathBuf::from("/etc/cairn/id_ed25519")),
            known_hosts: Some(PathBuf::from("/etc/cairn/known_hosts")),
            ..Credentials::default()
        };
        let command = ssh_command(&credentials, Duration::from_secs(5)).expect("command");
        assert!(command.contains("StrictHostKeyChecking=yes"), "{command}");
        assert!(
            command.contains("UserKnownHostsFile='/etc/cairn/known_hosts'"),
            "{command}"
        );
        let quoted = Credentials {
            known_hosts: Some(PathBuf::from("/tmp/x'; touch /tmp/pwned; '")),
            ..Credentials::default()
        };
        assert!(ssh_command(&quoted, Duration::from_secs(5)).is_err());
    }
}
