//! Loopback: the ceiling. The rate at which `ctrlhub.v1.ControllerManager/Connect` streams can
//! carry requests and results over loopback TCP on this machine when nothing else happens: no
//! Kubernetes, no cache, no queue, no reconciler.
//!
//! A tonic server implements `Connect` with an empty handler: after the Register it keeps
//! `credit` requests in flight per stream, answering each result with the next request, as the
//! manager does with a replica's credit. A tonic client answers each request at once with a
//! `done` result. Messages are the throughput scenario's: a [`ReconcileRequest`](pb::ReconcileRequest) carrying the
//! stored Widget's JSON (`include_object`), an id, key, deadline and traceparent, and a
//! [`ReconcileResult`](pb::ReconcileResult) with `done`. Batched, the server sends what is due at once as one
//! `WorkBatch` (at most `max_batch` pieces) and the client answers a batch with one
//! `ResultBatch`, the shape of the manager's and the Rust SDK's batching at its best.
//!
//! The topology is the throughput scenario's: 3 streams (replicas) of 16 credits, each client
//! on a one-thread runtime of its own (as each `bench-sdk-controller` is), the server on the
//! harness' runtime (as the manager runs on a multi-thread runtime).

use super::LOAD_PATIENCE;
use crate::env::{now_micros, widget, widget_name};
use crate::report::{Outcome, Row};
use anyhow::{Context, Result, anyhow, bail};
use ctrlhub_proto::v1 as pb;
use ctrlhub_proto::v1::controller_manager_client::ControllerManagerClient;
use ctrlhub_proto::v1::controller_manager_server::{ControllerManager, ControllerManagerServer};
use pb::{controller_message, manager_message};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Status, Streaming};

/// Streams (replicas) and credits per stream, as in the throughput scenario.
pub const STREAMS: usize = 3;
/// Requests in flight per stream (the SDK's `max_concurrent_reconciles` in throughput).
pub const CREDIT: usize = 16;
/// Pieces per batch at most: the manager's cap (docs/protocol.md, "Batches").
pub const MAX_BATCH: usize = 64;
/// Namespace in the requests' keys and objects.
const NS: &str = "tp-ctrlhub-backlog";

/// What one loopback run moves.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// Requests in all, split evenly over the streams.
    pub total: usize,
    /// Concurrent Connect streams, each on its own connection.
    pub streams: usize,
    /// Requests in flight per stream.
    pub credit: usize,
    /// Pieces per message at most; 1 sends every request and result alone.
    pub max_batch: usize,
}

/// One measured loopback run.
#[derive(Debug, Clone, Copy)]
pub struct LoopbackRun {
    /// The run's shape.
    pub shape: Shape,
    /// From the moment every stream was registered until the last result arrived.
    pub elapsed: Duration,
    /// Messages the server sent (requests alone or batches) after registering.
    pub server_messages: u64,
    /// Messages the client sent (results alone or batches) after registering.
    pub client_messages: u64,
}

impl LoopbackRun {
    /// Requests (and so results) per second.
    pub fn rate(&self) -> f64 {
        self.requests() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Requests answered: `total` rounded down to a multiple of `streams`.
    pub fn requests(&self) -> usize {
        per_stream(&self.shape) * self.shape.streams
    }

    /// Requests per server message.
    pub fn requests_per_message(&self) -> f64 {
        self.requests() as f64 / (self.server_messages.max(1)) as f64
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({"requests": self.requests(), "streams": self.shape.streams,
            "creditPerStream": self.shape.credit, "maxBatch": self.shape.max_batch,
            "seconds": self.elapsed.as_secs_f64(), "requestsPerSecond": self.rate(),
            "serverMessages": self.server_messages, "clientMessages": self.client_messages})
    }
}

fn per_stream(shape: &Shape) -> usize {
    shape.total / shape.streams.max(1)
}

/// The Widget as the manager holds it and sends it with `include_object`: the load generator's
/// object with the metadata the API server fills in (676–681 bytes in the throughput scenario).
pub fn stored_widget_json() -> Vec<u8> {
    let mut w = widget(NS, &widget_name(4242));
    let meta = &mut w["metadata"];
    meta["uid"] = "6f1c0b8e-2d4a-4c6e-9a53-1f0e7d2b9c41".into();
    meta["resourceVersion"] = "104242".into();
    meta["generation"] = 1.into();
    meta["creationTimestamp"] = "2026-11-26T19:30:00Z".into();
    serde_json::to_vec(&w).unwrap_or_default()
}

/// Builds the requests a stream sends: one object, the manager's id and deadline forms.
#[derive(Clone)]
struct Requests {
    object: Arc<Vec<u8>>,
    stream: usize,
}

impl Requests {
    fn request(&self, i: usize) -> pb::ReconcileRequest {
        let deadline = (SystemTime::now() + Duration::from_secs(30))
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        pb::ReconcileRequest {
            id: format!("loopback-{}", self.stream * 1_000_000_000 + i),
            key: Some(pb::ObjectKey {
                namespace: NS.into(),
                name: widget_name(i),
            }),
            attempt: 1,
            reasons: vec![pb::reconcile_request::Reason::InitialList as i32],
            object: Some(pb::reconcile_request::Object::ObjectJson(
                self.object.as_ref().clone(),
            )),
            deadline: Some(prost_types_timestamp(deadline)),
            traceparent: format!("00-{:032x}-{:016x}-01", now_micros(), i + 1),
            tracestate: String::new(),
        }
    }
}

fn prost_types_timestamp(since_epoch: Duration) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: since_epoch.as_secs() as i64,
        nanos: since_epoch.subsec_nanos() as i32,
    }
}

