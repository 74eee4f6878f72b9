//! Reads on the pool: sources, revisions, content, history, counts, the lexical index
//! (`tsvector` under GIN, queried with the query's words joined by OR, ranked by `ts_rank`
//! normalised by passage length) and the binding of search hits to current, searchable
//! revisions.

use async_trait::async_trait;
use sqlx::Row;
use uuid::Uuid;

use super::{history_from_row, job_from_row, revision_from_row, PostgresLedger, REVISION_COLUMNS};
use crate::error::{LedgerError, Result};
use crate::faults::FaultPoint;
use crate::filter::facets::{FacetCounts, FacetField, FacetTally, FacetValue};
use crate::filter::sql::{Dialect, Param};
use crate::filter::{Filter, RevisionFacts};
use crate::ledger::Reader;
use crate::model::{
    BoundHit, ContentBlock, DatasetSummary, HistoryEntry, HitRef, LedgerCounts, LexicalHit,
    RevisionDetail, SourceListing, SourceView,
};
use crate::passages;
use crate::validity::At;

/// The query's stems ([`passages::query_stems`]: stemmed as the index was), or `None` when
/// the query has no words.
fn ts_query(text: &str) -> Option<Vec<String>> {
    let stems = passages::query_stems(text);
    (!stems.is_empty()).then_some(stems)
}

/// SQLSTATE `query_canceled`: a statement ended by `statement_timeout`.
const QUERY_CANCELED: &str = "57014";

#[async_trait]
impl Reader for PostgresLedger {
    async fn source(&self, dataset: &str, source_key: &str) -> Result<Option<SourceView>> {
        let head: Option<Uuid> = sqlx::query_scalar(
            "SELECT head_revision_id FROM sources WHERE dataset = $1 AND source_key = $2",
        )
        .bind(dataset)
        .bind(source_key)
        .fetch_optional(&self.pool)
        .await?;
        let Some(head_id) = head else { return Ok(None) };
        let revisions = sqlx::query(&format!(
            "SELECT {REVISION_COLUMNS} FROM revisions WHERE dataset = $1 AND source_key = $2 \
             ORDER BY accepted_at DESC, id DESC"
        ))
        .bind(dataset)
        .bind(source_key)
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(revision_from_row)
        .collect::<Result<Vec<_>>>()?;
        let head = revisions
            .iter()
            .find(|revision| revision.id == head_id)
            .cloned()
            .ok_or_else(|| LedgerError::Corrupt(format!("head {head_id} missing")))?;
        // Head moves only: a source's history also holds its assertions (validity time).
        let head_history = self
            .history("source", &format!("{dataset}/{source_key}"))
            .await?
            .into_iter()
            .filter(|entry| entry.event == "head_moved")
            .collect();
        Ok(Some(SourceView {
            dataset: dataset.to_owned(),
            source_key: source_key.to_owned(),
            deleted: head.tombstone,
            head,
            revisions,
            head_history,
        }))
    }

