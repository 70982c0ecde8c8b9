//! Manager-wide dispatch seats, shared between tenants by weighted fair queueing.
//!
//! Every request the manager has in flight to a controller holds a *seat*. The number of seats
//! is the manager's budget for outstanding work (`--max-dispatch-seats`); controllers of every
//! tenant draw from it. While seats are free, any controller takes one at once. When they are
//! all taken, controllers that have ready work wait in their tenant's queue, and each seat that
//! is freed goes to the tenant whose next request has the smallest virtual start tag —
//! start-time fair queueing (Goyal et al.) over tenants, the scheme API Priority and Fairness
//! builds on. Within a tenant, waiting controllers take turns.
//!
//! Tenants are charged in *seat-seconds* divided by their weight, as APF does: a seat is
//! charged the tenant's running estimate of how long its requests hold a seat when it is
//! granted, and corrected by the real holding time when it is released. A tenant whose
//! reconciles are slow therefore gets fewer grants, not a larger share of the manager, and a
//! tenant with a huge backlog is served no faster than its weight allows while another tenant
//! has work waiting. Virtual time is the smallest start tag among seats in service, so a tenant
//! that was idle gets no credit for the time it did not use, and one that was served alone
//! while nobody competed is ahead by at most the seats it holds.
//!
//! Fair queueing decides who goes next; it does not stop a tenant from *holding* what it got, and
//! a controller that never answers holds its seats until its deadlines. So each tenant with
//! sessions also has a *guaranteed share*: `capacity × weight / Σ weights` of the tenants with
//! sessions, but never more than its sessions can use (their credits). The part of every other
//! tenant's guarantee it is not using now is never lent, and of the rest at least
//! [`HEADROOM_DIVISOR`]th stays free for tenants that have not asked yet: a tenant beyond its own
//! guarantee only borrows what is left after both. A tenant with work therefore always finds its
//! guaranteed seats free, whatever another tenant holds or how long it holds them.

use parking_lot::{Mutex, MutexGuard, RwLock};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use tokio::sync::Notify;

/// The default seat budget: far above what one controller's replicas hold in flight (tens), so
/// seats bind only when many tenants' backlogs meet.
pub(crate) const DEFAULT_SEATS: usize = 256;
/// What a seat is charged before anything is known of a tenant's requests (1 ms).
const FIRST_ESTIMATE: f64 = 0.001;
/// Weight of the newest holding time in a tenant's running estimate.
const ESTIMATE_GAIN: f64 = 0.2;
/// Floor for a seat's charge, so a stream of instant requests still advances its tenant's tag.
const MIN_CHARGE: f64 = 0.000_01;
/// Borrowing beyond a tenant's guarantee stops while fewer than `capacity / HEADROOM_DIVISOR`
/// seats are free, so a tenant that connects while another holds everything it may borrow still
/// gets seats at once instead of waiting for the borrower's deadlines.
pub(crate) const HEADROOM_DIVISOR: usize = 8;

/// Tenant weights: a default and per-tenant overrides.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Weights {
    default: u32,
    overrides: HashMap<String, u32>,
}

impl Default for Weights {
    fn default() -> Self {
        Weights {
            default: 1,
            overrides: HashMap::new(),
        }
    }
}

/// A tenant weight the manager's configuration could not read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum WeightError {
    /// Not TENANT=N.
    #[error(
        "--tenant-weight {0:?} is not TENANT=N (for example system:serviceaccount:team-a:ctrl=4)"
    )]
    Malformed(String),
    /// N is not a whole number from 1 to 1000.
    #[error("--tenant-weight {0:?}: the weight must be a whole number from 1 to 1000")]
    OutOfRange(String),
}

impl Weights {
    /// Weights from `TENANT=N` overrides; every other tenant weighs `default`.
    pub(crate) fn parse<'a>(
        default: u32,
        overrides: impl IntoIterator<Item = &'a str>,
    ) -> Result<Self, WeightError> {
        if !(1..=1000).contains(&default) {
            return Err(WeightError::OutOfRange(default.to_string()));
        }
        let mut map = HashMap::new();
        for spec in overrides {
            // Tenants are usernames and contain ':'; the weight follows the last '='.
            let (tenant, n) = spec
                .rsplit_once('=')
                .filter(|(t, _)| !t.trim().is_empty())
                .ok_or_else(|| WeightError::Malformed(spec.to_string()))?;
            let n: u32 = n
                .trim()
                .parse()
                .ok()
                .filter(|n| (1..=1000).contains(n))
                .ok_or_else(|| WeightError::OutOfRange(spec.to_string()))?;
            map.insert(tenant.trim().to_string(), n);
        }
        Ok(Weights {
            default,
            overrides: map,
        })
    }

    /// The same weights with `tenant`'s set to `weight` (a tenant policy).
    pub(crate) fn with(mut self, tenant: &str, weight: u32) -> Self {
        self.overrides.insert(tenant.to_string(), weight);
        self
    }

    /// Every tenant given a weight of its own.
    pub(crate) fn named(&self) -> impl Iterator<Item = &str> {
        self.overrides.keys().map(String::as_str)
    }

    /// The weight of `tenant`.
    pub(crate) fn of(&self, tenant: &str) -> u32 {
        self.overrides.get(tenant).copied().unwrap_or(self.default)
    }
}

