//! Tokens in the SQLite ledger: creation, revocation and rotation (run by the writer task,
//! inside its transaction), listing and authentication (read connections).
//!
//! Every change is one UPDATE or INSERT whose history row is written by a trigger
//! (`token_created`, `token_revoked`) with the actor and reason carried on the row. The secret
//! is generated here, returned once and stored only as its SHA-256.

use sqlx::sqlite::{SqliteConnection, SqliteRow};
use sqlx::{Row, SqlitePool};
use uuid::Uuid;

use super::rows::json_text;
use super::rows::parse_uuid;
use crate::auth::{
    self, generate_secret, secret_hash, NewToken, Principal, Scope, TokenChange, TokenChanged,
    TokenInfo, TokenState,
};
use crate::clock::Micros;
use crate::error::{LedgerError, Result};
use crate::ids;

const COLUMNS: &str = "id, name, scopes, datasets, created_by, created_at, expires_at, \
                       revoked_at, revoked_by, replaced_by, principal, groups";

/// Applies one change (inside the writer's transaction).
pub(crate) async fn change(
    connection: &mut SqliteConnection,
    change: TokenChange,
    now: Micros,
) -> Result<TokenChanged> {
    match change {
        TokenChange::Create(token) => {
            auth::check_new(&token, now)?;
            create(connection, &token, now).await
        }
        TokenChange::Revoke { id, actor, reason } => {
            revoke(connection, id, &actor, reason.as_deref(), None, now).await?;
            let token = fetch(connection, id, now)
                .await?
                .ok_or(LedgerError::TokenNotFound(id))?;
            Ok(TokenChanged {
                token,
                secret: None,
            })
        }
        TokenChange::Rotate {
            id,
            actor,
            reason,
            expires_at,
        } => {
            let old = fetch(connection, id, now)
                .await?
                .ok_or(LedgerError::TokenNotFound(id))?;
            if old.state == TokenState::Revoked {
                return Err(LedgerError::TokenRevoked(id));
            }
            let expires_at = auth::rotated_expiry(&old, expires_at, now);
            auth::check_expiry(expires_at, now)?;
            let created = create(
                connection,
                &NewToken {
                    name: old.name.clone(),
                    scopes: old.scopes.clone(),
                    datasets: old.datasets.clone(),
                    identity: old.identity.clone(),
                    created_by: actor.clone(),
                    expires_at,
                },
                now,
            )
            .await?;
            revoke(
                connection,
                id,
                &actor,
                reason.as_deref(),
                Some(created.token.id),
                now,
            )
            .await?;
            Ok(created)
        }
    }
}

async fn create(
    connection: &mut SqliteConnection,
    token: &NewToken,
    now: Micros,
) -> Result<TokenChanged> {
    let id = ids::new_v7();
    let secret = generate_secret();
    sqlx::query(
        "INSERT INTO tokens (id, name, sha256, scopes, datasets, created_by, created_at, \
         expires_at, principal, groups) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(id.to_string())
    .bind(&token.name)
    .bind(secret_hash(&secret))
    .bind(json_text(&token.scopes))
    .bind(token.datasets.as_ref().map(json_text))
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
            .map(|identity| json_text(&identity.groups)),
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
    connection: &mut SqliteConnection,
    id: Uuid,
    actor: &str,
    reason: Option<&str>,
    replaced_by: Option<Uuid>,
    now: Micros,
) -> Result<()> {
    let done = sqlx::query(
        "UPDATE tokens SET revoked_at = ?, revoked_by = ?, revoke_reason = ?, replaced_by = ? \
         WHERE id = ? AND revoked_at IS NULL",
    )
    .bind(now)
    .bind(actor)
    .bind(reason.unwrap_or(if replaced_by.is_some() {
        "rotated"
    } else {
        "revoked"
    }))
    .bind(replaced_by.map(|id| id.to_string()))
    .bind(id.to_string())
    .execute(&mut *connection)
    .await?;
    if done.rows_affected() == 1 {
        return Ok(());
    }
    let exists: Option<i64> = sqlx::query_scalar("SELECT 1 FROM tokens WHERE id = ?")
        .bind(id.to_string())
        .fetch_optional(&mut *connection)
        .await?;
    Err(match exists {
        Some(_) => LedgerError::TokenRevoked(id),
        None => LedgerError::TokenNotFound(id),
    })
}

async fn fetch(
    connection: &mut SqliteConnection,
    id: Uuid,
    now: Micros,
) -> Result<Option<TokenInfo>> {
    let row = sqlx::query(&format!("SELECT {COLUMNS} FROM tokens WHERE id = ?"))
        .bind(id.to_string())
        .fetch_optional(&mut *connection)
        .await?;
    row.map(|row| info(&row, now)).transpose()
}

/// Every token, newest first.
pub(crate) async fn list(reads: &SqlitePool, now: Micros) -> Result<Vec<TokenInfo>> {
    let rows = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM tokens ORDER BY created_at DESC, id DESC"
    ))
    .fetch_all(reads)
    .await?;
    rows.iter().map(|row| info(row, now)).collect()
}

