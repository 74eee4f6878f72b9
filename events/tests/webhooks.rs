//! Webhook deliveries, end to end at the HTTP level: signed deliveries verified by the
//! reference verifier (PyPI `standardwebhooks`, in tests/webhooks/receiver.py), a rotated
//! secret's grace, and targets that must receive nothing: loopback and metadata addresses, a
//! name that resolves to loopback, a redirect towards another host, and a receiver that does
//! not answer in time.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use events::signing::Secret;
use events::target::{deliver, Outcome, TargetPolicy};

fn python() -> PathBuf {
    std::env::var_os("CAIRN_WEBHOOKS_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.venv-webhooks/bin/python")
        })
}

/// The reference receiver on a free port, verifying under each named secret.
struct Receiver {
    child: tokio::process::Child,
    base: String,
}

impl Receiver {
    async fn start(secrets: &[(&str, &Secret)]) -> Receiver {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        let mut command = tokio::process::Command::new(python());
        command
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../tests/webhooks/receiver.py"
            ))
            .arg(port.to_string());
        for (name, secret) in secrets {
            command.arg(format!("{name}={}", secret.text()));
        }
        let mut child = command
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("the receiver (scripts/setup-webhooks)");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout));
        let ready = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("the receiver started in time")
            .expect("read");
        assert_eq!(ready.as_deref(), Some("listening"));
        Receiver {
            child,
            base: format!("http://127.0.0.1:{port}"),
        }
    }

    async fn log(&self) -> Vec<serde_json::Value> {
        reqwest::get(format!("{}/log", self.base))
            .await
            .expect("log")
            .text()
            .await
            .expect("text")
            .lines()
            .map(|line| serde_json::from_str(line).expect("json line"))
            .collect()
    }
}

fn loopback_policy() -> Arc<TargetPolicy> {
    Arc::new(TargetPolicy::new(&["127.0.0.1".to_owned()]))
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_secs() as i64)
        .unwrap_or_default()
}

#[tokio::test]
async fn the_reference_verifier_accepts_cairns_signatures_and_a_rotations_grace() {
    let old = Secret::generate().expect("old");
    let new = Secret::generate().expect("new");
    let stranger = Secret::generate().expect("stranger");
    let mut receiver = Receiver::start(&[("new", &new), ("old", &old)]).await;
    let policy = loopback_policy();
    let client = policy.client(Duration::from_secs(5)).expect("client");
    let body = br#"{"id":"evt_7","type":"receipt.verified","data":{"backend":"all"}}"#;
    let at = |path: &str| {
        policy
            .check(&format!("{}/{path}", receiver.base))
            .expect("an allowed target")
    };
    let timestamp = now();
    // Signed with the new secret: the receiver that holds it verifies.
    assert_eq!(
        deliver(
            &client,
            &at("new"),
            std::slice::from_ref(&new),
            "evt_7",
            timestamp,
            body
        )
        .await,
        Outcome::Delivered(204)
    );
    // During the grace, both secrets sign: a receiver still on the old one verifies too.
    let both = [new.clone(), old.clone()];
    assert_eq!(
        deliver(&client, &at("old"), &both, "evt_8", timestamp, body).await,
        Outcome::Delivered(204)
    );
    assert_eq!(
        deliver(&client, &at("new"), &both, "evt_9", timestamp, body).await,
        Outcome::Delivered(204)
    );
    // After the grace the old receiver no longer verifies; a stranger's signature never does;
    // a timestamp far in the past is refused as a replay.
    for (path, secrets, stamp) in [
        ("old", vec![new.clone()], timestamp),
        ("new", vec![stranger.clone()], timestamp),
        ("new", vec![new.clone()], timestamp - 86_400 * 30),
    ] {
        assert_eq!(
            deliver(&client, &at(path), &secrets, "evt_x", stamp, body).await,
            Outcome::Failed {
                status: Some(401),
                reason: "the receiver answered 401".to_owned()
            },
            "{path}"
        );
    }
    let log = receiver.log().await;
    let verified: Vec<bool> = log
        .iter()
        .map(|item| item["verified"].as_bool().unwrap_or(false))
        .collect();
    assert_eq!(verified, vec![true, true, true, false, false, false]);
    assert_eq!(log[0]["id"], "evt_7");
    assert_eq!(log[0]["body"], String::from_utf8_lossy(body).as_ref());
    let _ = receiver.child.kill().await;
}

