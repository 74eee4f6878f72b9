//! Short in-process retries of a store call, shared by the networked stores: exponential
//! backoff (the `backoff` crate) for at most a budget that configuration keeps below the job
//! lease; only [`GatewayError::Unavailable`] and [`GatewayError::Timeout`] are retried. When
//! the budget is spent, the job's own retry policy takes over.

use std::time::Duration;

use crate::GatewayError;

/// Whether an error may pass by itself (worth another attempt).
pub(crate) fn retryable(error: &GatewayError) -> bool {
    matches!(
        error,
        GatewayError::Unavailable { .. } | GatewayError::Timeout { .. }
    )
}

/// Runs `attempt` until it succeeds, fails for good, or `budget` is spent; logs the final
/// failure with `what` and `location` (never a secret) and the number of attempts.
pub(crate) async fn with_backoff<T, F, Fut>(
    budget: Duration,
    what: &'static str,
    location: &str,
    attempt: F,
) -> Result<T, GatewayError>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T, GatewayError>>,
{
    let policy = backoff::ExponentialBackoff {
        initial_interval: Duration::from_millis(50),
        max_interval: Duration::from_secs(1),
        max_elapsed_time: Some(budget),
        ..backoff::ExponentialBackoff::default()
    };
    let attempts = std::sync::atomic::AtomicU32::new(0);
    let result = backoff::future::retry(policy, || async {
        let number = attempts.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        attempt().await.map_err(|error| {
            if retryable(&error) {
                tracing::debug!(%error, attempt = number, what, location, "store call failed; retrying");
                backoff::Error::transient(error)
            } else {
                backoff::Error::permanent(error)
            }
        })
    })
    .await;
    if let Err(error) = &result {
        tracing::warn!(
            %error, what, location,
            attempts = attempts.load(std::sync::atomic::Ordering::Relaxed),
            "store call failed"
        );
    }
    result
}