/// The principal of a secret that is neither revoked nor expired. One indexed lookup per call,
/// and no cache: a revocation takes effect at the next request, in every process.
pub(crate) async fn authenticate(
    reads: &SqlitePool,
    secret: &str,
    now: Micros,
) -> Result<Option<Principal>> {
    let row = sqlx::query(
        "SELECT id, name, scopes, datasets, principal, groups FROM tokens WHERE sha256 = ? \
         AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > ?)",
    )
    .bind(secret_hash(secret))
    .bind(now)
    .fetch_optional(reads)
    .await?;
    let Some(row) = row else { return Ok(None) };
    Ok(Some(Principal {
        token_id: parse_uuid(&row.try_get::<String, _>("id")?)?,
        name: row.try_get("name")?,
        scopes: json(&row.try_get::<String, _>("scopes")?)?,
        datasets: row
            .try_get::<Option<String>, _>("datasets")?
            .map(|text| json(&text))
            .transpose()?,
        identity: identity(&row)?,
    }))
}

/// Tokens that authenticate now.
pub(crate) async fn active_count(reads: &SqlitePool, now: Micros) -> Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM tokens WHERE revoked_at IS NULL \
         AND (expires_at IS NULL OR expires_at > ?)",
    )
    .bind(now)
    .fetch_one(reads)
    .await?)
}

fn info(row: &SqliteRow, now: Micros) -> Result<TokenInfo> {
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
        id: parse_uuid(&row.try_get::<String, _>("id")?)?,
        name: row.try_get("name")?,
        scopes: json::<Vec<Scope>>(&row.try_get::<String, _>("scopes")?)?,
        datasets: row
            .try_get::<Option<String>, _>("datasets")?
            .map(|text| json(&text))
            .transpose()?,
        created_by: row.try_get("created_by")?,
        created_at: row.try_get("created_at")?,
        expires_at,
        revoked_at,
        revoked_by: row.try_get("revoked_by")?,
        replaced_by: row
            .try_get::<Option<String>, _>("replaced_by")?
            .as_deref()
            .map(parse_uuid)
            .transpose()?,
        identity: identity(row)?,
        state,
    })
}

/// The identity stored with a token, if it has one.
fn identity(row: &SqliteRow) -> Result<Option<crate::access::Identity>> {
    let Some(principal) = row.try_get::<Option<String>, _>("principal")? else {
        return Ok(None);
    };
    let groups = row
        .try_get::<Option<String>, _>("groups")?
        .map(|text| json::<Vec<String>>(&text))
        .transpose()?
        .unwrap_or_default();
    Ok(Some(crate::access::Identity { principal, groups }))
}

fn json<T: serde::de::DeserializeOwned>(text: &str) -> Result<T> {
    serde_json::from_str(text).map_err(|error| LedgerError::Corrupt(error.to_string()))
}
