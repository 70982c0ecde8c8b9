//! Fair dispatch between tenants, against the real manager on devcluster with two real tenants
//! (ServiceAccount tokens, RBAC): every tenant with sessions is guaranteed its share of the
//! manager's dispatch seats, so one tenant's backlog cannot hold the seat another tenant's live
//! change needs.

use ctrlhub_tests::rbac::*;
use ctrlhub_tests::*;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenants_backlog_does_not_delay_another_tenants_live_change() {
    // It measures latency: alone, as every test of this binary that measures time.
    let _alone = SERIAL.lock().await;
    let c = start_cluster().await;
    // Two seats for the whole manager, far fewer than tenant A's credits: alone, A's backlog
    // would keep both taken; with B registered, one is B's and A may not borrow it.
    let mut args = RBAC_ARGS.to_vec();
    args.extend(["--max-dispatch-seats", "2"]);
    let m = Manager::start(&c, "fairness", &args).await;
    m.wait_leading().await;
    let a_auth = tenant(&c, "fair-a", "ctl").await;
    let b_auth = tenant(&c, "fair-b", "ctl").await;
    grant_configmaps(&c, "fair-a", "ctl", Some("fair-a")).await;
    grant_configmaps(&c, "fair-b", "ctl", Some("fair-b")).await;
    const BACKLOG: usize = 200;
    for i in 0..BACKLOG {
        put_configmap(&c.client, "fair-a", &format!("cm-{i:03}"), &[("v", "0")]).await;
    }

    let mut a = Replica::connect_with(
        &m.grpc,
        configmaps_in("flood", &["fair-a"]),
        Some(a_auth.as_str()),
    )
    .await
    .expect("tenant A registers");
    let mut b = Replica::connect_with(
        &m.grpc,
        configmaps_in("live", &["fair-b"]),
        Some(b_auth.as_str()),
    )
    .await
    .expect("tenant B registers");

    // A works through its backlog one request at a time, each taking a while: its queue stays
    // long for many seconds, and both seats stay taken by it whenever B has nothing waiting.
    let (progress_tx, progress) = tokio::sync::watch::channel(0usize);
    let a_worker = tokio::spawn(async move {
        let mut done = 0;
        while done < BACKLOG {
            let Some(r) = a.next(PATIENCE).await else {
                break;
            };
            tokio::time::sleep(Duration::from_millis(50)).await;
            a.done(&r.id).await;
            done += 1;
            let _ = progress_tx.send(done);
        }
        done
    });
    wait_for("tenant A is working through its backlog", || {
        let progress = progress.clone();
        async move { *progress.borrow() >= 5 }
    })
    .await;

    put_configmap(&c.client, "fair-b", "live", &[("v", "changed")]).await;
    let r = b.expect().await;
    let a_done_when_b_served = *progress.borrow();
    b.done(&r.id).await;
    assert_eq!(key(&r), "fair-b/live");
    assert!(
        a_done_when_b_served < BACKLOG / 2,
        "B's change was served only after A had finished {a_done_when_b_served} of its \
         {BACKLOG} queued keys"
    );
    // The seat budget bound A (it waited for seats, so the test proved something), and B's
    // guaranteed seat was free when its change came.
    let waits = |t: &'static str| {
        let m = &m;
        async move {
            m.metric(&format!(
                "ctrlhub_dispatch_seat_waits_total{{tenant=\"system:serviceaccounts:{t}\"}}"
            ))
            .await
        }
    };
    assert!(
        waits("fair-a").await >= 1.0,
        "A never waited for a seat: the budget did not bind and the test proved nothing"
    );
    // A's backlog is not lost behind B: it finishes.
    let a_done = a_worker.await.expect("A's worker");
    assert_eq!(a_done, BACKLOG, "A's backlog was not fully reconciled");
}
