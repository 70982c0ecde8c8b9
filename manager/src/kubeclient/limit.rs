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

/// Whether a request spends a token. A list's continuation pages do not: a list is one
/// operation for the limit, its pages go one after another (never two of one list at once), and
/// charging each page made a 100,000-object first list (1,000 pages of 100) wait 18 s at the
/// default 50 qps after its burst. Everything else, the first page of every list included, is
/// charged.
pub(crate) trait Charged {
    /// False for a request the limit lets through without a token.
    fn charged(&self) -> bool;
}

impl<B> Charged for http::Request<B> {
    fn charged(&self) -> bool {
        !continues_a_list(self.method(), self.uri())
    }
}

/// A GET whose query carries a non-empty `continue` token: a list's next page.
fn continues_a_list(method: &http::Method, uri: &http::Uri) -> bool {
    method == http::Method::GET
        && uri.query().is_some_and(|q| {
            q.split('&').any(|pair| {
                pair.strip_prefix("continue=")
                    .is_some_and(|t| !t.is_empty())
            })
        })
}

impl<S, Req> tower::Service<Req> for Limit<S>
where
    S: tower::Service<Req>,
    Req: Charged,
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
        // A free request leaves the token for the next call that spends one.
        if req.charged() {
            self.permit = false;
            self.since = None;
        }
        self.inner.call(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::{Service as _, ServiceExt as _};

    /// Test calls: charged unless they say otherwise.
    #[derive(Clone, Copy)]
    struct Call {
        page: bool,
    }

    impl Charged for Call {
        fn charged(&self) -> bool {
            !self.page
        }
    }

    fn limited(
        qps: f64,
        burst: u32,
    ) -> Limit<impl tower::Service<Call, Response = Instant, Error = std::convert::Infallible>>
    {
        let metrics = crate::metrics::Metrics::new();
        let limiter = Qps { qps, burst }.limiter().expect("a limit");
        let layer = LimitLayer::new(Some(limiter), &metrics.api);
        tower::Layer::layer(
            &layer,
            tower::service_fn(|_: Call| async {
                Ok::<_, std::convert::Infallible>(Instant::now())
            }),
        )
    }

    async fn calls(
        svc: &mut Limit<
            impl tower::Service<Call, Response = Instant, Error = std::convert::Infallible>,
        >,
        n: usize,
        call: Call,
    ) -> Vec<Instant> {
        let mut at = Vec::new();
        for _ in 0..n {
            at.push(
                svc.ready()
                    .await
                    .expect("ready")
                    .call(call)
                    .await
                    .expect("call"),
            );
        }
        at
    }

    #[test]
    fn only_a_lists_next_pages_are_free() {
        let get = http::Method::GET;
        let page = |q: &str| {
            format!("/apis/g/v1/widgets?{q}")
                .parse::<http::Uri>()
                .expect("uri")
        };
        assert!(continues_a_list(&get, &page("limit=100&continue=abc")));
        assert!(continues_a_list(&get, &page("continue=abc&limit=100")));
        assert!(!continues_a_list(&get, &page("limit=100")), "a first page");
        assert!(
            !continues_a_list(&get, &page("limit=100&continue=")),
            "an empty token"
        );
        assert!(!continues_a_list(&get, &page("labelSelector=continue%3Dx")));
        assert!(!continues_a_list(&get, &page("xcontinue=abc")));
        assert!(!continues_a_list(
            &http::Method::POST,
            &page("continue=abc")
        ));
    }

    /// Once the bucket is empty, a list's further pages still go at once, and the token they
    /// did not spend is there for the next charged call.
    #[tokio::test]
    async fn pages_after_the_first_do_not_wait_for_the_rate() {
        let mut svc = limited(2.0, 2);
        let start = Instant::now();
        calls(&mut svc, 2, Call { page: false }).await;
        let pages = calls(&mut svc, 50, Call { page: true }).await;
        assert!(
            pages[49].duration_since(start) < Duration::from_millis(600),
            "50 pages after an empty bucket took {:?}",
            pages[49].duration_since(start)
        );
        let next = calls(&mut svc, 2, Call { page: false }).await;
        assert!(
            next[1].duration_since(start) >= Duration::from_millis(450),
            "charged calls still keep to the rate: {:?}",
            next[1].duration_since(start)
        );
    }

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
        let mut svc = limited(20.0, 5);
        let start = Instant::now();
        let at = calls(&mut svc, 15, Call { page: false }).await;
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
