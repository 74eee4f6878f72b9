//! The HTTP server under careless and hostile clients: half-sent requests, idle keep-alive
//! connections, more connections than the cap, slow bodies, and shutdown while all of that
//! is open. Also the binary: a private data directory, and SIGTERM that ends cleanly.

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use cairn::server::{HttpSettings, ServeReport};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::common::app_with;

/// A running in-process server and the way to stop it.
struct Running {
    address: SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<ServeReport>,
    _app: crate::common::TestApp,
}

async fn start(settings: HttpSettings, env: &[(&str, &str)]) -> Running {
    let app = app_with(env).await;
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("listener");
    let address = listener.local_addr().expect("address");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(cairn::server::run(
        listener,
        app.app.clone(),
        settings,
        async move {
            let _ = stopped.await;
        },
    ));
    Running {
        address,
        stop,
        task,
        _app: app,
    }
}

/// Sends one request with `Connection: close` and returns the status and the whole answer.
async fn request(address: SocketAddr, head: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(address).await.expect("connect");
    stream
        .write_all(format!("{head}\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .expect("write");
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer))
        .await
        .expect("answered within 5 s")
        .expect("read");
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    (status, text)
}

/// Waits until the server closes `stream` (EOF or reset); returns how long that took.
async fn closed_within(stream: &mut TcpStream, limit: Duration) -> Duration {
    let started = Instant::now();
    let mut buffer = [0u8; 4096];
    loop {
        match tokio::time::timeout(limit, stream.read(&mut buffer)).await {
            Err(_) => panic!("the connection was still open after {limit:?}"),
            Ok(Ok(0)) | Ok(Err(_)) => return started.elapsed(),
            // hyper may answer a timed-out head before closing; keep reading to the end.
            Ok(Ok(_)) => continue,
        }
    }
}

fn settings(max_connections: usize, header_read_timeout: Duration) -> HttpSettings {
    HttpSettings {
        max_connections,
        header_read_timeout,
        ..HttpSettings::default()
    }
}

#[tokio::test]
async fn half_sent_heads_are_closed_and_health_answers_at_the_cap() {
    let server = start(settings(4, Duration::from_millis(400)), &[]).await;
    // Fill the cap with connections that send only part of a head, like a slowloris client.
    let mut slow = Vec::new();
    for _ in 0..4 {
        let mut stream = TcpStream::connect(server.address).await.expect("connect");
        stream
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n")
            .await
            .expect("write");
        slow.push(stream);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;

    // At the cap: health checks still answer; everything else is a typed 503 that closes.
    let (status, text) = request(server.address, "GET /healthz HTTP/1.1").await;
    assert_eq!(status, 200, "{text}");
    let (status, text) = request(server.address, "GET /v1/status HTTP/1.1").await;
    assert_eq!(status, 503, "{text}");
    assert!(text.contains("\"code\":\"overloaded\""), "{text}");
    assert!(
        text.to_ascii_lowercase().contains("retry-after: 1"),
        "{text}"
    );

    // The half-sent heads are closed by the header-read timeout, not left open.
    for stream in &mut slow {
        let took = closed_within(stream, Duration::from_secs(5)).await;
        assert!(took < Duration::from_secs(3), "closed after {took:?}");
    }
    // The cap is free again: the application answers.
    let (status, text) = request(server.address, "GET /v1/status HTTP/1.1").await;
    assert_eq!(status, 401, "{text}");

    let _ = server.stop.send(());
    let report = server.task.await.expect("server task");
    assert!(report.overflowed >= 2, "{report:?}");
    assert!(report.served >= 5, "{report:?}");
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed() {
    let server = start(settings(16, Duration::from_millis(400)), &[]).await;
    let mut stream = TcpStream::connect(server.address).await.expect("connect");
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    let mut buffer = [0u8; 4096];
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buffer))
        .await
        .expect("answered")
        .expect("read");
    let answer = String::from_utf8_lossy(&buffer[..read]).into_owned();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(!answer.to_ascii_lowercase().contains("connection: close"));
    // Kept alive, then closed once it has been idle for the timeout.
    let took = closed_within(&mut stream, Duration::from_secs(5)).await;
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(3),
        "{took:?}"
    );
    let _ = server.stop.send(());
    server.task.await.expect("server task");
}