/// A tenant's share of the seats, as status and metrics report it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TenantSeats {
    /// The tenant.
    pub tenant: String,
    /// Its weight.
    pub weight: u32,
    /// Seats its requests hold (granted but not yet used included).
    pub in_use: usize,
    /// Its controllers waiting for a seat.
    pub waiting: usize,
    /// Seats it is guaranteed now (its share by weight, at most what its sessions can use).
    pub guaranteed: usize,
    /// Seats granted to it since the manager started.
    pub granted: u64,
    /// Grants that had to wait for a seat to be freed.
    pub waited: u64,
}

/// The manager's dispatch seats.
pub(crate) struct SeatPool {
    /// 0 = unlimited: every request gets a seat at once and nobody ever waits.
    capacity: usize,
    /// Swapped whole when tenant policies change (`set_weights`); read once per call.
    weights: RwLock<Arc<Weights>>,
    inner: Mutex<Inner>,
    next_flow: AtomicU64,
}

#[derive(Default)]
struct Inner {
    in_use: usize,
    /// Start tags of the seats in service (f64 bits; tags are never negative, so the bit
    /// patterns order like the numbers) → how many. The smallest is the virtual time.
    in_service: BTreeMap<u64, usize>,
    /// Virtual time while nothing is in service: the largest finish tag handed out.
    idle_time: f64,
    /// Every tenant that asked for a seat. Kept while idle (a few words each, bounded by the
    /// identities that registered): an idle tenant's old finish tag is behind virtual time and
    /// costs nothing, and its grant counters stay monotonic for `/metrics`.
    tenants: HashMap<Arc<str>, TenantState>,
    /// Seats granted to waiting flows and not yet taken, by flow.
    grants: HashMap<u64, Vec<Grant>>,
    /// What each flow's sessions can hold at once (its demand), by flow, with its tenant.
    demands: HashMap<u64, (Arc<str>, u64)>,
    /// Σ over tenants of the guaranteed seats they are not using: never lent to a borrower.
    unused_guarantees: usize,
    /// Tenants seen so far: the next one's `since`.
    seen: u64,
}

struct TenantState {
    weight: f64,
    /// Finish tag of its last grant.
    finish: f64,
    /// Running estimate of how long its requests hold a seat, in seconds.
    estimate: f64,
    /// Its controllers waiting for a seat, in turn order.
    waiting: VecDeque<Waiter>,
    in_use: usize,
    granted: u64,
    waited: u64,
    /// Σ of its flows' demands: how many seats its sessions could hold at once.
    demand: u64,
    /// Seats guaranteed to it now (see the module docs).
    guaranteed: usize,
    /// When it first asked for a seat (an order, not a time): ties in the guarantees go to
    /// the tenant that was there first.
    since: u64,
}

impl TenantState {
    /// Guaranteed seats it is not using.
    fn unused_guarantee(&self) -> usize {
        self.guaranteed.saturating_sub(self.in_use)
    }
}

struct Waiter {
    flow: u64,
    wake: Arc<Notify>,
}

#[derive(Clone, Copy)]
struct Grant {
    start: f64,
    charge: f64,
    at: Instant,
}

impl Inner {
    fn virtual_time(&self) -> f64 {
        self.in_service
            .keys()
            .next()
            .map_or(self.idle_time, |bits| f64::from_bits(*bits))
    }

    fn tenant(&mut self, tenant: &Arc<str>, weights: &Weights) -> &mut TenantState {
        let since = self.seen;
        if !self.tenants.contains_key(tenant) {
            self.seen += 1;
        }
        self.tenants
            .entry(tenant.clone())
            .or_insert_with(|| TenantState {
                weight: f64::from(weights.of(tenant)),
                finish: 0.0,
                estimate: FIRST_ESTIMATE,
                waiting: VecDeque::new(),
                in_use: 0,
                granted: 0,
                waited: 0,
                demand: 0,
                guaranteed: 0,
                since,
            })
    }

    /// Change `tenant`'s seats in use by `delta`, keeping the unused-guarantee total in step.
    fn add_in_use(&mut self, tenant: &Arc<str>, delta: isize) {
        let Some(t) = self.tenants.get_mut(tenant) else {
            return;
        };
        let before = t.unused_guarantee();
        t.in_use = t.in_use.saturating_add_signed(delta);
        let after = t.unused_guarantee();
        self.unused_guarantees = self.unused_guarantees + after - before;
    }

