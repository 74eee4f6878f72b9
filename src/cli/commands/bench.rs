//! `cairn bench`: the benchmarks, each writing a JSON report.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;

use super::{file_config, write_report};

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// No-op jobs claimed and completed per second with 1, 2, 4 and 8 workers, and
    /// enqueue-to-start latency.
    Queue {
        /// Jobs per throughput scenario.
        #[arg(long, default_value_t = 5000)]
        jobs: usize,
        /// Jobs accepted one by one for the latency scenario.
        #[arg(long, default_value_t = 300)]
        latency_jobs: usize,
        /// Jobs each worker runs at once.
        #[arg(long, default_value_t = 32)]
        concurrency: usize,
        /// Worker counts to measure (comma-separated). Each side's best count is compared: apalis
        /// (tasks in one process) gains up to 8, so 8 is measured too.
        #[arg(long, value_delimiter = ',', default_values_t = [1usize, 2, 4, 8])]
        workers: Vec<usize>,
        /// Measure a PostgreSQL ledger, with workers as separate `cairn worker` processes.
        #[arg(long)]
        ledger: Option<String>,
        /// Where to write the JSON report (also printed).
        #[arg(long, default_value = "bench-queue.json")]
        out: PathBuf,
    },
    /// Every model this configuration can run (fp32, int8, the embedding server's), called
    /// directly on the same chunks: chunks per second in order and sorted, and each one's
    /// cosine against the default model.
    Models {
        /// A BEIR corpus.jsonl.
        #[arg(long, default_value = "../shared/eval/scifact/corpus.jsonl")]
        corpus: PathBuf,
        /// Documents whose chunks are embedded (from the start of the corpus).
        #[arg(long, default_value_t = 400)]
        docs: usize,
        /// TOML configuration file (projection and embedding settings).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Where to write the JSON report (also printed).
        #[arg(long, default_value = "bench-models.json")]
        out: PathBuf,
    },
    /// Projection throughput (accepted to verified) against the raw embedder on the same
    /// chunks, qdrant-edge upsert rate and peak RSS.
    Project {
        /// A BEIR corpus.jsonl.
        #[arg(long, default_value = "../shared/eval/scifact/corpus.jsonl")]
        corpus: PathBuf,
        /// Documents to project (from the start of the corpus).
        #[arg(long, default_value_t = 400)]
        docs: usize,
        /// Workers.
        #[arg(long, default_value_t = 1)]
        workers: usize,
        /// Jobs each worker runs at once (the default, like `workers.concurrency`'s, gives
        /// the embedding batcher enough chunks to sort by length).
        #[arg(long, default_value_t = crate::config::DEFAULT_WORKER_CONCURRENCY)]
        concurrency: usize,
        /// Also run the pipeline with this graph (a Bolt URL; user, password and database
        /// from CAIRN_GRAPH_USER, CAIRN_GRAPH_PASSWORD, CAIRN_GRAPH_DATABASE).
        #[arg(long)]
        graph: Option<String>,
        /// Then project a new revision of every document (one in eight with changed text, the
        /// rest with a new tag) and compare with the first projection (chunk reuse).
        #[arg(long)]
        edits: bool,
        /// The model to project with (default: `projection.model`): a local model's id, or
        /// `remote` for the embedding server's (`CAIRN_EMBEDDINGS_*`); the raw baseline calls
        /// the same model directly.
        #[arg(long)]
        model: Option<String>,
        /// Project one line per document (the corpus records' titles): the case where each
        /// job's fixed costs weigh most against its embedding.
        #[arg(long)]
        one_line: bool,
        /// Project the PDFs of this folder that have a text layer (at most `--docs`) instead
        /// of the corpus, e.g. pdf.js's `test/pdfs`: the pipeline extracts them again.
        #[arg(long)]
        pdfs: Option<PathBuf>,
        /// Runs, each the raw embedder then the pipeline (interleaved); with more than one,
        /// the report gives each run and the median ratio with its spread.
        #[arg(long, default_value_t = 1)]
        runs: usize,
        /// With `--pdfs`: only the PDFs whose text makes at least this many chunks (pdf.js's
        /// corpus is mostly one-line test files; documents people have are longer).
        #[arg(long, default_value_t = 1)]
        min_chunks: usize,
        /// Qdrant server gRPC URL, or a cluster's nodes separated by commas (also
        /// `CAIRN_VECTORS_URL`): measure the networked store, in a collection of this run's own.
        #[arg(long)]
        vectors: Option<String>,
        /// TOML configuration file (projection settings).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Where to write the JSON report (also printed).
        #[arg(long, default_value = "bench-project.json")]
        out: PathBuf,
    },
    /// Search latency per mode at each corpus size, against the raw embedder plus a bare
    /// qdrant-edge search.
    Search {
        /// Corpus sizes in chunks (comma-separated).
        #[arg(long, value_delimiter = ',', default_values_t = [10_000usize, 100_000])]
        sizes: Vec<usize>,
        /// Queries per mode (the overhead is a difference of two p50s of ~13 ms series, so
        /// it needs several hundred samples; it still moves by about 0.25 ms between runs).
        #[arg(long, default_value_t = 500)]
        queries: usize,
        /// Results per query.
        #[arg(long, default_value_t = 10)]
        top_k: usize,
        /// Keep each loaded corpus under DIR/SIZE and reuse it on the next run (default: a
        /// temporary directory per size).
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// Qdrant server gRPC URL, or a cluster's nodes separated by commas (also
        /// `CAIRN_VECTORS_URL`): measure the networked store, in a collection of this run's own.
        #[arg(long)]
        vectors: Option<String>,
        /// TOML configuration file (model and search settings).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Where to write the JSON report (also printed).
        #[arg(long, default_value = "bench-search.json")]
        out: PathBuf,
    },
    /// Search at a point in time (`valid_at`, `as_of`, both) over sources with several
    /// revisions each, every one projected: p50 and p99 per mode, and vector recall against an
    /// exact search with the same filter (embedded default: SQLite, qdrant-edge).
    Temporal {
        /// Sources in the corpus.
        #[arg(long, default_value_t = 100_000)]
        docs: usize,
        /// Revisions per source.
        #[arg(long, default_value_t = 5)]
        revisions: usize,
        /// Queries per kind of point and mode.
        #[arg(long, default_value_t = 200)]
        queries: usize,
        /// Results per query.
        #[arg(long, default_value_t = 10)]
        top_k: usize,
        /// TOML configuration file (model and search settings).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Where to write the JSON report (also printed).
        #[arg(long, default_value = "bench-temporal.json")]
        out: PathBuf,
    },
    /// Filtered search at 50%, 5%, 0.5% and 0.05% selectivity, per mode, against the same
    /// queries unfiltered: p50, p99, vector recall against an exact filtered search, full
    /// pages; and facet counts over every head (embedded default: SQLite, qdrant-edge).
    Filters {
        #[command(flatten)]
        corpus: CorpusArgs,
        /// Where to write the JSON report (also printed).
        #[arg(long, default_value = "bench-filters.json")]
        out: PathBuf,
    },
    /// Who may read what, priced: access changes per second and to their commit, then search
    /// for identities that may read every source, 10% and 1% of them, against search with no
    /// identity: p50, p99, vector recall against an exact search over what each may read
    /// (embedded default: SQLite, qdrant-edge).
    Access {
        #[command(flatten)]
        corpus: CorpusArgs,
        /// Where to write the JSON report (also printed).
        #[arg(long, default_value = "bench-access.json")]
        out: PathBuf,
    },
    /// The MCP `search` tool over HTTP against `POST /v1/search` on the same server and
    /// queries: added latency, and throughput at each client count.
    Mcp {
        /// Documents in the synthetic corpus.
        #[arg(long, default_value_t = 5000)]
        docs: usize,
        /// Queries per path in the latency series.
        #[arg(long, default_value_t = 500)]
        queries: usize,
        /// Client counts for the throughput runs (comma-separated).
        #[arg(long, value_delimiter = ',', default_values_t = [8usize, 64])]
        concurrency: Vec<usize>,
        /// Seconds per throughput run.
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        /// TOML configuration file (search settings).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Where to write the JSON report (also printed).
        #[arg(long, default_value = "bench-mcp.json")]
        out: PathBuf,
    },
    /// What checking an issuer's JWT (OAuth) adds to a search against a cairn token: paired
    /// latency per algorithm, 64 clients with tokens of their own, and the key-set fetches
    /// when the issuer rotates its key under that load.
    Oauth {
        /// Documents in the synthetic corpus.
        #[arg(long, default_value_t = 2000)]
        docs: usize,
        /// Queries per token in the latency series.
        #[arg(long, default_value_t = 500)]
        queries: usize,
        /// Clients in the load run and at the rotation.
        #[arg(long, default_value_t = 64)]
        clients: usize,
        /// Seconds per load run.
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        /// Where to write the JSON report (also printed).
        #[arg(long, default_value = "bench-oauth.json")]
        out: PathBuf,
    },
    /// What webhooks cost acceptance (16 clients, with 0, 1 and 10 subscriptions) and the
    /// delivery lag from commit to the receiver's answer on loopback.
    Webhooks {
        /// Documents put per scenario.
        #[arg(long, default_value_t = 3000)]
        docs: usize,
        /// Distinct source keys (a put to a key already there supersedes: one event).
        #[arg(long, default_value_t = 300)]
        keys: usize,
        /// Rounds; the scenarios interleave and each reports its median round.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Where to write the JSON report (also printed).
        #[arg(long, default_value = "bench-webhooks.json")]
        out: PathBuf,
    },
    /// `cairn ingest DIR --prune` over a folder of many files: the first run, a run with no
    /// change, and a run after a few edits.
    Prune {
        /// Files in the folder.
        #[arg(long, default_value_t = 10_000)]
        files: usize,
        /// Edits before the last run (a third changed, a third deleted, a third new).
        #[arg(long, default_value_t = 30)]
        changes: usize,
        /// Where to write the JSON report (also printed).
        #[arg(long, default_value = "bench-prune.json")]
        out: PathBuf,
    },
    /// A folder connector's runs over a folder of many files (the runner a worker uses, on
    /// an SQLite ledger): the first run, a run with no change, and a run after a few edits.
    Connector {
        /// Files in the folder.
        #[arg(long, default_value_t = 10_000)]
        files: usize,
        /// Edits before the last run (a third changed, a third deleted, a third new).
        #[arg(long, default_value_t = 30)]
        changes: usize,
        /// Commit the files to a git repository and read it with a git connector.
        #[arg(long)]
        git: bool,
        /// Serve that repository with `git daemon` on loopback and read it as a remote
        /// (`git://`), fetched into the connector's mirror at every run (implies --git).
        #[arg(long)]
        remote: bool,
        /// Where to write the JSON report (also printed).
        #[arg(long, default_value = "bench-connector.json")]
        out: PathBuf,
    },
    /// Push-to-searchable: a served cairn keeps a dataset equal to a `git daemon` remote
    /// (runs a day apart); each round pushes a commit, sends its push hook and times until a
    /// lexical search finds the commit's change.
    PushHook {
        /// Pushes measured.
        #[arg(long, default_value_t = 20)]
        pushes: usize,
        /// Where to write the JSON report (also printed).
        #[arg(long, default_value = "bench-push-hook.json")]
        out: PathBuf,
    },
    /// Extraction throughput per format (PDF, DOCX, HTML, Markdown) on the files of the
    /// given folders, one document at a time.
    Extract {
        /// Folders to read (recursively); files are chosen by extension.
        #[arg(long = "dir", default_value = "extract/tests/fixtures")]
        dirs: Vec<PathBuf>,
        /// Where to write the JSON report (also printed).
        #[arg(long, default_value = "bench-extract.json")]
        out: PathBuf,
    },
    /// Verify passes (counts, scrub, deep) over many sources and points generated without
    /// embedding (SQLite and qdrant-edge), with search latency while each pass runs.
    Verify {
        /// Sources, each a settled head.
        #[arg(long, default_value_t = 100_000)]
        sources: usize,
        /// Chunk rows and points per source.
        #[arg(long, default_value_t = 10)]
        chunks: usize,
        /// The vectors' dimension (verify reads values only in the deep tier).
        #[arg(long, default_value_t = 8)]
        dimension: usize,
        /// Run each pass at this limit, points per second (a store request counts as 100;
        /// `verify.points_per_second` defaults to 12000), instead of unthrottled.
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        rate: Option<u32>,
        /// Leave out the backup and restore that follow the passes.
        #[arg(long)]
        no_backup: bool,
        /// Where to write the JSON report (also printed).
        #[arg(long, default_value = "bench-verify.json")]
        out: PathBuf,
    },
    /// Durable receipts per second through the API against a raw sqlx loop.
    Accept {
        /// Measure a PostgreSQL ledger (a database of its own) instead of SQLite.
        #[arg(long)]
        ledger: Option<String>,
        /// Documents per round for the single-document scenarios.
        #[arg(long, default_value_t = 1000)]
        docs: usize,
        /// Documents per round for the batch scenarios (multiple of 1000).
        #[arg(long, default_value_t = 5000)]
        batch_docs: usize,
        /// Rounds; every scenario runs once per round and reports its median.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Where to write the JSON report (also printed).
        #[arg(long, default_value = "bench-accept.json")]
        out: PathBuf,
    },
}

