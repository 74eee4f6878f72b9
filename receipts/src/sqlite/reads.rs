//! Reads on the read pool: sources, revisions, content, history, counts, the lexical index
//! (FTS5, with its query built from words only) and the binding of search hits to current,
//! searchable revisions.

use super::erasure;
use super::ledger::SqliteLedger;
use super::rows::history_from_row;
use super::rows::job_from_row;
use super::rows::json_text;
use super::rows::parse_uuid;
use super::rows::revision_from_row;
use super::rows::REVISION_COLUMNS;
use crate::error::LedgerError;
use crate::error::Result;
use crate::faults::FaultPoint;
use crate::filter::facets::{FacetCounts, FacetField, FacetTally, FacetValue};
use crate::filter::sql::{Dialect, Param};
use crate::filter::{Filter, RevisionFacts};
use crate::ledger::Reader;
use crate::model::BoundHit;
use crate::model::ContentBlock;
use crate::model::DatasetSummary;
use crate::model::Erasure;
use crate::model::HistoryEntry;
use crate::model::HitRef;
use crate::model::LedgerCounts;
use crate::model::LexicalHit;
use crate::model::RevisionDetail;
use crate::model::SourceListing;
use crate::model::SourceView;
use crate::validity::At;
use async_trait::async_trait;
use sqlx::Row;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use uuid::Uuid;

use crate::passages;

/// Turns free text into an FTS5 query: the query's words ([`passages::query_words`]), each
/// quoted (no query syntax reaches FTS5), joined with OR so that BM25 ranks by how many and
/// how rare the matching words are.
pub(super) fn fts_query(text: &str) -> Option<String> {
    let words = passages::query_words(text);
    if words.is_empty() {
        return None;
    }
    Some(
        words
            .iter()
            .map(|word| format!("\"{word}\""))
            .collect::<Vec<_>>()
            .join(" OR "),
    )
}

/// Tells a lexical query's task that its caller has gone (see `lexical_search`).
struct AbandonOnDrop(Arc<AtomicBool>);

impl Drop for AbandonOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

#[async_trait]
impl Reader for SqliteLedger {
    async fn source(&self, dataset: &str, source_key: &str) -> Result<Option<SourceView>> {
        let head: Option<String> = sqlx::query_scalar(
            "SELECT head_revision_id FROM sources WHERE dataset = ? AND source_key = ?",
        )
        .bind(dataset)
        .bind(source_key)
        .fetch_optional(&self.reads)
        .await?;
        let Some(head) = head else { return Ok(None) };
        let head_id = parse_uuid(&head)?;
        let rows = sqlx::query(&format!(
            "SELECT {REVISION_COLUMNS} FROM revisions WHERE dataset = ? AND source_key = ? \
             ORDER BY accepted_at DESC, id DESC"
        ))
        .bind(dataset)
        .bind(source_key)
        .fetch_all(&self.reads)
        .await?;
        let revisions = rows
            .iter()
            .map(revision_from_row)
            .collect::<Result<Vec<_>>>()?;
        let head = revisions
            .iter()
            .find(|revision| revision.id == head_id)
            .cloned()
            .ok_or_else(|| LedgerError::Corrupt(format!("head {head_id} missing")))?;
        let history = sqlx::query(
            "SELECT * FROM history WHERE entity = 'source' AND entity_id = ? \
               AND event = 'head_moved' ORDER BY seq",
        )
        .bind(format!("{dataset}/{source_key}"))
        .fetch_all(&self.reads)
        .await?
        .iter()
        .map(history_from_row)
        .collect::<Result<Vec<_>>>()?;
        Ok(Some(SourceView {
            dataset: dataset.to_owned(),
            source_key: source_key.to_owned(),
            deleted: head.tombstone,
            head,
            revisions,
            head_history: history,
        }))
    }