    /// Whether `tenant` may take one of the free seats now: within its guarantee; or, holding
    /// nothing, if what stays free covers every other tenant's unused guarantee (a turn from the
    /// headroom); or, borrowing, only if what stays free covers those and the headroom too.
    fn may_take(&self, tenant: &str, capacity: usize) -> bool {
        if capacity == 0 {
            return true;
        }
        let free = capacity.saturating_sub(self.in_use);
        if free == 0 {
            return false;
        }
        let headroom = capacity / HEADROOM_DIVISOR;
        let Some(t) = self.tenants.get(tenant) else {
            return free > headroom + self.unused_guarantees;
        };
        if t.in_use < t.guaranteed {
            return true;
        }
        let reserved = self.unused_guarantees - t.unused_guarantee();
        if t.in_use == 0 && t.demand > 0 {
            // The headroom exists for this: a tenant with sessions and no seat (one without a
            // guarantee because there are more tenants than shared seats) gets a turn.
            return free > reserved;
        }
        free > reserved + headroom
    }

    /// Recompute every tenant's guarantee from the weights and demands of the tenants with
    /// sessions. Runs when a demand changes (sessions come, go or change credits), not per
    /// request; O(tenants).
    ///
    /// The guarantees never sum to more than the seats less the headroom, however many tenants
    /// there are: each gets `shared × weight / Σ weights` rounded down, and the seats the
    /// rounding leaves go one each to the largest remainders, ties to the heavier and then to
    /// the tenant that asked first. With more tenants than shared seats, the last to arrive
    /// are guaranteed nothing and get turns from the headroom instead, so a flood of new
    /// tenants (Sybils: one per namespace an attacker may create) cannot take a seat already
    /// guaranteed to a tenant that was there before it.
    fn share_out(&mut self, capacity: usize) {
        let shared = (capacity - capacity / HEADROOM_DIVISOR) as u64;
        let total: u64 = self
            .tenants
            .values()
            .filter(|t| t.demand > 0)
            .map(|t| t.weight as u64)
            .sum();
        let mut shares: Vec<(u64, u64, u64, Arc<str>)> = self
            .tenants
            .iter()
            .filter(|(_, t)| t.demand > 0 && capacity > 0)
            .map(|(name, t)| {
                let exact = shared * t.weight as u64;
                (exact / total, exact % total, t.since, name.clone())
            })
            .collect();
        let leftover = shared.saturating_sub(shares.iter().map(|s| s.0).sum::<u64>());
        // The leftover seats go to the first `leftover` by (remainder desc, arrival): a
        // selection, not a sort, so a session changing its credits costs O(tenants).
        let first = usize::try_from(leftover).unwrap_or(usize::MAX);
        if first > 0 && first < shares.len() {
            shares.select_nth_unstable_by(first, |a, b| b.1.cmp(&a.1).then(a.2.cmp(&b.2)));
        }
        let mut unused = 0;
        for t in self.tenants.values_mut() {
            t.guaranteed = 0;
        }
        for (i, (base, _, _, name)) in shares.into_iter().enumerate() {
            let share = base + u64::from((i as u64) < leftover);
            if let Some(t) = self.tenants.get_mut(&name) {
                t.guaranteed = usize::try_from(share.min(t.demand)).unwrap_or(usize::MAX);
            }
        }
        for t in self.tenants.values() {
            unused += t.unused_guarantee();
        }
        self.unused_guarantees = unused;
    }

    /// Give `tenant` a seat now: tag it and put it in service.
    fn grant(&mut self, tenant: &Arc<str>, weights: &Weights, now: Instant) -> Grant {
        let v = self.virtual_time();
        let t = self.tenant(tenant, weights);
        let start = t.finish.max(v);
        let charge = t.estimate.max(MIN_CHARGE) / t.weight;
        t.finish = start + charge;
        t.granted += 1;
        let finish = t.finish;
        self.add_in_use(tenant, 1);
        self.idle_time = self.idle_time.max(finish);
        self.in_use += 1;
        *self.in_service.entry(start.to_bits()).or_default() += 1;
        Grant {
            start,
            charge,
            at: now,
        }
    }

    /// Take a seat out of service; `held` is how long it was held, or `None` for a grant that
    /// was never used (its charge is refunded).
    fn release(&mut self, tenant: &Arc<str>, grant: Grant, held: Option<f64>) {
        self.in_use = self.in_use.saturating_sub(1);
        let bits = grant.start.to_bits();
        if let Some(n) = self.in_service.get_mut(&bits) {
            *n -= 1;
            if *n == 0 {
                self.in_service.remove(&bits);
            }
        }
        self.add_in_use(tenant, -1);
        if let Some(t) = self.tenants.get_mut(tenant) {
            match held {
                Some(secs) => {
                    // Correct the charge to what the seat really cost, as APF does on completion.
                    t.finish += secs.max(MIN_CHARGE) / t.weight - grant.charge;
                    t.estimate += ESTIMATE_GAIN * (secs - t.estimate);
                }
                None => t.finish -= grant.charge,
            }
        }
    }