/// The synthetic corpus `cairn bench filters` and `cairn bench access` search.
#[derive(Debug, clap::Args)]
struct CorpusArgs {
    /// Sources in the corpus.
    #[arg(long, default_value_t = 100_000)]
    docs: usize,
    /// Queries per case (selectivity or identity) and mode.
    #[arg(long, default_value_t = 100)]
    queries: usize,
    /// Results per query.
    #[arg(long, default_value_t = 10)]
    top_k: usize,
    /// TOML configuration file (model and search settings).
    #[arg(long)]
    config: Option<PathBuf>,
}

impl CorpusArgs {
    /// The configuration and the benchmark's sizes, each at least 1.
    fn resolve(
        self,
        env: &HashMap<String, String>,
    ) -> anyhow::Result<(crate::config::Config, crate::bench::FilterBench)> {
        let config = file_config(self.config, None, env)?;
        Ok((
            config,
            crate::bench::FilterBench {
                docs: self.docs.max(1),
                queries: self.queries.max(1),
                top_k: self.top_k.clamp(1, search::MAX_TOP_K),
            },
        ))
    }
}

/// Benchmarks that write JSON.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    command: BenchCommand,
}

impl BenchArgs {
    /// Runs the command.
    pub async fn run(self, env: &HashMap<String, String>) -> anyhow::Result<ExitCode> {
        match self.command {
            BenchCommand::Queue {
                jobs,
                latency_jobs,
                concurrency,
                workers,
                ledger,
                out,
            } => {
                let report = crate::bench::queue(crate::bench::QueueBench {
                    jobs,
                    latency_jobs,
                    concurrency: concurrency.max(1),
                    worker_counts: workers,
                    ledger_url: ledger.or_else(|| env.get("CAIRN_LEDGER_URL").cloned()),
                })
                .await?;
                write_report(&out, &report)?;
            }
            BenchCommand::Models {
                corpus,
                docs,
                config,
                out,
            } => {
                let config = file_config(config, None, env)?;
                let report = crate::bench::models(&config, &corpus, docs).await?;
                write_report(&out, &report)?;
            }
            BenchCommand::Search {
                sizes,
                queries,
                top_k,
                data_dir,
                vectors,
                config,
                out,
            } => {
                let config = file_config(config, vectors, env)?;
                let report = crate::bench::search(
                    &config,
                    crate::bench::SearchBench {
                        sizes,
                        queries: queries.max(1),
                        top_k: top_k.clamp(1, search::MAX_TOP_K),
                        data_dir,
                    },
                )
                .await?;
                write_report(&out, &report)?;
            }
            BenchCommand::Filters { corpus, out } => {
                let (config, bench) = corpus.resolve(env)?;
                let report = crate::bench::filters(&config, bench).await?;
                write_report(&out, &report)?;
            }
            BenchCommand::Access { corpus, out } => {
                let (config, bench) = corpus.resolve(env)?;
                let report = crate::bench::access(&config, bench).await?;
                write_report(&out, &report)?;
            }
            BenchCommand::Temporal {
                docs,
                revisions,
                queries,
                top_k,
                config,
                out,
            } => {
                let config = file_config(config, None, env)?;
                let report = crate::bench::temporal(
                    &config,
                    crate::bench::TemporalBench {
                        docs: docs.max(1),
                        revisions,
                        queries: queries.max(1),
                        top_k: top_k.clamp(1, search::MAX_TOP_K),
                    },
                )
                .await?;
                write_report(&out, &report)?;
            }
            BenchCommand::Project {
                corpus,
                docs,
                workers,
                concurrency,
                graph,
                edits,
                one_line,
                pdfs,
                runs,
                min_chunks,
                vectors,
                config,
                out,
                model,
            } => {
                let mut env = env.clone();
                if let Some(model) = model {
                    env.insert("CAIRN_MODEL".to_owned(), model);
                }
                let config = file_config(config, vectors, &env)?;
                let graph = graph.map(|url| {
                    let variable = |name: &str, default: &str| {
                        env.get(name).cloned().unwrap_or_else(|| default.to_owned())
                    };
                    gateways::BoltOptions::new(
                        &url,
                        &variable("CAIRN_GRAPH_USER", "neo4j"),
                        &variable("CAIRN_GRAPH_PASSWORD", ""),
                        &variable("CAIRN_GRAPH_DATABASE", "neo4j"),
                    )
                });
                let bench = crate::bench::ProjectBench {
                    corpus,
                    docs,
                    workers: workers.max(1),
                    concurrency: concurrency.max(1),
                    graph,
                    edits,
                    one_line,
                    pdfs,
                    min_chunks,
                };
                let mut reports = Vec::new();
                for run in 1..=runs.max(1) {
                    if runs > 1 {
                        eprintln!("project: run {run} of {runs}");
                    }
                    reports.push(crate::bench::project(&config, bench.clone()).await?);
                }
                let report = crate::bench::project_runs(reports);
                write_report(&out, &report)?;
            }
            BenchCommand::Mcp {
                docs,
                queries,
                concurrency,
                seconds,
                config,
                out,
            } => {
                let config = file_config(config, None, env)?;
                let report = crate::bench::mcp(
                    &config,
                    crate::bench::McpBench {
                        docs: docs.max(1),
                        queries,
                        concurrency,
                        seconds,
                    },
                )
                .await?;
                write_report(&out, &report)?;
            }
            BenchCommand::Oauth {
                docs,
                queries,
                clients,
                seconds,
                out,
            } => {
                let config = file_config(None, None, env)?;
                let report = crate::bench::oauth(
                    &config,
                    crate::bench::OAuthBench {
                        docs: docs.max(1),
                        queries,
                        clients,
                        seconds,
                    },
                )
                .await?;
                write_report(&out, &report)?;
            }
            BenchCommand::Webhooks {
                docs,
                keys,
                rounds,
                out,
            } => {
                let report = crate::bench::webhooks(crate::bench::WebhooksBench {
                    docs: docs.max(1),
                    keys: keys.max(1),
                    rounds,
                })
                .await?;
                write_report(&out, &report)?;
            }
            BenchCommand::Prune {
                files,
                changes,
                out,
            } => {
                let config = file_config(None, None, env)?;
                let report = crate::bench::prune(
                    &config,
                    crate::bench::PruneBench {
                        files: files.max(1),
                        changes,
                    },
                )
                .await?;
                write_report(&out, &report)?;
            }
            BenchCommand::Connector {
                files,
                changes,
                git,
                remote,
                out,
            } => {
                let report = crate::bench::connector(crate::bench::ConnectorBench {
                    files: files.max(1),
                    changes,
                    git,
                    remote,
                })
                .await?;
                write_report(&out, &report)?;
            }
            BenchCommand::PushHook { pushes, out } => {
                let report =
                    crate::bench::push_hook(crate::bench::PushHookBench { pushes }).await?;
                write_report(&out, &report)?;
            }
            BenchCommand::Verify {
                sources,
                chunks,
                dimension,
                rate,
                no_backup,
                out,
            } => {
                let report = crate::bench::verify(crate::bench::VerifyBench {
                    sources: sources.max(1),
                    chunks: chunks.max(1),
                    dimension: dimension.max(2),
                    rate,
                    backup: !no_backup,
                })
                .await?;
                write_report(&out, &report)?;
            }
            BenchCommand::Extract { dirs, out } => {
                let report = tokio::task::spawn_blocking(move || crate::bench::extract(&dirs))
                    .await
                    .context("the extraction benchmark")??;
                write_report(&out, &report)?;
            }
            BenchCommand::Accept {
                docs,
                batch_docs,
                rounds,
                ledger,
                out,
            } => {
                let ledger = ledger.or_else(|| env.get("CAIRN_LEDGER_URL").cloned());
                let report = crate::bench::accept(docs, batch_docs, rounds, ledger).await?;
                write_report(&out, &report)?;
            }
        }
        Ok(ExitCode::SUCCESS)
    }
}
