//! A graph server over Bolt 4 through `neo4rs` 0.8, in portable openCypher (tested against
//! ArcadeDB 26.10's Bolt plugin; Neo4j takes the same statements).
//!
//! ## Invariants
//! - Every statement is idempotent (`MERGE`, deletes by match), so a retried or repeated step
//!   converges; the steps of a `HEAD` move each re-check the source's `head_at`, so a run that
//!   a newer head overtook mid-way stops changing anything.
//! - Every call runs under [`BoltOptions::timeout`] (neo4rs retries a refused connection for
//!   tens of seconds by itself); transient failures are retried with exponential backoff
//!   (`backoff`) for at most [`BoltOptions::retry_budget`], kept below the lease by
//!   configuration.
//! - The password is never logged or shown (`Debug` hides it).

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use neo4rs::{query, BoltType, ConfigBuilder, Graph, Query};
use uuid::Uuid;

use super::{Direction, GraphCounts, GraphStore, LinkedSource, RevisionGraph, SourceGraph};
use crate::GatewayError;

const STORE: &str = "graph";

/// What claiming a source's head found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Claim {
    /// A newer head is in the graph: leave `HEAD` and the references alone.
    Overtaken,
    /// The source had no head: nothing to replace.
    First,
    /// The source had a head (this one or an older one): its references are replaced.
    Replacing,
}

/// How to reach a Bolt server.
#[derive(Clone, PartialEq, Eq)]
pub struct BoltOptions {
    /// `bolt://host:7687` (or `host:7687`).
    pub url: String,
    /// The user.
    pub user: String,
    /// The password (from the environment only).
    pub password: String,
    /// The database.
    pub database: String,
    /// The limit on one call (connecting included).
    pub timeout: Duration,
    /// How long one operation may keep retrying transient failures.
    pub retry_budget: Duration,
    /// Connections in the pool.
    pub max_connections: usize,
}

impl BoltOptions {
    /// Options with the defaults: 10 s per call, 5 s of retries, 8 connections.
    pub fn new(url: &str, user: &str, password: &str, database: &str) -> BoltOptions {
        BoltOptions {
            url: url.to_owned(),
            user: user.to_owned(),
            password: password.to_owned(),
            database: database.to_owned(),
            timeout: Duration::from_secs(10),
            retry_budget: Duration::from_secs(5),
            max_connections: 8,
        }
    }
}

impl std::fmt::Debug for BoltOptions {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("BoltOptions")
            .field("url", &self.url)
            .field("user", &self.user)
            .field("password", &"<hidden>")
            .field("database", &self.database)
            .field("timeout", &self.timeout)
            .field("retry_budget", &self.retry_budget)
            .finish()
    }
}

/// The projection graph on a Bolt server.
#[derive(Clone)]
pub struct BoltGraphStore {
    graph: Graph,
    options: BoltOptions,
}

impl std::fmt::Debug for BoltGraphStore {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("BoltGraphStore")
            .field("options", &self.options)
            .finish()
    }
}

fn unavailable(message: impl Into<String>) -> GatewayError {
    GatewayError::Unavailable {
        store: STORE,
        message: message.into(),
    }
}

/// A driver error by kind: the server refusing a statement is permanent, everything about
/// reaching it (and the server's transient errors) is retryable.
fn classify(error: neo4rs::Error) -> GatewayError {
    match &error {
        neo4rs::Error::Neo4j(failure) => {
            let code = failure.code();
            if code.contains("TransientError") || code.contains("Security") {
                unavailable(format!("{code}: {}", failure.message()))
            } else if code.contains("ClientError") {
                GatewayError::Rejected {
                    store: STORE,
                    message: format!("{code}: {}", failure.message()),
                }
            } else {
                unavailable(format!("{code}: {}", failure.message()))
            }
        }
        neo4rs::Error::UrlParseError(_)
        | neo4rs::Error::UnsupportedScheme(_)
        | neo4rs::Error::InvalidDnsName(_)
        | neo4rs::Error::InvalidConfig => GatewayError::Config(format!("graph.url: {error}")),
        neo4rs::Error::AuthenticationError(message) => unavailable(format!(
            "authentication failed ({message}); check graph.user and the password"
        )),
        neo4rs::Error::ConversionError | neo4rs::Error::DeserializationError(_) => {
            GatewayError::Rejected {
                store: STORE,
                message: error.to_string(),
            }
        }
        _ => unavailable(error.to_string()),
    }
}

