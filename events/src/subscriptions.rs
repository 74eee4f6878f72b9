//! `/v1/webhooks`: subscriptions and their deliveries, every change through
//! [`receipts::webhooks::Webhooks::change_webhook`] (so history records who and why).
//!
//! ## Who may do what
//! - Creating, changing and acting on deliveries needs `ops:write` (or `admin`), with every
//!   dataset the subscription names in the token's allowlist; a subscription that names no
//!   dataset (every dataset) needs a token without an allowlist. Reading needs `ops:read` or
//!   `ops:write` on the same terms; a subscription the token may not see is answered as
//!   absent.
//! - A token that reads as an identity (principal and groups) cannot create one: a
//!   subscription hears every event of its datasets, whoever may read the sources.
//! - The signing secret is answered once, at creation and at each rotation; it is stored
//!   sealed ([`crate::sealing`]), never shown again.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{FromRef, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use receipts::events::EventType;
use receipts::http::{read_json, reason, ApiError, ApiErrors, Auth};
use receipts::webhooks::{
    DeliveryCounts, DeliveryState, NewWebhook, Webhook, WebhookChange, WebhookCommand,
    MAX_DESCRIPTION_CHARS, MAX_URL_CHARS,
};
use receipts::{EventsLedger, Principal, Scope, Tokens};
use serde::Deserialize;
use serde_json::json;
use utoipa::ToSchema;
use uuid::Uuid;

use crate::sealing::Sealer;
use crate::signing::Secret;
use crate::target::{Refused, TargetPolicy};

/// Largest request body read.
const MAX_BODY_BYTES: usize = 16 * 1024;

/// The handlers' state.
#[derive(Clone)]
pub struct SubscriptionsState {
    /// The ledger.
    pub ledger: Arc<dyn EventsLedger>,
    /// Seals new secrets; `None` when the key file could not be opened (then every change
    /// that needs a secret answers 503).
    pub sealer: Option<Arc<Sealer>>,
    /// Which URLs may receive.
    pub policy: Arc<TargetPolicy>,
    /// How long a rotated secret keeps signing.
    pub rotation_grace: Duration,
}

impl FromRef<SubscriptionsState> for Arc<dyn Tokens> {
    fn from_ref(state: &SubscriptionsState) -> Self {
        state.ledger.clone()
    }
}

/// `POST /v1/webhooks`'s body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateBody {
    /// Where deliveries go: `https`, or `http` to a host in `webhooks.allow_hosts`.
    #[schema(max_length = 2048)]
    url: String,
    /// The event types to deliver (default: every type).
    #[serde(default)]
    events: Vec<String>,
    /// The datasets whose events to deliver (default: every dataset the token may read,
    /// which, for a token without an allowlist, is every dataset).
    datasets: Option<Vec<String>>,
    /// What it is for.
    #[serde(default)]
    #[schema(max_length = 1000)]
    description: String,
    /// Why (recorded in history).
    reason: Option<String>,
}

/// The body of an action on deliveries.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DeliveriesBody {
    /// One event's delivery (default: every dead one).
    seq: Option<i64>,
    /// Why (recorded in history).
    reason: Option<String>,
}

/// `POST /v1/webhooks/{id}/replay`'s body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReplayBody {
    /// The first event to deliver again.
    from: i64,
    /// Why (recorded in history).
    reason: Option<String>,
}

/// The query of a change.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ChangeQuery {
    /// Why (recorded in history).
    reason: Option<String>,
}

/// `GET /v1/webhooks/{id}/deliveries`'s query.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DeliveriesQuery {
    /// Only this state: pending, delivering, delivered, dead or discarded.
    state: Option<String>,
    /// After this sequence number.
    after: Option<i64>,
    /// At most this many (1 to 1000, default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
}

fn unavailable() -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "webhooks_unavailable",
        "webhook secrets cannot be sealed: the key file (webhooks.secret_key_file) could not be opened; the detail is in the server's log",
    )
}

fn webhook_id(text: &str) -> Result<Uuid, ApiError> {
    Uuid::parse_str(text)
        .map_err(|_| ApiError::not_found("webhook_not_found", "a webhook id is a UUID".to_owned()))
}

