//! Exclusive attempts, the replica's side (docs/protocol.md, "Exclusive attempts"): what a
//! session's handlers and the hold watchdog share ([`SessionState`]), the heartbeats and their
//! anchor ([`Heartbeats`]), and the watchdog thread that exits the process when a handler of a
//! session outlives 80 % of the hold after its anchor ([`watch`]).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use ctrlhub_proto::v1 as pb;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::error;

use crate::ObjectKey;

/// The exit status of a process whose handler still ran at 80 % of the hold after its session's
/// last answered heartbeat (`EX_SOFTWARE`): the manager may hand that key to another replica
/// at the end of the hold, so the process stops itself and Kubernetes restarts it.
pub const HOLD_EXIT_CODE: i32 = 70;

/// How often the watchdog thread looks at the sessions it watches.
const WATCHDOG_TICK: Duration = Duration::from_millis(20);

/// At most this many unanswered heartbeats are remembered (older ones cannot move the anchor
/// forward anyway once a newer one is answered).
const REMEMBERED_BEATS: usize = 64;

/// One session as its handlers, its loop and the watchdog see it.
#[derive(Debug)]
pub(crate) struct SessionState {
    /// `Registered.session_id`.
    pub(crate) id: String,
    /// The controller's name, for log lines.
    controller: String,
    /// Cancelled when the session ends: every handler's token is a child.
    cancel: CancellationToken,
    live: AtomicBool,
    /// `Registered.hold`; `None` when the manager sent none (no heartbeats, no fence).
    hold: Option<Duration>,
    /// When this replica sent the last heartbeat the manager answered.
    anchor: Mutex<Option<Instant>>,
    /// Handlers started and not yet stopped, by request id.
    running: Mutex<HashMap<String, ObjectKey>>,
    /// Requests received and not yet answered or abandoned.
    in_flight: AtomicUsize,
    /// Notified whenever `in_flight` drops to zero.
    idle: Notify,
}

impl SessionState {
    pub(crate) fn new(id: String, controller: String, hold: Option<Duration>) -> Self {
        Self {
            id,
            controller,
            cancel: CancellationToken::new(),
            live: AtomicBool::new(true),
            hold,
            anchor: Mutex::new(None),
            running: Mutex::new(HashMap::new()),
            in_flight: AtomicUsize::new(0),
            idle: Notify::new(),
        }
    }

    /// Whether the session still lives (results may be sent on it).
    pub(crate) fn is_live(&self) -> bool {
        self.live.load(Ordering::Acquire)
    }

    /// Ends the session: no result is sent on it any more and every handler is cancelled.
    pub(crate) fn end(&self) {
        self.live.store(false, Ordering::Release);
        self.cancel.cancel();
    }

    /// A token cancelled when the session ends.
    pub(crate) fn child_token(&self) -> CancellationToken {
        self.cancel.child_token()
    }

    /// The hold the manager announced.
    pub(crate) fn hold(&self) -> Option<Duration> {
        self.hold
    }

    /// The current anchor, if a heartbeat was answered yet.
    pub(crate) fn anchor(&self) -> Option<Instant> {
        *lock(&self.anchor)
    }

    /// Moves the anchor forward to `sent` (never back).
    fn advance_anchor(&self, sent: Instant) {
        let mut anchor = lock(&self.anchor);
        if anchor.is_none_or(|a| a < sent) {
            *anchor = Some(sent);
        }
    }

    /// A handler starts (until the returned guard is dropped).
    pub(crate) fn running(self: &Arc<Self>, id: &str, key: &ObjectKey) -> RunningGuard {
        lock(&self.running).insert(id.to_owned(), key.clone());
        RunningGuard {
            state: self.clone(),
            id: id.to_owned(),
        }
    }

    /// How many handlers of the session run now.
    pub(crate) fn running_count(&self) -> usize {
        lock(&self.running).len()
    }

    /// A request was received (until the returned guard is dropped).
    pub(crate) fn in_flight(self: &Arc<Self>) -> InFlightGuard {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlightGuard(self.clone())
    }

