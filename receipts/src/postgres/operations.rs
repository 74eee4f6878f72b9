//! [`Operations`] on PostgreSQL: read-only queries on the pool, with the definitions of
//! [`crate::operations`].

use std::time::Duration;

use async_trait::async_trait;
use sqlx::{Postgres, QueryBuilder, Row};

use super::{job_from_row, parse_enum, LedgerClock, PostgresLedger};
use crate::clock::Micros;
use crate::error::Result;
use crate::model::JobState;
use crate::operations::{
    Activity, JobEvent, JobFilter, JobOrder, JobPage, LatencySummary, Operations, Pause, MAX_PAGE,
};

/// Appends the filter's conditions (after a `WHERE true`).
fn push_conditions(query: &mut QueryBuilder<'_, Postgres>, filter: &JobFilter) {
    if !filter.states.is_empty() {
        let states: Vec<String> = filter
            .states
            .iter()
            .map(|state| state.as_str().to_owned())
            .collect();
        query.push(" AND state = ANY(").push_bind(states).push(")");
    }
    if let Some(dataset) = &filter.dataset {
        query.push(" AND dataset = ").push_bind(dataset.clone());
    }
    if let Some(allowed) = &filter.allowed_datasets {
        query
            .push(" AND dataset = ANY(")
            .push_bind(allowed.clone())
            .push(")");
    }
    if let Some(text) = filter.text.as_ref().filter(|text| !text.is_empty()) {
        query
            .push(" AND (strpos(source_key, ")
            .push_bind(text.clone())
            .push(") > 0 OR id::text = ")
            .push_bind(text.to_ascii_lowercase())
            .push(" OR revision_id::text = ")
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
            crate::filter::sql::readable(crate::filter::sql::Dialect::Postgres, "jobs", names)
        {
            match piece {
                crate::filter::sql::Piece::Sql(text) => {
                    query.push(text);
                }
                crate::filter::sql::Piece::Bind(crate::filter::sql::Param::Text(text)) => {
                    query.push_bind(text);
                }
                crate::filter::sql::Piece::Bind(crate::filter::sql::Param::Texts(texts)) => {
                    query.push_bind(texts);
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
impl Operations for PostgresLedger {
    async fn find_jobs(&self, filter: &JobFilter) -> Result<JobPage> {
        let mut count = QueryBuilder::<Postgres>::new("SELECT count(*) AS n FROM jobs WHERE true");
        push_conditions(&mut count, filter);
        let total: i64 = count.build().fetch_one(&self.pool).await?.try_get("n")?;
        let mut page = QueryBuilder::<Postgres>::new("SELECT * FROM jobs WHERE true");
        push_conditions(&mut page, filter);
        page.push(match filter.order {
            JobOrder::RecentlyChanged => " ORDER BY changed_at DESC, id",
            JobOrder::RunAt => " ORDER BY run_at, id",
            JobOrder::LeaseExpiry => " ORDER BY lease_expires_at NULLS FIRST, id",
        });
        page.push(" LIMIT ")
            .push_bind(i64::from(filter.limit.clamp(1, MAX_PAGE)))
            .push(" OFFSET ")
            .push_bind(i64::from(filter.offset));
        let jobs = page
            .build()
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(job_from_row)
            .collect::<Result<Vec<_>>>()?;
        Ok(JobPage { total, jobs })
    }

    async fn activity(&self, window: Duration) -> Result<Activity> {
        let now = self.read_now().await?;
        let mut window = crate::operations::MinuteWindow::new(now, window);
        let (first, last, since) = (window.first, window.last, window.since);
        let pool = &self.pool;

        let rows = sqlx::query(
            "SELECT minute, sum(claimed)::bigint AS claimed, sum(completed)::bigint AS completed, \
               sum(retried)::bigint AS retried, sum(failed)::bigint AS failed, \
               sum(queued_delta)::bigint AS queued_delta \
             FROM job_minutes WHERE minute BETWEEN $1 AND $2 GROUP BY minute",
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
               (SELECT count(*) FROM jobs WHERE state IN ('pending', 'retry_wait') \
                  AND run_at <= $1) AS due, \
               (SELECT count(*) FROM jobs WHERE state = 'running') AS running, \
               (SELECT $1 - min(started_at) FROM jobs WHERE state = 'running') AS oldest_lease, \
               (SELECT $1 - min(heartbeat_at) FROM jobs WHERE state = 'running') AS max_heartbeat",
        )
        .bind(now)
        .fetch_one(pool)
        .await?;
        let queue_depth: i64 = row.try_get("queued")?;
        let buckets = window.finish(queue_depth);

        // Both latencies come from the window's job history (found through the BRIN index
        // on `history.at`), so that claims and completions write no index entries for the
        // dashboard: the first claim of each job that started in the window, and the
        // completion of each project job completed in it.
        let latencies = sqlx::query(
            "WITH events AS MATERIALIZED ( \
               SELECT h.entity_id, h.to_state, h.at FROM history h \
               WHERE h.at >= $1 AND h.entity = 'job' AND h.event = 'state' \
                 AND h.to_state IN ('running', 'completed')) \
             SELECT e.to_state = 'running' AS started, e.at - j.created_at AS micros \
             FROM events e JOIN jobs j ON j.id = e.entity_id::uuid \
             WHERE (e.to_state = 'running' AND j.first_started_at = e.at) \
                OR (e.to_state = 'completed' AND j.kind = 'project' AND j.state = 'completed')",
        )
        .bind(since)
        .fetch_all(pool)
        .await?;
        let (mut enqueue_to_start, mut accepted_to_searchable) = (Vec::new(), Vec::new());
        for row in &latencies {
            let micros: Micros = row.try_get("micros")?;
            if row.try_get("started")? {
                enqueue_to_start.push(micros);
            } else {
                accepted_to_searchable.push(micros);
            }
        }

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
            enqueue_to_start: LatencySummary::of(enqueue_to_start),
            accepted_to_searchable: LatencySummary::of(accepted_to_searchable),
            pauses,
        })
    }

    async fn job_events(&self, after_seq: i64, limit: u32) -> Result<Vec<JobEvent>> {
        sqlx::query(
            "SELECT h.seq, h.at, j.id, h.from_state, h.to_state, h.actor, h.error_code, \
               h.stage, j.dataset, j.kind, j.created_at, \
               (h.to_state = 'running' AND h.at = j.first_started_at) AS first_claim \
             FROM history h JOIN jobs j ON j.id::text = h.entity_id \
             WHERE h.seq > $1 AND h.entity = 'job' AND h.event = 'state' \
             ORDER BY h.seq LIMIT $2",
        )
        .bind(after_seq)
        .bind(i64::from(limit.max(1)))
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(|row| {
            let from: Option<String> = row.try_get("from_state")?;
            Ok(JobEvent {
                seq: row.try_get("seq")?,
                at: row.try_get("at")?,
                job_id: row.try_get("id")?,
                dataset: row.try_get("dataset")?,
                kind: parse_enum(&row.try_get::<String, _>("kind")?)?,
                from: from.as_deref().map(parse_enum::<JobState>).transpose()?,
                to: parse_enum(&row.try_get::<String, _>("to_state")?)?,
                actor: row.try_get("actor")?,
                error_code: row.try_get("error_code")?,
                stage: row.try_get("stage")?,
                first_claim: row.try_get::<Option<bool>, _>("first_claim")? == Some(true),
                job_created_at: row.try_get("created_at")?,
            })
        })
        .collect()
    }

    fn clock_now(&self) -> Micros {
        match &self.clock {
            LedgerClock::Injected(clock) => clock.now_micros(),
            // The local clock: only used to label reads (the database's clock fences writes).
            LedgerClock::Database => crate::clock::Clock::now_micros(&crate::clock::SystemClock),
        }
    }

    async fn last_history_seq(&self) -> Result<i64> {
        Ok(
            sqlx::query_scalar("SELECT coalesce(max(seq), 0) FROM history")
                .fetch_one(&self.pool)
                .await?,
        )
    }
}
