//! The command-line client: `cairn ingest`, `cairn status`, `cairn block`. It speaks the same
//! HTTP API as any other client, with the token from `--token`, `CAIRN_TOKEN` or
//! `<data-dir>/admin.token`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use base64::Engine;
use serde_json::{json, Value};

/// An authenticated API client.
#[derive(Debug, Clone)]
pub struct Client {
    base: String,
    token: String,
    http: reqwest::Client,
}

/// Finds the token: the explicit one, or the admin token file of `data_dir`.
pub fn resolve_token(explicit: Option<String>, data_dir: &Path) -> anyhow::Result<String> {
    if let Some(token) = explicit.filter(|token| !token.trim().is_empty()) {
        return Ok(token.trim().to_owned());
    }
    let path = crate::config::admin_token_path(data_dir);
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "no token given and {} is unreadable; pass --token, set CAIRN_TOKEN, or point --data-dir at the server's data directory",
            path.display()
        )
    })?;
    Ok(text.trim().to_owned())
}

impl Client {
    /// A client for the server at `base` (e.g. `http://127.0.0.1:7171`).
    pub fn new(base: &str, token: String) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(120))
            .build()
            .context("building the HTTP client")?;
        Ok(Self {
            base: base.trim_end_matches('/').to_owned(),
            token,
            http,
        })
    }

    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> anyhow::Result<(u16, Value)> {
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.token);
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request
            .send()
            .await
            .with_context(|| format!("cannot reach cairn at {}", self.base))?;
        let status = response.status().as_u16();
        let text = response.text().await?;
        let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Ok((status, value))
    }

    /// `GET path`, failing on a non-2xx answer with the server's code and message.
    pub async fn get(&self, path: &str) -> anyhow::Result<Value> {
        let (status, value) = self.call(reqwest::Method::GET, path, None).await?;
        ok_or_error(status, value)
    }

    /// `POST path` with a JSON body.
    pub async fn post(&self, path: &str, body: &Value) -> anyhow::Result<(u16, Value)> {
        self.call(reqwest::Method::POST, path, Some(body)).await
    }

    /// `PUT path` with a JSON body.
    pub async fn put(&self, path: &str, body: &Value) -> anyhow::Result<(u16, Value)> {
        self.call(reqwest::Method::PUT, path, Some(body)).await
    }

    /// `DELETE path`.
    pub async fn delete(&self, path: &str) -> anyhow::Result<(u16, Value)> {
        self.call(reqwest::Method::DELETE, path, None).await
    }
}

pub(crate) fn ok_or_error(status: u16, value: Value) -> anyhow::Result<Value> {
    if (200..300).contains(&status) {
        return Ok(value);
    }
    let code = value
        .get("code")
        .and_then(Value::as_str)
        .unwrap_or("unknown");
    let message = value.get("message").and_then(Value::as_str).unwrap_or("");
    bail!("HTTP {status} {code}: {message}")
}

/// What `cairn ingest` did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct IngestSummary {
    /// New heads recorded.
    pub accepted: usize,
    /// Identical to the current head.
    pub duplicate: usize,
    /// Refused, with `(source_key, code, message)`.
    pub rejected: Vec<(String, String, String)>,
}

struct FileItem {
    key: String,
    path: PathBuf,
}

fn collect_files(paths: &[PathBuf]) -> anyhow::Result<Vec<FileItem>> {
    let mut files = Vec::new();
    for root in paths {
        let metadata =
            std::fs::metadata(root).with_context(|| format!("reading {}", root.display()))?;
        if metadata.is_file() {
            let key = root
                .file_name()
                .map(|name| name.to_string_lossy().into_owned())
                .unwrap_or_default();
            files.push(FileItem {
                key,
                path: root.clone(),
            });
            continue;
        }
        for entry in walkdir::WalkDir::new(root).sort_by_file_name() {
            let entry = entry.with_context(|| format!("walking {}", root.display()))?;
            if !entry.file_type().is_file() {
                continue;
            }
            let relative = entry.path().strip_prefix(root).unwrap_or(entry.path());
            let key = relative
                .components()
                .map(|part| part.as_os_str().to_string_lossy())
                .collect::<Vec<_>>()
                .join("/");
            files.push(FileItem {
                key,
                path: entry.path().to_path_buf(),
            });
        }
    }
    Ok(files)
}

