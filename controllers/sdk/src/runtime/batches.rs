//! The session's outbound stream, batching results: when the transport asks for the next
//! message, every result that finished while it was busy leaves in one `ResultBatch`
//! (docs/protocol.md, "Batches"). Nothing waits to fill a batch, so batching costs a result no
//! time; it only saves the per-message cost on both sides when results come faster than one
//! message each can carry them.

use ctrlhub_proto::v1::{self as pb, controller_message};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use tokio::sync::mpsc;
use tokio_stream::Stream;

/// The most results one batch carries (the manager's own limit for the other direction).
pub(crate) const MAX_BATCH: u32 = 64;

/// What the session sends, as the transport takes it: results that are ready together go as
/// one `ResultBatch` once the manager said it takes them; everything else, alone and in order.
pub(crate) struct ResultBatches {
    rx: mpsc::Receiver<pb::ControllerMessage>,
    /// Set once `Registered` shows the manager takes batches (an older manager would refuse
    /// the variant).
    enabled: Arc<AtomicBool>,
    /// A message taken while filling a batch that is not a result: it goes next.
    held: Option<pb::ControllerMessage>,
}

impl ResultBatches {
    /// The stream of `rx`'s messages; batches once `enabled` is set.
    pub(crate) fn new(rx: mpsc::Receiver<pb::ControllerMessage>, enabled: Arc<AtomicBool>) -> Self {
        Self {
            rx,
            enabled,
            held: None,
        }
    }

    /// `first` with every result already waiting behind it (up to [`MAX_BATCH`]).
    fn fill(&mut self, first: pb::ReconcileResult) -> pb::ControllerMessage {
        let mut results = vec![first];
        while results.len() < MAX_BATCH as usize {
            match self.rx.try_recv() {
                Ok(pb::ControllerMessage {
                    message: Some(controller_message::Message::Result(r)),
                }) => results.push(r),
                Ok(other) => {
                    self.held = Some(other);
                    break;
                }
                Err(_) => break,
            }
        }
        let message = if results.len() == 1 {
            controller_message::Message::Result(results.remove(0))
        } else {
            controller_message::Message::Results(pb::ResultBatch {
                results,
                acks: Vec::new(),
            })
        };
        pb::ControllerMessage {
            message: Some(message),
        }
    }
}

impl Stream for ResultBatches {
    type Item = pb::ControllerMessage;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if let Some(held) = self.held.take() {
            return Poll::Ready(Some(held));
        }
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(pb::ControllerMessage {
                message: Some(controller_message::Message::Result(first)),
            })) if self.enabled.load(Ordering::Acquire) => Poll::Ready(Some(self.fill(first))),
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_stream::StreamExt;

    fn result(id: &str) -> pb::ControllerMessage {
        pb::ControllerMessage {
            message: Some(controller_message::Message::Result(pb::ReconcileResult {
                id: id.into(),
                outcome: None,
            })),
        }
    }

    fn beat() -> pb::ControllerMessage {
        pb::ControllerMessage {
            message: Some(controller_message::Message::Heartbeat(pb::Heartbeat {
                nonce: 7,
            })),
        }
    }

    /// The ids each message of `stream` carries, until `n` messages were read.
    async fn ids(stream: &mut ResultBatches, n: usize) -> Vec<Vec<String>> {
        let mut out = Vec::new();
        for _ in 0..n {
            let m = stream.next().await.and_then(|m| m.message);
            out.push(match m {
                Some(controller_message::Message::Result(r)) => vec![r.id],
                Some(controller_message::Message::Results(b)) => {
                    b.results.into_iter().map(|r| r.id).collect()
                }
                Some(controller_message::Message::Heartbeat(_)) => vec!["beat".into()],
                other => vec![format!("{other:?}")],
            });
        }
        out
    }

    #[tokio::test]
    async fn ready_results_leave_together_and_other_messages_keep_their_place() {
        let (tx, rx) = mpsc::channel(16);
        let mut stream = ResultBatches::new(rx, Arc::new(AtomicBool::new(true)));
        for m in [result("a"), result("b"), beat(), result("c")] {
            tx.send(m).await.expect("queued");
        }
        assert_eq!(
            ids(&mut stream, 3).await,
            vec![
                vec!["a".to_string(), "b".into()],
                vec!["beat".into()],
                vec!["c".into()]
            ]
        );
    }

    #[tokio::test]
    async fn without_the_managers_consent_every_result_goes_alone() {
        let (tx, rx) = mpsc::channel(16);
        let mut stream = ResultBatches::new(rx, Arc::new(AtomicBool::new(false)));
        for m in [result("a"), result("b")] {
            tx.send(m).await.expect("queued");
        }
        assert_eq!(
            ids(&mut stream, 2).await,
            vec![vec!["a".to_string()], vec!["b".to_string()]]
        );
    }

    #[tokio::test]
    async fn a_batch_stops_at_the_limit() {
        let (tx, rx) = mpsc::channel(200);
        let mut stream = ResultBatches::new(rx, Arc::new(AtomicBool::new(true)));
        for i in 0..(MAX_BATCH + 1) {
            tx.send(result(&i.to_string())).await.expect("queued");
        }
        let sizes: Vec<usize> = ids(&mut stream, 2).await.iter().map(Vec::len).collect();
        assert_eq!(sizes, vec![MAX_BATCH as usize, 1]);
    }
}