/// Whether `principal` may see `webhook`: every dataset it names in the allowlist.
fn may_see(principal: &Principal, datasets: Option<&[String]>) -> bool {
    match datasets {
        None => principal.datasets.is_none(),
        Some(names) => names
            .iter()
            .all(|name| principal.require_dataset(name).is_ok()),
    }
}

/// The subscription `id`, if the token may see it.
async fn visible(
    state: &SubscriptionsState,
    principal: &Principal,
    id: &str,
) -> Result<Webhook, ApiError> {
    let id = webhook_id(id)?;
    let absent = || ApiError::not_found("webhook_not_found", format!("webhook {id} not found"));
    let webhook = state.ledger.webhook(id).await?.ok_or_else(absent)?;
    if !may_see(principal, webhook.datasets.as_deref()) {
        return Err(absent());
    }
    Ok(webhook)
}

fn view(webhook: &Webhook, counts: Option<&DeliveryCounts>) -> serde_json::Value {
    json!({
        "webhook": webhook,
        "deliveries": counts.cloned().unwrap_or_default(),
    })
}

fn refused(refused: Refused) -> ApiError {
    ApiError::unprocessable(Refused::CODE, refused.0)
}

fn new_secret(state: &SubscriptionsState, id: Uuid) -> Result<(Secret, String), ApiError> {
    let sealer = state.sealer.as_ref().ok_or_else(unavailable)?;
    let secret = Secret::generate().map_err(|error| {
        tracing::error!(%error, "a webhook secret could not be made");
        unavailable()
    })?;
    let sealed = sealer.seal(&id.to_string(), &secret).map_err(|error| {
        tracing::error!(%error, "a webhook secret could not be sealed");
        unavailable()
    })?;
    Ok((secret, sealed))
}

/// `GET /v1/webhooks`: the subscriptions the token may see, newest first, with their
/// deliveries counted.
#[utoipa::path(get, path = "/v1/webhooks", tag = "events", security(("bearer" = [])),
    responses((status = 200, description = "Subscriptions (deleted ones too), newest first, each with its deliveries counted.", body = Object), ApiErrors))]
async fn list_webhooks(
    State(state): State<SubscriptionsState>,
    auth: Auth,
) -> Result<Response, ApiError> {
    let principal = auth.require_any(&[Scope::OpsRead, Scope::OpsWrite])?;
    let counts = state.ledger.delivery_counts().await?;
    let webhooks: Vec<serde_json::Value> = state
        .ledger
        .webhooks()
        .await?
        .iter()
        .filter(|webhook| may_see(principal, webhook.datasets.as_deref()))
        .map(|webhook| {
            let counted = counts
                .iter()
                .find(|(id, _)| *id == webhook.id)
                .map(|(_, counts)| counts);
            view(webhook, counted)
        })
        .collect();
    Ok(Json(json!({ "webhooks": webhooks })).into_response())
}

/// `POST /v1/webhooks`: a subscription, active at once; answers its signing secret, once.
#[utoipa::path(post, path = "/v1/webhooks", tag = "events", security(("bearer" = [])),
    request_body(content = CreateBody, content_type = "application/json"),
    responses((status = 201, description = "Created: `secret` (shown only now) signs its deliveries; it hears the events committed from now on.", body = Object), ApiErrors))]
