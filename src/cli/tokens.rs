//! `cairn token create|list|revoke|rotate`: the token lifecycle on a data directory, through
//! the same ledger path as the HTTP token API (history records `cli:<user>` and the reason).
//! A secret is printed once, on stdout, alone on its line; everything else goes to stderr.

use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context;
use receipts::auth::{NewToken, TokenChange, TokenInfo};
use receipts::{Scope, Tokens};
use uuid::Uuid;

/// Microseconds since the epoch, `text` from now: `90d`, `12h`, `30m`, `45s` or seconds.
pub fn expires_at(text: &str) -> anyhow::Result<i64> {
    let text = text.trim();
    let (number, unit) = match text.char_indices().last() {
        Some((index, unit)) if unit.is_ascii_alphabetic() => (&text[..index], unit),
        _ => (text, 's'),
    };
    let count: u64 = number
        .parse()
        .with_context(|| format!("`{text}` is not a duration such as 90d, 12h, 30m or 45s"))?;
    let seconds = match unit {
        'd' => count.saturating_mul(86_400),
        'h' => count.saturating_mul(3_600),
        'm' => count.saturating_mul(60),
        's' => count,
        other => anyhow::bail!("unknown unit `{other}` in `{text}` (use d, h, m or s)"),
    };
    receipts::auth::expiry_after(seconds).map_err(anyhow::Error::msg)
}

/// Creates a token; prints its secret.
pub async fn create(
    ledger: &dyn Tokens,
    actor: String,
    name: String,
    scopes: &[String],
    datasets: Vec<String>,
    identity: Option<receipts::access::Identity>,
    expires_in: Option<&str>,
) -> anyhow::Result<()> {
    let scopes = scopes
        .iter()
        .map(|scope| scope.parse::<Scope>().map_err(anyhow::Error::msg))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let changed = ledger
        .change_token(TokenChange::Create(NewToken {
            name,
            scopes,
            datasets: (!datasets.is_empty()).then_some(datasets),
            identity,
            created_by: actor,
            expires_at: expires_in.map(expires_at).transpose()?,
        }))
        .await?;
    print_secret(&changed.token, changed.secret.as_deref(), "created")
}

/// Revokes a token.
pub async fn revoke(
    ledger: &dyn Tokens,
    actor: String,
    id: &str,
    reason: Option<String>,
) -> anyhow::Result<()> {
    let id = parse_id(id)?;
    let changed = ledger
        .change_token(TokenChange::Revoke {
            id,
            actor,
            reason: Some(reason.unwrap_or_else(|| "revoked with the CLI".to_owned())),
        })
        .await?;
    eprintln!(
        "token {} ({}) revoked; it stops working at once",
        changed.token.id, changed.token.name
    );
    Ok(())
}

/// Rotates a token; prints the new secret.
pub async fn rotate(
    ledger: &dyn Tokens,
    actor: String,
    id: &str,
    reason: Option<String>,
    expires_in: Option<&str>,
) -> anyhow::Result<()> {
    let id = parse_id(id)?;
    let changed = ledger
        .change_token(TokenChange::Rotate {
            id,
            actor,
            reason: Some(reason.unwrap_or_else(|| "rotated with the CLI".to_owned())),
            expires_at: expires_in.map(expires_at).transpose()?,
        })
        .await?;
    print_secret(
        &changed.token,
        changed.secret.as_deref(),
        &format!("rotated from {id}; the old secret stops working now;"),
    )
}

/// Lists tokens (never secrets).
pub async fn list(ledger: &dyn Tokens, json: bool) -> anyhow::Result<()> {
    let tokens = ledger.tokens().await?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_micros() as i64);
    if json {
        println!("{}", serde_json::to_string_pretty(&tokens)?);
        return Ok(());
    }
    println!(
        "{:<36}  {:<20}  {:<8}  {:<28}  {:<16}  EXPIRES",
        "ID", "NAME", "STATE", "SCOPES", "DATASETS"
    );
    for token in &tokens {
        let scopes: Vec<&str> = token.scopes.iter().map(|scope| scope.as_str()).collect();
        println!(
            "{:<36}  {:<20}  {:<8}  {:<28}  {:<16}  {}",
            token.id,
            token.name,
            serde_json::to_value(token.state)?
                .as_str()
                .unwrap_or_default(),
            scopes.join(","),
            token
                .datasets
                .as_ref()
                .map_or_else(|| "*".to_owned(), |datasets| datasets.join(",")),
            token.expires_at.map_or_else(
                || "never".to_owned(),
                |at| format!("in {}", crate::cli::ops::duration(Some((at - now) / 1000)))
            ),
        );
    }
    Ok(())
}

fn parse_id(text: &str) -> anyhow::Result<Uuid> {
    Uuid::parse_str(text).with_context(|| {
        format!("`{text}` is not a token id (UUID); `cairn token list` shows them")
    })
}

fn print_secret(token: &TokenInfo, secret: Option<&str>, what: &str) -> anyhow::Result<()> {
    let secret = secret.context("the ledger returned no secret")?;
    println!("{secret}");
    eprintln!(
        "token {} ({}) {what} the secret above is shown once",
        token.id, token.name
    );
    Ok(())
}