    /// How many requests are received and not yet answered.
    pub(crate) fn in_flight_count(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Resolves once no request of the session is in flight.
    pub(crate) async fn all_answered(&self) {
        loop {
            let notified = self.idle.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.in_flight_count() == 0 {
                return;
            }
            notified.await;
        }
    }

    /// When the watchdog must find no handler running any more: 80 % of the hold after the
    /// anchor (none before the first answer: no handler starts before it).
    fn exit_deadline(&self) -> Option<Instant> {
        let hold = self.hold?;
        Some(self.anchor()? + hold.mul_f64(0.8))
    }
}

/// Marks a handler as running until dropped.
pub(crate) struct RunningGuard {
    state: Arc<SessionState>,
    id: String,
}

impl Drop for RunningGuard {
    fn drop(&mut self) {
        lock(&self.state.running).remove(&self.id);
    }
}

/// Counts a received request as in flight until dropped.
pub(crate) struct InFlightGuard(Arc<SessionState>);

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// A poisoned lock only means another thread panicked while holding it; the data (ids,
/// instants) stays usable.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The heartbeats of one session: nonces sent and when, and the anchor they move.
#[derive(Debug)]
pub(crate) struct Heartbeats {
    state: Arc<SessionState>,
    interval: Option<Duration>,
    /// When `Registered` arrived: the silence check counts from here until the first answer.
    registered_at: Instant,
    next_nonce: u64,
    sent: VecDeque<(u64, Instant)>,
}

impl Heartbeats {
    /// Heartbeats every `interval` (none when the manager sent no interval or no hold).
    pub(crate) fn new(state: Arc<SessionState>, interval: Option<Duration>) -> Self {
        let interval = interval.filter(|i| !i.is_zero() && state.hold.is_some());
        Self {
            state,
            interval,
            registered_at: Instant::now(),
            next_nonce: 1,
            sent: VecDeque::new(),
        }
    }

    /// How often to send one, when the session sends heartbeats at all.
    pub(crate) fn interval(&self) -> Option<Duration> {
        self.interval
    }

    /// Whether handlers may start: a session with a hold starts them only once a heartbeat was
    /// answered, so that its anchor is fresh.
    pub(crate) fn anchored(&self) -> bool {
        self.interval.is_none() || self.state.anchor().is_some()
    }

    /// The next heartbeat to send; its send time is remembered now (a little before it leaves,
    /// which only makes the anchor earlier, never later than the truth).
    pub(crate) fn beat(&mut self) -> pb::ControllerMessage {
        let nonce = self.next_nonce;
        self.next_nonce += 1;
        if self.sent.len() == REMEMBERED_BEATS {
            self.sent.pop_front();
        }
        self.sent.push_back((nonce, Instant::now()));
        pb::ControllerMessage {
            message: Some(pb::controller_message::Message::Heartbeat(pb::Heartbeat {
                nonce,
            })),
        }
    }

    /// The manager echoed `nonce`: the anchor becomes the time it was sent. Unknown nonces
    /// (too old, or never sent) change nothing.
    pub(crate) fn answered(&mut self, nonce: u64) {
        let Some(pos) = self.sent.iter().position(|(n, _)| *n == nonce) else {
            return;
        };
        let (_, sent) = self.sent[pos];
        self.sent.drain(..=pos);
        self.state.advance_anchor(sent);
    }