    async fn revision(&self, id: Uuid) -> Result<Option<RevisionDetail>> {
        let row = sqlx::query(&format!(
            "SELECT {REVISION_COLUMNS} FROM revisions WHERE id = ?"
        ))
        .bind(id.to_string())
        .fetch_optional(&self.reads)
        .await?;
        let Some(row) = row else { return Ok(None) };
        let revision = revision_from_row(&row)?;
        let is_head: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM sources WHERE dataset = ? AND source_key = ? AND head_revision_id = ?)",
        )
        .bind(&revision.dataset)
        .bind(&revision.source_key)
        .bind(id.to_string())
        .fetch_one(&self.reads)
        .await?;
        // The revision's latest projection job (`project` or `tombstone`) in the active
        // generation (else the latest in any); its `graph` job, when the graph backend is
        // configured, adds its receipt below.
        let job = sqlx::query(
            "SELECT * FROM jobs WHERE revision_id = ? AND kind <> 'graph' \
             ORDER BY generation IS (SELECT id FROM generations WHERE state = 'active') DESC, \
               created_at DESC, id DESC LIMIT 1",
        )
        .bind(id.to_string())
        .fetch_optional(&self.reads)
        .await?
        .as_ref()
        .map(job_from_row)
        .transpose()?;
        let mut receipts = match &job {
            Some(job) => self.load_receipts(job.id).await?,
            None => Vec::new(),
        };
        let graph_job: Option<String> = sqlx::query_scalar(
            "SELECT id FROM jobs WHERE revision_id = ? AND kind = 'graph' \
             ORDER BY created_at DESC, id DESC LIMIT 1",
        )
        .bind(id.to_string())
        .fetch_optional(&self.reads)
        .await?;
        if let Some(graph_job) = graph_job {
            let graph_job = super::rows::parse_uuid(&graph_job)?;
            receipts.extend(self.load_receipts(graph_job).await?);
        }
        // Every lookup goes through history's (entity, entity_id, seq) index.
        let history = sqlx::query(
            "SELECT * FROM history WHERE entity = 'source' AND entity_id = ?2 \
               AND (to_state = ?1 OR from_state = ?1) \
             UNION ALL SELECT * FROM history WHERE entity = 'job' \
               AND entity_id IN (SELECT id FROM jobs WHERE revision_id = ?1) \
             UNION ALL SELECT * FROM history WHERE entity = 'receipt' \
               AND entity_id IN (SELECT receipt.job_id || '/' || receipt.backend \
                 FROM projection_receipts AS receipt JOIN jobs ON jobs.id = receipt.job_id \
                 WHERE jobs.revision_id = ?1) \
             ORDER BY seq",
        )
        .bind(id.to_string())
        .bind(format!("{}/{}", revision.dataset, revision.source_key))
        .fetch_all(&self.reads)
        .await?
        .iter()
        .map(history_from_row)
        .collect::<Result<Vec<_>>>()?;
        Ok(Some(RevisionDetail {
            revision,
            is_head,
            job,
            receipts,
            history,
        }))
    }

    async fn content(&self, sha256: &str) -> Result<Option<Vec<u8>>> {
        let bytes = sqlx::query_scalar("SELECT bytes FROM contents WHERE sha256 = ?")
            .bind(sha256)
            .fetch_optional(&self.reads)
            .await?;
        Ok(bytes)
    }

    async fn lexical_search(
        &self,
        query: &str,
        datasets: &[String],
        limit: u32,
        deadline: Option<std::time::Instant>,
    ) -> Result<Vec<LexicalHit>> {
        self.lexical(query, datasets, limit, deadline, None).await
    }

    async fn lexical_search_at(
        &self,
        query: &str,
        datasets: &[String],
        limit: u32,
        deadline: Option<std::time::Instant>,
        at: At,
    ) -> Result<Vec<LexicalHit>> {
        self.lexical(query, datasets, limit, deadline, Some(at))
            .await
    }

    async fn lexical_search_where(
        &self,
        query: &str,
        datasets: &[String],
        filter: &Filter,
        limit: u32,
        deadline: Option<std::time::Instant>,
        at: Option<At>,
    ) -> Result<Vec<LexicalHit>> {
        self.lexical_filtered(query, datasets, limit, deadline, at, Some(filter))
            .await
    }

    async fn filter_revisions(
        &self,
        datasets: &[String],
        filter: &Filter,
        at: Option<At>,
        limit: u32,
    ) -> Result<Vec<Uuid>> {
        let compiled = crate::filter::sql::compile(
            filter,
            Dialect::Sqlite,
            "fr",
            if at.is_some() { 5 } else { 3 },
        );
        let sql = match at {
            None => format!(
                "SELECT s.head_revision_id AS id FROM sources s \
                 JOIN revisions fr ON fr.id = s.head_revision_id AND fr.tombstone = 0 \
                 WHERE (json_array_length(?1) = 0 OR s.dataset IN (SELECT value FROM json_each(?1))) \
                   AND {} LIMIT ?2",
                compiled.sql
            ),
            Some(_) => format!(
                "SELECT DISTINCT v.revision_id AS id FROM validity v \
                 JOIN revisions fr ON fr.id = v.revision_id AND fr.tombstone = 0 \
                 WHERE v.valid_from <= ?3 AND ?3 < v.valid_to \
                   AND v.recorded_from <= ?4 AND ?4 < v.recorded_to \
                   AND (json_array_length(?1) = 0 OR fr.dataset IN (SELECT value FROM json_each(?1))) \
                   AND {} LIMIT ?2",
                compiled.sql
            ),
        };
        let mut params = vec![
            Param::Texts(datasets.to_vec()),
            Param::Int(i64::from(limit)),
        ];
        if let Some(at) = at {
            params.extend([Param::Int(at.valid_at), Param::Int(at.as_of)]);
        }
        params.extend(compiled.params);
        bind_params(sqlx::query(&sql), &params)
            .fetch_all(&self.reads)
            .await?
            .iter()
            .map(|row| parse_uuid(&row.try_get::<String, _>("id")?))
            .collect()
    }

    async fn facet_counts(
        &self,
        datasets: &[String],
        filter: Option<&Filter>,
        at: Option<At>,
        field: &FacetField,
        max_values: u32,
        deadline: Option<std::time::Instant>,
    ) -> Result<FacetCounts> {
        let compiled = crate::filter::sql::facet_query(
            Dialect::Sqlite,
            datasets,
            filter,
            at,
            field,
            max_values,
        );
        let rows = match fetch_bounded(&self.reads, compiled.sql, compiled.params, deadline).await?
        {
            Ok(rows) => rows,
            Err(error) if deadline.is_some_and(|d| std::time::Instant::now() >= d) => {
                return Err(LedgerError::DeadlineExceeded(format!(
                    "facet count of {} interrupted at its deadline ({error})",
                    field.name()
                )))
            }
            Err(error) => return Err(error.into()),
        };
        let mut tally = FacetTally::new(field, max_values);
        for row in &rows {
            let kind: String = row.try_get("kind")?;
            let n: i64 = row.try_get("n")?;
            if kind == "value" {
                let rank: i64 = row.try_get("rank")?;
                let value = match rank {
                    0 => FacetValue::Bool(
                        row.try_get::<Option<String>, _>("txt")?.as_deref() == Some("true"),
                    ),
                    1 => FacetValue::Number(
                        row.try_get::<Option<f64>, _>("num")?.unwrap_or_default(),
                    ),
                    _ => FacetValue::Text(
                        row.try_get::<Option<String>, _>("txt")?.unwrap_or_default(),
                    ),
                };
                tally.value(value, n);
            } else {
                tally.total(&kind, n);
            }
        }
        Ok(tally.finish())
    }

    async fn access_of(
        &self,
        dataset: &str,
        source_key: &str,
    ) -> Result<crate::access::AccessRecord> {
        super::access::of(&self.reads, dataset, source_key).await
    }

    async fn named_readers(
        &self,
        dataset: &str,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<(String, Vec<String>)>> {
        // Byte order on both engines, so a cursor pages the same way.
        sqlx::query("SELECT source_key, readers FROM source_access WHERE dataset = ?1 AND (?2 IS NULL OR source_key > ?2) ORDER BY source_key LIMIT ?3")
            .bind(dataset)
            .bind(after)
            .bind(i64::from(limit.min(crate::model::MAX_LISTING_PAGE)))
            .fetch_all(&self.reads)
            .await?
            .iter()
            .map(|row| {
                let readers: String = row.try_get("readers")?;
                Ok((
                    row.try_get("source_key")?,
                    crate::access::StoredReaders::readers(readers)?,
                ))
            })
            .collect()
    }

    async fn revision_facts(&self, revision_ids: &[Uuid]) -> Result<Vec<RevisionFacts>> {
        if revision_ids.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<String> = revision_ids.iter().map(Uuid::to_string).collect();
        let rows = sqlx::query(&format!(
            "SELECT {REVISION_COLUMNS}, {} FROM revisions WHERE id IN (SELECT value FROM json_each(?))",
            crate::access::FACT_COLUMNS
        ))
        .bind(json_text(&ids))
        .fetch_all(&self.reads)
        .await?;
        rows.iter()
            .map(|row| {
                let revision = revision_from_row(row)?;
                Ok(RevisionFacts {
                    revision_id: revision.id,
                    source_key: revision.source_key,
                    media_type: revision.media_type,
                    tags: revision.tags,
                    metadata: revision.metadata,
                    accepted_at: revision.accepted_at,
                    readers: crate::access::in_force(
                        row.try_get::<Option<String>, _>("named_readers")?,
                        row.try_get::<Option<String>, _>("default_access")?
                            .as_deref(),
                    )?,
                })
            })
            .collect()
    }

    async fn bind_hits(&self, hits: &[HitRef], generation: &str) -> Result<Vec<BoundHit>> {
        self.bind(hits, generation, None).await
    }

    async fn bind_hits_at(
        &self,
        hits: &[HitRef],
        generation: &str,
        at: At,
    ) -> Result<Vec<BoundHit>> {
        self.bind(hits, generation, Some(at)).await
    }

    async fn erasure(&self, revision_id: Uuid) -> Result<Option<Erasure>> {
        erasure::read(&self.reads, revision_id).await
    }

    async fn content_block(&self, dataset: &str, sha256: &str) -> Result<Option<ContentBlock>> {
        let row = sqlx::query("SELECT dataset, sha256, reason, actor FROM content_blocks WHERE dataset = ? AND sha256 = ?")
            .bind(dataset)
            .bind(sha256)
            .fetch_optional(&self.reads)
            .await?;
        row.map(|row| {
            Ok(ContentBlock {
                dataset: row.try_get("dataset")?,
                sha256: row.try_get("sha256")?,
                reason: row.try_get("reason")?,
                actor: row.try_get("actor")?,
            })
        })
        .transpose()
    }

    async fn timeline(&self, dataset: &str, source_key: &str) -> Result<crate::validity::Timeline> {
        super::validity::timeline(&self.reads, dataset, source_key).await
    }

    async fn held_at(
        &self,
        dataset: &str,
        source_key: &str,
        valid_at: crate::clock::Micros,
        as_of: crate::clock::Micros,
    ) -> Result<Option<crate::validity::Held>> {
        super::validity::held_at(&self.reads, dataset, source_key, valid_at, as_of).await
    }

    async fn history_gaps(
        &self,
        datasets: &[String],
        generation: Option<&str>,
        at: At,
    ) -> Result<crate::validity::HistoryGaps> {
        super::validity::history_gaps(&self.reads, datasets, generation, at).await
    }

    async fn periods(
        &self,
        revisions: &[Uuid],
        at: At,
    ) -> Result<Vec<(Uuid, crate::validity::Period)>> {
        if revisions.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<String> = revisions.iter().map(Uuid::to_string).collect();
        let rows = sqlx::query(
            "SELECT v.revision_id, v.valid_from, v.valid_to FROM json_each(?1) AS asked \
             CROSS JOIN validity v ON v.revision_id = asked.value \
             WHERE v.valid_from <= ?2 AND ?2 < v.valid_to \
               AND v.recorded_from <= ?3 AND ?3 < v.recorded_to",
        )
        .bind(json_text(&ids))
        .bind(at.valid_at)
        .bind(at.as_of)
        .fetch_all(&self.reads)
        .await?;
        rows.iter()
            .map(|row| {
                Ok((
                    parse_uuid(&row.try_get::<String, _>("revision_id")?)?,
                    crate::validity::Period {
                        from: row.try_get("valid_from")?,
                        to: row.try_get("valid_to")?,
                    },
                ))
            })
            .collect()
    }

    async fn history(&self, entity: &str, entity_id: &str) -> Result<Vec<HistoryEntry>> {
        sqlx::query("SELECT * FROM history WHERE entity = ? AND entity_id = ? ORDER BY seq")
            .bind(entity)
            .bind(entity_id)
            .fetch_all(&self.reads)
            .await?
            .iter()
            .map(history_from_row)
            .collect()
    }

    async fn counts(&self) -> Result<LedgerCounts> {
        let row = sqlx::query(
            "SELECT (SELECT count(*) FROM sources) AS sources, \
             (SELECT count(*) FROM sources s JOIN revisions r ON r.id = s.head_revision_id WHERE r.tombstone = 1) AS deleted, \
             (SELECT count(*) FROM revisions) AS revisions, \
             (SELECT count(*) FROM contents) AS contents, \
             (SELECT coalesce(sum(byte_length), 0) FROM contents) AS bytes, \
             (SELECT count(*) FROM history) AS history",
        )
        .fetch_one(&self.reads)
        .await?;
        let mut counts = LedgerCounts {
            sources: row.try_get("sources")?,
            deleted_sources: row.try_get("deleted")?,
            revisions: row.try_get("revisions")?,
            contents: row.try_get("contents")?,
            retained_bytes: row.try_get("bytes")?,
            history: row.try_get("history")?,
            ..LedgerCounts::default()
        };
        for row in sqlx::query("SELECT state, count(*) AS n FROM jobs GROUP BY state")
            .fetch_all(&self.reads)
            .await?
        {
            counts.jobs.insert(row.try_get("state")?, row.try_get("n")?);
        }
        for row in sqlx::query("SELECT backend || '/' || state AS key, count(*) AS n FROM projection_receipts GROUP BY backend, state")
            .fetch_all(&self.reads)
            .await?
        {
            counts.receipts.insert(row.try_get("key")?, row.try_get("n")?);
        }
        Ok(counts)
    }

    async fn datasets(&self) -> Result<Vec<DatasetSummary>> {
        let rows = sqlx::query(
            "SELECT s.dataset, count(*) AS sources, sum(r.tombstone) AS deleted, \
               max(r.accepted_at) AS latest \
             FROM sources s JOIN revisions r ON r.id = s.head_revision_id \
             GROUP BY s.dataset ORDER BY s.dataset",
        )
        .fetch_all(&self.reads)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(DatasetSummary {
                    dataset: row.try_get("dataset")?,
                    sources: row.try_get("sources")?,
                    deleted_sources: row.try_get("deleted")?,
                    last_accepted_at: row.try_get("latest")?,
                })
            })
            .collect()
    }

    async fn list_sources(
        &self,
        dataset: &str,
        prefix: &str,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<SourceListing>> {
        // `source_key >= prefix` starts the scan of the (dataset, source_key) key at the
        // prefix; the `substr` test keeps the keys that start with it (BINARY collation: byte
        // order, as PostgreSQL's `COLLATE "C"`).
        let rows = sqlx::query(
            "SELECT s.source_key, r.id, r.content_sha256, r.byte_length, r.tombstone, \
               r.accepted_at, s.owner \
             FROM sources s JOIN revisions r ON r.id = s.head_revision_id \
             WHERE s.dataset = ?1 AND s.source_key >= ?2 \
               AND substr(s.source_key, 1, length(?2)) = ?2 \
               AND (?3 IS NULL OR s.source_key > ?3) \
             ORDER BY s.source_key LIMIT ?4",
        )
        .bind(dataset)
        .bind(prefix)
        .bind(after)
        .bind(i64::from(limit.min(crate::model::MAX_LISTING_PAGE)))
        .fetch_all(&self.reads)
        .await?;
        rows.iter()
            .map(|row| {
                let id: String = row.try_get("id")?;
                Ok(SourceListing {
                    source_key: row.try_get("source_key")?,
                    head_revision_id: parse_uuid(&id)?,
                    content_sha256: row.try_get("content_sha256")?,
                    byte_length: row.try_get("byte_length")?,
                    tombstone: row.try_get::<i64, _>("tombstone")? != 0,
                    accepted_at: row.try_get("accepted_at")?,
                    owner: row.try_get("owner")?,
                })
            })
            .collect()
    }

    async fn ping(&self) -> Result<()> {
        sqlx::query("SELECT 1").execute(&self.reads).await?;
        if self.writer.is_closed() {
            return Err(LedgerError::Unavailable(
                "the ledger writer has stopped".to_owned(),
            ));
        }
        Ok(())
    }
}