/// A row's integer column (0 when absent).
fn count(row: &neo4rs::Row, key: &str) -> usize {
    row.get::<i64>(key)
        .ok()
        .and_then(|value| usize::try_from(value).ok())
        .unwrap_or(0)
}

fn uuid_text(id: Uuid) -> String {
    id.to_string()
}

/// Statements run at start: uniqueness and lookup indexes (idempotent).
const SCHEMA: [&str; 7] = [
    "CREATE CONSTRAINT cairn_dataset IF NOT EXISTS FOR (d:Dataset) REQUIRE d.name IS UNIQUE",
    "CREATE CONSTRAINT cairn_source IF NOT EXISTS FOR (s:Source) REQUIRE (s.dataset, s.key) IS UNIQUE",
    "CREATE CONSTRAINT cairn_revision IF NOT EXISTS FOR (r:Revision) REQUIRE r.id IS UNIQUE",
    "CREATE CONSTRAINT cairn_chunk IF NOT EXISTS FOR (c:Chunk) REQUIRE c.id IS UNIQUE",
    "CREATE CONSTRAINT cairn_tag IF NOT EXISTS FOR (t:Tag) REQUIRE t.name IS UNIQUE",
    "CREATE CONSTRAINT cairn_url IF NOT EXISTS FOR (u:Url) REQUIRE u.url IS UNIQUE",
    "CREATE INDEX cairn_revision_dataset IF NOT EXISTS FOR (r:Revision) ON (r.dataset)",
];

impl BoltGraphStore {
    /// Connects and creates the constraints and indexes.
    pub async fn open(options: &BoltOptions) -> Result<BoltGraphStore, GatewayError> {
        let uri = options
            .url
            .strip_prefix("bolt://")
            .unwrap_or(&options.url)
            .to_owned();
        let config = ConfigBuilder::default()
            .uri(uri)
            .user(options.user.as_str())
            .password(options.password.as_str())
            .db(options.database.as_str())
            .max_connections(options.max_connections.max(1))
            .build()
            .map_err(classify)?;
        let graph = tokio::time::timeout(options.timeout, Graph::connect(config))
            .await
            .map_err(|_| GatewayError::Timeout {
                store: STORE,
                message: format!(
                    "connecting to {} took more than {:?}",
                    options.url, options.timeout
                ),
            })?
            .map_err(classify)?;
        let store = BoltGraphStore {
            graph,
            options: options.clone(),
        };
        for statement in SCHEMA {
            store.run("schema", query(statement)).await?;
        }
        Ok(store)
    }