    /// Hand free seats to waiting tenants, smallest start tag first.
    fn serve_waiting(&mut self, capacity: usize, weights: &Weights, now: Instant) {
        while capacity == 0 || self.in_use < capacity {
            let v = self.virtual_time();
            let next = self
                .tenants
                .iter()
                .filter(|(name, t)| !t.waiting.is_empty() && self.may_take(name, capacity))
                .min_by(|(a_name, a), (b_name, b)| {
                    let (sa, sb) = (a.finish.max(v), b.finish.max(v));
                    sa.total_cmp(&sb)
                        .then(a.in_use.cmp(&b.in_use))
                        .then(a_name.cmp(b_name))
                })
                .map(|(name, _)| name.clone());
            let Some(tenant) = next else { break };
            let Some(waiter) = self
                .tenants
                .get_mut(&tenant)
                .and_then(|t| t.waiting.pop_front())
            else {
                break;
            };
            let grant = self.grant(&tenant, weights, now);
            if let Some(t) = self.tenants.get_mut(&tenant) {
                t.waited += 1;
            }
            self.grants.entry(waiter.flow).or_default().push(grant);
            waiter.wake.notify_one();
        }
    }
}

impl SeatPool {
    /// `capacity` seats (0 = unlimited) shared by `weights`.
    pub(crate) fn new(capacity: usize, weights: Weights) -> Arc<Self> {
        Arc::new(SeatPool {
            capacity,
            weights: RwLock::new(Arc::new(weights)),
            inner: Mutex::new(Inner::default()),
            next_flow: AtomicU64::new(1),
        })
    }

    #[cfg(test)]
    /// Unlimited seats: nothing waits (tests and embedding without a budget).
    pub(crate) fn unlimited() -> Arc<Self> {
        Self::new(0, Weights::default())
    }

    fn weights(&self) -> Arc<Weights> {
        self.weights.read().clone()
    }

    /// Replace the tenants' weights (tenant policies changed): every tenant known so far takes
    /// its new weight at once, and guarantees are shared out again.
    pub(crate) fn set_weights(&self, weights: Weights) {
        let weights = Arc::new(weights);
        *self.weights.write() = weights.clone();
        let mut inner = self.lock();
        for (name, t) in inner.tenants.iter_mut() {
            t.weight = f64::from(weights.of(name));
        }
        inner.share_out(self.capacity);
        inner.serve_waiting(self.capacity, &weights, Instant::now());
    }

    /// The seat budget (0 = unlimited).
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock()
    }

    /// A flow of requests for `tenant`: one per controller. `wake` is notified when a seat it
    /// waited for has been granted.
    pub(crate) fn flow(self: &Arc<Self>, tenant: &str, wake: Arc<Notify>) -> Flow {
        Flow {
            id: self.next_flow.fetch_add(1, Ordering::Relaxed),
            tenant: Arc::from(tenant),
            seat_pool: self.clone(),
            wake,
        }
    }

    /// Seats per tenant, for status and metrics.
    pub(crate) fn tenants(&self) -> Vec<TenantSeats> {
        let inner = self.lock();
        let mut out: Vec<TenantSeats> = inner
            .tenants
            .iter()
            .map(|(name, t)| TenantSeats {
                tenant: name.to_string(),
                weight: t.weight as u32,
                in_use: t.in_use,
                waiting: t.waiting.len(),
                guaranteed: t.guaranteed,
                granted: t.granted,
                waited: t.waited,
            })
            .collect();
        out.sort_by(|a, b| a.tenant.cmp(&b.tenant));
        out
    }

    #[cfg(test)]
    /// Seats in use across all tenants.
    pub(crate) fn in_use(&self) -> usize {
        self.lock().in_use
    }

    fn release(&self, tenant: &Arc<str>, grant: Grant, held: Option<f64>, now: Instant) {
        let mut inner = self.lock();
        inner.release(tenant, grant, held);
        inner.serve_waiting(self.capacity, &self.weights(), now);
    }
}

/// One controller's claim on seats.
pub(crate) struct Flow {
    id: u64,
    tenant: Arc<str>,
    seat_pool: Arc<SeatPool>,
    wake: Arc<Notify>,
}

impl Flow {
    /// A seat for one request, or `None`: then this flow waits in its tenant's queue and its
    /// `wake` is notified when a seat has been set aside for it. Call only with a request ready
    /// to send, and [`Flow::withdraw`] when no longer wanting one.
    pub(crate) fn acquire(&self) -> Option<Seat> {
        self.acquire_at(Instant::now())
    }

    /// [`Flow::acquire`] with the clock given.
    pub(crate) fn acquire_at(&self, now: Instant) -> Option<Seat> {
        let s = &self.seat_pool;
        let weights = s.weights();
        let mut inner = s.lock();
        let grant = match inner.grants.get_mut(&self.id).and_then(Vec::pop) {
            Some(g) => g,
            None if inner.may_take(&self.tenant, s.capacity) => {
                inner.grant(&self.tenant, &weights, now)
            }
            None => {
                let t = inner.tenant(&self.tenant, &weights);
                if !t.waiting.iter().any(|w| w.flow == self.id) {
                    t.waiting.push_back(Waiter {
                        flow: self.id,
                        wake: self.wake.clone(),
                    });
                }
                return None;
            }
        };
        if inner.grants.get(&self.id).is_some_and(Vec::is_empty) {
            inner.grants.remove(&self.id);
        }
        Some(Seat {
            tenant: self.tenant.clone(),
            seat_pool: s.clone(),
            grant: Some(grant),
        })
    }