impl SqliteLedger {
    /// BM25 over the lexical index: of current heads, or at `at` of the revisions held then
    /// (current heads' passages and past passages).
    async fn lexical(
        &self,
        query: &str,
        datasets: &[String],
        limit: u32,
        deadline: Option<std::time::Instant>,
        at: Option<At>,
    ) -> Result<Vec<LexicalHit>> {
        self.lexical_filtered(query, datasets, limit, deadline, at, None)
            .await
    }

    /// The lexical query, with `filter` (when given) inside its ranked candidates: a passage
    /// counts only when its revision matches, before the `LIMIT`.
    async fn lexical_filtered(
        &self,
        query: &str,
        datasets: &[String],
        limit: u32,
        deadline: Option<std::time::Instant>,
        at: Option<At>,
        filter: Option<&Filter>,
    ) -> Result<Vec<LexicalHit>> {
        let Some(fts) = fts_query(query) else {
            return Ok(Vec::new());
        };
        let slow = deadline.is_some() && self.faults.fire(FaultPoint::SlowLexical);
        let sql: std::borrow::Cow<'static, str> = if slow {
            "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < 10000000000) \
             SELECT '' AS dataset, '' AS source_key, '' AS revision_id, 0 AS passage_index, \
             '' AS text, NULL AS section, NULL AS page, 0.0 AS score \
             FROM n WHERE x = -?3 AND ?1 <> ?2"
                .into()
        } else if at.is_some() {
            TEMPORAL_LEXICAL.into()
        } else {
            // Rank first (passage ids and positions only), then read the text of the page:
            // reading every match's bytes before the LIMIT made common-word queries slow.
            "WITH ranked AS ( \
               SELECT p.id, p.dataset, p.source_key, p.revision_id, p.passage_index, \
                 p.byte_start, p.byte_end, p.text, p.section, p.page, \
                 bm25(passages_fts) AS rank \
               FROM passages_fts JOIN passages p ON p.id = passages_fts.rowid \
               WHERE passages_fts MATCH ?1 \
                 AND (json_array_length(?2) = 0 \
                      OR p.dataset IN (SELECT value FROM json_each(?2))) \
               ORDER BY rank LIMIT ?3) \
             SELECT k.dataset, k.source_key, k.revision_id, k.passage_index, \
               coalesce(k.text, CAST(substr(c.bytes, k.byte_start + 1, k.byte_end - k.byte_start) \
                 AS TEXT)) AS text, \
               k.section, k.page, -k.rank AS score \
             FROM ranked k \
             JOIN sources s ON s.dataset = k.dataset AND s.source_key = k.source_key \
                AND s.head_revision_id = k.revision_id \
             JOIN revisions r ON r.id = k.revision_id \
             JOIN contents c ON c.sha256 = r.content_sha256 \
             ORDER BY k.rank"
                .into()
        };
        // The filter's condition goes beside the dataset condition of every corpus (current
        // passages, and at a point in time past ones), numbered after the fixed parameters.
        let compiled = filter.filter(|_| !slow).map(|filter| {
            let first = if at.is_some() { 6 } else { 4 };
            crate::filter::sql::compile(filter, Dialect::Sqlite, "fr", first)
        });
        let sql: std::borrow::Cow<'static, str> = match &compiled {
            None => sql,
            Some(compiled) => {
                let mut text = sql.into_owned();
                for alias in ["p", "pp"] {
                    let anchor =
                        format!("OR {alias}.dataset IN (SELECT value FROM json_each(?2)))");
                    text = text.replace(
                        &anchor,
                        &format!(
                            "{anchor} AND EXISTS (SELECT 1 FROM revisions fr WHERE fr.id = \
                             {alias}.revision_id AND {})",
                            compiled.sql
                        ),
                    );
                }
                text.into()
            }
        };
        let mut params = vec![
            Param::Text(fts),
            Param::Texts(datasets.to_vec()),
            Param::Int(i64::from(limit)),
        ];
        if let (Some(at), false) = (at, slow) {
            params.extend([Param::Int(at.valid_at), Param::Int(at.as_of)]);
        }
        params.extend(compiled.into_iter().flat_map(|compiled| compiled.params));
        let result = fetch_bounded(&self.reads, sql.into_owned(), params, deadline).await?;
        let rows = match result {
            Ok(rows) => rows,
            Err(error)
                if deadline.is_some_and(|deadline| std::time::Instant::now() >= deadline) =>
            {
                return Err(LedgerError::DeadlineExceeded(format!(
                    "lexical search interrupted at its deadline ({error})"
                )))
            }
            Err(error) => return Err(error.into()),
        };
        rows.iter()
            .map(|row| {
                Ok(LexicalHit {
                    dataset: row.try_get("dataset")?,
                    source_key: row.try_get("source_key")?,
                    revision_id: parse_uuid(&row.try_get::<String, _>("revision_id")?)?,
                    passage_index: row.try_get("passage_index")?,
                    text: row.try_get("text")?,
                    section: row.try_get("section")?,
                    page: row.try_get("page")?,
                    score: row.try_get("score")?,
                })
            })
            .collect()
    }

    /// Binds hits to the ledger: `current` is "its source's head" or, at `at`, "held then";
    /// `vector_searchable` is "verified in the generation" or, at `at`, "projected in it"
    /// (its chunk rows are there; the receipts of a revision that is no longer head are
    /// superseded, its points kept).
    async fn bind(
        &self,
        hits: &[HitRef],
        generation: &str,
        at: Option<At>,
    ) -> Result<Vec<BoundHit>> {
        if hits.is_empty() {
            return Ok(Vec::new());
        }
        let asked: Vec<(String, Option<u32>)> = hits
            .iter()
            .map(|hit| (hit.revision_id.to_string(), hit.chunk_index))
            .collect();
        // One row of JSON instead of a row per hit: sqlx hands each row across threads, which
        // cost more than the query itself (1.3 ms against 0.3 ms for 20 hits). `CROSS JOIN`
        // keeps the asked hits as the outer loop (the planner cannot size a `json_each`). Each
        // row names its hit by position in `hits`; the order is restored here, not by a sort
        // in SQL.
        let (current, searchable) = match at {
            None => (
                "coalesce(s.head_revision_id = r.id AND r.tombstone = 0, 0)",
                "EXISTS (SELECT 1 FROM searchable_revisions sr WHERE sr.revision_id = r.id \
                   AND sr.generation = ?2)",
            ),
            Some(_) => (
                "r.tombstone = 0 AND EXISTS (SELECT 1 FROM validity v \
                   WHERE v.revision_id = r.id AND v.valid_from <= ?3 AND ?3 < v.valid_to \
                   AND v.recorded_from <= ?4 AND ?4 < v.recorded_to)",
                "EXISTS (SELECT 1 FROM chunks pc WHERE pc.revision_id = r.id \
                   AND pc.generation = ?2)",
            ),
        };
        let sql = format!(
            "WITH asked AS (SELECT key AS position, value ->> 0 AS revision_id, \
                 value ->> 1 AS chunk_index FROM json_each(?1)) \
             SELECT json_group_array(json_array(a.position, r.dataset, r.source_key, \
               {current}, {searchable}, \
               c.text, c.section, c.page, r.accepted_at, r.actor)) \
             FROM asked a CROSS JOIN revisions r ON r.id = a.revision_id \
             LEFT JOIN sources s ON s.dataset = r.dataset AND s.source_key = r.source_key \
             LEFT JOIN chunks c ON c.revision_id = r.id AND c.generation = ?2 \
               AND c.chunk_index = a.chunk_index"
        );
        let mut statement = sqlx::query_scalar(&sql)
            .bind(json_text(&asked))
            .bind(generation);
        if let Some(at) = at {
            statement = statement.bind(at.valid_at).bind(at.as_of);
        }
        let packed: Option<String> = statement.fetch_one(&self.reads).await?;
        type Packed = (
            usize,
            String,
            String,
            i64,
            i64,
            Option<String>,
            Option<String>,
            Option<i64>,
            i64,
            String,
        );
        let mut rows: Vec<Packed> = serde_json::from_str(packed.as_deref().unwrap_or("[]"))
            .map_err(|error| LedgerError::Corrupt(format!("bound hits: {error}")))?;
        rows.sort_unstable_by_key(|row| row.0);
        rows.into_iter()
            .map(
                |(
                    position,
                    dataset,
                    source_key,
                    current,
                    searchable,
                    text,
                    section,
                    page,
                    accepted_at,
                    actor,
                )| {
                    let hit = *hits.get(position).ok_or_else(|| {
                        LedgerError::Internal(format!("bound hit {position} was not asked"))
                    })?;
                    Ok(BoundHit {
                        hit,
                        dataset,
                        source_key,
                        current: current != 0,
                        vector_searchable: searchable != 0,
                        chunk_text: text,
                        section,
                        page,
                        accepted_at,
                        actor,
                    })
                },
            )
            .collect()
    }
}

