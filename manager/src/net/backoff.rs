//! How long an accept loop pauses after a failed `accept`. Out of file descriptors (EMFILE,
//! ENFILE) or memory, `accept` fails at once every time it is called while the listening socket
//! stays readable: without a pause the loop spins a core and starves everything else on the
//! runtime. Plain data, tested without sockets.

use std::io;
use std::time::Duration;

/// The first pause after a failure that needs one.
const FIRST: Duration = Duration::from_millis(10);
/// The longest pause: a freed descriptor is used within a second.
const LONGEST: Duration = Duration::from_secs(1);

/// What a failed `accept` means for the loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AcceptFailure {
    /// One connection failed on its way in (reset, aborted, interrupted): accept the next at once.
    Connection,
    /// The process or system is out of something (EMFILE, ENFILE, ENOBUFS, ENOMEM, or an error
    /// not known to be about one connection): pause, longer each time.
    Exhausted,
}

impl AcceptFailure {
    /// Classifies an `accept` error.
    pub(crate) fn of(e: &io::Error) -> Self {
        match e.kind() {
            io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionRefused
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock => AcceptFailure::Connection,
            _ => AcceptFailure::Exhausted,
        }
    }

    /// The metrics label (bounded).
    pub(crate) fn label(self) -> &'static str {
        match self {
            AcceptFailure::Connection => "connection",
            AcceptFailure::Exhausted => "exhausted",
        }
    }
}

/// Exponential pause after consecutive exhausted accepts, reset by a successful one.
#[derive(Debug, Default)]
pub(crate) struct AcceptBackoff {
    next: Option<Duration>,
}

impl AcceptBackoff {
    /// How long to pause after `failure`.
    pub(crate) fn failed(&mut self, failure: AcceptFailure) -> Duration {
        match failure {
            AcceptFailure::Connection => Duration::ZERO,
            AcceptFailure::Exhausted => {
                let pause = self.next.unwrap_or(FIRST);
                self.next = Some((pause * 2).min(LONGEST));
                pause
            }
        }
    }

    /// A connection was accepted: the next failure starts from the shortest pause.
    pub(crate) fn succeeded(&mut self) {
        self.next = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn emfile() -> io::Error {
        io::Error::from_raw_os_error(libc::EMFILE)
    }

    #[test]
    fn out_of_descriptors_pauses_longer_each_time_up_to_a_second() {
        let mut b = AcceptBackoff::default();
        let failure = AcceptFailure::of(&emfile());
        assert_eq!(failure, AcceptFailure::Exhausted);
        assert_eq!(
            AcceptFailure::of(&io::Error::from_raw_os_error(libc::ENFILE)),
            AcceptFailure::Exhausted
        );
        let pauses: Vec<Duration> = (0..10).map(|_| b.failed(failure)).collect();
        assert_eq!(pauses[0], FIRST);
        assert!(pauses.windows(2).all(|w| w[1] >= w[0]), "{pauses:?}");
        assert_eq!(pauses[9], LONGEST);
        // A thousand failures in a row are at most one a second: no spinning.
        let total: Duration = (0..1000).map(|_| b.failed(failure)).sum();
        assert!(total >= Duration::from_secs(999), "{total:?}");
        b.succeeded();
        assert_eq!(b.failed(failure), FIRST);
    }

    #[test]
    fn one_failed_connection_does_not_pause_the_loop() {
        let mut b = AcceptBackoff::default();
        let aborted = io::Error::from(io::ErrorKind::ConnectionAborted);
        assert_eq!(AcceptFailure::of(&aborted), AcceptFailure::Connection);
        assert_eq!(b.failed(AcceptFailure::Connection), Duration::ZERO);
        assert_eq!(
            b.failed(AcceptFailure::Exhausted),
            FIRST,
            "not counted as exhaustion"
        );
    }
}