    /// Stop waiting and hand back seats granted but not taken (no ready work, not leading, or
    /// no session with credits).
    pub(crate) fn withdraw(&self) {
        self.withdraw_at(Instant::now());
    }

    /// [`Flow::withdraw`] with the clock given.
    pub(crate) fn withdraw_at(&self, now: Instant) {
        let s = &self.seat_pool;
        let weights = s.weights();
        let mut inner = s.lock();
        if let Some(t) = inner.tenants.get_mut(&self.tenant) {
            t.waiting.retain(|w| w.flow != self.id);
        }
        let unused = inner.grants.remove(&self.id).unwrap_or_default();
        if unused.is_empty() {
            return;
        }
        for grant in unused {
            inner.release(&self.tenant, grant, None);
        }
        inner.serve_waiting(s.capacity, &weights, now);
    }

    /// How many seats this flow's sessions could hold at once (their credits, capped by the
    /// controller's max concurrency): what its tenant's guarantee is sized by.
    pub(crate) fn set_demand(&self, demand: u64) {
        self.set_demand_at(demand, Instant::now());
    }

    /// [`Flow::set_demand`] with the clock given.
    pub(crate) fn set_demand_at(&self, demand: u64, now: Instant) {
        let s = &self.seat_pool;
        let weights = s.weights();
        let mut inner = s.lock();
        let old = match demand {
            0 => inner.demands.remove(&self.id),
            d => inner.demands.insert(self.id, (self.tenant.clone(), d)),
        }
        .map_or(0, |(_, d)| d);
        if old == demand {
            return;
        }
        let t = inner.tenant(&self.tenant, &weights);
        t.demand = t.demand - old + demand;
        inner.share_out(s.capacity);
        inner.serve_waiting(s.capacity, &weights, now);
    }

    #[cfg(test)]
    /// Seats granted to this flow and not yet taken.
    pub(crate) fn pending(&self) -> usize {
        self.seat_pool
            .lock()
            .grants
            .get(&self.id)
            .map_or(0, Vec::len)
    }
}

impl Drop for Flow {
    fn drop(&mut self) {
        self.set_demand(0);
        self.withdraw();
    }
}

/// One request's seat: freed, and its tenant charged for the time held, when dropped.
pub(crate) struct Seat {
    tenant: Arc<str>,
    seat_pool: Arc<SeatPool>,
    /// Taken when the seat is freed, so it is freed once.
    grant: Option<Grant>,
}

impl Seat {
    #[cfg(test)]
    /// Free the seat as of `now` (dropping it frees it as of the current time).
    pub(crate) fn release_at(mut self, now: Instant) {
        self.free(now);
    }