async fn create_webhook(
    State(state): State<SubscriptionsState>,
    auth: Auth,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let principal = auth.require(Scope::OpsWrite)?;
    let body: CreateBody = read_json(&headers, body, MAX_BODY_BYTES).await?;
    if principal.reads_as().is_some() {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "identity_token",
            "a token that reads as an identity cannot create a webhook: a webhook hears every event of its datasets; use a token that reads its whole datasets",
        ));
    }
    if body.url.chars().count() > MAX_URL_CHARS {
        return Err(ApiError::unprocessable(
            Refused::CODE,
            format!("a webhook URL has at most {MAX_URL_CHARS} characters"),
        ));
    }
    state.policy.check(&body.url).map_err(refused)?;
    if body.description.chars().count() > MAX_DESCRIPTION_CHARS {
        return Err(ApiError::unprocessable(
            "invalid_description",
            format!("a description has at most {MAX_DESCRIPTION_CHARS} characters"),
        ));
    }
    let mut events = body
        .events
        .iter()
        .map(|name| name.parse::<EventType>())
        .collect::<Result<Vec<_>, _>>()?;
    events.sort();
    events.dedup();
    let datasets = match body.datasets {
        Some(mut names) => {
            if names.is_empty() {
                return Err(ApiError::unprocessable(
                    "invalid_datasets",
                    "`datasets` names at least one dataset; leave it out for every dataset",
                ));
            }
            for name in &names {
                receipts::validate::dataset(name)?;
                principal.require_dataset(name)?;
            }
            names.sort();
            names.dedup();
            Some(names)
        }
        None => principal.datasets.clone(),
    };
    let reason = reason(body.reason, "created through the API")?;
    let id = Uuid::new_v4();
    let (secret, sealed_secret) = new_secret(&state, id)?;
    let created = state
        .ledger
        .change_webhook(WebhookCommand {
            change: WebhookChange::Create(NewWebhook {
                id,
                url: body.url,
                events,
                datasets,
                description: body.description,
                sealed_secret,
            }),
            actor: principal.actor(),
            reason,
        })
        .await?;
    tracing::info!(webhook = %id, url = %created.webhook.url, actor = %principal.actor(), "webhook created");
    Ok((
        StatusCode::CREATED,
        Json(json!({"webhook": created.webhook, "secret": secret.text()})),
    )
        .into_response())
}

/// `GET /v1/webhooks/{id}`: a subscription, its deliveries counted, and its history.
#[utoipa::path(get, path = "/v1/webhooks/{id}", tag = "events", security(("bearer" = [])),
    params(("id" = uuid::Uuid, Path, description = "Webhook id")),
    responses((status = 200, description = "The subscription, its deliveries counted, and every change to it.", body = Object), ApiErrors))]
async fn get_webhook(
    State(state): State<SubscriptionsState>,
    auth: Auth,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let principal = auth.require_any(&[Scope::OpsRead, Scope::OpsWrite])?;
    let webhook = visible(&state, principal, &id).await?;
    let counts = state.ledger.delivery_counts().await?;
    let history = state
        .ledger
        .history("webhook", &webhook.id.to_string())
        .await?;
    let mut answer = view(
        &webhook,
        counts
            .iter()
            .find(|(each, _)| *each == webhook.id)
            .map(|(_, counts)| counts),
    );
    answer["history"] = json!(history);
    Ok(Json(answer).into_response())
}

/// Applies the change `make` builds to a subscription the token may change.
async fn apply(
    state: &SubscriptionsState,
    auth: &Auth,
    id: &str,
    make: impl FnOnce(&Webhook) -> Result<WebhookChange, ApiError>,
    reason_text: Option<String>,
    default_reason: &str,
) -> Result<receipts::webhooks::WebhookChanged, ApiError> {
    let principal = auth.require(Scope::OpsWrite)?;
    let webhook = visible(state, principal, id).await?;
    let change = make(&webhook)?;
    let action = change.action();
    let done = state
        .ledger
        .change_webhook(WebhookCommand {
            change,
            actor: principal.actor(),
            reason: reason(reason_text, default_reason)?,
        })
        .await?;
    tracing::info!(webhook = %webhook.id, action, state = %done.webhook.state, deliveries = done.deliveries, actor = %principal.actor(), "webhook changed");
    Ok(done)
}

fn change_query(
    query: Result<Query<ChangeQuery>, QueryRejection>,
) -> Result<ChangeQuery, ApiError> {
    query
        .map(|Query(query)| query)
        .map_err(|rejection| ApiError::unprocessable("invalid_query", rejection.body_text()))
}

macro_rules! state_change {
    ($name:ident, $path:literal, $method:ident, $variant:ident, $what:literal, $default:literal) => {
        #[doc = concat!("`", stringify!($method), " ", $path, "`: ", $what)]
        #[utoipa::path($method, path = $path, tag = "events", security(("bearer" = [])),
            params(("id" = uuid::Uuid, Path, description = "Webhook id"), ChangeQuery),
            responses((status = 200, description = $what, body = Object), ApiErrors))]
        async fn $name(
            State(state): State<SubscriptionsState>,
            auth: Auth,
            Path(id): Path<String>,
            query: Result<Query<ChangeQuery>, QueryRejection>,
        ) -> Result<Response, ApiError> {
            let query = change_query(query)?;
            let done = apply(
                &state,
                &auth,
                &id,
                |webhook| Ok(WebhookChange::$variant(webhook.id)),
                query.reason,
                $default,
            )
            .await?;
            Ok(Json(json!({"webhook": done.webhook, "deliveries": done.deliveries})).into_response())
        }
    };
}

