//! Tokens on PostgreSQL: creation, revocation and rotation in one transaction each (history by
//! the `token_history` trigger, with the actor and reason carried on the row), listing and
//! authentication. The secret is returned once and stored only as its SHA-256.
//!
//! Authentication is an indexed lookup whose positive answers are kept for a moment
//! ([`TokenCache`]): a lookup on every request was a round trip and a pooled connection per
//! request, which 16 clients' single-document acceptances paid beside their group's
//! transaction. A change of `tokens` by anyone (this process, another one, psql) clears every
//! process's cache: this process's own changes clear it when they commit, and the
//! `tokens_changed` trigger (migration 12) notifies `cairn_tokens`, which every process
//! listens on (`postgres::listen`, which also clears the cache whenever its connection was
//! lost, since notifications may have been missed). An answer is kept at most
//! [`PostgresOptions::token_cache`](super::PostgresOptions) (1 s by default) in any case, and
//! never past the token's expiry by the ledger's clock.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Row};
use uuid::Uuid;

use super::PostgresLedger;
use crate::auth::{
    self, generate_secret, secret_hash, NewToken, Principal, Scope, TokenChange, TokenChanged,
    TokenInfo, TokenState,
};
use crate::clock::Micros;
use crate::error::{LedgerError, Result};
use crate::ids;
use crate::ledger::Tokens;

/// Recently authenticated secrets (by their SHA-256) and their principals, shared by the
/// clones of a ledger. Only positive answers are kept: an unknown secret is looked up every
/// time, as before.
#[derive(Debug, Default)]
pub(super) struct TokenCache {
    entries: std::sync::Mutex<HashMap<String, Cached>>,
    /// Bumped by every clearing: a lookup that began before one does not keep its answer.
    generation: AtomicU64,
}

#[derive(Debug)]
struct Cached {
    principal: Principal,
    expires_at: Option<Micros>,
    fetched: Instant,
}

/// Most secrets kept; the cache is emptied when it is full.
const CACHED_SECRETS: usize = 4096;

impl TokenCache {
    /// Forgets every kept answer.
    pub(super) fn clear(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        if let Ok(mut entries) = self.entries.lock() {
            entries.clear();
        }
    }

    fn get(&self, hash: &str, now: Micros, max_age: Duration) -> Option<Principal> {
        let entries = self.entries.lock().ok()?;
        let cached = entries.get(hash)?;
        let fresh = cached.fetched.elapsed() < max_age
            && cached.expires_at.is_none_or(|expires_at| expires_at > now);
        fresh.then(|| cached.principal.clone())
    }

    fn keep(&self, hash: String, cached: Cached, generation: u64) {
        let Ok(mut entries) = self.entries.lock() else {
            return;
        };
        // Checked under the lock that `clear` takes after bumping the generation: an answer
        // read before a clearing is either cleared with the rest or not kept at all.
        if self.generation.load(Ordering::Acquire) != generation {
            return;
        }
        if entries.len() >= CACHED_SECRETS {
            entries.clear();
        }
        entries.insert(hash, cached);
    }
}

const COLUMNS: &str = "id, name, scopes, datasets, created_by, created_at, expires_at, \
                       revoked_at, revoked_by, replaced_by, principal, groups";

async fn create(
    connection: &mut PgConnection,
    token: &NewToken,
    now: Micros,
) -> Result<TokenChanged> {
    let id = ids::new_v7();
    let secret = generate_secret();
    sqlx::query(
        "INSERT INTO tokens (id, name, sha256, scopes, datasets, created_by, created_at, \
         expires_at, principal, groups) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
    )
    .bind(id)
    .bind(&token.name)
    .bind(secret_hash(&secret))
    .bind(serde_json::json!(token.scopes))
    .bind(
        token
            .datasets
            .as_ref()
            .map(|datasets| serde_json::json!(datasets)),
    )
    .bind(&token.created_by)
    .bind(now)
    .bind(token.expires_at)
    .bind(
        token
            .identity
            .as_ref()
            .map(|identity| identity.principal.clone()),
    )
    .bind(
        token
            .identity
            .as_ref()
            .map(|identity| serde_json::json!(identity.groups)),
    )
    .execute(&mut *connection)
    .await?;
    let info = fetch(connection, id, now)
        .await?
        .ok_or_else(|| LedgerError::Internal(format!("token {id} vanished after its insert")))?;
    Ok(TokenChanged {
        token: info,
        secret: Some(secret),
    })
}

async fn revoke(
    connection: &mut PgConnection,
    id: Uuid,
    actor: &str,
    reason: Option<&str>,
    replaced_by: Option<Uuid>,
    now: Micros,
) -> Result<()> {
    let done = sqlx::query(
        "UPDATE tokens SET revoked_at = $1, revoked_by = $2, revoke_reason = $3, replaced_by = $4 \
         WHERE id = $5 AND revoked_at IS NULL",
    )
    .bind(now)
    .bind(actor)
    .bind(reason.unwrap_or(if replaced_by.is_some() {
        "rotated"
    } else {
        "revoked"
    }))
    .bind(replaced_by)
    .bind(id)
    .execute(&mut *connection)
    .await?;
    if done.rows_affected() == 1 {
        return Ok(());
    }
    let exists: Option<i32> = sqlx::query_scalar("SELECT 1 FROM tokens WHERE id = $1")
        .bind(id)
        .fetch_optional(&mut *connection)
        .await?;
    Err(match exists {
        Some(_) => LedgerError::TokenRevoked(id),
        None => LedgerError::TokenNotFound(id),
    })
}

async fn fetch(connection: &mut PgConnection, id: Uuid, now: Micros) -> Result<Option<TokenInfo>> {
    let row = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM tokens WHERE id = $1 FOR UPDATE"
    ))
    .bind(id)
    .fetch_optional(&mut *connection)
    .await?;
    row.map(|row| info(&row, now)).transpose()
}

