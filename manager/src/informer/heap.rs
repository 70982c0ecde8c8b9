//! Giving freed heap back to the operating system after bursts.
//!
//! glibc keeps what a thread freed in that thread's arena and only unmaps the top of each arena,
//! so after an initial list (every object parsed once, transiently) or a drained backlog (every
//! key queued, then done) the manager would stay resident at its high-water mark for as long as
//! it runs, well above what the objects it caches need. `malloc_trim(0)` walks the arenas and
//! returns freed pages with `madvise`. It is called only after such bursts, at most once per
//! [`MIN_INTERVAL`], on a blocking thread: a trim of a large heap takes milliseconds and locks each
//! arena in turn.

use parking_lot::Mutex;
use std::time::{Duration, Instant};

/// Bursts closer together than this share one trim, which runs at the end of the interval so
/// that the last burst is always followed by one.
pub(crate) const MIN_INTERVAL: Duration = Duration::from_secs(2);

struct State {
    last: Option<Instant>,
    pending: bool,
}

static STATE: Mutex<State> = Mutex::new(State {
    last: None,
    pending: false,
});

fn state() -> parking_lot::MutexGuard<'static, State> {
    STATE.lock()
}

/// Ask for freed heap to be returned soon: now, or when [`MIN_INTERVAL`] since the previous trim
/// has passed. Does nothing outside a Tokio runtime.
pub(crate) fn release_after_burst() {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let wait = {
        let mut st = state();
        if st.pending {
            return;
        }
        st.pending = true;
        st.last
            .map(|t| MIN_INTERVAL.saturating_sub(t.elapsed()))
            .unwrap_or_default()
    };
    handle.spawn(async move {
        tokio::time::sleep(wait).await;
        {
            let mut st = state();
            st.pending = false;
            st.last = Some(Instant::now());
        }
        let released = tokio::task::spawn_blocking(trim).await.unwrap_or(false);
        tracing::debug!(released, "returned freed heap to the operating system");
    });
}

/// Return freed pages now; true if glibc gave any back.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[expect(
    unsafe_code,
    reason = "malloc_trim is a C function; this is ctrlhub's only FFI call"
)]
pub(crate) fn trim() -> bool {
    // SAFETY: malloc_trim takes a plain integer, touches only the allocator's own state and is
    // thread-safe; it has no caller-side invariants.
    unsafe { libc::malloc_trim(0) != 0 }
}

/// Other allocators (musl, the macOS allocator) have no equivalent and need none.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn trim() -> bool {
    false
}