fn media_type_for(path: &Path) -> &'static str {
    path.file_name()
        .and_then(|name| name.to_str())
        .and_then(connectors::media_type_for)
        .unwrap_or("application/octet-stream")
}

/// Sends files and folders through the batch API with a progress bar.
pub async fn ingest(
    client: &Client,
    paths: &[PathBuf],
    dataset: &str,
    batch_size: usize,
    quiet: bool,
) -> anyhow::Result<IngestSummary> {
    send_files(client, &collect_files(paths)?, dataset, batch_size, quiet).await
}

/// What `cairn ingest DIR --prune` found and did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PruneSummary {
    /// The difference between the folder and the dataset, before anything was sent.
    pub difference: receipts::sync::Difference,
    /// What sending the added and changed files did.
    pub sent: IngestSummary,
    /// Sources tombstoned.
    pub removed: usize,
    /// Tombstones refused, with `(source_key, code, message)`.
    pub refused: Vec<(String, String, String)>,
    /// Files of the folder left out, and why.
    pub skipped: Vec<connectors::folder::Skipped>,
}

/// Every head of `dataset` under `prefix`, through the paged listing.
pub async fn list_heads(
    client: &Client,
    dataset: &str,
    prefix: &str,
) -> anyhow::Result<Vec<receipts::SourceListing>> {
    let mut heads = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut url = reqwest::Url::parse("http://cairn/")?;
        url.path_segments_mut()
            .map_err(|()| anyhow::anyhow!("cannot build the listing's URL"))?
            .extend(["v1", "datasets", dataset, "sources"]);
        url.query_pairs_mut()
            .append_pair("prefix", prefix)
            .append_pair("limit", &receipts::MAX_LISTING_PAGE.to_string());
        if let Some(after) = &after {
            url.query_pairs_mut().append_pair("after", after);
        }
        let path = format!("{}?{}", url.path(), url.query().unwrap_or_default());
        let page = client.get(&path).await?;
        let sources: Vec<receipts::SourceListing> = serde_json::from_value(
            page.get("sources")
                .cloned()
                .unwrap_or(Value::Array(Vec::new())),
        )
        .context("reading the listing of the dataset's sources")?;
        heads.extend(sources);
        match page.get("next_after").and_then(Value::as_str) {
            Some(next) => after = Some(next.to_owned()),
            None => return Ok(heads),
        }
    }
}

/// Makes `dataset`'s sources under `prefix` equal to the folder `root`: files the dataset
/// lacks or holds other bytes for are sent, files it holds the same bytes for are not, and
/// sources the folder no longer has are tombstoned (the difference is
/// [`receipts::sync::difference`], the one the connectors use). With `dry_run`, only the
/// difference.
#[allow(clippy::too_many_arguments)]
pub async fn prune(
    client: &Client,
    root: &Path,
    dataset: &str,
    prefix: &str,
    selection: &connectors::Selection,
    batch_size: usize,
    quiet: bool,
    dry_run: bool,
) -> anyhow::Result<PruneSummary> {
    if !std::fs::metadata(root)
        .with_context(|| format!("reading {}", root.display()))?
        .is_dir()
    {
        bail!(
            "--prune keeps a dataset equal to a folder: {} is not one",
            root.display()
        );
    }
    // The same listing a folder connector makes (links followed only inside the folder).
    let folder = connectors::confine::open_folder(root)
        .with_context(|| format!("opening {}", root.display()))?;
    let listing = connectors::folder::list(&folder, selection)
        .with_context(|| format!("listing {}", root.display()))?;
    let mut files: Vec<FileItem> = listing
        .entries
        .into_iter()
        .map(|entry| FileItem {
            path: root.join(&entry.key),
            key: entry.key,
        })
        .collect();
    for file in &mut files {
        file.key = format!("{prefix}{}", file.key);
    }
    let mut hashes = Vec::with_capacity(files.len());
    for file in &files {
        let bytes = std::fs::read(&file.path)
            .with_context(|| format!("reading {}", file.path.display()))?;
        hashes.push(receipts::ids::sha256_hex(&bytes));
    }
    let heads = list_heads(client, dataset, prefix).await?;
    let difference = receipts::sync::difference(
        files
            .iter()
            .zip(&hashes)
            .map(|(file, hash)| (file.key.as_str(), hash.as_str())),
        &heads,
    );
    let mut summary = PruneSummary {
        difference,
        skipped: listing.skipped,
        ..PruneSummary::default()
    };
    if dry_run {
        return Ok(summary);
    }
    let wanted: std::collections::HashSet<&str> = summary
        .difference
        .added
        .iter()
        .chain(&summary.difference.changed)
        .map(String::as_str)
        .collect();
    let sending: Vec<FileItem> = files
        .into_iter()
        .filter(|file| wanted.contains(file.key.as_str()))
        .collect();
    summary.sent = send_files(client, &sending, dataset, batch_size, quiet).await?;
    let place: String = root.display().to_string().chars().take(300).collect();
    let reason = format!("pruned by `cairn ingest --prune`: no longer in {place}");
    let reason = if receipts::validate::reason(&reason).is_ok() {
        reason
    } else {
        "pruned by `cairn ingest --prune`: no longer in the folder".to_owned()
    };
    for key in &summary.difference.removed {
        let mut url = reqwest::Url::parse("http://cairn/v1/sources")?;
        url.query_pairs_mut()
            .append_pair("dataset", dataset)
            .append_pair("source_key", key)
            .append_pair("reason", &reason);
        let path = format!("{}?{}", url.path(), url.query().unwrap_or_default());
        let (status, answer) = client.delete(&path).await?;
        if (200..300).contains(&status) {
            summary.removed += 1;
        } else {
            let text = |field: &str| {
                answer
                    .get(field)
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned()
            };
            if matches!(status, 401 | 403 | 503) {
                bail!("HTTP {status} {}: {}", text("code"), text("message"));
            }
            summary
                .refused
                .push((key.clone(), text("code"), text("message")));
        }
    }
    Ok(summary)
}