type Reply = mpsc::Sender<Result<pb::ManagerMessage, Status>>;
type Out = Pin<Box<dyn futures::Stream<Item = Result<pb::ManagerMessage, Status>> + Send>>;

/// The server's side of one run, shared by its streams.
struct Plan {
    shape: Shape,
    object: Arc<Vec<u8>>,
    streams: AtomicU64,
    sent: AtomicU64,
    /// Each stream reports once registered.
    registered: mpsc::UnboundedSender<()>,
    /// Set when the clock starts.
    go: watch::Receiver<bool>,
    /// Each stream reports when its last result arrived (or why it failed).
    done: mpsc::UnboundedSender<Result<Instant, String>>,
}

/// `Connect` with an empty handler; `Get` and `List` are not part of the ceiling.
struct EmptyManager {
    plan: Arc<Plan>,
}

#[tonic::async_trait]
impl ControllerManager for EmptyManager {
    type ConnectStream = Out;

    async fn connect(
        &self,
        req: tonic::Request<Streaming<pb::ControllerMessage>>,
    ) -> Result<tonic::Response<Out>, Status> {
        let (to, rx) = mpsc::channel(4 * CREDIT.max(self.plan.shape.credit));
        let plan = self.plan.clone();
        let stream = plan.streams.fetch_add(1, Ordering::Relaxed) as usize;
        let from = req.into_inner();
        tokio::spawn(async move {
            let outcome = serve_stream(&plan, stream, from, &to)
                .await
                .map_err(|e| format!("{e:#}"));
            let _ = plan.done.send(outcome);
        });
        Ok(tonic::Response::new(
            Box::pin(ReceiverStream::new(rx)) as Out
        ))
    }

    async fn get(
        &self,
        _: tonic::Request<pb::GetRequest>,
    ) -> Result<tonic::Response<pb::GetResponse>, Status> {
        Err(Status::unimplemented("not part of the loopback ceiling"))
    }

    async fn list(
        &self,
        _: tonic::Request<pb::ListRequest>,
    ) -> Result<tonic::Response<pb::ListResponse>, Status> {
        Err(Status::unimplemented("not part of the loopback ceiling"))
    }
}

/// One stream, the manager's way: Register → Registered, then keep `credit` requests in flight
/// until this stream's share was answered; returns when the last result arrived.
async fn serve_stream(
    plan: &Plan,
    stream: usize,
    mut from: Streaming<pb::ControllerMessage>,
    to: &Reply,
) -> Result<Instant> {
    let register = match from.message().await? {
        Some(pb::ControllerMessage {
            message: Some(controller_message::Message::Register(r)),
        }) => r,
        other => bail!("expected Register first, got {other:?}"),
    };
    let effective = pb::Register {
        max_batch: register.max_batch.min(plan.shape.max_batch as u32),
        ..*register
    };
    send(
        to,
        manager_message::Message::Registered(Box::new(pb::Registered {
            session_id: format!("loopback-{stream}"),
            effective: Some(effective),
            ..Default::default()
        })),
    )
    .await?;
    let _ = plan.registered.send(());
    let mut go = plan.go.clone();
    go.wait_for(|go| *go).await?;
    let mut work = Work {
        requests: Requests {
            object: plan.object.clone(),
            stream,
        },
        quota: per_stream(&plan.shape),
        sent: 0,
        max_batch: plan.shape.max_batch,
    };
    let mut answered = 0;
    plan.sent
        .fetch_add(work.send(plan.shape.credit, to).await?, Ordering::Relaxed);
    while answered < work.quota {
        let Some(msg) = from.message().await? else {
            bail!("the client closed the stream after {answered} results");
        };
        let n = results_in(&msg);
        answered += n;
        plan.sent
            .fetch_add(work.send(n, to).await?, Ordering::Relaxed);
    }
    Ok(Instant::now())
}