    /// Runs `make()`'s statement under the timeout, retrying transient failures with
    /// exponential backoff within the retry budget.
    async fn call<T, F, Fut>(&self, what: &'static str, attempt: F) -> Result<T, GatewayError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T, GatewayError>>,
    {
        let timeout = self.options.timeout;
        crate::retry::with_backoff(
            self.options.retry_budget,
            what,
            &self.location(),
            || async {
                match tokio::time::timeout(timeout, attempt()).await {
                    Ok(outcome) => outcome,
                    Err(_) => Err(GatewayError::Timeout {
                        store: STORE,
                        message: format!("{what} took more than {timeout:?}"),
                    }),
                }
            },
        )
        .await
    }

    async fn run(&self, what: &'static str, statement: Query) -> Result<(), GatewayError> {
        self.call(what, || {
            let statement = statement.clone();
            async move { self.graph.run(statement).await.map_err(classify) }
        })
        .await
    }

    async fn rows(
        &self,
        what: &'static str,
        statement: Query,
    ) -> Result<Vec<neo4rs::Row>, GatewayError> {
        self.call(what, || {
            let statement = statement.clone();
            async move {
                let mut stream = self.graph.execute(statement).await.map_err(classify)?;
                let mut rows = Vec::new();
                while let Some(row) = stream.next().await.map_err(classify)? {
                    rows.push(row);
                }
                Ok(rows)
            }
        })
        .await
    }

    /// Moves the source's `head_at` to `head_at` unless a newer head is there; returns whether
    /// this head is (still) the newest, and whether the source had a head before (a source
    /// without one has no references to replace).
    async fn claim_head(
        &self,
        dataset: &str,
        source_key: &str,
        head_at: i64,
    ) -> Result<Claim, GatewayError> {
        let rows = self
            .rows(
                "claim head",
                query(
                    "MERGE (d:Dataset {name: $dataset}) \
                     MERGE (s:Source {dataset: $dataset, key: $key}) \
                     MERGE (d)-[:CONTAINS]->(s) \
                     WITH s, s.head_at AS before \
                     WHERE before IS NULL OR before <= $head_at \
                     SET s.head_at = $head_at RETURN before",
                )
                .param("dataset", dataset)
                .param("key", source_key)
                .param("head_at", head_at),
            )
            .await?;
        Ok(match rows.first() {
            None => Claim::Overtaken,
            Some(row) => match row.get::<Option<i64>>("before") {
                Ok(Some(_)) => Claim::Replacing,
                _ => Claim::First,
            },
        })
    }

    /// The tags and URLs the source's revisions other than `keep` reference (candidates for
    /// orphan cleanup once those references go).
    async fn references_of_others(
        &self,
        dataset: &str,
        source_key: &str,
        keep: Option<Uuid>,
    ) -> Result<(Vec<String>, Vec<String>), GatewayError> {
        let keep = keep.map(uuid_text).unwrap_or_default();
        let rows = self
            .rows(
                "old references",
                query(
                    "MATCH (:Source {dataset: $dataset, key: $key})-[:HAS_REVISION]->(o:Revision) \
                     WHERE o.id <> $keep \
                     OPTIONAL MATCH (o)-[:TAGGED]->(t:Tag) \
                     OPTIONAL MATCH (o)-[:CITES]->(u:Url) \
                     RETURN collect(DISTINCT t.name) AS tags, collect(DISTINCT u.url) AS urls",
                )
                .param("dataset", dataset)
                .param("key", source_key)
                .param("keep", keep),
            )
            .await?;
        let Some(row) = rows.first() else {
            return Ok((Vec::new(), Vec::new()));
        };
        Ok((
            row.get::<Vec<String>>("tags").unwrap_or_default(),
            row.get::<Vec<String>>("urls").unwrap_or_default(),
        ))
    }

    /// Removes the references (head edge, links, tags, URLs) of the source's revisions other
    /// than `keep`, while `head_at` is still the source's.
    async fn drop_references(
        &self,
        dataset: &str,
        source_key: &str,
        keep: Option<Uuid>,
        head_at: i64,
    ) -> Result<(), GatewayError> {
        let keep = keep.map(uuid_text).unwrap_or_default();
        let statements = [
            "MATCH (s:Source {dataset: $dataset, key: $key})-[h:HEAD]->(o:Revision) \
             WHERE s.head_at = $head_at AND o.id <> $keep DELETE h",
            "MATCH (s:Source {dataset: $dataset, key: $key})-[l:LINKS_TO]->(:Source) \
             WHERE s.head_at = $head_at AND l.revision_id <> $keep DELETE l",
            "MATCH (s:Source {dataset: $dataset, key: $key})-[:HAS_REVISION]->(o:Revision)-[e:TAGGED]->(:Tag) \
             WHERE s.head_at = $head_at AND o.id <> $keep DELETE e",
            "MATCH (s:Source {dataset: $dataset, key: $key})-[:HAS_REVISION]->(o:Revision)-[e:CITES]->(:Url) \
             WHERE s.head_at = $head_at AND o.id <> $keep DELETE e",
        ];
        for statement in statements {
            self.run(
                "drop references",
                query(statement)
                    .param("dataset", dataset)
                    .param("key", source_key)
                    .param("keep", keep.as_str())
                    .param("head_at", head_at),
            )
            .await?;
        }
        Ok(())
    }

    /// Deletes the given tags and URLs if nothing references them any more.
    async fn collect_orphans(
        &self,
        tags: Vec<String>,
        urls: Vec<String>,
    ) -> Result<(), GatewayError> {
        if !tags.is_empty() {
            self.run(
                "orphan tags",
                query(
                    "UNWIND $names AS name MATCH (t:Tag {name: name}) \
                     WHERE NOT (t)<-[:TAGGED]-() DETACH DELETE t",
                )
                .param("names", tags),
            )
            .await?;
        }
        if !urls.is_empty() {
            self.run(
                "orphan urls",
                query(
                    "UNWIND $urls AS url MATCH (u:Url {url: url}) \
                     WHERE NOT (u)<-[:CITES]-() DETACH DELETE u",
                )
                .param("urls", urls),
            )
            .await?;
        }
        Ok(())
    }
}

#[async_trait]
impl GraphStore for BoltGraphStore {
    fn name(&self) -> &'static str {
        "bolt"
    }

