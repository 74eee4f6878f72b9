//! `cairn bench mcp`: the MCP `search` tool over HTTP against `POST /v1/search`, on the same
//! server, the same queries and the same arguments (3 hits, lexical mode), so the difference
//! is what the MCP layer adds: JSON-RPC, the SDK's dispatch, the envelope, cleaning and
//! bounding, and the datasets read that names what was searched.
//!
//! Latency: the two paths alternate query by query on one keep-alive connection, and the
//! report gives each path's percentiles and the median of the paired differences. Throughput:
//! `c` clients each run their path back to back for a fixed time, at each concurrency.
//! The corpus is synthetic (the search benchmark's generator), accepted through the ledger,
//! so the lexical index is the real one; vectors are left out because the embedder and the
//! nearest-neighbour search cost the same on both paths.

use std::time::{Duration, Instant};

use receipts::Scope;
use serde_json::{json, Value};

use super::search_latency::{summary, Random};
use crate::config::Config;

/// How the MCP benchmark runs.
#[derive(Debug, Clone)]
pub struct McpBench {
    /// Documents in the corpus.
    pub docs: usize,
    /// Queries per path in the latency series (after a warm-up).
    pub queries: usize,
    /// Client counts for the throughput runs.
    pub concurrency: Vec<usize>,
    /// Seconds per throughput run.
    pub seconds: u64,
}

const DATASET: &str = "bench";

/// One path to search through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    Rest,
    Mcp,
}

impl Path {
    fn name(self) -> &'static str {
        match self {
            Path::Rest => "rest",
            Path::Mcp => "mcp",
        }
    }
}

/// One search through `path`; `Ok(hits)` when it answered with results.
async fn once(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    path: Path,
    query: &str,
    id: u64,
) -> anyhow::Result<usize> {
    let arguments = json!({"query": query, "top_k": 3, "mode": "lexical"});
    match path {
        Path::Rest => {
            let answer: Value = http
                .post(format!("{base}/v1/search"))
                .bearer_auth(token)
                .json(&arguments)
                .send()
                .await?
                .error_for_status()?
                .json()
                .await?;
            Ok(answer["results"].as_array().map_or(0, Vec::len))
        }
        Path::Mcp => {
            let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
                "name": "search", "arguments": arguments,
                "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                          "io.modelcontextprotocol/clientCapabilities": {}}}});
            let answer: Value = http
                .post(format!("{base}/mcp"))
                .bearer_auth(token)
                .header("Accept", "application/json, text/event-stream")
                .header("MCP-Protocol-Version", "2026-07-28")
                .header("Mcp-Method", "tools/call")
                .header("Mcp-Name", "search")
                .json(&body)
                .send()
                .await?
                .error_for_status()?
                .json()
                .await?;
            let result = &answer["result"];
            anyhow::ensure!(
                result["isError"] != json!(true) && answer.get("error").is_none(),
                "the MCP search failed: {answer}"
            );
            Ok(result["structuredContent"]["hits"]
                .as_array()
                .map_or(0, Vec::len))
        }
    }
}

/// Runs the benchmark and returns its JSON report.
pub async fn mcp(config: &Config, bench: McpBench) -> anyhow::Result<Value> {
    let served = super::served::served(config, Scope::Search).await?;
    let (token, base) = (served.token.clone(), served.base.clone());
    let mut random = Random(7);
    let queries = served
        .seed(DATASET, bench.docs, 120, bench.queries, &mut random)
        .await?;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(128)
        .build()?;

    // Warm-up, then the paired latency series.
    for (index, query) in queries.iter().take(50).enumerate() {
        once(&http, &base, &token, Path::Rest, query, index as u64).await?;
        once(&http, &base, &token, Path::Mcp, query, index as u64).await?;
    }
    let (mut rest, mut mcp, mut added) = (Vec::new(), Vec::new(), Vec::new());
    let mut hits = (0usize, 0usize);
    for (index, query) in queries.iter().enumerate() {
        // Alternate which path goes first, so neither always meets a warmer cache.
        let order = if index % 2 == 0 {
            [Path::Rest, Path::Mcp]
        } else {
            [Path::Mcp, Path::Rest]
        };
        let mut took = [0.0f64; 2];
        for path in order {
            let started = Instant::now();
            let found = once(&http, &base, &token, path, query, index as u64).await?;
            let ms = started.elapsed().as_secs_f64() * 1000.0;
            match path {
                Path::Rest => {
                    took[0] = ms;
                    hits.0 += found;
                }
                Path::Mcp => {
                    took[1] = ms;
                    hits.1 += found;
                }
            }
        }
        rest.push(took[0]);
        mcp.push(took[1]);
        added.push(took[1] - took[0]);
    }
    anyhow::ensure!(
        hits.0 == hits.1,
        "the two paths found different numbers of hits ({} against {})",
        hits.0,
        hits.1
    );
    let mut sorted_added = added.clone();
    sorted_added.sort_by(f64::total_cmp);
    let latency = json!({
        "rest": summary(rest.clone()),
        "mcp": summary(mcp.clone()),
        "added_p50_ms_paired": super::percentile_f64(&sorted_added, 0.5),
        "added_p50_ms": summary_p50(&mcp) - summary_p50(&rest),
        "hits_per_query": hits.0 as f64 / queries.len() as f64,
    });

    let mut throughput = Vec::new();
    for clients in &bench.concurrency {
        let mut row = json!({"clients": clients});
        for path in [Path::Rest, Path::Mcp] {
            let deadline = Instant::now() + Duration::from_secs(bench.seconds.max(1));
            let started = Instant::now();
            let tasks: Vec<_> = (0..*clients)
                .map(|client| {
                    let (http, base, token, queries) =
                        (http.clone(), base.clone(), token.clone(), queries.clone());
                    tokio::spawn(async move {
                        let (mut done, mut failed, mut n) = (0u64, 0u64, client);
                        while Instant::now() < deadline {
                            let query = &queries[n % queries.len()];
                            match once(&http, &base, &token, path, query, n as u64).await {
                                Ok(_) => done += 1,
                                Err(_) => failed += 1,
                            }
                            n += 7;
                        }
                        (done, failed)
                    })
                })
                .collect();
            let (mut done, mut failed) = (0u64, 0u64);
            for task in tasks {
                let (d, f) = task.await.unwrap_or((0, 0));
                done += d;
                failed += f;
            }
            let elapsed = started.elapsed().as_secs_f64();
            row[path.name()] = json!({
                "searches_per_second": done as f64 / elapsed,
                "answered": done,
                "failed": failed,
            });
            eprintln!(
                "mcp bench: {clients} clients, {}: {:.0} searches/s ({failed} failed)",
                path.name(),
                done as f64 / elapsed
            );
        }
        throughput.push(row);
    }
    Ok(json!({
        "benchmark": "mcp",
        "corpus": {"docs": bench.docs, "words_per_doc": 120},
        "queries": queries.len(),
        "arguments": {"top_k": 3, "mode": "lexical"},
        "latency": latency,
        "throughput": throughput,
        "machine": super::machine(),
    }))
}

fn summary_p50(samples: &[f64]) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    super::percentile_f64(&sorted, 0.5)
}
