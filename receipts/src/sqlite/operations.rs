//! [`Operations`] on SQLite: read-only queries on the read pool.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::{QueryBuilder, Row, Sqlite};

use super::ledger::SqliteLedger;
use super::rows::job_from_row;
use super::rows::parse_enum;
use super::rows::parse_uuid;
use crate::clock::Micros;
use crate::error::{LedgerError, Result};
use crate::model::JobState;
use crate::operations::{
    Activity, JobEvent, JobFilter, JobOrder, JobPage, LatencySummary, Operations, Pause, MAX_PAGE,
};

/// Appends the filter's conditions (after a `WHERE 1`).
fn push_conditions(query: &mut QueryBuilder<'_, Sqlite>, filter: &JobFilter) {
    if !filter.states.is_empty() {
        // Closed enum values, not input text: inlined so the planner sees the state index.
        let states: Vec<String> = filter
            .states
            .iter()
            .map(|state| format!("'{}'", state.as_str()))
            .collect();
        query.push(format!(" AND state IN ({})", states.join(", ")));
    }
    if let Some(dataset) = &filter.dataset {
        query.push(" AND dataset = ").push_bind(dataset.clone());
    }
    if let Some(allowed) = &filter.allowed_datasets {
        let list = serde_json::Value::from(allowed.clone()).to_string();
        query
            .push(" AND dataset IN (SELECT value FROM json_each(")
            .push_bind(list)
            .push("))");
    }
    if let Some(text) = filter.text.as_ref().filter(|text| !text.is_empty()) {
        query
            .push(" AND (instr(source_key, ")
            .push_bind(text.clone())
            .push(") > 0 OR id = ")
            .push_bind(text.to_ascii_lowercase())
            .push(" OR revision_id = ")
            .push_bind(text.to_ascii_lowercase())
            .push(")");
    }
    if let Some(code) = &filter.error_code {
        query
            .push(" AND last_error_code = ")
            .push_bind(code.clone());
    }
    if let Some(names) = &filter.readable_by {
        query.push(" AND ");
        for piece in
            crate::filter::sql::readable(crate::filter::sql::Dialect::Sqlite, "jobs", names)
        {
            match piece {
                crate::filter::sql::Piece::Sql(text) => {
                    query.push(text);
                }
                crate::filter::sql::Piece::Bind(crate::filter::sql::Param::Text(text)) => {
                    query.push_bind(text);
                }
                crate::filter::sql::Piece::Bind(crate::filter::sql::Param::Texts(texts)) => {
                    // On SQLite a list travels as JSON text.
                    query.push_bind(serde_json::Value::from(texts).to_string());
                }
                crate::filter::sql::Piece::Bind(crate::filter::sql::Param::Int(value)) => {
                    query.push_bind(value);
                }
                crate::filter::sql::Piece::Bind(crate::filter::sql::Param::Real(value)) => {
                    query.push_bind(value);
                }
            }
        }
    }
}

#[async_trait]
impl Operations for SqliteLedger {
    async fn find_jobs(&self, filter: &JobFilter) -> Result<JobPage> {
        let mut count = QueryBuilder::<Sqlite>::new("SELECT count(*) AS n FROM jobs WHERE 1");
        push_conditions(&mut count, filter);
        let total: i64 = count
            .build()
            .fetch_one(self.read_pool())
            .await?
            .try_get("n")?;
        let mut page = QueryBuilder::<Sqlite>::new("SELECT * FROM jobs WHERE 1");
        push_conditions(&mut page, filter);
        page.push(match filter.order {
            JobOrder::RecentlyChanged => " ORDER BY changed_at DESC, id",
            JobOrder::RunAt => " ORDER BY run_at, id",
            JobOrder::LeaseExpiry => " ORDER BY lease_expires_at, id",
        });
        page.push(" LIMIT ")
            .push_bind(i64::from(filter.limit.clamp(1, MAX_PAGE)))
            .push(" OFFSET ")
            .push_bind(i64::from(filter.offset));
        let jobs = page
            .build()
            .fetch_all(self.read_pool())
            .await?
            .iter()
            .map(job_from_row)
            .collect::<Result<Vec<_>>>()?;
        Ok(JobPage { total, jobs })
    }