/// Results a controller message carries (a heartbeat or credit carries none).
fn results_in(msg: &pb::ControllerMessage) -> usize {
    match &msg.message {
        Some(controller_message::Message::Result(_)) => 1,
        Some(controller_message::Message::Results(b)) => b.results.len(),
        _ => 0,
    }
}

/// The requests of one stream still to send.
struct Work {
    requests: Requests,
    quota: usize,
    sent: usize,
    max_batch: usize,
}

impl Work {
    /// Send up to `n` more requests (fewer once the quota is reached): alone when unbatched or
    /// when one is due, else in batches of at most `max_batch`. Returns the messages sent.
    async fn send(&mut self, n: usize, to: &Reply) -> Result<u64> {
        let n = n.min(self.quota - self.sent);
        let mut messages = 0;
        let mut left = n;
        while left > 0 {
            let size = if self.max_batch > 1 {
                left.min(self.max_batch)
            } else {
                1
            };
            let msg = if size == 1 {
                manager_message::Message::Reconcile(self.requests.request(self.sent))
            } else {
                manager_message::Message::Batch(pb::WorkBatch {
                    requests: (self.sent..self.sent + size)
                        .map(|i| self.requests.request(i))
                        .collect(),
                    events: Vec::new(),
                })
            };
            self.sent += size;
            left -= size;
            send(to, msg).await?;
            messages += 1;
        }
        Ok(messages)
    }
}

async fn send(to: &Reply, m: manager_message::Message) -> Result<()> {
    to.send(Ok(pb::ManagerMessage { message: Some(m) }))
        .await
        .map_err(|_| anyhow!("the response stream is gone"))
}

/// A client stream: register asking for `max_batch`, then answer every request at once with a
/// `done` result (a batch with one `ResultBatch`) until the server ends the stream. Returns the
/// messages it sent after the Register.
async fn client(addr: String, max_batch: usize) -> Result<u64> {
    let channel = tonic::transport::Endpoint::from_shared(addr)?
        .tcp_nodelay(true)
        .connect()
        .await
        .context("connecting to the loopback server")?;
    let mut client = ControllerManagerClient::new(channel);
    let (tx, rx) = mpsc::channel(4 * CREDIT);
    let register = pb::Register {
        controller_name: "loopback".into(),
        max_batch: max_batch as u32,
        include_object: true,
        ..Default::default()
    };
    answer(
        &tx,
        controller_message::Message::Register(Box::new(register)),
    )
    .await?;
    let mut inbound = client.connect(ReceiverStream::new(rx)).await?.into_inner();
    let mut sent = 0;
    while let Some(msg) = inbound.message().await? {
        let reply = match msg.message {
            Some(manager_message::Message::Reconcile(r)) => {
                controller_message::Message::Result(done(r.id))
            }
            Some(manager_message::Message::Batch(b)) => {
                controller_message::Message::Results(pb::ResultBatch {
                    results: b.requests.into_iter().map(|r| done(r.id)).collect(),
                    acks: Vec::new(),
                })
            }
            _ => continue,
        };
        answer(&tx, reply).await?;
        sent += 1;
    }
    Ok(sent)
}

fn done(id: String) -> pb::ReconcileResult {
    pb::ReconcileResult {
        id,
        outcome: Some(pb::reconcile_result::Outcome::Done(
            pb::reconcile_result::Done {},
        )),
    }
}

async fn answer(
    tx: &mpsc::Sender<pb::ControllerMessage>,
    m: controller_message::Message,
) -> Result<()> {
    tx.send(pb::ControllerMessage { message: Some(m) })
        .await
        .map_err(|_| anyhow!("the request stream is gone"))
}

/// A client stream on a one-thread runtime of its own thread, like a `bench-sdk-controller`;
/// its outcome arrives on the returned receiver.
fn spawn_client(addr: String, max_batch: usize) -> oneshot::Receiver<Result<u64>> {
    let (tx, rx) = oneshot::channel();
    std::thread::spawn(move || {
        let outcome = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(anyhow::Error::from)
            .and_then(|rt| rt.block_on(client(addr, max_batch)));
        let _ = tx.send(outcome);
    });
    rx
}