    fn free(&mut self, now: Instant) {
        if let Some(grant) = self.grant.take() {
            let held = now.saturating_duration_since(grant.at).as_secs_f64();
            self.seat_pool.release(&self.tenant, grant, Some(held), now);
        }
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        self.free(Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    use std::time::Duration;

    /// Backlogged flows (always wanting another seat) served under a simulated clock: each
    /// seat is held for its flow's fixed time.
    struct Sim {
        flows: Vec<(Flow, Duration)>,
        now: Instant,
        ends: BinaryHeap<Reverse<(Instant, u64)>>,
        seats: HashMap<u64, Seat>,
        next_seat: u64,
        grants: Vec<u64>,
        held: Vec<Duration>,
        order: Vec<usize>,
    }

    impl Sim {
        fn new(seat_pool: &Arc<SeatPool>, flows: &[(&str, Duration)]) -> Sim {
            Sim {
                flows: flows
                    .iter()
                    .map(|(t, d)| (seat_pool.flow(t, Arc::new(Notify::new())), *d))
                    .collect(),
                now: Instant::now(),
                ends: BinaryHeap::new(),
                seats: HashMap::new(),
                next_seat: 0,
                grants: vec![0; flows.len()],
                held: vec![Duration::ZERO; flows.len()],
                order: Vec::new(),
            }
        }

        /// Let every flow in `active` take what it can.
        fn take(&mut self, active: &[usize]) {
            for &i in active {
                while let Some(seat) = self.flows[i].0.acquire_at(self.now) {
                    let id = self.next_seat;
                    self.next_seat += 1;
                    self.ends.push(Reverse((self.now + self.flows[i].1, id)));
                    self.seats.insert(id, seat);
                    self.grants[i] += 1;
                    self.held[i] += self.flows[i].1;
                    self.order.push(i);
                }
            }
        }

        /// Run until `n` more seats have been freed.
        fn run(&mut self, active: &[usize], n: usize) {
            self.take(active);
            for _ in 0..n {
                let Some(Reverse((at, id))) = self.ends.pop() else {
                    return;
                };
                self.now = at;
                if let Some(seat) = self.seats.remove(&id) {
                    seat.release_at(at);
                }
                self.take(active);
            }
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn unlimited_seats_never_wait() {
        let s = SeatPool::unlimited();
        let f = s.flow("a", Arc::new(Notify::new()));
        let seats: Vec<Seat> = (0..10_000).map_while(|_| f.acquire()).collect();
        assert_eq!(seats.len(), 10_000);
        assert_eq!(s.in_use(), 10_000);
        drop(seats);
        assert_eq!(s.in_use(), 0);
    }

    #[test]
    fn the_budget_is_never_exceeded_and_freed_seats_are_reused() {
        let s = SeatPool::new(3, Weights::default());
        let f = s.flow("a", Arc::new(Notify::new()));
        let mut seats: Vec<Seat> = (0..5).map_while(|_| f.acquire()).collect();
        assert_eq!(seats.len(), 3);
        assert!(f.acquire().is_none(), "a fourth seat past a budget of 3");
        seats.pop();
        // The freed seat was set aside for the waiting flow.
        assert_eq!(f.pending(), 1);
        assert!(f.acquire().is_some());
        assert_eq!(s.in_use(), 2, "the taken seat was dropped at once");
    }

    #[test]
    fn a_waiting_tenant_gets_the_next_freed_seat_ahead_of_a_backlogged_one() {
        let s = SeatPool::new(4, Weights::default());
        let wake_b = Arc::new(Notify::new());
        let a = s.flow("tenant-a", Arc::new(Notify::new()));
        let b = s.flow("tenant-b", wake_b.clone());
        let mut a_seats: Vec<Seat> = (0..4).map_while(|_| a.acquire()).collect();
        assert_eq!(a_seats.len(), 4);
        // A has a backlog and waited first; B's single live change arrives after.
        assert!(a.acquire().is_none());
        assert!(b.acquire().is_none());
        a_seats.pop();
        assert_eq!(b.pending(), 1, "the freed seat goes to B");
        assert_eq!(a.pending(), 0);
        assert!(b.acquire().is_some());
        // B's wake was notified: its dispatch task runs without polling.
        let notified = wake_b.notified();
        tokio::pin!(notified);
        assert!(
            futures_util_poll_once(notified.as_mut()),
            "B's controller was not woken"
        );
    }

    /// Poll a future once with a no-op waker.
    fn futures_util_poll_once<F: std::future::Future>(f: std::pin::Pin<&mut F>) -> bool {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        f.poll(&mut cx).is_ready()
    }

    #[test]
    fn weights_share_seats_in_proportion() {
        let weights = Weights::parse(1, ["tenant-b=3"]).expect("weights");
        let s = SeatPool::new(4, weights);
        let mut sim = Sim::new(&s, &[("tenant-a", ms(10)), ("tenant-b", ms(10))]);
        sim.run(&[0, 1], 4_000);
        let (a, b) = (sim.grants[0] as f64, sim.grants[1] as f64);
        let share = b / (a + b);
        assert!(
            (0.72..=0.78).contains(&share),
            "B (weight 3) got {b} of {} grants: share {share:.3}, expected 0.75",
            a + b
        );
    }

    /// A weight changed by a tenant policy takes effect for tenants already running, without
    /// a new pool (no restart).
    #[test]
    fn changed_weights_apply_to_running_tenants() {
        let s = SeatPool::new(4, Weights::default());
        let mut sim = Sim::new(&s, &[("tenant-a", ms(10)), ("tenant-b", ms(10))]);
        sim.run(&[0, 1], 2_000);
        s.set_weights(Weights::default().with("tenant-b", 3));
        let before = (sim.grants[0], sim.grants[1]);
        sim.run(&[0, 1], 4_000);
        let (a, b) = (
            (sim.grants[0] - before.0) as f64,
            (sim.grants[1] - before.1) as f64,
        );
        let share = b / (a + b);
        assert!(
            (0.72..=0.78).contains(&share),
            "after the change B (weight 3) got {b} of {} grants: share {share:.3}, expected 0.75",
            a + b
        );
        let weights: Vec<u32> = s.tenants().iter().map(|t| t.weight).collect();
        assert_eq!(weights, vec![1, 3]);
    }

    #[test]
    fn slow_requests_are_charged_for_the_seat_time_they_hold() {
        let s = SeatPool::new(4, Weights::default());
        // A's reconciles hold a seat 50x longer than B's.
        let mut sim = Sim::new(&s, &[("tenant-a", ms(100)), ("tenant-b", ms(2))]);
        sim.run(&[0, 1], 20_000);
        let (a, b) = (sim.held[0].as_secs_f64(), sim.held[1].as_secs_f64());
        let share = b / (a + b);
        assert!(
            (0.4..=0.6).contains(&share),
            "seat-time A {a:.1}s, B {b:.1}s: B's share {share:.3}, expected about half"
        );
        assert!(
            sim.grants[1] > 20 * sim.grants[0],
            "B got {} grants, A {}",
            sim.grants[1],
            sim.grants[0]
        );
    }

    #[test]
    fn an_idle_tenant_gets_no_credit_for_the_time_it_did_not_use() {
        let s = SeatPool::new(4, Weights::default());
        let mut sim = Sim::new(&s, &[("tenant-a", ms(10)), ("tenant-b", ms(10))]);
        // A alone for a long while, then both are backlogged.
        sim.run(&[0], 2_000);
        let before = sim.order.len();
        sim.run(&[0, 1], 400);
        let after = &sim.order[before..];
        // B may lead by the seats A held when it arrived, then they alternate.
        let longest_b_run = after
            .split(|&i| i == 0)
            .map(<[usize]>::len)
            .max()
            .unwrap_or(0);
        assert!(
            longest_b_run <= 8,
            "B was served {longest_b_run} times in a row after being idle"
        );
        let b_share = after.iter().filter(|&&i| i == 1).count() as f64 / after.len() as f64;
        assert!((0.4..=0.6).contains(&b_share), "B's share {b_share:.3}");
    }

    #[test]
    fn a_withdrawn_grant_goes_to_the_next_waiter() {
        let s = SeatPool::new(1, Weights::default());
        let a = s.flow("tenant-a", Arc::new(Notify::new()));
        let b = s.flow("tenant-b", Arc::new(Notify::new()));
        let c = s.flow("tenant-c", Arc::new(Notify::new()));
        let seat = a.acquire().expect("free seat");
        assert!(b.acquire().is_none());
        assert!(c.acquire().is_none());
        drop(seat);
        let (first, second) = if b.pending() == 1 { (&b, &c) } else { (&c, &b) };
        assert_eq!(first.pending(), 1);
        // The granted flow no longer has work: its seat moves on instead of being lost.
        first.withdraw();
        assert_eq!(second.pending(), 1);
        assert_eq!(s.in_use(), 1);
        drop(second.acquire());
        assert_eq!(s.in_use(), 0);
    }

    #[test]
    fn a_dropped_flow_returns_its_grants() {
        let s = SeatPool::new(1, Weights::default());
        let a = s.flow("tenant-a", Arc::new(Notify::new()));
        let b = s.flow("tenant-b", Arc::new(Notify::new()));
        let seat = a.acquire().expect("free seat");
        assert!(b.acquire().is_none());
        drop(seat);
        assert_eq!(b.pending(), 1);
        drop(b);
        assert_eq!(s.in_use(), 0);
        assert!(a.acquire().is_some());
    }

    /// Take seats for `flow` until it is refused.
    fn take_all(flow: &Flow) -> Vec<Seat> {
        std::iter::from_fn(|| flow.acquire()).take(10_000).collect()
    }

    #[test]
    fn a_tenant_holding_every_seat_it_can_never_keeps_another_from_its_guarantee() {
        let s = SeatPool::new(256, Weights::default());
        let hog = s.flow("hog", Arc::new(Notify::new()));
        hog.set_demand(300);
        let held = take_all(&hog);
        assert_eq!(held.len(), 224, "a lone tenant leaves the headroom free");
        // A tenant arriving while the hog holds all it can, and never answers.
        let b = s.flow("team-b", Arc::new(Notify::new()));
        b.set_demand(4);
        let b_seats = take_all(&b);
        assert_eq!(b_seats.len(), 4, "B gets its whole demand at once");
        assert!(hog.acquire().is_none(), "the hog borrows no further");
        drop(b_seats);
        assert_eq!(take_all(&b).len(), 4, "and gets it again every time");
    }

    #[test]
    fn borrowing_stops_at_the_unused_guarantees_of_others() {
        let s = SeatPool::new(16, Weights::default());
        let a = s.flow("tenant-a", Arc::new(Notify::new()));
        let b = s.flow("tenant-b", Arc::new(Notify::new()));
        a.set_demand(100);
        b.set_demand(4);
        // A's guarantee is 7 of the 14 shared seats; B's 4 and the headroom (2) are kept
        // free.
        let a_seats = take_all(&a);
        assert_eq!(a_seats.len(), 10);
        assert_eq!(take_all(&b).len(), 4);
        drop(a_seats);
        // B's sessions go away: nothing is kept for it any more, A borrows up to the headroom.
        b.set_demand(0);
        assert_eq!(take_all(&a).len(), 14);
    }

    #[test]
    fn a_freed_seat_goes_to_a_waiting_tenant_within_its_guarantee_before_a_borrower() {
        let s = SeatPool::new(8, Weights::default());
        let a = s.flow("tenant-a", Arc::new(Notify::new()));
        let b = s.flow("tenant-b", Arc::new(Notify::new()));
        a.set_demand(100);
        let mut a_seats = take_all(&a);
        assert_eq!(a_seats.len(), 7, "everything but the headroom");
        assert!(
            b.acquire().is_none(),
            "the headroom is for tenants with sessions"
        );
        b.set_demand(4);
        // B is guaranteed 3 of the 7 shared seats: it takes the headroom at once and waits
        // for the rest; A waits to borrow.
        let headroom = take_all(&b);
        assert_eq!(headroom.len(), 1);
        assert!(a.acquire().is_none());
        a_seats.pop();
        assert_eq!(b.pending(), 1, "the freed seat goes to B");
        assert_eq!(a.pending(), 0);
    }

    /// The guarantee of each flow's tenant, in the order given.
    fn guarantees(s: &Arc<SeatPool>, flows: &[Flow]) -> Vec<usize> {
        let by_name: HashMap<String, usize> = s
            .tenants()
            .into_iter()
            .map(|t| (t.tenant, t.guaranteed))
            .collect();
        flows
            .iter()
            .map(|f| by_name.get(&*f.tenant).copied().unwrap_or(0))
            .collect()
    }

    #[test]
    fn guarantees_never_sum_past_the_shared_seats_however_many_tenants() {
        let s = SeatPool::new(256, Weights::default());
        let flows: Vec<Flow> = (0..300)
            .map(|i| {
                let f = s.flow(&format!("t{i:03}"), Arc::new(Notify::new()));
                f.set_demand(1);
                f
            })
            .collect();
        let g = guarantees(&s, &flows);
        assert_eq!(
            g.iter().sum::<usize>(),
            224,
            "256 seats less the 32 of headroom"
        );
        assert!(
            g[..224].iter().all(|&n| n == 1),
            "the first 224 keep one each"
        );
        assert!(
            g[224..].iter().all(|&n| n == 0),
            "later ones get turns, not seats"
        );
        // When the crowd leaves, the guarantees grow back for those still there.
        for f in &flows[10..] {
            f.set_demand(0);
        }
        assert_eq!(
            guarantees(&s, &flows[..10]),
            [1; 10],
            "capped by their demand"
        );
    }

    #[test]
    fn sybil_tenants_cannot_take_a_seat_guaranteed_to_a_tenant_already_there() {
        let s = SeatPool::new(16, Weights::default());
        let b = s.flow("team-b", Arc::new(Notify::new()));
        b.set_demand(4);
        // Sixteen tenants, one per namespace an attacker could create, each holding what it
        // can and never answering.
        let sybils: Vec<Flow> = (0..16)
            .map(|i| {
                let f = s.flow(&format!("sybil-{i:02}"), Arc::new(Notify::new()));
                f.set_demand(1);
                f
            })
            .collect();
        let held: Vec<Seat> = sybils.iter().flat_map(take_all).collect();
        assert_eq!(
            held.len(),
            15,
            "13 guaranteed and 2 turns from the headroom; the last seat is team-b's"
        );
        let b_seats = take_all(&b);
        assert_eq!(b_seats.len(), 1, "team-b keeps its guaranteed seat");
        drop(b_seats);
        assert!(
            sybils.iter().all(|f| f.acquire().is_none()),
            "a seat team-b freed stays team-b's"
        );
        assert_eq!(take_all(&b).len(), 1);
    }

    #[test]
    fn a_tenant_holding_nothing_gets_a_turn_from_the_headroom() {
        let s = SeatPool::new(8, Weights::default());
        let hog = s.flow("hog", Arc::new(Notify::new()));
        hog.set_demand(100);
        let first: Vec<Flow> = (0..7)
            .map(|i| {
                let f = s.flow(&format!("early-{i}"), Arc::new(Notify::new()));
                f.set_demand(1);
                f
            })
            .collect();
        // 7 shared seats for 8 tenants: the hog (first) and six others are guaranteed one.
        let g = guarantees(&s, &first);
        assert_eq!(g, [1, 1, 1, 1, 1, 1, 0]);
        let hog_seats = take_all(&hog);
        assert_eq!(
            hog_seats.len(),
            1,
            "the hog borrows nothing while others are owed"
        );
        let late = &first[6];
        let turn = take_all(late);
        assert_eq!(
            turn.len(),
            1,
            "the one without a guarantee gets the headroom seat"
        );
        assert!(take_all(late).is_empty(), "one turn at a time");
    }

    #[test]
    fn weights_are_read_from_tenant_equals_n() {
        let w = Weights::parse(2, ["system:serviceaccount:team-a:ctrl=5"]).expect("weights");
        assert_eq!(w.of("system:serviceaccount:team-a:ctrl"), 5);
        assert_eq!(w.of("anyone"), 2);
        assert!(matches!(
            Weights::parse(1, ["no-weight"]),
            Err(WeightError::Malformed(_))
        ));
        assert!(matches!(
            Weights::parse(1, ["=3"]),
            Err(WeightError::Malformed(_))
        ));
        assert!(matches!(
            Weights::parse(1, ["a=0"]),
            Err(WeightError::OutOfRange(_))
        ));
        assert!(matches!(
            Weights::parse(1, ["a=x"]),
            Err(WeightError::OutOfRange(_))
        ));
    }
}