    async fn activity(&self, window: Duration) -> Result<Activity> {
        let now = self.clock().now_micros();
        let mut window = crate::operations::MinuteWindow::new(now, window);
        let (first, last, since) = (window.first, window.last, window.since);
        let pool = self.read_pool();

        let rows = sqlx::query(
            "SELECT minute, claimed, completed, retried, failed, queued_delta FROM job_minutes \
             WHERE minute BETWEEN ?1 AND ?2",
        )
        .bind(first)
        .bind(last)
        .fetch_all(pool)
        .await?;
        for row in rows {
            window.add(
                row.try_get("minute")?,
                [
                    row.try_get("claimed")?,
                    row.try_get("completed")?,
                    row.try_get("retried")?,
                    row.try_get("failed")?,
                    row.try_get("queued_delta")?,
                ],
            );
        }

        let row = sqlx::query(
            "SELECT \
               (SELECT count(*) FROM jobs WHERE state IN ('pending', 'retry_wait')) AS queued, \
               (SELECT count(*) FROM jobs WHERE state IN ('pending', 'retry_wait') AND run_at <= ?1) AS due, \
               (SELECT count(*) FROM jobs WHERE state = 'running') AS running, \
               (SELECT ?1 - min(started_at) FROM jobs WHERE state = 'running') AS oldest_lease, \
               (SELECT ?1 - min(heartbeat_at) FROM jobs WHERE state = 'running') AS max_heartbeat",
        )
        .bind(now)
        .fetch_one(pool)
        .await?;
        let queue_depth: i64 = row.try_get("queued")?;
        let buckets = window.finish(queue_depth);

        let latencies = |sql: &'static str| async move {
            let packed: Option<String> =
                sqlx::query_scalar(sql).bind(since).fetch_one(pool).await?;
            let values: Vec<Micros> = serde_json::from_str(packed.as_deref().unwrap_or("[]"))
                .map_err(|error| LedgerError::Corrupt(format!("latencies: {error}")))?;
            Ok::<_, LedgerError>(LatencySummary::of(values))
        };
        // Both read the jobs table through indexes on the window's time column, so their cost
        // follows the jobs of the window, not the history's length.
        let enqueue_to_start = latencies(
            "SELECT json_group_array(first_started_at - created_at) \
             FROM jobs INDEXED BY jobs_by_first_start WHERE first_started_at >= ?1",
        )
        .await?;
        let accepted_to_searchable = latencies(
            "SELECT json_group_array(changed_at - created_at) \
             FROM jobs INDEXED BY jobs_completed \
             WHERE state = 'completed' AND kind = 'project' AND changed_at >= ?1",
        )
        .await?;

        let pauses = sqlx::query(
            "SELECT dataset, reason, actor, created_at FROM claim_pauses ORDER BY dataset",
        )
        .fetch_all(pool)
        .await?
        .iter()
        .map(|row| {
            let dataset: String = row.try_get("dataset")?;
            Ok(Pause {
                dataset: (dataset != "*").then_some(dataset),
                reason: row.try_get("reason")?,
                actor: row.try_get("actor")?,
                since: row.try_get("created_at")?,
            })
        })
        .collect::<Result<Vec<_>>>()?;

        Ok(Activity {
            now,
            since,
            minutes: buckets,
            queue_depth,
            due: row.try_get("due")?,
            running: row.try_get("running")?,
            oldest_lease_age_micros: row.try_get("oldest_lease")?,
            max_heartbeat_age_micros: row.try_get("max_heartbeat")?,
            enqueue_to_start,
            accepted_to_searchable,
            pauses,
        })
    }

    async fn job_events(&self, after_seq: i64, limit: u32) -> Result<Vec<JobEvent>> {
        sqlx::query(
            "SELECT h.seq, h.at, h.entity_id, h.from_state, h.to_state, h.actor, h.error_code, \
               h.stage, j.dataset, j.kind, j.created_at, \
               (h.to_state = 'running' AND h.at = j.first_started_at) AS first_claim \
             FROM history AS h NOT INDEXED JOIN jobs AS j ON j.id = h.entity_id \
             WHERE h.seq > ?1 AND h.entity = 'job' ORDER BY h.seq LIMIT ?2",
        )
        .bind(after_seq)
        .bind(i64::from(limit.max(1)))
        .fetch_all(self.read_pool())
        .await?
        .iter()
        .map(|row| {
            let from: Option<String> = row.try_get("from_state")?;
            Ok(JobEvent {
                seq: row.try_get("seq")?,
                at: row.try_get("at")?,
                job_id: parse_uuid(&row.try_get::<String, _>("entity_id")?)?,
                dataset: row.try_get("dataset")?,
                kind: parse_enum(&row.try_get::<String, _>("kind")?)?,
                from: from.as_deref().map(parse_enum::<JobState>).transpose()?,
                to: parse_enum(&row.try_get::<String, _>("to_state")?)?,
                actor: row.try_get("actor")?,
                error_code: row.try_get("error_code")?,
                stage: row.try_get("stage")?,
                first_claim: row.try_get::<i64, _>("first_claim")? == 1,
                job_created_at: row.try_get("created_at")?,
            })
        })
        .collect()
    }

    fn clock_now(&self) -> Micros {
        self.clock().now_micros()
    }

    async fn last_history_seq(&self) -> Result<i64> {
        Ok(
            sqlx::query_scalar("SELECT coalesce(max(seq), 0) FROM history")
                .fetch_one(self.read_pool())
                .await?,
        )
    }
}