#[tokio::test]
async fn a_request_that_outlives_the_request_timeout_gets_a_typed_503() {
    let directory = tempfile::tempdir().expect("tempdir");
    let file = directory.path().join("cairn.toml");
    std::fs::write(
        &file,
        "[search]\nmax_budget_ms = 200\ndefault_budget_ms = 100\n[http]\nrequest_timeout_ms = 500\n",
    )
    .expect("config");
    let path = file.to_string_lossy().into_owned();
    let server = start(
        settings(16, Duration::from_secs(10)),
        &[("CAIRN_CONFIG", path.as_str())],
    )
    .await;
    // A body that promises 100 bytes and sends 2: the handler waits for the rest.
    let mut stream = TcpStream::connect(server.address).await.expect("connect");
    stream
        .write_all(
            b"POST /v1/sources HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer x\r\n\
              Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"",
        )
        .await
        .expect("write");
    let mut buffer = [0u8; 4096];
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buffer))
        .await
        .expect("answered")
        .expect("read");
    let answer = String::from_utf8_lossy(&buffer[..read]).into_owned();
    // The bearer token is checked first: a wrong one is refused before the body is read.
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    drop(stream);

    let token = server._app.admin.clone();
    let started = Instant::now();
    let mut stream = TcpStream::connect(server.address).await.expect("connect");
    stream
        .write_all(
            format!(
                "POST /v1/sources HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\
                 Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\""
            )
            .as_bytes(),
        )
        .await
        .expect("write");
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buffer))
        .await
        .expect("answered")
        .expect("read");
    let took = started.elapsed();
    let answer = String::from_utf8_lossy(&buffer[..read]).into_owned();
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("\"code\":\"request_timeout\""), "{answer}");
    assert!(took >= Duration::from_millis(450), "{took:?}");
    let _ = server.stop.send(());
    server.task.await.expect("server task");
}