    fn location(&self) -> String {
        format!("{} database {}", self.options.url, self.options.database)
    }

    async fn project(&self, revision: &RevisionGraph) -> Result<bool, GatewayError> {
        let rid = uuid_text(revision.revision_id);
        // The revision's own subgraph, whatever its place in the source's history.
        self.run(
            "revision",
            query(
                "MERGE (d:Dataset {name: $dataset}) \
                 MERGE (s:Source {dataset: $dataset, key: $key}) \
                 MERGE (d)-[:CONTAINS]->(s) \
                 MERGE (r:Revision {id: $rid}) \
                 SET r.sha256 = $sha256, r.accepted_at = $accepted_at, \
                   r.generation = $generation, r.dataset = $dataset, r.source_key = $key, \
                   r.head_at = $head_at \
                 MERGE (s)-[:HAS_REVISION]->(r)",
            )
            .param("dataset", revision.dataset.as_str())
            .param("key", revision.source_key.as_str())
            .param("rid", rid.as_str())
            .param("sha256", revision.sha256.as_str())
            .param("accepted_at", revision.accepted_at)
            .param("generation", revision.generation.as_str())
            .param("head_at", revision.head_at),
        )
        .await?;
        if let Some(previous) = revision.previous_revision_id {
            self.run(
                "supersedes",
                query(
                    "MATCH (r:Revision {id: $rid}) MERGE (p:Revision {id: $previous}) \
                     MERGE (r)-[:SUPERSEDES]->(p)",
                )
                .param("rid", rid.as_str())
                .param("previous", uuid_text(previous)),
            )
            .await?;
        }
        if !revision.chunks.is_empty() {
            let chunks: Vec<HashMap<String, BoltType>> = revision
                .chunks
                .iter()
                .map(|chunk| {
                    HashMap::from([
                        ("id".to_owned(), BoltType::from(uuid_text(chunk.id))),
                        ("index".to_owned(), BoltType::from(i64::from(chunk.index))),
                        ("sha256".to_owned(), BoltType::from(chunk.sha256.as_str())),
                    ])
                })
                .collect();
            self.run(
                "chunks",
                query(
                    "MATCH (r:Revision {id: $rid}) UNWIND $chunks AS c \
                     MERGE (ch:Chunk {id: c.id}) \
                     SET ch.revision_id = $rid, ch.index = c.index, ch.sha256 = c.sha256 \
                     MERGE (r)-[:HAS_CHUNK]->(ch)",
                )
                .param("rid", rid.as_str())
                .param("chunks", chunks),
            )
            .await?;
            let pairs: Vec<HashMap<String, BoltType>> = revision
                .chunks
                .windows(2)
                .map(|pair| {
                    HashMap::from([
                        ("a".to_owned(), BoltType::from(uuid_text(pair[0].id))),
                        ("b".to_owned(), BoltType::from(uuid_text(pair[1].id))),
                    ])
                })
                .collect();
            if !pairs.is_empty() {
                self.run(
                    "next",
                    query(
                        "UNWIND $pairs AS p MATCH (a:Chunk {id: p.a}) MATCH (b:Chunk {id: p.b}) \
                         MERGE (a)-[:NEXT]->(b)",
                    )
                    .param("pairs", pairs),
                )
                .await?;
            }
        }
        // HEAD and references: only for the newest head the graph has seen.
        let claim = self
            .claim_head(&revision.dataset, &revision.source_key, revision.head_at)
            .await?;
        if claim == Claim::Overtaken {
            return Ok(false);
        }
        let (old_tags, old_urls) = if claim == Claim::Replacing {
            let old = self
                .references_of_others(
                    &revision.dataset,
                    &revision.source_key,
                    Some(revision.revision_id),
                )
                .await?;
            self.drop_references(
                &revision.dataset,
                &revision.source_key,
                Some(revision.revision_id),
                revision.head_at,
            )
            .await?;
            old
        } else {
            (Vec::new(), Vec::new())
        };
        let base = |statement: &str| {
            query(statement)
                .param("dataset", revision.dataset.as_str())
                .param("key", revision.source_key.as_str())
                .param("rid", rid.as_str())
                .param("head_at", revision.head_at)
        };
        self.run(
            "head",
            base(
                "MATCH (s:Source {dataset: $dataset, key: $key}) WHERE s.head_at = $head_at \
                 MATCH (r:Revision {id: $rid}) MERGE (s)-[:HEAD]->(r)",
            ),
        )
        .await?;
        if !revision.links.is_empty() {
            self.run(
                "links",
                base(
                    "MATCH (s:Source {dataset: $dataset, key: $key}) WHERE s.head_at = $head_at \
                     MATCH (d:Dataset {name: $dataset}) \
                     UNWIND $links AS target \
                     MERGE (t:Source {dataset: $dataset, key: target}) \
                     MERGE (d)-[:CONTAINS]->(t) \
                     MERGE (s)-[:LINKS_TO {revision_id: $rid}]->(t)",
                )
                .param("links", revision.links.clone()),
            )
            .await?;
        }
        if !revision.tags.is_empty() {
            self.run(
                "tags",
                base(
                    "MATCH (s:Source {dataset: $dataset, key: $key}) WHERE s.head_at = $head_at \
                     MATCH (r:Revision {id: $rid}) UNWIND $tags AS name \
                     MERGE (t:Tag {name: name}) MERGE (r)-[:TAGGED]->(t)",
                )
                .param("tags", revision.tags.clone()),
            )
            .await?;
        }
        if !revision.urls.is_empty() {
            self.run(
                "urls",
                base(
                    "MATCH (s:Source {dataset: $dataset, key: $key}) WHERE s.head_at = $head_at \
                     MATCH (r:Revision {id: $rid}) UNWIND $urls AS url \
                     MERGE (u:Url {url: url}) MERGE (r)-[:CITES]->(u)",
                )
                .param("urls", revision.urls.clone()),
            )
            .await?;
        }
        self.collect_orphans(old_tags, old_urls).await?;
        Ok(true)
    }

