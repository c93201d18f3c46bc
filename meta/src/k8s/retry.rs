//! Bounded retry of transient API failures (transport errors, timeouts, 5xx, 429).

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use super::error::{Ctx, K8sError};

/// How long to keep retrying transient failures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Stop retrying once this much time has passed since the first attempt.
    pub total: Duration,
    /// Pause between attempts.
    pub interval: Duration,
}

impl Default for RetryPolicy {
    /// Multus thin's pod-fetch budget: 2.5 s total, 250 ms between attempts.
    fn default() -> Self {
        RetryPolicy {
            total: Duration::from_millis(2500),
            interval: Duration::from_millis(250),
        }
    }
}

impl RetryPolicy {
    /// A single attempt, no retry.
    pub const fn none() -> Self {
        RetryPolicy {
            total: Duration::ZERO,
            interval: Duration::ZERO,
        }
    }
}

/// Run `op` until it succeeds, fails non-transiently, or `policy.total` is used up.
///
/// The first attempt gets the full `timeout`; later attempts get what is left of the budget
/// (but at least `policy.interval`), so the worst case is about `max(timeout, policy.total)`.
pub(crate) async fn run<T, F, Fut>(
    policy: RetryPolicy,
    timeout: Duration,
    ctx: Ctx<'_>,
    mut op: F,
) -> Result<T, K8sError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, K8sError>>,
{
    let start = Instant::now();
    let deadline = start + policy.total;
    let mut attempt_timeout = timeout;
    let mut attempt = 1u32;
    loop {
        let err = match tokio::time::timeout(attempt_timeout, op()).await {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) => e,
            Err(_) => K8sError::timeout(ctx, attempt_timeout),
        };
        let now = Instant::now();
        if !err.is_transient() || now + policy.interval >= deadline {
            return Err(err);
        }
        tracing::debug!(what = ctx.what, ns = ctx.ns, name = ctx.name, attempt, error = %err, "transient API error, retrying");
        tokio::time::sleep(policy.interval).await;
        let left = deadline.saturating_duration_since(Instant::now());
        attempt_timeout = timeout.min(left.max(policy.interval));
        attempt += 1;
    }
}