/// The server on the caller's runtime, serving until the returned handle is aborted.
fn serve(plan: Arc<Plan>) -> Result<(String, tokio::task::JoinHandle<()>)> {
    let incoming = tonic::transport::server::TcpIncoming::bind(([127, 0, 0, 1], 0).into())
        .map_err(|e| anyhow!("binding the loopback server: {e}"))?
        .with_nodelay(Some(true));
    let addr = incoming.local_addr()?;
    let server = tonic::transport::Server::builder()
        .add_service(ControllerManagerServer::new(EmptyManager { plan }))
        .serve_with_incoming(incoming);
    let task = tokio::spawn(async move {
        let _ = server.await;
    });
    Ok((format!("http://{addr}"), task))
}

/// Once all `streams` registered, start the clock and let them go; returns the time until the
/// last stream's last result.
async fn clock(
    streams: usize,
    registered: &mut mpsc::UnboundedReceiver<()>,
    go: watch::Sender<bool>,
    done: &mut mpsc::UnboundedReceiver<Result<Instant, String>>,
) -> Result<Duration> {
    for _ in 0..streams {
        registered.recv().await.context("the server stopped")?;
    }
    let start = Instant::now();
    go.send(true)?;
    let mut last = start;
    for _ in 0..streams {
        let end = done.recv().await.context("the server stopped")?;
        last = last.max(end.map_err(|e| anyhow!("a loopback stream failed: {e}"))?);
    }
    Ok(last.duration_since(start))
}

/// Measure one loopback run of `shape`.
pub async fn measure(shape: Shape) -> Result<LoopbackRun> {
    let (registered_tx, mut registered) = mpsc::unbounded_channel();
    let (done_tx, mut done) = mpsc::unbounded_channel();
    let (go_tx, go) = watch::channel(false);
    let plan = Arc::new(Plan {
        shape,
        object: Arc::new(stored_widget_json()),
        streams: AtomicU64::new(0),
        sent: AtomicU64::new(0),
        registered: registered_tx,
        go,
        done: done_tx,
    });
    let (addr, server) = serve(plan.clone())?;
    let clients: Vec<_> = (0..shape.streams)
        .map(|_| spawn_client(addr.clone(), shape.max_batch))
        .collect();
    let timed = tokio::time::timeout(LOAD_PATIENCE, async {
        let elapsed = clock(shape.streams, &mut registered, go_tx, &mut done).await?;
        // The clients end when the server ends their streams, so the server stays up until then.
        let mut client_messages = 0;
        for c in clients {
            client_messages += c.await.context("a client thread died")??;
        }
        anyhow::Ok((elapsed, client_messages))
    })
    .await;
    server.abort();
    let (elapsed, client_messages) =
        timed.map_err(|_| anyhow!("loopback run took over {LOAD_PATIENCE:?}"))??;
    Ok(LoopbackRun {
        shape,
        elapsed,
        server_messages: plan.sent.load(Ordering::Relaxed),
        client_messages,
    })
}

/// The unbatched and batched ceilings with `total` requests each.
#[derive(Debug, Clone, Copy)]
pub struct Ceiling {
    /// Every request and result alone.
    pub unbatched: LoopbackRun,
    /// Up to [`MAX_BATCH`] per message.
    pub batched: LoopbackRun,
}

/// Measure both ceilings with `total` requests each, 3 streams × 16 in flight.
pub async fn measure_ceiling(total: usize) -> Result<Ceiling> {
    let shape = |max_batch| Shape {
        total,
        streams: STREAMS,
        credit: CREDIT,
        max_batch,
    };
    let unbatched = measure(shape(1)).await?;
    eprintln!("  unbatched {:>9.0} req/s", unbatched.rate());
    let batched = measure(shape(MAX_BATCH)).await?;
    eprintln!(
        "  batched   {:>9.0} req/s ({:.1} requests per message)",
        batched.rate(),
        batched.requests_per_message()
    );
    Ok(Ceiling { unbatched, batched })
}

/// ctrlhub's throughput figures (objects per second) from a throughput run of the same
/// invocation, to express as a fraction of the ceiling.
#[derive(Debug, Clone, Copy)]
pub struct ThroughputRates {
    /// ctrlhub, live.
    pub live: f64,
    /// ctrlhub, from a backlog.
    pub backlog: f64,
}

impl ThroughputRates {
    /// The rates out of the throughput scenario's results (`ctrlhub.live` and
    /// `ctrlhub.backlog`), if it ran.
    pub fn from_outcome(o: &Outcome) -> Option<ThroughputRates> {
        if o.scenario != "throughput" {
            return None;
        }
        let rate = |run: &str| o.json["ctrlhub"][run]["objectsPerSecond"].as_f64();
        Some(ThroughputRates {
            live: rate("live")?,
            backlog: rate("backlog")?,
        })
    }
}