state_change!(
    pause_webhook,
    "/v1/webhooks/{id}/pause",
    post,
    Pause,
    "Paused: nothing is delivered; events wait (while retention keeps them) and go when it is resumed.",
    "paused through the API"
);
state_change!(
    resume_webhook,
    "/v1/webhooks/{id}/resume",
    post,
    Resume,
    "Active again (from paused, or disabled by a 410): what waited is delivered.",
    "resumed through the API"
);
state_change!(
    delete_webhook,
    "/v1/webhooks/{id}",
    delete,
    Delete,
    "Deleted for good; its waiting deliveries are discarded (`deliveries` counts them).",
    "deleted through the API"
);

/// `POST /v1/webhooks/{id}/rotate-secret`: a new secret, answered once; the one it replaces
/// keeps signing (beside it) for `webhooks.rotation_grace_seconds`.
#[utoipa::path(post, path = "/v1/webhooks/{id}/rotate-secret", tag = "events", security(("bearer" = [])),
    params(("id" = uuid::Uuid, Path, description = "Webhook id"), ChangeQuery),
    responses((status = 200, description = "Rotated: `secret` (shown only now) signs from now on, and `previous_secret_until` says until when the one before signs too.", body = Object), ApiErrors))]
async fn rotate_secret(
    State(state): State<SubscriptionsState>,
    auth: Auth,
    Path(id): Path<String>,
    query: Result<Query<ChangeQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let query = change_query(query)?;
    let grace = state.rotation_grace;
    let mut shown = None;
    let done = apply(
        &state,
        &auth,
        &id,
        |webhook| {
            let (secret, sealed_secret) = new_secret(&state, webhook.id)?;
            shown = Some(secret);
            Ok(WebhookChange::RotateSecret {
                id: webhook.id,
                sealed_secret,
                previous_until: receipts::Clock::now_micros(&receipts::SystemClock)
                    .saturating_add(grace.as_micros() as i64),
            })
        },
        query.reason,
        "secret rotated through the API",
    )
    .await?;
    let secret = shown.map(|secret| secret.text());
    Ok(Json(json!({"webhook": done.webhook, "secret": secret})).into_response())
}

/// `GET /v1/webhooks/{id}/deliveries`: its deliveries in sequence order.
#[utoipa::path(get, path = "/v1/webhooks/{id}/deliveries", tag = "events", security(("bearer" = [])),
    params(("id" = uuid::Uuid, Path, description = "Webhook id"), DeliveriesQuery),
    responses((status = 200, description = "Deliveries after the cursor, oldest first: state, attempts, the receiver's last status and error.", body = Object), ApiErrors))]
async fn list_deliveries(
    State(state): State<SubscriptionsState>,
    auth: Auth,
    Path(id): Path<String>,
    query: Result<Query<DeliveriesQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let principal = auth.require_any(&[Scope::OpsRead, Scope::OpsWrite])?;
    let query = query
        .map(|Query(query)| query)
        .map_err(|rejection| ApiError::unprocessable("invalid_query", rejection.body_text()))?;
    let webhook = visible(&state, principal, &id).await?;
    let wanted = query
        .state
        .as_deref()
        .map(|text| text.parse::<DeliveryState>())
        .transpose()
        .map_err(|error| ApiError::unprocessable("invalid_state", error))?;
    let limit = query.limit.unwrap_or(100);
    if limit == 0 || limit > 1000 {
        return Err(ApiError::unprocessable(
            "invalid_limit",
            "`limit` is 1 to 1000",
        ));
    }
    let after = query.after.unwrap_or(0);
    if after < 0 {
        return Err(ApiError::unprocessable(
            "invalid_cursor",
            "`after` is a sequence number, 0 or more",
        ));
    }
    let deliveries = state
        .ledger
        .deliveries(webhook.id, wanted, after, limit)
        .await?;
    Ok(Json(json!({ "deliveries": deliveries })).into_response())
}

