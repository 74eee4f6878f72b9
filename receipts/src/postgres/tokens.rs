//! Tokens on PostgreSQL: creation, revocation and rotation in one transaction each (history by
//! the `token_history` trigger, with the actor and reason carried on the row), listing and
//! authentication (one indexed lookup, no cache). The secret is returned once and stored only
//! as its SHA-256.

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

const COLUMNS: &str = "id, name, scopes, datasets, created_by, created_at, expires_at, \
                       revoked_at, revoked_by, replaced_by";

async fn create(
    connection: &mut PgConnection,
    token: &NewToken,
    now: Micros,
) -> Result<TokenChanged> {
    let id = ids::new_v7();
    let secret = generate_secret();
    sqlx::query(
        "INSERT INTO tokens (id, name, sha256, scopes, datasets, created_by, created_at, \
         expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
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
        state,
    })
}

#[async_trait]
impl Tokens for PostgresLedger {
    async fn change_token(&self, change: TokenChange) -> Result<TokenChanged> {
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
        Ok(changed)
    }

    async fn authenticate(&self, secret: &str) -> Result<Option<Principal>> {
        // One round trip on every request: the clock is read in the query itself.
        let row = sqlx::query(
            "SELECT id, name, scopes, datasets FROM tokens WHERE sha256 = $1 \
             AND revoked_at IS NULL \
             AND (expires_at IS NULL OR expires_at > COALESCE($2, cairn_db_now()))",
        )
        .bind(secret_hash(secret))
        .bind(self.injected_now())
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else { return Ok(None) };
        Ok(Some(Principal {
            token_id: row.try_get("id")?,
            name: row.try_get("name")?,
            scopes: json(row.try_get("scopes")?)?,
            datasets: row
                .try_get::<Option<serde_json::Value>, _>("datasets")?
                .map(json)
                .transpose()?,
        }))
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