/// BM25 at a point in time (`?4` valid, `?5` record time): the passages of current heads and
/// the past passages, each only where its revision's believed rectangle at `?5` holds `?4`
/// (one probe of `validity_by_revision` per match) and it is no tombstone. A revision whose
/// passages are current is ranked from the current index only. FTS5 ranks each index on its
/// own statistics; the two lists are merged by score.
const TEMPORAL_LEXICAL: &str = "WITH ranked AS (SELECT * FROM ( \
       SELECT p.dataset, p.source_key, p.revision_id, p.passage_index, p.byte_start, \
         p.byte_end, p.text, p.section, p.page, bm25(passages_fts) AS rank \
       FROM passages_fts JOIN passages p ON p.id = passages_fts.rowid \
       WHERE passages_fts MATCH ?1 \
         AND (json_array_length(?2) = 0 OR p.dataset IN (SELECT value FROM json_each(?2))) \
         AND EXISTS (SELECT 1 FROM validity v WHERE v.revision_id = p.revision_id \
           AND v.valid_from <= ?4 AND ?4 < v.valid_to \
           AND v.recorded_from <= ?5 AND ?5 < v.recorded_to) \
       UNION ALL \
       SELECT pp.dataset, pp.source_key, pp.revision_id, pp.passage_index, pp.byte_start, \
         pp.byte_end, pp.text, pp.section, pp.page, bm25(past_passages_fts) AS rank \
       FROM past_passages_fts JOIN past_passages pp ON pp.id = past_passages_fts.rowid \
       WHERE past_passages_fts MATCH ?1 \
         AND (json_array_length(?2) = 0 OR pp.dataset IN (SELECT value FROM json_each(?2))) \
         AND EXISTS (SELECT 1 FROM validity v WHERE v.revision_id = pp.revision_id \
           AND v.valid_from <= ?4 AND ?4 < v.valid_to \
           AND v.recorded_from <= ?5 AND ?5 < v.recorded_to) \
         AND NOT EXISTS (SELECT 1 FROM passages c WHERE c.revision_id = pp.revision_id)) \
     ORDER BY rank LIMIT ?3) \
   SELECT k.dataset, k.source_key, k.revision_id, k.passage_index, \
     coalesce(k.text, CAST(substr(c.bytes, k.byte_start + 1, k.byte_end - k.byte_start) \
       AS TEXT)) AS text, \
     k.section, k.page, -k.rank AS score \
   FROM ranked k \
   JOIN revisions r ON r.id = k.revision_id AND r.tombstone = 0 \
   JOIN contents c ON c.sha256 = r.content_sha256 \
   ORDER BY k.rank";

