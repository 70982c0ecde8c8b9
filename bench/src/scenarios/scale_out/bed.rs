//! The test bed of the ring phases: devcluster, the live members in start order, the
//! controllers' replicas and their log, and steady updates over every controller's namespace.

use super::figures::{Plan, Steady};
use super::replicas::Shared;
use super::ring::{self, addr, expected, owners};
use crate::env::{Cluster, Manager, load};
use anyhow::{Result, bail};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Steady updates over every controller namespace until stopped.
pub(super) struct Load {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    pub(super) tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    pub(super) fn start(c: &Cluster, namespaces: &[String], objects: usize, rate: u32) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let each = (rate / namespaces.len().max(1) as u32).max(1);
        let tasks = namespaces
            .iter()
            .map(|ns| {
                let (client, ns) = (c.client.clone(), ns.clone());
                let (stop, sent) = (stop.clone(), sent.clone());
                let errors = Arc::new(AtomicU64::new(0));
                tokio::spawn(
                    async move { load(&client, &ns, objects, each, stop, sent, errors).await },
                )
            })
            .collect();
        Load { stop, sent, tasks }
    }

    pub(super) async fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            let _ = t.await;
        }
        self.sent.load(Ordering::Relaxed)
    }
}

/// The test bed: devcluster, the live members, the replicas and their log.
pub(super) struct Bed {
    pub(super) c: Cluster,
    pub(super) plan: Plan,
    pub(super) names: Vec<String>,
    pub(super) namespaces: Vec<String>,
    pub(super) members: Vec<Manager>,
    pub(super) log: Shared,
    pub(super) tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Bed {
    pub(super) fn refs(&self) -> Vec<&Manager> {
        self.members.iter().collect()
    }

    pub(super) fn want(&self) -> BTreeMap<String, String> {
        expected("ctrlhub", &self.names, &self.refs())
    }

    /// The "Service": replicas without an address to go to dial the live members in turn.
    pub(super) fn serve_members(&self) {
        self.log.lock().members = self.members.iter().map(addr).collect();
    }

    /// Starts member `identity` and waits until every member publishes the new view.
    pub(super) async fn add_member(&mut self, identity: &str) -> Result<()> {
        let m = ring::member(&self.c, identity, "ctrlhub").await?;
        self.members.push(m);
        self.serve_members();
        ring::settled(&self.refs()).await
    }

    /// [`Bed::add_member`], then every unit owned where the function says.
    pub(super) async fn join(&mut self, identity: &str) -> Result<()> {
        self.add_member(identity).await?;
        self.settle().await
    }

    /// The ring settled and every unit owned where the function says.
    pub(super) async fn settle(&self) -> Result<()> {
        ring::settled(&self.refs()).await?;
        ring::wait_owned(&self.refs(), &self.want()).await
    }

    /// Until no key is in flight and nothing was dispatched for 500 ms.
    pub(super) async fn quiet(&self) -> Result<()> {
        let start = Instant::now();
        loop {
            let before = self.log.lock().dispatched;
            tokio::time::sleep(Duration::from_millis(500)).await;
            let l = self.log.lock();
            if l.in_flight() == 0 && l.dispatched == before {
                return Ok(());
            }
            if start.elapsed() > super::super::LOAD_PATIENCE {
                bail!("dispatch never went quiet");
            }
        }
    }

    pub(super) async fn counters(&self) -> Result<Vec<(f64, f64)>> {
        let mut out = Vec::new();
        for m in &self.members {
            out.push(ring::counters(m).await?);
        }
        Ok(out)
    }

    /// The figures of the settled ring at its current size.
    pub(super) async fn steady(&self) -> Result<Steady> {
        let n = self.members.len();
        eprintln!("scale-out: N = {n}");
        let want = self.want();
        let got = owners(&self.refs(), &self.names).await;
        self.quiet().await?;
        let (cpu0, (w0, r0), t) = (
            self.counters().await?,
            ring::lease_requests(&self.c),
            Instant::now(),
        );
        tokio::time::sleep(self.plan.idle).await;
        let (cpu1, (w1, r1)) = (self.counters().await?, ring::lease_requests(&self.c));
        let idle = t.elapsed().as_secs_f64();
        let per_member = |d: u64| d as f64 / idle / n as f64;
        let (lease_writes, lease_reads) = (per_member(w1 - w0), per_member(r1 - r0));
        let t = Instant::now();
        let load = Load::start(&self.c, &self.namespaces, self.plan.objects, self.plan.rate);
        tokio::time::sleep(self.plan.load).await;
        load.stop().await;
        self.quiet().await?;
        let cpu2 = self.counters().await?;
        let busy = t.elapsed().as_secs_f64();
        let mut members = Vec::new();
        let mut reconciles = 0.0;
        for (i, m) in self.members.iter().enumerate() {
            let units = got.values().filter(|o| **o == m.identity).count();
            let under_load = (cpu2[i].0 - cpu1[i].0, cpu2[i].1 - cpu1[i].1);
            reconciles += under_load.1;
            let idle_ms = (cpu1[i].0 - cpu0[i].0) * 1e3 / idle;
            members.push((m.identity.clone(), units, under_load, idle_ms));
        }
        Ok(Steady {
            members,
            matches: got == want,
            lease_writes,
            lease_reads,
            lease_bytes: ring::lease_bytes(&self.c, "ctrlhub").await?,
            reconciles_per_s: reconciles / busy,
        })
    }

    /// Who owns what now, by `/status`.
    pub(super) async fn owners(&self) -> BTreeMap<String, String> {
        owners(&self.refs(), &self.names).await
    }

    /// Waits until each of `units` had a first dispatch at a member other than `from` after
    /// `t0`.
    pub(super) async fn wait_dispatched_elsewhere(
        &self,
        units: &BTreeSet<String>,
        from: &str,
        t0: Instant,
    ) -> Result<()> {
        ctrlhub_tests::poll_until(
            "every moved unit dispatched at its successor",
            ctrlhub_tests::PATIENCE,
            || async {
                let l = self.log.lock();
                let left = units
                    .iter()
                    .filter(|u| l.first_dispatch_at(u, t0, |m| m != from).is_none())
                    .count();
                if left == 0 {
                    Ok(())
                } else {
                    Err(format!("{left} not yet"))
                }
            },
        )
        .await?;
        Ok(())
    }
}