/// Sends `files` through the batch API with a progress bar.
async fn send_files(
    client: &Client,
    files: &[FileItem],
    dataset: &str,
    batch_size: usize,
    quiet: bool,
) -> anyhow::Result<IngestSummary> {
    let progress = if quiet {
        indicatif::ProgressBar::hidden()
    } else {
        indicatif::ProgressBar::new(files.len() as u64)
    };
    progress.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:40} {pos}/{len} files  {per_sec}  eta {eta}  {msg}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let mut summary = IngestSummary::default();
    let batch_bytes_limit = 16 * 1024 * 1024;
    let mut start = 0;
    while start < files.len() {
        let mut items = Vec::new();
        let mut keys = Vec::new();
        let mut bytes_in_batch = 0usize;
        let mut end = start;
        while end < files.len() && items.len() < batch_size.max(1) {
            let file = &files[end];
            let bytes = std::fs::read(&file.path)
                .with_context(|| format!("reading {}", file.path.display()))?;
            if !items.is_empty() && bytes_in_batch + bytes.len() > batch_bytes_limit {
                break;
            }
            bytes_in_batch += bytes.len();
            let mut media_type = media_type_for(&file.path);
            let item = match String::from_utf8(bytes) {
                Ok(text) => {
                    if media_type == "application/octet-stream" {
                        media_type = "text/plain";
                    }
                    json!({ "dataset": dataset, "source_key": file.key, "content": text, "media_type": media_type })
                }
                Err(error) => {
                    let encoded =
                        base64::engine::general_purpose::STANDARD.encode(error.into_bytes());
                    json!({ "dataset": dataset, "source_key": file.key, "content_base64": encoded, "media_type": media_type })
                }
            };
            items.push(item);
            keys.push(file.key.clone());
            end += 1;
        }
        let (status, answer) = client
            .post("/v1/sources/batch", &json!({ "items": items }))
            .await?;
        if status == 200 {
            let results = answer
                .get("results")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            for (key, result) in keys.iter().zip(results) {
                match result.get("status").and_then(Value::as_str) {
                    Some("duplicate") => summary.duplicate += 1,
                    Some(_) if result.get("accepted") == Some(&Value::Bool(true)) => {
                        summary.accepted += 1
                    }
                    _ => summary.rejected.push((
                        key.clone(),
                        result
                            .get("code")
                            .and_then(Value::as_str)
                            .unwrap_or("unknown")
                            .to_owned(),
                        result
                            .get("message")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_owned(),
                    )),
                }
            }
        } else {
            let code = answer
                .get("code")
                .and_then(Value::as_str)
                .unwrap_or("unknown")
                .to_owned();
            let message = answer
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned();
            if matches!(status, 401 | 403 | 503) {
                bail!("HTTP {status} {code}: {message}");
            }
            for key in &keys {
                summary
                    .rejected
                    .push((key.clone(), code.clone(), message.clone()));
            }
        }
        progress.inc((end - start) as u64);
        progress.set_message(format!(
            "{} accepted, {} duplicate, {} rejected",
            summary.accepted,
            summary.duplicate,
            summary.rejected.len()
        ));
        start = end;
    }
    progress.finish_and_clear();
    Ok(summary)
}