    async fn revision_counts(&self, revision_id: Uuid) -> Result<GraphCounts, GatewayError> {
        let rows = self
            .rows(
                "read back",
                query(
                    "MATCH (r:Revision {id: $rid}) \
                     OPTIONAL MATCH (r)-[:HAS_CHUNK]->(c:Chunk) \
                     WITH r, count(DISTINCT c) AS chunks \
                     OPTIONAL MATCH (r)-[:HAS_CHUNK]->(:Chunk)-[n:NEXT]->(:Chunk)<-[:HAS_CHUNK]-(r) \
                     WITH r, chunks, count(DISTINCT n) AS next \
                     OPTIONAL MATCH (r)-[:TAGGED]->(t:Tag) \
                     WITH r, chunks, next, count(DISTINCT t) AS tags \
                     OPTIONAL MATCH (r)-[:CITES]->(u:Url) \
                     WITH r, chunks, next, tags, count(DISTINCT u) AS urls \
                     OPTIONAL MATCH (s:Source)-[:HEAD]->(r) \
                     WITH r, chunks, next, tags, urls, count(DISTINCT s) AS heads \
                     OPTIONAL MATCH (:Source)-[l:LINKS_TO {revision_id: $rid}]->(:Source) \
                     RETURN chunks, next, tags, urls, heads, count(DISTINCT l) AS links",
                )
                .param("rid", uuid_text(revision_id)),
            )
            .await?;
        Ok(match rows.first() {
            None => GraphCounts::default(),
            Some(row) => GraphCounts {
                exists: true,
                chunks: count(row, "chunks"),
                next: count(row, "next"),
                links: count(row, "links"),
                urls: count(row, "urls"),
                tags: count(row, "tags"),
                is_head: count(row, "heads") > 0,
            },
        })
    }