    /// When the session must end for want of answers: half the hold after the anchor (after
    /// `Registered` until the first answer). `None` without a hold.
    pub(crate) fn silence_deadline(&self) -> Option<Instant> {
        let hold = self.state.hold?;
        self.interval?;
        let base = self.state.anchor().unwrap_or(self.registered_at);
        Some(base + hold / 2)
    }
}

/// The sessions the watchdog thread looks at.
struct Watchdog {
    sessions: Mutex<Vec<Arc<SessionState>>>,
}

/// Has the process-wide watchdog thread look after `state` until the session has ended and no
/// handler of it runs: if one still runs at 80 % of the hold after the anchor, it logs why at
/// ERROR and exits the process with [`HOLD_EXIT_CODE`]. A thread of its own, so that handlers
/// blocking the async runtime cannot hold it up. Sessions without a hold are not watched.
pub(crate) fn watch(state: Arc<SessionState>) {
    if state.hold.is_none() {
        return;
    }
    static WATCHDOG: OnceLock<Arc<Watchdog>> = OnceLock::new();
    let watchdog = WATCHDOG.get_or_init(|| {
        let watchdog = Arc::new(Watchdog {
            sessions: Mutex::new(Vec::new()),
        });
        let looking = watchdog.clone();
        let spawned = std::thread::Builder::new()
            .name("ctrlhub-hold-watchdog".into())
            .spawn(move || looking.run());
        if let Err(err) = spawned {
            // Without the thread the session loop still ends sessions at half the hold and
            // cancels their handlers; only the last resort for stuck blocking code is missing.
            error!("cannot start the hold watchdog thread: {err}");
        }
        watchdog
    });
    lock(&watchdog.sessions).push(state);
}

impl Watchdog {
    fn run(&self) {
        loop {
            std::thread::sleep(WATCHDOG_TICK);
            let now = Instant::now();
            let mut sessions = lock(&self.sessions);
            sessions.retain(|s| s.is_live() || s.running_count() > 0);
            for s in sessions.iter() {
                if let Some(deadline) = s.exit_deadline()
                    && now >= deadline
                    && s.running_count() > 0
                {
                    stop_the_process(s, now);
                }
            }
        }
    }
}

/// A handler of `s` still runs at 80 % of the hold: say why, then exit.
fn stop_the_process(s: &SessionState, now: Instant) -> ! {
    let keys: Vec<String> = lock(&s.running).values().map(ToString::to_string).collect();
    let since = s
        .anchor()
        .map_or(Duration::ZERO, |a| now.saturating_duration_since(a));
    error!(
        controller = %s.controller,
        session_id = %s.id,
        keys = %keys.join(","),
        "exiting the process (status {HOLD_EXIT_CODE}): a reconcile of {} still runs {} after the \
         manager last answered this session's heartbeats, 80% of its hold of {}; it ignored its \
         cancellation (blocking code?), and the manager may hand its key to another replica \
         once the hold is over. Kubernetes restarts the process.",
        keys.join(", "),
        humantime::format_duration(round_ms(since)),
        humantime::format_duration(s.hold.unwrap_or_default()),
    );
    std::process::exit(HOLD_EXIT_CODE);
}

/// `d` to whole milliseconds, for log lines.
pub(crate) fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(hold: Option<Duration>) -> Arc<SessionState> {
        Arc::new(SessionState::new("s".into(), "c".into(), hold))
    }

    #[test]
    fn the_anchor_is_when_the_answered_beat_was_sent() {
        let s = state(Some(Duration::from_secs(2)));
        let mut beats = Heartbeats::new(s.clone(), Some(Duration::from_millis(400)));
        assert!(
            !beats.anchored(),
            "no handler starts before the first answer"
        );
        let before = beats.silence_deadline();
        assert!(before.is_some_and(|d| d <= Instant::now() + Duration::from_secs(1)));
        let _ = beats.beat();
        let sent_1 = beats.sent[0].1;
        let _ = beats.beat();
        let sent_2 = beats.sent[1].1;
        beats.answered(2);
        assert_eq!(s.anchor(), Some(sent_2));
        // A late echo of an older beat never moves the anchor back.
        beats.answered(1);
        assert_eq!(s.anchor(), Some(sent_2));
        assert!(sent_1 <= sent_2 && beats.anchored());
        assert_eq!(
            beats.silence_deadline(),
            Some(sent_2 + Duration::from_secs(1))
        );
        assert_eq!(
            s.exit_deadline(),
            Some(sent_2 + Duration::from_millis(1600))
        );
        beats.answered(99);
        assert_eq!(s.anchor(), Some(sent_2));
    }

    #[test]
    fn without_a_hold_there_are_no_heartbeats() {
        let s = state(None);
        let beats = Heartbeats::new(s.clone(), Some(Duration::from_millis(400)));
        assert_eq!(beats.interval(), None);
        assert!(beats.anchored());
        assert_eq!(beats.silence_deadline(), None);
        assert_eq!(s.exit_deadline(), None);
    }

    #[test]
    fn only_a_bounded_number_of_beats_is_remembered() {
        let s = state(Some(Duration::from_secs(2)));
        let mut beats = Heartbeats::new(s, Some(Duration::from_millis(1)));
        for _ in 0..(REMEMBERED_BEATS * 2) {
            let _ = beats.beat();
        }
        assert_eq!(beats.sent.len(), REMEMBERED_BEATS);
    }

    #[tokio::test]
    async fn guards_count_running_handlers_and_requests() {
        let s = state(Some(Duration::from_secs(2)));
        let key = ObjectKey::new("ns", "a");
        let flight = s.in_flight();
        let running = s.running("1", &key);
        assert_eq!((s.running_count(), s.in_flight_count()), (1, 1));
        drop(running);
        assert_eq!(s.running_count(), 0);
        let waiter = tokio::spawn({
            let s = s.clone();
            async move { s.all_answered().await }
        });
        drop(flight);
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .ok()
            .and_then(Result::ok)
            .expect("all_answered resolves once nothing is in flight");
        assert!(s.is_live());
        let token = s.child_token();
        s.end();
        assert!(!s.is_live() && token.is_cancelled());
    }
}