/// Prints what `--prune` found and did.
pub fn print_prune(summary: &PruneSummary, dry_run: bool) {
    let difference = &summary.difference;
    let verb = if dry_run { "would " } else { "" };
    println!("added     {} ({verb}sent)", difference.added.len());
    println!("changed   {} ({verb}sent)", difference.changed.len());
    println!("unchanged {} (not sent)", difference.unchanged.len());
    println!("removed   {} ({verb}tombstoned)", difference.removed.len());
    println!(
        "skipped   {} (left out of the folder's listing)",
        summary.skipped.len()
    );
    for skipped in summary.skipped.iter().take(20) {
        println!(
            "    {}: {} ({})",
            skipped.path,
            skipped.reason.as_str(),
            skipped.detail
        );
    }
    if summary.skipped.len() > 20 {
        println!("    ... and {} more", summary.skipped.len() - 20);
    }
    for key in difference.removed.iter().take(20) {
        println!("    {key}");
    }
    if difference.removed.len() > 20 {
        println!("    ... and {} more", difference.removed.len() - 20);
    }
    if dry_run {
        return;
    }
    for (key, code, message) in summary.refused.iter().take(20) {
        println!("  not tombstoned {key}: {code} {message}");
    }
    print_summary(&summary.sent);
}

/// Prints an ingest summary; rejected files are grouped by code.
pub fn print_summary(summary: &IngestSummary) {
    println!("accepted  {}", summary.accepted);
    println!("duplicate {}", summary.duplicate);
    println!("rejected  {}", summary.rejected.len());
    let mut by_code: BTreeMap<&str, Vec<&(String, String, String)>> = BTreeMap::new();
    for rejected in &summary.rejected {
        by_code
            .entry(rejected.1.as_str())
            .or_default()
            .push(rejected);
    }
    for (code, items) in by_code {
        println!("  {code} ({}):", items.len());
        for (key, _, message) in items.iter().take(20) {
            println!("    {key}: {message}");
        }
        if items.len() > 20 {
            println!("    ... and {} more", items.len() - 20);
        }
    }
    println!("accepted is not indexed: projection runs in the background.");
}

/// The strings of the array at `key`, joined by `separator` ("" when absent).
fn joined(value: &Value, key: &str, separator: &str) -> String {
    value
        .get(key)
        .and_then(Value::as_array)
        .map(|items| {
            items
                .iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(separator)
        })
        .unwrap_or_default()
}