    async fn exclude(
        &self,
        dataset: &str,
        source_key: &str,
        head_at: i64,
    ) -> Result<(), GatewayError> {
        if self.claim_head(dataset, source_key, head_at).await? == Claim::Overtaken {
            return Ok(());
        }
        let (tags, urls) = self.references_of_others(dataset, source_key, None).await?;
        self.drop_references(dataset, source_key, None, head_at)
            .await?;
        self.collect_orphans(tags, urls).await
    }

    async fn source(&self, dataset: &str, source_key: &str) -> Result<SourceGraph, GatewayError> {
        let rows = self
            .rows(
                "source",
                query(
                    "MATCH (s:Source {dataset: $dataset, key: $key}) \
                     OPTIONAL MATCH (s)-[:HEAD]->(r:Revision) \
                     WITH s, collect(r.id) AS heads \
                     OPTIONAL MATCH (s)-[l:LINKS_TO]->(:Source) \
                     RETURN heads, count(l) AS links",
                )
                .param("dataset", dataset)
                .param("key", source_key),
            )
            .await?;
        let Some(row) = rows.first() else {
            return Ok(SourceGraph::default());
        };
        let heads: Vec<String> = row.get("heads").unwrap_or_default();
        Ok(SourceGraph {
            head: heads.first().and_then(|id| id.parse().ok()),
            heads: heads.len(),
            links_out: count(row, "links"),
        })
    }

    async fn orphans(&self) -> Result<usize, GatewayError> {
        let rows = self
            .rows(
                "orphans",
                query(
                    "OPTIONAL MATCH (t:Tag) WHERE NOT (t)<-[:TAGGED]-() \
                     WITH count(t) AS tags \
                     OPTIONAL MATCH (u:Url) WHERE NOT (u)<-[:CITES]-() \
                     RETURN tags, count(u) AS urls",
                ),
            )
            .await?;
        Ok(rows
            .first()
            .map(|row| count(row, "tags") + count(row, "urls"))
            .unwrap_or(0))
    }

    async fn linked(
        &self,
        dataset: &str,
        source_key: &str,
        direction: Direction,
        limit: usize,
    ) -> Result<Vec<LinkedSource>, GatewayError> {
        let mut found = Vec::new();
        let shapes: &[(Direction, &str)] = match direction {
            Direction::Out => &[(Direction::Out, "(s)-[l:LINKS_TO]->(o:Source)")],
            Direction::In => &[(Direction::In, "(s)<-[l:LINKS_TO]-(o:Source)")],
            Direction::Both => &[
                (Direction::Out, "(s)-[l:LINKS_TO]->(o:Source)"),
                (Direction::In, "(s)<-[l:LINKS_TO]-(o:Source)"),
            ],
        };
        for (way, pattern) in shapes {
            let statement = format!(
                "MATCH (s:Source {{dataset: $dataset, key: $key}}) MATCH {pattern} \
                 OPTIONAL MATCH (o)-[:HEAD]->(h:Revision) \
                 OPTIONAL MATCH (h)-[:TAGGED]->(t:Tag) \
                 RETURN o.key AS key, l.revision_id AS via, h.id AS head, \
                   collect(DISTINCT t.name) AS tags \
                 ORDER BY key LIMIT $limit"
            );
            let rows = self
                .rows(
                    "linked",
                    query(&statement)
                        .param("dataset", dataset)
                        .param("key", source_key)
                        .param("limit", i64::try_from(limit).unwrap_or(i64::MAX)),
                )
                .await?;
            for row in rows {
                let (Ok(key), Ok(via)) = (row.get::<String>("key"), row.get::<String>("via"))
                else {
                    continue;
                };
                let Ok(via) = via.parse() else { continue };
                let mut tags: Vec<String> = row.get("tags").unwrap_or_default();
                tags.sort();
                found.push(LinkedSource {
                    source_key: key,
                    direction: *way,
                    via_revision: via,
                    head: row
                        .get::<String>("head")
                        .ok()
                        .and_then(|id| id.parse().ok()),
                    tags,
                });
            }
        }
        Ok(found)
    }

