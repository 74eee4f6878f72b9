//! Tokens, scopes and principals. A token is a random secret shown once; the ledger stores only
//! its SHA-256. A principal is what a verified token grants: scopes and an optional dataset
//! allowlist.

use rand::RngCore;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::clock::Micros;
use crate::error::LedgerError;
use crate::ids::sha256_hex;
use crate::validate;

/// A permission a token can carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "http", derive(utoipa::ToSchema))]
pub enum Scope {
    /// Submit and delete sources; read sources and revisions.
    #[serde(rename = "ingest")]
    Ingest,
    /// Run searches.
    #[serde(rename = "search")]
    Search,
    /// Read operational state.
    #[serde(rename = "ops:read")]
    OpsRead,
    /// Act on jobs and content (requeue, cancel, block).
    #[serde(rename = "ops:write")]
    OpsWrite,
    /// Erase sources: every trace of every revision, in every store (legal requests).
    #[serde(rename = "erase")]
    Erase,
    /// Everything.
    #[serde(rename = "admin")]
    Admin,
}

impl Scope {
    /// Every scope.
    pub const ALL: [Scope; 6] = [
        Scope::Ingest,
        Scope::Search,
        Scope::OpsRead,
        Scope::OpsWrite,
        Scope::Erase,
        Scope::Admin,
    ];

    /// The scope's wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Ingest => "ingest",
            Scope::Search => "search",
            Scope::OpsRead => "ops:read",
            Scope::OpsWrite => "ops:write",
            Scope::Erase => "erase",
            Scope::Admin => "admin",
        }
    }
}

impl std::str::FromStr for Scope {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Scope::ALL
            .into_iter()
            .find(|scope| scope.as_str() == text)
            .ok_or_else(|| {
                let valid: Vec<&str> = Scope::ALL.iter().map(|scope| scope.as_str()).collect();
                format!("unknown scope `{text}`; valid scopes: {}", valid.join(", "))
            })
    }
}

/// What a verified token may do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "http", derive(utoipa::ToSchema))]
pub struct Principal {
    /// The token's id.
    pub token_id: Uuid,
    /// The token's name, used as the actor in history (`token:<name>`).
    pub name: String,
    /// Granted scopes.
    pub scopes: Vec<Scope>,
    /// Datasets the token may touch; `None` means all.
    pub datasets: Option<Vec<String>>,
    /// The identity the token reads as ([`crate::access`]); `None`: it reads every document
    /// of its datasets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<crate::access::Identity>,
}

/// Why a principal may not do something.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    /// A scope is missing.
    #[error("this token lacks the `{}` scope", .0.as_str())]
    Scope(Scope),
    /// A dataset is outside the allowlist.
    #[error("this token may not access dataset `{0}`")]
    Dataset(String),
    /// The action covers every dataset, and the token is limited to some.
    #[error("{0} covers every dataset: it needs a token without a dataset allowlist")]
    AllDatasets(&'static str),
}

impl Principal {
    /// The names it reads as (its principal and groups), or `None` for a token that reads
    /// every document of its datasets.
    pub fn reads_as(&self) -> Option<Vec<String>> {
        self.identity.as_ref().map(crate::access::Identity::names)
    }

    /// The actor name recorded in history.
    pub fn actor(&self) -> String {
        format!("token:{}", self.name)
    }

    /// Whether the token holds `scope` (admin holds every scope).
    pub fn has(&self, scope: Scope) -> bool {
        self.scopes.contains(&Scope::Admin) || self.scopes.contains(&scope)
    }

    /// Requires `scope`.
    pub fn require(&self, scope: Scope) -> Result<(), Denied> {
        if self.has(scope) {
            Ok(())
        } else {
            Err(Denied::Scope(scope))
        }
    }

    /// Requires a token without a dataset allowlist, for `action`, which covers every
    /// dataset (a verify pass, say).
    pub fn require_all_datasets(&self, action: &'static str) -> Result<(), Denied> {
        match self.datasets {
            Some(_) => Err(Denied::AllDatasets(action)),
            None => Ok(()),
        }
    }

    /// Requires that `dataset` is within the allowlist.
    pub fn require_dataset(&self, dataset: &str) -> Result<(), Denied> {
        match &self.datasets {
            Some(allowed) if !allowed.iter().any(|name| name == dataset) => {
                Err(Denied::Dataset(dataset.to_owned()))
            }
            _ => Ok(()),
        }
    }
}

/// A token to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewToken {
    /// Human name (used as the actor).
    pub name: String,
    /// Scopes.
    pub scopes: Vec<Scope>,
    /// Dataset allowlist (`None`: all datasets).
    pub datasets: Option<Vec<String>>,
    /// The identity it reads as (`None`: every document of its datasets).
    pub identity: Option<crate::access::Identity>,
    /// Who creates it.
    pub created_by: String,
    /// When it stops working (microseconds since the epoch; `None`: never).
    pub expires_at: Option<Micros>,
}

/// Longest lifetime a token may be given: ten years.
pub const MAX_LIFETIME_SECONDS: u64 = 10 * 365 * 24 * 3600;