/// A listener that counts the connections it accepts and answers each with `answer` (or
/// never, for `slow`).
async fn counting(answer: String) -> (u16, Arc<AtomicU64>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("address").port();
    let count = Arc::new(AtomicU64::new(0));
    let counted = count.clone();
    let answer = Arc::new(answer);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            let answer = answer.clone();
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut buffer = vec![0u8; 65536];
                let _ = stream.read(&mut buffer).await;
                if answer.as_str() == "slow" {
                    tokio::time::sleep(Duration::from_secs(3)).await;
                    return;
                }
                let _ = stream.write_all(answer.as_bytes()).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    (port, count)
}

fn status_line(status: &str) -> String {
    format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
}

#[tokio::test]
async fn refused_targets_receive_nothing() {
    let (port, connections) = counting(status_line("204 No Content")).await;
    let strict = Arc::new(TargetPolicy::new(&[]));
    let secret = [Secret::generate().expect("secret")];
    // Refused when given: loopback over http or https, the metadata address.
    for url in [
        format!("http://127.0.0.1:{port}/hook"),
        format!("https://127.0.0.1:{port}/hook"),
        format!("https://[::1]:{port}/hook"),
        "https://169.254.169.254/latest/meta-data/".to_owned(),
    ] {
        let refused = strict.check(&url).expect_err(&url);
        assert!(!refused.0.is_empty());
    }
    // A name that resolves to loopback passes the syntax check but is refused by the
    // client's resolver at connection time: nothing is sent.
    let client = strict.client(Duration::from_secs(5)).expect("client");
    let url = strict
        .check(&format!("https://localhost:{port}/hook"))
        .expect("a name is checked when it is resolved");
    match deliver(&client, &url, &secret, "evt_1", 1, b"{}").await {
        Outcome::Failed {
            status: None,
            reason,
        } => assert!(reason.contains("resolves only to addresses"), "{reason}"),
        other => panic!("delivered to loopback: {other:?}"),
    }
    assert_eq!(
        connections.load(Ordering::SeqCst),
        0,
        "nothing reached the listener"
    );

    // A redirect is not followed, even towards a host the policy allows.
    let (target, followed) = counting(status_line("204 No Content")).await;
    let (redirecting, _) = counting(format!(
        "HTTP/1.1 302 Found\r\nlocation: http://127.0.0.1:{target}/elsewhere\r\n\
         content-length: 0\r\nconnection: close\r\n\r\n"
    ))
    .await;
    let policy = loopback_policy();
    let client = policy.client(Duration::from_secs(5)).expect("client");
    let url = policy
        .check(&format!("http://127.0.0.1:{redirecting}/hook"))
        .expect("allowed");
    assert_eq!(
        deliver(&client, &url, &secret, "evt_2", 1, b"{}").await,
        Outcome::Failed {
            status: Some(302),
            reason: "the receiver answered 302".to_owned()
        }
    );
    assert_eq!(
        followed.load(Ordering::SeqCst),
        0,
        "the redirect was not followed"
    );

    // A receiver that never answers costs one attempt's time, then fails.
    let (slow, _) = counting("slow".to_owned()).await;
    let client = policy.client(Duration::from_millis(500)).expect("client");
    let url = policy
        .check(&format!("http://127.0.0.1:{slow}/hook"))
        .expect("allowed");
    let started = std::time::Instant::now();
    match deliver(&client, &url, &secret, "evt_3", 1, b"{}").await {
        Outcome::Failed {
            status: None,
            reason,
        } => assert!(reason.contains("in time"), "{reason}"),
        other => panic!("{other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(2));

    // 410: the receiver wants no more.
    let (gone, _) = counting(status_line("410 Gone")).await;
    let client = policy.client(Duration::from_secs(5)).expect("client");
    let url = policy
        .check(&format!("http://127.0.0.1:{gone}/hook"))
        .expect("allowed");
    assert_eq!(
        deliver(&client, &url, &secret, "evt_4", 1, b"{}").await,
        Outcome::Gone
    );
}