/// Binds `params` in order: lists travel as JSON text.
fn bind_params<'q>(
    mut statement: sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments<'q>>,
    params: &[Param],
) -> sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments<'q>> {
    for param in params {
        statement = match param {
            Param::Text(text) => statement.bind(text.clone()),
            Param::Texts(texts) => statement.bind(json_text(texts)),
            Param::Int(number) => statement.bind(*number),
            Param::Real(number) => statement.bind(*number),
        };
    }
    statement
}

/// Runs a read that stops at `deadline`: the outer error is the pool's or the task's, the
/// inner one the statement's (interrupted when the deadline passed).
///
/// The query runs in a task of its own, so a caller that stops waiting (a client that hung
/// up, a cancelled tool call) cannot leave a connection behind with the progress handler still
/// installed: the task always removes it before the connection goes back to the pool. The
/// handler runs every 1,000 SQLite VM steps and interrupts the query once the deadline passes,
/// or as soon as the caller has gone.
async fn fetch_bounded(
    pool: &sqlx::SqlitePool,
    sql: String,
    params: Vec<Param>,
    deadline: Option<std::time::Instant>,
) -> Result<std::result::Result<Vec<sqlx::sqlite::SqliteRow>, sqlx::Error>> {
    let abandoned = Arc::new(AtomicBool::new(false));
    let _abandon_on_drop = AbandonOnDrop(abandoned.clone());
    let pool = pool.clone();
    let query = async move {
        let mut connection = pool.acquire().await?;
        if let Some(deadline) = deadline {
            connection
                .lock_handle()
                .await?
                .set_progress_handler(1_000, move || {
                    !abandoned.load(Ordering::Relaxed) && std::time::Instant::now() < deadline
                });
        }
        let result = bind_params(sqlx::query(&sql), &params)
            .fetch_all(&mut *connection)
            .await;
        if deadline.is_some() {
            connection.lock_handle().await?.remove_progress_handler();
        }
        Ok::<_, LedgerError>(result)
    };
    tokio::spawn(query)
        .await
        .map_err(|error| LedgerError::Internal(format!("bounded read task: {error}")))?
}

#[cfg(test)]
mod fts_tests {
    use super::fts_query;

    #[test]
    fn queries_quote_words_and_drop_stop_words_unless_nothing_is_left() {
        assert_eq!(
            fts_query("The effect of p53 on \"cells\" AND (x").as_deref(),
            Some("\"effect\" OR \"p53\" OR \"cells\" OR \"x\"")
        );
        assert_eq!(
            fts_query("to be or not").as_deref(),
            Some("\"to\" OR \"be\" OR \"or\" OR \"not\"")
        );
        assert_eq!(fts_query("  ...  "), None);
    }
}