    async fn revision(&self, id: Uuid) -> Result<Option<RevisionDetail>> {
        let row = sqlx::query(&format!(
            "SELECT {REVISION_COLUMNS} FROM revisions WHERE id = $1"
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else { return Ok(None) };
        let revision = revision_from_row(&row)?;
        let is_head: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM sources WHERE dataset = $1 AND source_key = $2 \
             AND head_revision_id = $3)",
        )
        .bind(&revision.dataset)
        .bind(&revision.source_key)
        .bind(id)
        .fetch_one(&self.pool)
        .await?;
        // The revision's latest projection job (`project` or `tombstone`) in the active
        // generation (else the latest in any); its `graph` job, when the graph backend is
        // configured, adds its receipt below.
        let job = sqlx::query(
            "SELECT * FROM jobs WHERE revision_id = $1 AND kind <> 'graph' \
             ORDER BY (generation IS NOT DISTINCT FROM \
               (SELECT id FROM generations WHERE state = 'active')) DESC, \
               created_at DESC, id DESC LIMIT 1",
        )
        .bind(id)
        .fetch_optional(&self.pool)
        .await?
        .as_ref()
        .map(job_from_row)
        .transpose()?;
        let mut receipts = match &job {
            Some(job) => self.load_receipts(job.id).await?,
            None => Vec::new(),
        };
        let graph_job: Option<Uuid> = sqlx::query_scalar(
            "SELECT id FROM jobs WHERE revision_id = $1 AND kind = 'graph' \
             ORDER BY created_at DESC, id DESC LIMIT 1",
        )
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        if let Some(graph_job) = graph_job {
            receipts.extend(self.load_receipts(graph_job).await?);
        }
        let history = sqlx::query(
            "SELECT * FROM history WHERE entity = 'source' AND entity_id = $2 \
               AND (to_state = $1::text OR from_state = $1::text) \
             UNION ALL SELECT * FROM history WHERE entity = 'job' \
               AND entity_id IN (SELECT id::text FROM jobs WHERE revision_id = $1) \
             UNION ALL SELECT * FROM history WHERE entity = 'receipt' \
               AND entity_id IN (SELECT r.job_id || '/' || r.backend \
                 FROM projection_receipts r JOIN jobs j ON j.id = r.job_id \
                 WHERE j.revision_id = $1) \
             ORDER BY seq",
        )
        .bind(id)
        .bind(format!("{}/{}", revision.dataset, revision.source_key))
        .fetch_all(&self.pool)
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
        Ok(
            sqlx::query_scalar("SELECT bytes FROM contents WHERE sha256 = $1")
                .bind(sha256)
                .fetch_optional(&self.pool)
                .await?,
        )
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
            Dialect::Postgres,
            "fr",
            if at.is_some() { 5 } else { 3 },
        );
        let sql = match at {
            None => format!(
                "SELECT s.head_revision_id FROM sources s \
                 JOIN revisions fr ON fr.id = s.head_revision_id AND NOT fr.tombstone \
                 WHERE (cardinality($1::text[]) = 0 OR s.dataset = ANY($1)) \
                   AND {} LIMIT $2",
                compiled.sql
            ),
            Some(_) => format!(
                "SELECT DISTINCT v.revision_id FROM validity v \
                 JOIN revisions fr ON fr.id = v.revision_id AND NOT fr.tombstone \
                 WHERE v.valid_from <= $3 AND $3 < v.valid_to \
                   AND v.recorded_from <= $4 AND $4 < v.recorded_to \
                   AND (cardinality($1::text[]) = 0 OR fr.dataset = ANY($1)) \
                   AND {} LIMIT $2",
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
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(|row| Ok(row.try_get::<Uuid, _>(0)?))
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
            Dialect::Postgres,
            datasets,
            filter,
            at,
            field,
            max_values,
        );
        let rows = match self
            .fetch_bounded(&compiled.sql, &compiled.params, deadline)
            .await?
        {
            Ok(rows) => rows,
            Err(sqlx::Error::Database(error))
                if error.code().as_deref() == Some(QUERY_CANCELED) =>
            {
                return Err(LedgerError::DeadlineExceeded(format!(
                    "facet count of {} cancelled by the server at its deadline ({error})",
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
                let rank: i32 = row.try_get("rank")?;
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
        super::access::of(&self.pool, dataset, source_key).await
    }

    async fn named_readers(
        &self,
        dataset: &str,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<(String, Vec<String>)>> {
        // Byte order on both engines, so a cursor pages the same way.
        sqlx::query("SELECT source_key, readers FROM source_access WHERE dataset = $1 AND ($2::text IS NULL OR source_key COLLATE \"C\" > $2::text COLLATE \"C\") ORDER BY source_key COLLATE \"C\" LIMIT $3")
            .bind(dataset)
            .bind(after)
            .bind(i64::from(limit.min(crate::model::MAX_LISTING_PAGE)))
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(|row| {
                let readers: serde_json::Value = row.try_get("readers")?;
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
        let rows = sqlx::query(&format!(
            "SELECT {REVISION_COLUMNS}, {} FROM revisions WHERE id = ANY($1)",
            crate::access::FACT_COLUMNS
        ))
        .bind(revision_ids)
        .fetch_all(&self.pool)
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
                        row.try_get::<Option<serde_json::Value>, _>("named_readers")?,
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
    async fn erasure(&self, revision_id: Uuid) -> Result<Option<crate::model::Erasure>> {
        self.read_erasure(revision_id).await
    }

    async fn content_block(&self, dataset: &str, sha256: &str) -> Result<Option<ContentBlock>> {
        let row = sqlx::query(
            "SELECT dataset, sha256, reason, actor FROM content_blocks \
             WHERE dataset = $1 AND sha256 = $2",
        )
        .bind(dataset)
        .bind(sha256)
        .fetch_optional(&self.pool)
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
        super::validity::timeline(&self.pool, dataset, source_key).await
    }

    async fn held_at(
        &self,
        dataset: &str,
        source_key: &str,
        valid_at: crate::clock::Micros,
        as_of: crate::clock::Micros,
    ) -> Result<Option<crate::validity::Held>> {
        super::validity::held_at(&self.pool, dataset, source_key, valid_at, as_of).await
    }

    async fn history_gaps(
        &self,
        datasets: &[String],
        generation: Option<&str>,
        at: At,
    ) -> Result<crate::validity::HistoryGaps> {
        super::validity::history_gaps(&self.pool, datasets, generation, at).await
    }

    async fn periods(
        &self,
        revisions: &[Uuid],
        at: At,
    ) -> Result<Vec<(Uuid, crate::validity::Period)>> {
        if revisions.is_empty() {
            return Ok(Vec::new());
        }
        let rows = sqlx::query(
            "SELECT v.revision_id, v.valid_from, v.valid_to FROM validity v \
             WHERE v.revision_id = ANY($1) AND v.valid_from <= $2 AND $2 < v.valid_to \
               AND v.recorded_from <= $3 AND $3 < v.recorded_to",
        )
        .bind(revisions)
        .bind(at.valid_at)
        .bind(at.as_of)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok((
                    row.try_get("revision_id")?,
                    crate::validity::Period {
                        from: row.try_get("valid_from")?,
                        to: row.try_get("valid_to")?,
                    },
                ))
            })
            .collect()
    }

    async fn history(&self, entity: &str, entity_id: &str) -> Result<Vec<HistoryEntry>> {
        sqlx::query("SELECT * FROM history WHERE entity = $1 AND entity_id = $2 ORDER BY seq")
            .bind(entity)
            .bind(entity_id)
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(history_from_row)
            .collect()
    }

    async fn counts(&self) -> Result<LedgerCounts> {
        let row = sqlx::query(
            "SELECT (SELECT count(*) FROM sources) AS sources, \
             (SELECT count(*) FROM sources s JOIN revisions r ON r.id = s.head_revision_id \
               WHERE r.tombstone) AS deleted, \
             (SELECT count(*) FROM revisions) AS revisions, \
             (SELECT count(*) FROM contents) AS contents, \
             (SELECT coalesce(sum(byte_length), 0)::bigint FROM contents) AS bytes, \
             (SELECT count(*) FROM history) AS history",
        )
        .fetch_one(&self.pool)
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
            .fetch_all(&self.pool)
            .await?
        {
            counts.jobs.insert(row.try_get("state")?, row.try_get("n")?);
        }
        for row in sqlx::query(
            "SELECT backend || '/' || state AS key, count(*) AS n FROM projection_receipts \
             GROUP BY backend, state",
        )
        .fetch_all(&self.pool)
        .await?
        {
            counts
                .receipts
                .insert(row.try_get("key")?, row.try_get("n")?);
        }
        Ok(counts)
    }

    async fn datasets(&self) -> Result<Vec<DatasetSummary>> {
        let rows = sqlx::query(
            "SELECT s.dataset, count(*) AS sources, count(*) FILTER (WHERE r.tombstone) AS deleted, \
               max(r.accepted_at) AS latest \
             FROM sources s JOIN revisions r ON r.id = s.head_revision_id \
             GROUP BY s.dataset ORDER BY s.dataset",
        )
        .fetch_all(&self.pool)
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
        // Byte order (`COLLATE "C"`), as SQLite's BINARY, so a cursor pages the same way on
        // both engines whatever the database's collation.
        let rows = sqlx::query(
            "SELECT s.source_key, r.id, r.content_sha256, r.byte_length, r.tombstone, \
               r.accepted_at, s.owner \
             FROM sources s JOIN revisions r ON r.id = s.head_revision_id \
             WHERE s.dataset = $1 AND starts_with(s.source_key, $2) \
               AND ($3::text IS NULL OR s.source_key COLLATE \"C\" > $3::text COLLATE \"C\") \
             ORDER BY s.source_key COLLATE \"C\" LIMIT $4",
        )
        .bind(dataset)
        .bind(prefix)
        .bind(after)
        .bind(i64::from(limit.min(crate::model::MAX_LISTING_PAGE)))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(SourceListing {
                    source_key: row.try_get("source_key")?,
                    head_revision_id: row.try_get("id")?,
                    content_sha256: row.try_get("content_sha256")?,
                    byte_length: row.try_get("byte_length")?,
                    tombstone: row.try_get("tombstone")?,
                    accepted_at: row.try_get("accepted_at")?,
                    owner: row.try_get("owner")?,
                })
            })
            .collect()
    }

    async fn ping(&self) -> Result<()> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }
}

impl PostgresLedger {
    /// BM25 over the current heads' passages, or at `at` over the passages of the revisions
    /// held then (current and past ones, one corpus).
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

    /// The lexical query, with `filter` (when given) among the matched passages: a passage
    /// counts only when its revision matches, before ranking and the `LIMIT`.
    async fn lexical_filtered(
        &self,
        query: &str,
        datasets: &[String],
        limit: u32,
        deadline: Option<std::time::Instant>,
        at: Option<At>,
        filter: Option<&Filter>,
    ) -> Result<Vec<LexicalHit>> {
        let Some(words) = ts_query(query) else {
            return Ok(Vec::new());
        };
        let slow = deadline.is_some() && self.faults.fire(FaultPoint::SlowLexical);
        let sql = if slow {
            "SELECT '' AS dataset, '' AS source_key, NULL::uuid AS revision_id, \
               0::bigint AS passage_index, '' AS text, 0::float8 AS score \
             FROM pg_sleep(3600) WHERE $1::text[] IS NOT NULL AND $2::text[] IS NOT NULL AND $3 > 0"
        } else if at.is_some() {
            TEMPORAL_LEXICAL.as_str()
        } else {
            LEXICAL
        };
        // The filter's condition goes beside the dataset condition of the matched passages
        // (in both times, of the one corpus), numbered after the fixed parameters.
        let compiled = filter.filter(|_| !slow).map(|filter| {
            let first = if at.is_some() { 6 } else { 4 };
            crate::filter::sql::compile(filter, Dialect::Postgres, "fr", first)
        });
        let filtered;
        let sql = match &compiled {
            None => sql,
            Some(compiled) => {
                let anchor = "AND (cardinality($2::text[]) = 0 OR p.dataset = ANY($2))";
                filtered = sql.replacen(
                    anchor,
                    &format!(
                        "{anchor} AND EXISTS (SELECT 1 FROM revisions fr WHERE fr.id = \
                         p.revision_id AND {})",
                        compiled.sql
                    ),
                    1,
                );
                filtered.as_str()
            }
        };
        let mut params = vec![
            Param::Texts(words),
            Param::Texts(datasets.to_vec()),
            Param::Int(i64::from(limit)),
        ];
        if let (Some(at), false) = (at, slow) {
            params.extend([Param::Int(at.valid_at), Param::Int(at.as_of)]);
        }
        params.extend(compiled.into_iter().flat_map(|compiled| compiled.params));
        let rows = match self.fetch_bounded(sql, &params, deadline).await? {
            Ok(rows) => rows,
            Err(sqlx::Error::Database(error))
                if error.code().as_deref() == Some(QUERY_CANCELED) =>
            {
                return Err(LedgerError::DeadlineExceeded(format!(
                    "lexical search cancelled by the server at its deadline ({error})"
                )))
            }
            Err(error) => return Err(error.into()),
        };
        rows.iter()
            .map(|row| {
                Ok(LexicalHit {
                    dataset: row.try_get("dataset")?,
                    source_key: row.try_get("source_key")?,
                    revision_id: row.try_get("revision_id")?,
                    passage_index: row.try_get("passage_index")?,
                    text: row.try_get("text")?,
                    section: row.try_get("section")?,
                    page: row.try_get("page")?,
                    score: row.try_get("score")?,
                })
            })
            .collect()
    }

    /// Binds hits, as on SQLite (`sqlite::reads`): `current` is the head, or at `at` "held
    /// then"; `vector_searchable` is "verified in the generation", or at `at` "projected in it".
    async fn bind(
        &self,
        hits: &[HitRef],
        generation: &str,
        at: Option<At>,
    ) -> Result<Vec<BoundHit>> {
        if hits.is_empty() {
            return Ok(Vec::new());
        }
        let revisions: Vec<Uuid> = hits.iter().map(|hit| hit.revision_id).collect();
        let chunks: Vec<Option<i64>> = hits
            .iter()
            .map(|hit| hit.chunk_index.map(i64::from))
            .collect();
        let (current, searchable) = match at {
            None => (
                "coalesce(s.head_revision_id = r.id AND NOT r.tombstone, false)",
                "EXISTS (SELECT 1 FROM searchable_revisions sr WHERE sr.revision_id = r.id \
                   AND sr.generation = $3)",
            ),
            Some(_) => (
                "NOT r.tombstone AND EXISTS (SELECT 1 FROM validity v \
                   WHERE v.revision_id = r.id AND v.valid_from <= $4 AND $4 < v.valid_to \
                   AND v.recorded_from <= $5 AND $5 < v.recorded_to)",
                "EXISTS (SELECT 1 FROM chunks pc WHERE pc.revision_id = r.id \
                   AND pc.generation = $3)",
            ),
        };
        let sql = format!(
            "SELECT a.position, r.dataset, r.source_key, \
               {current} AS current, {searchable} AS searchable, \
               c.text, c.section, c.page, r.accepted_at, r.actor \
             FROM unnest($1::uuid[], $2::bigint[]) WITH ORDINALITY AS a(revision_id, chunk_index, position) \
             JOIN revisions r ON r.id = a.revision_id \
             LEFT JOIN sources s ON s.dataset = r.dataset AND s.source_key = r.source_key \
             LEFT JOIN chunks c ON c.revision_id = r.id AND c.generation = $3 \
               AND c.chunk_index = a.chunk_index \
             ORDER BY a.position"
        );
        let mut statement = sqlx::query(&sql)
            .bind(&revisions)
            .bind(&chunks)
            .bind(generation);
        if let Some(at) = at {
            statement = statement.bind(at.valid_at).bind(at.as_of);
        }
        let rows = statement.fetch_all(&self.pool).await?;
        rows.iter()
            .map(|row| {
                let position: i64 = row.try_get("position")?;
                let hit = *usize::try_from(position - 1)
                    .ok()
                    .and_then(|index| hits.get(index))
                    .ok_or_else(|| {
                        LedgerError::Internal(format!("bound hit {position} was not asked"))
                    })?;
                Ok(BoundHit {
                    hit,
                    dataset: row.try_get("dataset")?,
                    source_key: row.try_get("source_key")?,
                    current: row.try_get("current")?,
                    vector_searchable: row.try_get("searchable")?,
                    chunk_text: row.try_get("text")?,
                    section: row.try_get("section")?,
                    page: row.try_get("page")?,
                    accepted_at: row.try_get("accepted_at")?,
                    actor: row.try_get("actor")?,
                })
            })
            .collect()
    }
}

/// BM25 (k1 = 1.2, b = 0.75) over the current heads' passages, as FTS5 ranks on SQLite: the
/// query's stems, each stem's document frequency counted from the GIN index, the collection
/// size from the planner's statistics (counted when the table was never analysed), term
/// frequencies from the matching passages' `tsvector` positions, and the length normalised by
/// the matching passages' mean length. Rank first (ids and byte ranges), then cut the text of
/// the page only.
const LEXICAL: &str = "WITH terms AS MATERIALIZED ( \
               SELECT DISTINCT t.lexeme, quote_literal(t.lexeme)::tsquery AS query \
               FROM unnest($1::text[]) AS t(lexeme)), \
             everything AS ( \
               SELECT greatest(coalesce((SELECT reltuples FROM pg_class \
                 WHERE oid = 'passages'::regclass AND reltuples > 0), \
                 (SELECT count(*) FROM passages)), 1)::float8 AS n), \
             weights AS MATERIALIZED ( \
               SELECT terms.lexeme, \
                 ln(1 + (greatest(everything.n, df.n) - df.n + 0.5) / (df.n + 0.5)) AS idf \
               FROM terms CROSS JOIN everything CROSS JOIN LATERAL ( \
                 SELECT count(*)::float8 AS n FROM passages p WHERE p.words @@ terms.query) df), \
             matched AS MATERIALIZED ( \
               SELECT p.id, p.dataset, p.source_key, p.revision_id, p.passage_index, \
                 p.byte_start, p.byte_end, p.text, p.section, p.page, p.words, \
                 length(p.words)::float8 AS dl \
               FROM passages p \
               WHERE p.words @@ (SELECT string_agg(quote_literal(lexeme), ' | ')::tsquery FROM terms) \
                 AND (cardinality($2::text[]) = 0 OR p.dataset = ANY($2))), \
             mean AS MATERIALIZED (SELECT greatest(avg(dl), 1) AS dl FROM matched), \
             ranked AS ( \
               SELECT m.dataset, m.source_key, m.revision_id, m.passage_index, m.byte_start, \
                 m.byte_end, m.text, m.section, m.page, \
                 sum(w.idf * (tf.n * 2.2) / (tf.n + 1.2 * (0.25 + 0.75 * m.dl / mean.dl))) AS rank \
               FROM matched m CROSS JOIN mean \
               CROSS JOIN LATERAL ( \
                 SELECT u.lexeme, coalesce(array_length(u.positions, 1), 1)::float8 AS n \
                 FROM unnest(m.words) AS u) tf \
               JOIN weights w ON w.lexeme = tf.lexeme \
               GROUP BY m.id, m.dataset, m.source_key, m.revision_id, m.passage_index, \
                 m.byte_start, m.byte_end, m.text, m.section, m.page \
               ORDER BY rank DESC, m.id LIMIT $3) \
             SELECT k.dataset, k.source_key, k.revision_id, k.passage_index, \
               coalesce(k.text, convert_from(substring(c.bytes FROM k.byte_start::int + 1 \
                 FOR (k.byte_end - k.byte_start)::int), 'UTF8')) AS text, \
               k.section, k.page, k.rank::float8 AS score \
             FROM ranked k \
             JOIN sources s ON s.dataset = k.dataset AND s.source_key = k.source_key \
               AND s.head_revision_id = k.revision_id \
             JOIN revisions r ON r.id = k.revision_id \
             JOIN contents c ON c.sha256 = r.content_sha256 \
             ORDER BY k.rank DESC, k.dataset, k.source_key";

/// [`LEXICAL`] at a point in time (`$4` valid, `$5` record time): one corpus of the current
/// heads' passages and the past passages (a revision whose passages are current counts once),
/// matched only where the revision's believed rectangle at `$5` holds `$4`, and no tombstone.
static TEMPORAL_LEXICAL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let corpus = "(SELECT id, dataset, source_key, revision_id, passage_index, byte_start, \
         byte_end, text, section, page, words FROM passages \
       UNION ALL SELECT -pp.id, pp.dataset, pp.source_key, pp.revision_id, pp.passage_index, \
         pp.byte_start, pp.byte_end, pp.text, pp.section, pp.page, pp.words FROM past_passages pp \
       WHERE NOT EXISTS (SELECT 1 FROM passages c WHERE c.revision_id = pp.revision_id)) p";
    let held = "AND EXISTS (SELECT 1 FROM validity v WHERE v.revision_id = p.revision_id \
         AND v.valid_from <= $4 AND $4 < v.valid_to \
         AND v.recorded_from <= $5 AND $5 < v.recorded_to)";
    LEXICAL
        .replacen(
            "SELECT count(*)::float8 AS n FROM passages p WHERE",
            &format!("SELECT count(*)::float8 AS n FROM {corpus} WHERE"),
            1,
        )
        .replacen(
            "FROM passages p \
               WHERE p.words @@",
            &format!("FROM {corpus} WHERE p.words @@"),
            1,
        )
        .replacen(
            "AND (cardinality($2::text[]) = 0 OR p.dataset = ANY($2))), ",
            &format!("AND (cardinality($2::text[]) = 0 OR p.dataset = ANY($2)) {held}), "),
            1,
        )
        .replacen(
            "JOIN sources s ON s.dataset = k.dataset AND s.source_key = k.source_key \
               AND s.head_revision_id = k.revision_id \
             JOIN revisions r ON r.id = k.revision_id ",
            "JOIN revisions r ON r.id = k.revision_id AND NOT r.tombstone ",
            1,
        )
});

/// Binds `params` in order.
fn bind_params<'q>(
    mut statement: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    params: &[Param],
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    for param in params {
        statement = match param {
            Param::Text(text) => statement.bind(text.clone()),
            Param::Texts(texts) => statement.bind(texts.clone()),
            Param::Int(number) => statement.bind(*number),
            Param::Real(number) => statement.bind(*number),
        };
    }
    statement
}

impl PostgresLedger {
    /// Runs a read that the server cancels at `deadline` (`SET LOCAL statement_timeout`, so
    /// nothing keeps running after the caller gives up): the outer error is the connection's,
    /// the inner one the statement's (`57014` when cancelled).
    async fn fetch_bounded(
        &self,
        sql: &str,
        params: &[Param],
        deadline: Option<std::time::Instant>,
    ) -> Result<std::result::Result<Vec<sqlx::postgres::PgRow>, sqlx::Error>> {
        let mut tx = self.pool.begin().await?;
        if let Some(deadline) = deadline {
            let left = deadline
                .saturating_duration_since(std::time::Instant::now())
                .as_millis()
                .clamp(1, i32::MAX as u128);
            sqlx::query(&format!("SET LOCAL statement_timeout = {left}"))
                .execute(&mut *tx)
                .await?;
        }
        let result = bind_params(sqlx::query(sql), params)
            .fetch_all(&mut *tx)
            .await;
        if result.is_ok() {
            tx.commit().await?;
        }
        Ok(result)
    }
}
