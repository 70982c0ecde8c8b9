//! Client-side QPS and burst for the manager's Kubernetes API requests, as client-go's token
//! bucket: up to `burst` requests at once, then `qps` a second. The bucket is `governor`'s GCRA
//! limiter; this layer waits for a token in `poll_ready`, so a request is never sent before it
//! has one and waiting requests keep their order in kube's buffer.

use crate::metrics::api::ApiClientMetrics;
use governor::clock::{Clock as _, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use std::future::Future;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// A client's rate: `qps` requests a second after a burst of `burst`; 0 qps is no limit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Qps {
    /// Sustained requests per second (fractions allowed, as client-go's float QPS).
    pub qps: f64,
    /// Requests that may go at once after a quiet period.
    pub burst: u32,
}

impl Qps {
    /// The token bucket, or None for no limit (qps 0, not finite, or no burst).
    pub(crate) fn limiter(self) -> Option<Arc<DefaultDirectRateLimiter>> {
        if !(self.qps.is_finite() && self.qps > 0.0) {
            return None;
        }
        let burst = NonZeroU32::new(self.burst)?;
        let quota = Quota::with_period(Duration::from_secs_f64(1.0 / self.qps))?;
        Some(Arc::new(RateLimiter::direct(quota.allow_burst(burst))))
    }
}

/// Makes each request of a client take a token from a shared bucket before it is sent (none:
/// requests pass at once).
#[derive(Clone)]
pub(crate) struct LimitLayer {
    limiter: Option<Arc<DefaultDirectRateLimiter>>,
    metrics: ApiClientMetrics,
}

impl LimitLayer {
    /// Requests take tokens from `limiter`; waits are observed in `metrics`.
    pub(crate) fn new(
        limiter: Option<Arc<DefaultDirectRateLimiter>>,
        metrics: &ApiClientMetrics,
    ) -> Self {
        LimitLayer {
            limiter,
            metrics: metrics.clone(),
        }
    }
}

impl<S> tower::Layer<S> for LimitLayer {
    type Service = Limit<S>;

    fn layer(&self, inner: S) -> Limit<S> {
        Limit {
            inner,
            limiter: self.limiter.clone(),
            metrics: self.metrics.clone(),
            waiting: None,
            permit: false,
            since: None,
        }
    }
}

/// The service of [`LimitLayer`].
pub(crate) struct Limit<S> {
    inner: S,
    limiter: Option<Arc<DefaultDirectRateLimiter>>,
    metrics: ApiClientMetrics,
    /// The sleep until the bucket has a token again.
    waiting: Option<Pin<Box<tokio::time::Sleep>>>,
    /// A token taken for the next call.
    permit: bool,
    /// When the next call started waiting for its token.
    since: Option<Instant>,
}

impl<S> Limit<S> {
    /// Takes a token, or sleeps until one may be there; Ready once the next call holds one.
    fn poll_permit(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let Some(limiter) = self.limiter.clone() else {
            return Poll::Ready(());
        };
        let since = *self.since.get_or_insert_with(Instant::now);
        while !self.permit {
            if let Some(sleep) = self.waiting.as_mut() {
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.waiting = None;
            }
            match limiter.check() {
                Ok(()) => {
                    self.permit = true;
                    self.metrics.limiter_waited(since.elapsed());
                }
                Err(not_until) => {
                    let wait = not_until.wait_time_from(DefaultClock::default().now());
                    self.waiting = Some(Box::pin(tokio::time::sleep(wait)));
                }
            }
        }
        Poll::Ready(())
    }
}

impl<S, Req> tower::Service<Req> for Limit<S>
where
    S: tower::Service<Req>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        if self.poll_permit(cx).is_pending() {
            return Poll::Pending;
        }
        // The token is kept until the call it was taken for.
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> S::Future {
        self.permit = false;
        self.since = None;
        self.inner.call(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::{Service as _, ServiceExt as _};

    #[test]
    fn no_limit_for_zero_or_nonsense_rates() {
        for qps in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(Qps { qps, burst: 10 }.limiter().is_none(), "{qps}");
        }
        assert!(Qps { qps: 5.0, burst: 0 }.limiter().is_none());
        assert!(Qps { qps: 0.5, burst: 1 }.limiter().is_some());
    }

    /// A burst goes at once, then calls are spaced by 1/qps.
    #[tokio::test]
    async fn calls_beyond_the_burst_wait_for_the_rate() {
        let metrics = crate::metrics::Metrics::new();
        let limiter = Qps {
            qps: 20.0,
            burst: 5,
        }
        .limiter()
        .expect("a limit");
        let layer = LimitLayer::new(Some(limiter), &metrics.api);
        let mut svc = tower::Layer::layer(
            &layer,
            tower::service_fn(|()| async { Ok::<_, std::convert::Infallible>(Instant::now()) }),
        );
        let start = Instant::now();
        let mut at = Vec::new();
        for _ in 0..15 {
            at.push(
                svc.ready()
                    .await
                    .expect("ready")
                    .call(())
                    .await
                    .expect("call"),
            );
        }
        let burst_done = at[4].duration_since(start);
        assert!(
            burst_done < Duration::from_millis(40),
            "the burst waited {burst_done:?}"
        );
        // Ten more at 20 a second: half a second at least (GCRA is exact; allow timer slack).
        let all = at[14].duration_since(start);
        assert!(all >= Duration::from_millis(450), "15 calls in {all:?}");
        assert!(all < Duration::from_secs(3), "15 calls in {all:?}");
    }
}