/// The expiry of a token created now with a lifetime of `seconds` (microseconds since the
/// epoch), or why the lifetime is refused. One rule for the CLI and the token API.
pub fn expiry_after(seconds: u64) -> Result<Micros, String> {
    if seconds == 0 || seconds > MAX_LIFETIME_SECONDS {
        return Err(format!(
            "a token lifetime is between 1 and {MAX_LIFETIME_SECONDS} seconds (ten years)"
        ));
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|_| "the clock is before 1970".to_owned())?
        .as_micros();
    let now = Micros::try_from(now).unwrap_or(Micros::MAX);
    Ok(now.saturating_add(seconds as Micros * 1_000_000))
}

/// Where a token is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "http", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum TokenState {
    /// It authenticates.
    Active,
    /// Its expiry has passed.
    Expired,
    /// Revoked (or replaced by a rotation).
    Revoked,
}

/// A token as listed: everything but its secret, which is never stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "http", derive(utoipa::ToSchema))]
pub struct TokenInfo {
    /// Id.
    pub id: Uuid,
    /// Name (the actor `token:<name>`).
    pub name: String,
    /// Scopes.
    pub scopes: Vec<Scope>,
    /// Dataset allowlist (`None`: all datasets).
    pub datasets: Option<Vec<String>>,
    /// The identity it reads as (`None`: every document of its datasets).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub identity: Option<crate::access::Identity>,
    /// Who created it.
    pub created_by: String,
    /// When.
    pub created_at: Micros,
    /// When it expires (`None`: never).
    pub expires_at: Option<Micros>,
    /// When it was revoked or rotated away.
    pub revoked_at: Option<Micros>,
    /// Who revoked it.
    pub revoked_by: Option<String>,
    /// The token that replaced it in a rotation.
    pub replaced_by: Option<Uuid>,
    /// Active, expired or revoked, at the time it was read.
    pub state: TokenState,
}

/// A change to a token, applied by the ledger's one write path and recorded in history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenChange {
    /// Create a token.
    Create(NewToken),
    /// Revoke a token: it stops authenticating at once.
    Revoke {
        /// The token.
        id: Uuid,
        /// Who (recorded in history).
        actor: String,
        /// Why (recorded in history).
        reason: Option<String>,
    },
    /// Replace a token by a new one with the same name, scopes and datasets, in one
    /// transaction: the old secret stops working as the new one starts.
    Rotate {
        /// The token to replace.
        id: Uuid,
        /// Who (recorded in history).
        actor: String,
        /// Why (recorded in history).
        reason: Option<String>,
        /// The new token's expiry; `None` keeps the old token's lifetime, counted from now.
        expires_at: Option<Micros>,
    },
}

/// What a token change produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenChanged {
    /// The token changed (the new one, for a creation or rotation).
    pub token: TokenInfo,
    /// The new secret (creation and rotation only), shown once.
    pub secret: Option<String>,
}

/// A freshly created token: the secret is shown once and never stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreatedToken {
    /// The token's id.
    pub id: Uuid,
    /// The secret, `cairn_` followed by 43 base64url characters.
    pub secret: String,
}

/// A new random token secret.
pub fn generate_secret() -> String {
    use base64::Engine;
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    format!(
        "cairn_{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    )
}

/// The stored form of a secret.
pub fn secret_hash(secret: &str) -> String {
    sha256_hex(secret.as_bytes())
}

/// Refuses a token that could not be used or named: checked before any engine sees it.
pub(crate) fn check_new(token: &NewToken, now: Micros) -> crate::Result<()> {
    if token.name.trim().is_empty()
        || token.name.chars().count() > 128
        || token.name.chars().any(char::is_control)
    {
        return Err(LedgerError::invalid(
            "invalid_token_name",
            "a token name is 1-128 printable characters",
        ));
    }
    if token.scopes.is_empty() {
        return Err(LedgerError::invalid(
            "invalid_scopes",
            "a token needs at least one scope",
        ));
    }
    if let Some(datasets) = &token.datasets {
        for dataset in datasets {
            validate::dataset(dataset)?;
        }
    }
    if let Some(identity) = &token.identity {
        // Checked again as a whole: a caller that built one by hand gets the same rules.
        let again = crate::access::Identity::new(&identity.principal, &identity.groups)?;
        if &again != identity {
            return Err(LedgerError::invalid(
                "invalid_groups",
                "group names are `group:<name>`, sorted, without repeats",
            ));
        }
    }
    check_expiry(token.expires_at, now)
}

pub(crate) fn check_expiry(expires_at: Option<Micros>, now: Micros) -> crate::Result<()> {
    match expires_at {
        Some(at) if at <= now => Err(LedgerError::invalid(
            "invalid_expiry",
            "a token's expiry must be in the future",
        )),
        _ => Ok(()),
    }
}

/// The expiry of a rotated token: the one asked for, or the old token's lifetime again from
/// now (no expiry stays no expiry).
pub(crate) fn rotated_expiry(
    old: &TokenInfo,
    asked: Option<Micros>,
    now: Micros,
) -> Option<Micros> {
    asked.or_else(|| {
        old.expires_at
            .map(|at| now.saturating_add(at.saturating_sub(old.created_at).max(1)))
    })
}