#[tokio::test]
async fn shutdown_ends_within_the_grace_period_whatever_the_clients_do() {
    let mut http = settings(16, Duration::from_secs(60));
    http.shutdown_grace = Duration::from_millis(500);
    let server = start(http, &[]).await;
    let token = server._app.admin.clone();
    // One client stuck in a head, one stuck in a body (its handler is running).
    let mut head = TcpStream::connect(server.address).await.expect("connect");
    head.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n")
        .await
        .expect("write");
    let mut body = TcpStream::connect(server.address).await.expect("connect");
    body.write_all(
        format!(
            "POST /v1/sources HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\
             Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\""
        )
        .as_bytes(),
    )
    .await
    .expect("write");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    let _ = server.stop.send(());
    let report = tokio::time::timeout(Duration::from_secs(5), server.task)
        .await
        .expect("shutdown finished within 5 s")
        .expect("server task");
    let took = started.elapsed();
    assert!(took < Duration::from_secs(2), "{took:?}");
    // The request whose body never came is cut off at the end of the grace period.
    assert!(report.dropped_at_shutdown >= 1, "{report:?}");
    // New connections are refused once the listener is closed.
    assert!(TcpStream::connect(server.address).await.is_err());
    drop((head, body));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_keeps_its_data_private_and_stops_cleanly_on_sigterm() {
    let directory = tempfile::tempdir().expect("tempdir");
    let data = directory.path().join("data");
    // A data directory left world-readable by an earlier version or by hand.
    std::fs::create_dir(&data).expect("mkdir");
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::fs::write(data.join("notes.txt"), "operator notes").expect("write");
    std::fs::set_permissions(
        data.join("notes.txt"),
        std::fs::Permissions::from_mode(0o644),
    )
    .expect("chmod");

    let (mut child, base) = crate::crash::start(&data).await;
    let token = std::fs::read_to_string(data.join("admin.token"))
        .expect("admin token")
        .trim()
        .to_owned();
    let client = reqwest::Client::new();
    // Ingest and wait for projection, so that the ledger's WAL and the vector shard exist.
    let answer: Value = client
        .post(format!("{base}/v1/sources"))
        .bearer_auth(&token)
        .json(&json!({"dataset": "docs", "source_key": "a", "content": "private words"}))
        .send()
        .await
        .expect("ingest")
        .json()
        .await
        .expect("receipt");
    let revision = answer["source_revision_id"]
        .as_str()
        .expect("revision id")
        .to_owned();
    crate::projection::wait_for_job(&client, &base, &token, &revision, "completed").await;
    // A half-sent request stays open while the server is told to stop.
    let address = base.trim_start_matches("http://").to_owned();
    let mut stuck = TcpStream::connect(address.as_str()).await.expect("connect");
    stuck
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n")
        .await
        .expect("write");

    let mut loose = Vec::new();
    let mut files = 0;
    for entry in walkdir::WalkDir::new(&data) {
        let entry = entry.expect("walk");
        let mode = entry.metadata().expect("metadata").permissions().mode() & 0o777;
        files += usize::from(entry.file_type().is_file());
        if mode & 0o077 != 0 {
            loose.push(format!("{} {mode:o}", entry.path().display()));
        }
    }
    assert!(files >= 5, "ledger, WAL, token and vector files expected");
    assert!(loose.is_empty(), "readable by others: {loose:?}");
    assert!(data.join("ledger.db-wal").exists());

    let pid = child.id().expect("pid").to_string();
    let started = Instant::now();
    assert!(std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill")
        .success());
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("cairn serve stopped within 30 s of SIGTERM")
        .expect("wait");
    assert!(status.success(), "exit status {status:?}");
    // The default grace period is 10 s; the stuck client does not hold shutdown past it.
    assert!(started.elapsed() < Duration::from_secs(15));
    drop(stuck);
}

/// Mounts a small tmpfs (the test runs as root, as CI does) and unmounts it when dropped.
struct SmallDisk {
    path: std::path::PathBuf,
    _parent: tempfile::TempDir,
}

impl SmallDisk {
    fn mount(megabytes: u32) -> SmallDisk {
        let parent = tempfile::tempdir().expect("tempdir");
        let path = parent.path().join("disk");
        std::fs::create_dir(&path).expect("mkdir");
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={megabytes}m"), "tmpfs"])
            .arg(&path)
            .status()
            .expect("mount");
        assert!(
            status.success(),
            "mounting a tmpfs needs root (CAP_SYS_ADMIN), as CI runs; this test fills a disk"
        );
        SmallDisk {
            path,
            _parent: parent,
        }
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.path)
            .status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_on_a_full_disk_exits_without_a_panic() {
    let disk = SmallDisk::mount(48);
    let data = disk.path.join("data");
    let (mut child, base) =
        crate::crash::spawn_serve(&data, "info", std::process::Stdio::piped()).await;
    let stderr = child.stderr.take().expect("stderr");
    let log = tokio::spawn(async move {
        let mut text = String::new();
        let mut stderr = stderr;
        let _ = stderr.read_to_string(&mut text).await;
        text
    });
    let token = std::fs::read_to_string(data.join("admin.token"))
        .expect("token")
        .trim()
        .to_owned();
    let client = reqwest::Client::new();
    let put = |key: String, text: String| {
        let client = client.clone();
        let base = base.clone();
        let token = token.clone();
        async move {
            client
                .post(format!("{base}/v1/sources"))
                .bearer_auth(&token)
                .json(&json!({"dataset": "docs", "source_key": key, "content": text}))
                .send()
                .await
                .expect("send")
        }
    };
    let first: Value = put("a".into(), "projected before the disk fills".into())
        .await
        .json()
        .await
        .expect("receipt");
    let revision = first["source_revision_id"].as_str().expect("id").to_owned();
    crate::projection::wait_for_job(&client, &base, &token, &revision, "completed").await;

    // Fill the disk to the last byte.
    {
        use std::io::Write;
        let mut filler = std::fs::File::create(disk.path.join("filler")).expect("filler");
        let block = vec![0u8; 1 << 20];
        loop {
            if filler.write_all(&block).is_err() {
                break;
            }
        }
        let mut byte = [0u8; 1];
        while filler.write_all(&byte).is_ok() {
            byte[0] = byte[0].wrapping_add(1);
        }
    }
    // Acceptance on a full disk is a typed 503 with a stable message. The document (3 MB) is
    // larger than any room the WAL file already has from earlier writes (the migrations alone
    // leave some): a smaller one can be written into that room, durably, and is rightly
    // accepted.
    let refused = put("b".into(), "x ".repeat(1_500_000)).await;
    assert_eq!(refused.status(), 503);
    let body: Value = refused.json().await.expect("json");
    assert_eq!(body["code"], "ledger_unavailable");
    assert!(
        !body["message"]
            .as_str()
            .unwrap_or_default()
            .contains("code: 13"),
        "internal detail sent: {body}"
    );

    let pid = child.id().expect("pid").to_string();
    assert!(std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill")
        .success());
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("stopped within 30 s")
        .expect("wait");
    let log = log.await.expect("log");
    assert!(!log.contains("panicked"), "a panic at shutdown:\n{log}");
    // The vector store's last flush cannot succeed on a full disk: its failure is logged as
    // one error line naming the file and the OS error, and the exit status says so.
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(log.contains("closing the vector store"), "{log}");
    assert!(log.contains("No space left on device"), "{log}");
    assert!(!log.contains("backtrace"), "a backtrace in the log:\n{log}");
}