/// `cairn search`: one request to `POST /v1/search`, printed as a table (or the JSON).
pub async fn search(client: &Client, body: &Value, as_json: bool) -> anyhow::Result<()> {
    let (status, answer) = client.post("/v1/search", body).await?;
    let answer = ok_or_error(status, answer)?;
    if as_json {
        println!("{}", serde_json::to_string_pretty(&answer)?);
        return Ok(());
    }
    let results = answer
        .get("results")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let text = |value: &Value, key: &str| {
        value
            .get(key)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned()
    };
    println!(
        "{:>4}  {:<9} {:<16} {:<28} {:<14} {:<10} text",
        "rank", "score", "dataset", "source", "found by", "state"
    );
    for result in &results {
        let snippet: String = text(result, "text")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
            .chars()
            .take(70)
            .collect();
        let retrieval = joined(result, "retrieval", "+");
        // Where in the document: its section and page, when it has them.
        let place: Vec<String> = [
            result
                .get("page")
                .and_then(Value::as_i64)
                .map(|page| format!("p. {page}")),
            result
                .get("section")
                .and_then(Value::as_str)
                .map(str::to_owned),
        ]
        .into_iter()
        .flatten()
        .collect();
        let snippet = if place.is_empty() {
            snippet
        } else {
            format!("[{}] {snippet}", place.join(", "))
        };
        let source: String = text(result, "source_key").chars().take(28).collect();
        println!(
            "{:>4}  {:<9.4} {:<16} {:<28} {:<14} {:<10} {snippet}",
            result.get("rank").and_then(Value::as_u64).unwrap_or(0),
            result.get("score").and_then(Value::as_f64).unwrap_or(0.0),
            text(result, "dataset"),
            source,
            retrieval,
            text(result, "projection_state"),
        );
    }
    let degradations = joined(&answer, "degradations", ", ");
    println!(
        "{} result(s), mode {}, {:.1} ms of {} ms budget{}{}",
        results.len(),
        text(&answer, "mode"),
        answer.get("took_ms").and_then(Value::as_f64).unwrap_or(0.0),
        answer.get("budget_ms").and_then(Value::as_u64).unwrap_or(0),
        match answer.get("stale_dropped").and_then(Value::as_u64) {
            Some(0) | None => String::new(),
            Some(dropped) => format!(", {dropped} stale hit(s) dropped"),
        },
        if degradations.is_empty() {
            String::new()
        } else {
            format!(", DEGRADED: {degradations}")
        },
    );
    print_facets(&answer);
    Ok(())
}

/// The facet counts of an answer, one block per field: each value with its count.
fn print_facets(answer: &Value) {
    for facet in answer
        .get("facets")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let count = |key: &str| facet.get(key).and_then(Value::as_u64).unwrap_or(0);
        println!(
            "\n{} ({} source(s), {} without a value{})",
            facet.get("field").and_then(Value::as_str).unwrap_or("?"),
            count("sources"),
            count("missing"),
            if facet.get("truncated").and_then(Value::as_bool) == Some(true) {
                ", more values not shown"
            } else {
                ""
            }
        );
        for value in facet
            .get("values")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let shown = match value.get("value") {
                Some(Value::String(text)) => text.clone(),
                Some(other) => other.to_string(),
                None => String::new(),
            };
            let shown: String = shown.chars().take(60).collect();
            println!(
                "  {:>8}  {shown}",
                value.get("count").and_then(Value::as_u64).unwrap_or(0)
            );
        }
    }
    let partial = joined(answer, "facets_partial", ", ");
    if !partial.is_empty() {
        println!("\nnot counted within the budget: {partial}");
    }
}

/// `cairn status`: health, readiness and counts.
pub async fn status(client: &Client, as_json: bool) -> anyhow::Result<()> {
    let health = client.get("/healthz").await?;
    let ready = client.get("/readyz").await;
    let status = client.get("/v1/status").await?;
    if as_json {
        let ready_value = match &ready {
            Ok(value) => value.clone(),
            Err(error) => json!({ "error": error.to_string() }),
        };
        println!(
            "{}",
            serde_json::to_string_pretty(
                &json!({ "health": health, "ready": ready_value, "status": status })
            )?
        );
        return Ok(());
    }
    println!("server     {}", client.base);
    println!(
        "health     {}",
        health.get("status").and_then(Value::as_str).unwrap_or("?")
    );
    println!(
        "ready      {}",
        match &ready {
            Ok(_) => "yes".to_owned(),
            Err(error) => format!("no ({error})"),
        }
    );
    println!(
        "version    {}",
        status.get("version").and_then(Value::as_str).unwrap_or("?")
    );
    println!(
        "uptime     {} s",
        status
            .get("uptime_seconds")
            .and_then(Value::as_u64)
            .unwrap_or(0)
    );
    let counts = status.get("counts").cloned().unwrap_or(Value::Null);
    for field in [
        "sources",
        "deleted_sources",
        "revisions",
        "contents",
        "retained_bytes",
        "history",
    ] {
        println!(
            "{field:<16} {}",
            counts.get(field).and_then(Value::as_i64).unwrap_or(0)
        );
    }
    for (title, key) in [("jobs", "jobs"), ("receipts", "receipts")] {
        println!("{title}:");
        if let Some(map) = counts.get(key).and_then(Value::as_object) {
            for (state, count) in map {
                println!("  {state:<24} {count}");
            }
        }
    }
    Ok(())
}