/// "123456 (1.62 s)": requests per second and the seconds they took.
fn cell(run: &LoopbackRun) -> String {
    format!("{:.0} ({:.2} s)", run.rate(), run.elapsed.as_secs_f64())
}

/// The rows: both ceilings, the batches' mean size, and the throughput run's fraction of them.
pub fn rows(c: &Ceiling, throughput: Option<ThroughputRates>) -> Vec<Row> {
    let n = c.batched.requests();
    let mut rows = vec![
        Row::info(
            "loopback",
            &format!("unbatched, {n} requests, {STREAMS} streams × {CREDIT}: req/s (s)"),
            cell(&c.unbatched),
            "",
        ),
        Row::info(
            "loopback",
            &format!("batched (≤ {MAX_BATCH}), {n} requests: req/s (s)"),
            cell(&c.batched),
            "",
        ),
        Row::info(
            "loopback",
            "  requests per message, batched",
            format!("{:.1}", c.batched.requests_per_message()),
            "",
        ),
    ];
    if let Some(t) = throughput {
        for (name, ceiling) in [("batched", &c.batched), ("unbatched", &c.unbatched)] {
            rows.push(Row::info(
                "loopback",
                &format!("throughput live / backlog as a fraction of the {name} ceiling"),
                format!(
                    "{:.3} / {:.3}",
                    t.live / ceiling.rate(),
                    t.backlog / ceiling.rate()
                ),
                "",
            ));
        }
    }
    rows
}

/// The scenario: both ceilings with `total` requests each; with `throughput` (ctrlhub's rates
/// from the same invocation) also the fraction of the ceiling they reach.
pub async fn run(total: usize, throughput: Option<ThroughputRates>) -> Result<Outcome> {
    eprintln!("loopback: {total} requests per run, {STREAMS} streams × {CREDIT} in flight");
    let c = measure_ceiling(total).await?;
    let mut json =
        serde_json::json!({"unbatched": c.unbatched.json(), "batched": c.batched.json()});
    if let Some(t) = throughput {
        json["fractionOfBatched"] = serde_json::json!({"live": t.live / c.batched.rate(),
            "backlog": t.backlog / c.batched.rate()});
        json["fractionOfUnbatched"] = serde_json::json!({"live": t.live / c.unbatched.rate(),
            "backlog": t.backlog / c.unbatched.rate()});
    }
    Ok(Outcome {
        scenario: "loopback".into(),
        rows: rows(&c, throughput),
        json,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_carry_an_object_the_size_of_the_throughput_scenarios() {
        let len = stored_widget_json().len();
        assert!((650..=720).contains(&len), "{len} bytes");
    }

    fn run(rate: u64) -> LoopbackRun {
        LoopbackRun {
            shape: Shape {
                total: rate as usize,
                streams: 1,
                credit: 16,
                max_batch: 1,
            },
            elapsed: Duration::from_secs(1),
            server_messages: rate,
            client_messages: rate,
        }
    }

    #[test]
    fn the_throughput_rates_become_fractions_of_each_ceiling() {
        let throughput = Outcome {
            scenario: "throughput".into(),
            rows: Vec::new(),
            json: serde_json::json!({"ctrlhub": {"live": {"objectsPerSecond": 5000.0},
                "backlog": {"objectsPerSecond": 10000.0}}}),
        };
        let rates = ThroughputRates::from_outcome(&throughput).expect("rates");
        let other = Outcome {
            scenario: "latency".into(),
            ..throughput.clone()
        };
        assert!(ThroughputRates::from_outcome(&other).is_none());
        let ceiling = Ceiling {
            unbatched: run(100_000),
            batched: run(200_000),
        };
        let fractions: Vec<_> = rows(&ceiling, Some(rates))
            .into_iter()
            .filter(|r| r.metric.contains("fraction"))
            .map(|r| r.ctrlhub)
            .collect();
        assert_eq!(fractions, ["0.025 / 0.050", "0.050 / 0.100"]);
        assert_eq!(rows(&ceiling, None).len(), 3);
    }

    #[test]
    fn a_run_counts_whole_shares_per_stream() {
        let run = LoopbackRun {
            shape: Shape {
                total: 100,
                streams: 3,
                credit: 16,
                max_batch: 1,
            },
            elapsed: Duration::from_secs(1),
            server_messages: 99,
            client_messages: 99,
        };
        assert_eq!(run.requests(), 99);
        assert_eq!(run.rate(), 99.0);
        assert_eq!(run.requests_per_message(), 1.0);
    }
}
