//! The Python clients (`clients/python/`) against real `cairn serve` processes: their three
//! packages are built as wheels, installed into a fresh venv from those wheels and the pinned
//! wheelhouse alone (no index), and their pytest suite runs there against a server on the
//! embedded default and a busy one (one search slot, no queue, sixteen connections) where
//! 429 and 503 are met for real. `scripts/setup-clients` makes the build venv and the
//! wheelhouse.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

/// The packages, in the order they depend on each other.
const PACKAGES: [&str; 3] = [
    "cairn-client",
    "langchain-cairn",
    "llama-index-retrievers-cairn",
];

/// Connections the busy server serves (the tests hold them all to meet its 503).
const BUSY_CONNECTIONS: &str = "16";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs `program` with `args` to its end within `limit`; fails the test with its output when
/// it fails.
async fn run(program: &Path, args: &[&str], envs: &[(&str, String)], limit: Duration) -> String {
    let output = tokio::time::timeout(
        limit,
        tokio::process::Command::new(program)
            .args(args)
            .envs(envs.iter().map(|(name, value)| (*name, value.as_str())))
            .current_dir(root())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| {
        panic!(
            "{} {args:?} did not finish within {limit:?}",
            program.display()
        )
    })
    .unwrap_or_else(|error| panic!("run {}: {error}", program.display()));
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success(),
        "{} {args:?} failed ({}):\n{report}",
        program.display(),
        output.status
    );
    report
}

#[tokio::test]
async fn the_python_clients_work_against_a_real_server() {
    let build_venv = root().join(".venv-clients");
    let build_python = build_venv.join("bin/python");
    assert!(
        build_python.exists(),
        "{} is missing: run scripts/setup-clients",
        build_python.display()
    );
    let directory = tempfile::tempdir().expect("tempdir");
    let dist = directory.path().join("dist");
    for package in PACKAGES {
        let source = root().join("clients/python").join(package);
        run(
            &build_python,
            &[
                "-m",
                "pip",
                "wheel",
                "--quiet",
                "--no-deps",
                "--no-build-isolation",
                "--no-index",
                "--wheel-dir",
                dist.to_str().expect("utf-8 path"),
                source.to_str().expect("utf-8 path"),
            ],
            &[],
            Duration::from_secs(120),
        )
        .await;
    }
    let wheels: Vec<String> = std::fs::read_dir(&dist)
        .expect("dist")
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(wheels.len(), 3, "one wheel per package: {wheels:?}");

    // A fresh venv, from the wheels and the pinned wheelhouse alone.
    let fresh = directory.path().join("venv");
    run(
        Path::new("python3"),
        &["-m", "venv", fresh.to_str().expect("utf-8 path")],
        &[],
        Duration::from_secs(120),
    )
    .await;
    let wheelhouse = build_venv.join("wheelhouse");
    let mut install = vec![
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "--no-index",
        "--find-links",
        dist.to_str().expect("utf-8 path"),
        "--find-links",
        wheelhouse.to_str().expect("utf-8 path"),
        "pytest",
    ];
    install.extend(PACKAGES);
    let python = fresh.join("bin/python");
    run(&python, &install, &[], Duration::from_secs(400)).await;

    // The servers: the embedded default, and a busy one.
    let data = directory.path().join("data");
    // Webhooks may reach the tests' own receiver on the loopback.
    let (mut server, base) = crate::crash::spawn_serve_with(
        &data,
        &[],
        &[("CAIRN_WEBHOOKS_ALLOW_HOSTS", "127.0.0.1")],
        "warn",
        Stdio::inherit(),
    )
    .await;
    let busy_data = directory.path().join("busy");
    let (mut busy, busy_base) = crate::crash::spawn_serve_with(
        &busy_data,
        &[],
        &[
            ("CAIRN_SEARCH_MAX_IN_FLIGHT", "1"),
            ("CAIRN_SEARCH_MAX_QUEUED", "0"),
            ("CAIRN_HTTP_MAX_CONNECTIONS", BUSY_CONNECTIONS),
        ],
        "warn",
        Stdio::inherit(),
    )
    .await;
    let report = run(
        &python,
        &[
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--durations=5",
            "clients/python/tests",
        ],
        &[
            ("CAIRN_URL", base),
            ("CAIRN_ADMIN_TOKEN", crate::common::admin_token(&data)),
            ("CAIRN_BUSY_URL", busy_base),
            (
                "CAIRN_BUSY_ADMIN_TOKEN",
                crate::common::admin_token(&busy_data),
            ),
            ("CAIRN_BUSY_CONNECTIONS", BUSY_CONNECTIONS.to_owned()),
            ("CAIRN_CLIENTS_VENV", fresh.to_string_lossy().into_owned()),
        ],
        Duration::from_secs(480),
    )
    .await;
    eprintln!("{report}");
    assert!(report.contains(" passed"), "{report}");
    server.kill().await.expect("kill");
    busy.kill().await.expect("kill");
}