    async fn revisions(&self, dataset: &str) -> Result<Vec<(Uuid, bool)>, GatewayError> {
        let rows = self
            .rows(
                "revisions",
                query(
                    "MATCH (r:Revision {dataset: $dataset}) \
                     OPTIONAL MATCH (s:Source)-[:HEAD]->(r) \
                     RETURN r.id AS id, count(s) AS heads",
                )
                .param("dataset", dataset),
            )
            .await?;
        Ok(rows
            .iter()
            .filter_map(|row| {
                let id = row.get::<String>("id").ok()?.parse().ok()?;
                Some((id, count(row, "heads") > 0))
            })
            .collect())
    }

    async fn forget_revision(&self, revision_id: Uuid) -> Result<(), GatewayError> {
        let rid = uuid_text(revision_id);
        let rows = self
            .rows(
                "forget references",
                query(
                    "MATCH (r:Revision {id: $rid}) \
                     OPTIONAL MATCH (r)-[:TAGGED]->(t:Tag) \
                     OPTIONAL MATCH (r)-[:CITES]->(u:Url) \
                     RETURN collect(DISTINCT t.name) AS tags, collect(DISTINCT u.url) AS urls",
                )
                .param("rid", rid.as_str()),
            )
            .await?;
        let (tags, urls) = rows
            .first()
            .map(|row| {
                (
                    row.get::<Vec<String>>("tags").unwrap_or_default(),
                    row.get::<Vec<String>>("urls").unwrap_or_default(),
                )
            })
            .unwrap_or_default();
        self.run(
            "forget chunks",
            query("MATCH (c:Chunk {revision_id: $rid}) DETACH DELETE c").param("rid", rid.as_str()),
        )
        .await?;
        self.run(
            "forget links",
            query("MATCH (:Source)-[l:LINKS_TO {revision_id: $rid}]->(:Source) DELETE l")
                .param("rid", rid.as_str()),
        )
        .await?;
        self.run(
            "forget revision",
            query("MATCH (r:Revision {id: $rid}) DETACH DELETE r").param("rid", rid.as_str()),
        )
        .await?;
        self.collect_orphans(tags, urls).await
    }

    async fn source_revisions(
        &self,
        dataset: &str,
        source_key: &str,
        before: i64,
    ) -> Result<Vec<Uuid>, GatewayError> {
        let rows = self
            .rows(
                "source revisions",
                query(
                    "MATCH (r:Revision {dataset: $dataset, source_key: $key}) \
                     WHERE r.accepted_at < $before RETURN r.id AS id",
                )
                .param("dataset", dataset)
                .param("key", source_key)
                .param("before", before),
            )
            .await?;
        Ok(rows
            .iter()
            .filter_map(|row| row.get::<String>("id").ok()?.parse().ok())
            .collect())
    }

    async fn forget_source(&self, dataset: &str, source_key: &str) -> Result<bool, GatewayError> {
        let rows = self
            .rows(
                "source references",
                query(
                    "MATCH (s:Source {dataset: $dataset, key: $key}) \
                     OPTIONAL MATCH (s)-[h:HAS_REVISION]->(:Revision) \
                     WITH s, count(h) AS revisions \
                     OPTIONAL MATCH (:Source)-[l:LINKS_TO]->(s) \
                     RETURN revisions, count(l) AS incoming",
                )
                .param("dataset", dataset)
                .param("key", source_key),
            )
            .await?;
        let Some(row) = rows.first() else {
            return Ok(false);
        };
        if count(row, "revisions") > 0 || count(row, "incoming") > 0 {
            return Ok(false);
        }
        self.run(
            "forget source",
            query("MATCH (s:Source {dataset: $dataset, key: $key}) DETACH DELETE s")
                .param("dataset", dataset)
                .param("key", source_key),
        )
        .await?;
        Ok(true)
    }
}