/// Reads an optional JSON body (an empty one is the default).
async fn optional_body<T: serde::de::DeserializeOwned + Default>(
    body: Body,
) -> Result<T, ApiError> {
    let bytes = axum::body::to_bytes(body, MAX_BODY_BYTES)
        .await
        .map_err(|_| {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body_too_large",
                format!("the body is larger than {MAX_BODY_BYTES} bytes"),
            )
        })?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    receipts::http::from_object(&bytes)
}

async fn on_dead(
    state: SubscriptionsState,
    auth: Auth,
    id: String,
    body: Body,
    retry: bool,
) -> Result<Response, ApiError> {
    let body: DeliveriesBody = optional_body(body).await?;
    let seq = body.seq;
    let done = apply(
        &state,
        &auth,
        &id,
        |webhook| {
            Ok(if retry {
                WebhookChange::RetryDead {
                    id: webhook.id,
                    seq,
                }
            } else {
                WebhookChange::DiscardDead {
                    id: webhook.id,
                    seq,
                }
            })
        },
        body.reason,
        if retry {
            "dead deliveries retried through the API"
        } else {
            "dead deliveries discarded through the API"
        },
    )
    .await?;
    Ok(Json(json!({"webhook": done.webhook, "deliveries": done.deliveries})).into_response())
}

/// `POST /v1/webhooks/{id}/deliveries/retry`: dead deliveries (one, or all) are pending
/// again, with a fresh retry span.
#[utoipa::path(post, path = "/v1/webhooks/{id}/deliveries/retry", tag = "events", security(("bearer" = [])),
    params(("id" = uuid::Uuid, Path, description = "Webhook id")),
    request_body(content = DeliveriesBody, content_type = "application/json"),
    responses((status = 200, description = "`deliveries`: how many are pending again.", body = Object), ApiErrors))]
async fn retry_dead(
    State(state): State<SubscriptionsState>,
    auth: Auth,
    Path(id): Path<String>,
    body: Body,
) -> Result<Response, ApiError> {
    on_dead(state, auth, id, body, true).await
}

/// `POST /v1/webhooks/{id}/deliveries/discard`: dead deliveries (one, or all) are dropped.
#[utoipa::path(post, path = "/v1/webhooks/{id}/deliveries/discard", tag = "events", security(("bearer" = [])),
    params(("id" = uuid::Uuid, Path, description = "Webhook id")),
    request_body(content = DeliveriesBody, content_type = "application/json"),
    responses((status = 200, description = "`deliveries`: how many were discarded.", body = Object), ApiErrors))]
async fn discard_dead(
    State(state): State<SubscriptionsState>,
    auth: Auth,
    Path(id): Path<String>,
    body: Body,
) -> Result<Response, ApiError> {
    on_dead(state, auth, id, body, false).await
}

/// `POST /v1/webhooks/{id}/replay`: every event from `from` on that the subscription wants
/// is delivered again, in order, with its original id.
#[utoipa::path(post, path = "/v1/webhooks/{id}/replay", tag = "events", security(("bearer" = [])),
    params(("id" = uuid::Uuid, Path, description = "Webhook id")),
    request_body(content = ReplayBody, content_type = "application/json"),
    responses((status = 200, description = "`deliveries`: how many events go again.", body = Object), ApiErrors))]
async fn replay(
    State(state): State<SubscriptionsState>,
    auth: Auth,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let body: ReplayBody = read_json(&headers, body, MAX_BODY_BYTES).await?;
    let from = body.from;
    let done = apply(
        &state,
        &auth,
        &id,
        |webhook| {
            Ok(WebhookChange::Replay {
                id: webhook.id,
                from,
            })
        },
        body.reason,
        "replayed through the API",
    )
    .await?;
    Ok(Json(json!({"webhook": done.webhook, "deliveries": done.deliveries})).into_response())
}

/// The subscriptions' routes with their OpenAPI description.
pub fn routes(state: SubscriptionsState) -> utoipa_axum::router::OpenApiRouter {
    use utoipa_axum::routes;
    utoipa_axum::router::OpenApiRouter::new()
        .routes(routes!(list_webhooks, create_webhook))
        .routes(routes!(get_webhook, delete_webhook))
        .routes(routes!(pause_webhook))
        .routes(routes!(resume_webhook))
        .routes(routes!(rotate_secret))
        .routes(routes!(list_deliveries))
        .routes(routes!(retry_dead))
        .routes(routes!(discard_dead))
        .routes(routes!(replay))
        .with_state(state)
}