fn json<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> Result<T> {
    serde_json::from_value(value).map_err(|error| LedgerError::Corrupt(error.to_string()))
}

fn info(row: &PgRow, now: Micros) -> Result<TokenInfo> {
    let expires_at: Option<Micros> = row.try_get("expires_at")?;
    let revoked_at: Option<Micros> = row.try_get("revoked_at")?;
    let state = if revoked_at.is_some() {
        TokenState::Revoked
    } else if expires_at.is_some_and(|at| at <= now) {
        TokenState::Expired
    } else {
        TokenState::Active
    };
    Ok(TokenInfo {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        scopes: json::<Vec<Scope>>(row.try_get("scopes")?)?,
        datasets: row
            .try_get::<Option<serde_json::Value>, _>("datasets")?
            .map(json)
            .transpose()?,
        created_by: row.try_get("created_by")?,
        created_at: row.try_get("created_at")?,
        expires_at,
        revoked_at,
        revoked_by: row.try_get("revoked_by")?,
        replaced_by: row.try_get("replaced_by")?,
        identity: identity(row)?,
        state,
    })
}

/// The identity stored with a token, if it has one.
fn identity(row: &PgRow) -> Result<Option<crate::access::Identity>> {
    let Some(principal) = row.try_get::<Option<String>, _>("principal")? else {
        return Ok(None);
    };
    let groups = row
        .try_get::<Option<serde_json::Value>, _>("groups")?
        .map(json::<Vec<String>>)
        .transpose()?
        .unwrap_or_default();
    Ok(Some(crate::access::Identity { principal, groups }))
}

#[async_trait]
impl Tokens for PostgresLedger {
    async fn change_token(&self, change: TokenChange) -> Result<TokenChanged> {
        self.journal(|now| crate::journal::JournalEntry::token(&change, now))
            .await?;
        let mut tx = self.pool.begin().await?;
        let now = self.now(&mut tx).await?;
        let changed = match change {
            TokenChange::Create(token) => {
                auth::check_new(&token, now)?;
                create(&mut tx, &token, now).await?
            }
            TokenChange::Revoke { id, actor, reason } => {
                revoke(&mut tx, id, &actor, reason.as_deref(), None, now).await?;
                let token = fetch(&mut tx, id, now)
                    .await?
                    .ok_or(LedgerError::TokenNotFound(id))?;
                TokenChanged {
                    token,
                    secret: None,
                }
            }
            TokenChange::Rotate {
                id,
                actor,
                reason,
                expires_at,
            } => {
                let old = fetch(&mut tx, id, now)
                    .await?
                    .ok_or(LedgerError::TokenNotFound(id))?;
                if old.state == TokenState::Revoked {
                    return Err(LedgerError::TokenRevoked(id));
                }
                let expires_at = auth::rotated_expiry(&old, expires_at, now);
                auth::check_expiry(expires_at, now)?;
                let new = NewToken {
                    name: old.name.clone(),
                    scopes: old.scopes.clone(),
                    datasets: old.datasets.clone(),
                    identity: old.identity.clone(),
                    created_by: actor.clone(),
                    expires_at,
                };
                let created = create(&mut tx, &new, now).await?;
                revoke(
                    &mut tx,
                    id,
                    &actor,
                    reason.as_deref(),
                    Some(created.token.id),
                    now,
                )
                .await?;
                created
            }
        };
        tx.commit().await?;
        // Other processes clear theirs on the trigger's notification.
        self.token_cache.clear();
        Ok(changed)
    }

    async fn authenticate(&self, secret: &str) -> Result<Option<Principal>> {
        let hash = secret_hash(secret);
        let max_age = self.options.token_cache;
        let now = crate::operations::Operations::clock_now(self);
        if let Some(principal) = self.token_cache.get(&hash, now, max_age) {
            return Ok(Some(principal));
        }
        let generation = self.token_cache.generation.load(Ordering::Acquire);
        let fetched = Instant::now();
        // The clock is read in the query itself.
        let row = sqlx::query(
            "SELECT id, name, scopes, datasets, expires_at, principal, groups FROM tokens \
             WHERE sha256 = $1 \
             AND revoked_at IS NULL \
             AND (expires_at IS NULL OR expires_at > COALESCE($2, cairn_db_now()))",
        )
        .bind(&hash)
        .bind(self.injected_now())
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else { return Ok(None) };
        let principal = Principal {
            token_id: row.try_get("id")?,
            name: row.try_get("name")?,
            scopes: json(row.try_get("scopes")?)?,
            datasets: row
                .try_get::<Option<serde_json::Value>, _>("datasets")?
                .map(json)
                .transpose()?,
            identity: identity(&row)?,
        };
        if !max_age.is_zero() {
            let cached = Cached {
                principal: principal.clone(),
                expires_at: row.try_get("expires_at")?,
                fetched,
            };
            self.token_cache.keep(hash, cached, generation);
        }
        Ok(Some(principal))
    }

    async fn token_count(&self) -> Result<i64> {
        let now = self.read_now().await?;
        Ok(sqlx::query_scalar(
            "SELECT count(*) FROM tokens WHERE revoked_at IS NULL \
             AND (expires_at IS NULL OR expires_at > $1)",
        )
        .bind(now)
        .fetch_one(&self.pool)
        .await?)
    }

    async fn tokens(&self) -> Result<Vec<TokenInfo>> {
        let now = self.read_now().await?;
        sqlx::query(&format!(
            "SELECT {COLUMNS} FROM tokens ORDER BY created_at DESC, id DESC"
        ))
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(|row| info(row, now))
        .collect()
    }
}
