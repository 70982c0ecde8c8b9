//! The scenario's table rows, with the goals of design §6.2.

use super::costs::{Config, Memory};
use super::figures::{Change, Figures, Steady};
use super::ring::LEASE;
use crate::report::{Row, Verdict, mib, percentiles};
use std::time::Duration;

fn pct(v: &[Duration]) -> (Duration, Duration) {
    let mut v = v.to_vec();
    let (p50, p99, _) = percentiles(&mut v);
    (p50, p99)
}

fn secs2(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

/// The rows of one ring size.
fn steady_rows(s: &Steady, base: Option<&Steady>) -> Vec<Row> {
    let n = s.members.len();
    let units = s
        .members
        .iter()
        .map(|m| m.1.to_string())
        .collect::<Vec<_>>()
        .join(" / ");
    let per_member = s
        .members
        .iter()
        .map(|m| {
            if m.2.1 > 0.0 {
                format!("{:.0}", m.2.0 * 1e6 / m.2.1)
            } else {
                "–".into()
            }
        })
        .collect::<Vec<_>>()
        .join(" / ");
    let idle = s
        .members
        .iter()
        .map(|m| format!("{:.1}", m.3))
        .collect::<Vec<_>>()
        .join(" / ");
    let idle_max = s.members.iter().map(|m| m.3).fold(0.0, f64::max);
    let mut rows = vec![
        Row::new(
            "scale-out",
            &format!("N={n}: units per member (/status)"),
            units,
            "",
            "= hrw::owner",
            Verdict::of(s.matches),
        ),
        Row::info(
            "scale-out",
            &format!("N={n}: CPU-ms per 1,000 reconciles, per member"),
            per_member,
            "",
        ),
    ];
    let all = s.cpu_per_1k();
    rows.push(match base {
        Some(b) => {
            let ratio = all / b.cpu_per_1k();
            Row::new(
                "scale-out",
                &format!("N={n}: CPU-ms per 1,000 reconciles, all members"),
                format!("{all:.0} ({ratio:.2}× N=1)"),
                "",
                "within ±15% of N=1",
                Verdict::of((0.85..=1.15).contains(&ratio)),
            )
        }
        None => Row::info(
            "scale-out",
            &format!("N={n}: CPU-ms per 1,000 reconciles, all members"),
            format!("{all:.0}"),
            "",
        ),
    });
    rows.push(Row::info(
        "scale-out",
        &format!("N={n}: reconciles/s under the updates (all members)"),
        format!("{:.0}", s.reconciles_per_s),
        "",
    ));
    rows.push(Row::new(
        "scale-out",
        &format!("N={n}: idle CPU-ms/s per member"),
        idle,
        "",
        "≤ 5",
        Verdict::of(idle_max <= 5.0),
    ));
    rows.push(Row::new(
        "scale-out",
        &format!("N={n}: member-Lease writes/s per member (reads/s; Lease size)"),
        format!(
            "{:.2} ({:.2}; {} B per Lease)",
            s.lease_writes, s.lease_reads, s.lease_bytes
        ),
        "",
        "≤ 1 per 500 ms retry (2/s)",
        Verdict::of(s.lease_writes <= 2.05),
    ));
    rows
}

/// The rows of one membership change.
fn change_rows(what: &str, ch: &Change, seal: &str, dispatch: &str, crash: bool) -> Vec<Row> {
    let mut rows = vec![
        Row::new(
            "scale-out",
            &format!("{what}: units moved (HRW set)"),
            format!("{} ({})", ch.moved, ch.expected),
            "",
            "= HRW set",
            Verdict::of(ch.moved == ch.expected && ch.collateral == 0),
        ),
        Row::new(
            "scale-out",
            &format!("{what}: collateral moves"),
            ch.collateral.to_string(),
            "",
            "0",
            Verdict::of(ch.collateral == 0),
        ),
    ];
    if !crash {
        let (p50, p99) = pct(&ch.seal);
        rows.push(Row::info(
            "scale-out",
            &format!("{what}: {seal} p50 / p99 ({} units)", ch.seal.len()),
            format!("{} / {}", secs2(p50), secs2(p99)),
            "",
        ));
    }
    let (p50, p99) = pct(&ch.to_dispatch);
    let row = if crash {
        let x = p99.saturating_sub(LEASE);
        Row::new(
            "scale-out",
            &format!(
                "{what}: {dispatch} p50 / p99 ({} units)",
                ch.to_dispatch.len()
            ),
            format!(
                "{} / {} (lease 3 s + {:.2} s)",
                secs2(p50),
                secs2(p99),
                x.as_secs_f64()
            ),
            "",
            "≤ lease 3 s + 2 s",
            Verdict::of(
                p99 <= LEASE + Duration::from_secs(2) && ch.to_dispatch.len() == ch.expected,
            ),
        )
    } else {
        Row::new(
            "scale-out",
            &format!(
                "{what}: {dispatch} p50 / p99 ({} units)",
                ch.to_dispatch.len()
            ),
            format!("{} / {}", secs2(p50), secs2(p99)),
            "",
            "p99 ≤ 1 s",
            Verdict::of(p99 <= Duration::from_secs(1) && ch.to_dispatch.len() == ch.expected),
        )
    };
    rows.push(row);
    rows
}

/// The memory rows: per-member RSS per config and N; D's goal from design §6.2.
fn memory_rows(mem: &[Memory]) -> Vec<Row> {
    let mut rows = Vec::new();
    for m in mem {
        let rss = m
            .per_member
            .iter()
            .zip(&m.held)
            .map(|((u, _, r), (i, o))| format!("{} ({u} u, {i} inf, {o} obj)", mib(*r)))
            .collect::<Vec<_>>()
            .join(" / ");
        rows.push(Row::info(
            "scale-out",
            &format!(
                "memory {}, N={}: RSS per member (units, informers, objects)",
                m.config.letter(),
                m.members
            ),
            rss,
            "",
        ));
    }
    let one = mem
        .iter()
        .find(|m| m.config == Config::Disjoint && m.members == 1);
    let three = mem
        .iter()
        .find(|m| m.config == Config::Disjoint && m.members == 3);
    if let (Some(one), Some(three)) = (one, three) {
        // Each member's cache growth over its own baseline B, against its share of N = 1's
        // growth (design §6.2: RSS_m − B ≤ 1.2 × U_m/U × (RSS_1 − B)); members without units
        // have no share to compare with and are left out.
        let (u1, b1, r1) = one.per_member[0];
        let growth1 = r1.saturating_sub(b1) as f64;
        let ratios: Vec<f64> = three
            .per_member
            .iter()
            .filter(|(u, _, _)| *u > 0)
            .map(|(u, b, r)| {
                r.saturating_sub(*b) as f64 / (*u as f64 / u1.max(1) as f64 * growth1).max(1.0)
            })
            .collect();
        let worst = ratios.iter().copied().fold(0.0, f64::max);
        let text = ratios
            .iter()
            .map(|r| format!("{r:.2}"))
            .collect::<Vec<_>>()
            .join(" / ");
        rows.push(Row::new(
            "scale-out",
            "memory D, N=3: (RSS_m − B) ÷ (U_m/U × (RSS_1 − B)), members with units",
            text,
            "",
            "≤ 1.2",
            Verdict::of(worst <= 1.2),
        ));
    }
    rows
}

/// Every row of a run.
pub(super) fn rows(f: &Figures) -> Vec<Row> {
    let mut rows = Vec::new();
    for (i, s) in f.steady.iter().enumerate() {
        rows.extend(steady_rows(s, (i > 0).then(|| &f.steady[0])));
    }
    rows.extend(change_rows(
        "join 2→3",
        &f.join,
        "seal (old owner's /status)",
        "Revoked → first dispatch at the joiner",
        false,
    ));
    rows.extend(change_rows(
        "leave 3→2 (SIGTERM)",
        &f.leave,
        "SIGTERM → Revoked",
        "Revoked → first dispatch at the successor",
        false,
    ));
    rows.extend(change_rows(
        "crash 3→2 (SIGKILL)",
        &f.crash,
        "",
        "kill → first dispatch at the successor",
        true,
    ));
    rows.push(Row::new(
        "scale-out",
        "keys dispatched to two replicas at once",
        f.overlaps.to_string(),
        "",
        "0",
        Verdict::of(f.overlaps == 0),
    ));
    let ((d50, _), (r50, _)) = (pct(&f.routing.0), pct(&f.routing.1));
    let added = r50.saturating_sub(d50);
    rows.push(Row::new(
        "scale-out",
        &format!(
            "Connect → first request p50, direct / one redirect ({} each)",
            f.routing.0.len()
        ),
        format!(
            "{} / {} (+{})",
            crate::report::ms(d50),
            crate::report::ms(r50),
            crate::report::ms(added)
        ),
        "",
        "redirect adds ≤ 5 ms",
        Verdict::of(added <= Duration::from_millis(5)),
    ));
    rows.extend(memory_rows(&f.memory));
    for (n, ns) in &f.hrw {
        rows.push(Row::info(
            "scale-out",
            &format!("hrw::owner over {n} members (ns per evaluation)"),
            format!("{ns:.0} ({:.1} per member)", ns / *n as f64),
            "",
        ));
    }
    rows
}
