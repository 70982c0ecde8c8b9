//! Process metrics (`process_*`) with a fractional `process_cpu_seconds_total`.
//!
//! The prometheus crate's process collector divides the clock ticks of `/proc/self/stat` by the
//! tick rate in integers, so CPU time moves in whole seconds and a manager using a tenth of a
//! core shows a flat line. This collector keeps everything else of it and replaces that one
//! series with the ticks divided as a float (1/100 s resolution).

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{Counter, Opts};

/// The metric the inner collector rounds to whole seconds.
const CPU: &str = "process_cpu_seconds_total";

/// `process_*` of this process, CPU time in ticks rather than whole seconds.
pub(crate) struct ProcessMetrics {
    inner: prometheus::process_collector::ProcessCollector,
    cpu: Counter,
}

impl ProcessMetrics {
    /// The collector of the calling process.
    pub(crate) fn for_self() -> Result<Self, prometheus::Error> {
        Ok(ProcessMetrics {
            inner: prometheus::process_collector::ProcessCollector::for_self(),
            // The inner collector's help text, so the family reads the same as before.
            cpu: Counter::with_opts(Opts::new(
                CPU,
                "Total user and system CPU time spent in seconds.",
            ))?,
        })
    }

    /// User plus system CPU seconds from `/proc/self/stat`, to the clock tick.
    fn cpu_seconds() -> Option<f64> {
        let stat = procfs::process::Process::myself().ok()?.stat().ok()?;
        let ticks = stat.utime.saturating_add(stat.stime);
        Some(ticks as f64 / procfs::ticks_per_second() as f64)
    }
}

impl Collector for ProcessMetrics {
    fn desc(&self) -> Vec<&Desc> {
        let mut descs: Vec<&Desc> = self
            .inner
            .desc()
            .into_iter()
            .filter(|d| d.fq_name != CPU)
            .collect();
        descs.extend(self.cpu.desc());
        descs
    }

    fn collect(&self) -> Vec<MetricFamily> {
        if let Some(total) = Self::cpu_seconds() {
            // A counter only goes up: add what was spent since the last scrape.
            let delta = total - self.cpu.get();
            if delta > 0.0 {
                self.cpu.inc_by(delta);
            }
        }
        let mut families: Vec<MetricFamily> = self
            .inner
            .collect()
            .into_iter()
            .filter(|f| f.name() != CPU)
            .collect();
        families.extend(self.cpu.collect());
        families
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_seconds_are_fractional_and_other_process_series_stay() {
        let registry = prometheus::Registry::new();
        registry
            .register(Box::new(ProcessMetrics::for_self().expect("collector")))
            .expect("registered");
        // Burn a little CPU so the value is above zero.
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        assert_ne!(x, 1);
        let families = registry.gather();
        let cpu = families
            .iter()
            .find(|f| f.name() == CPU)
            .expect("cpu family");
        assert_eq!(cpu.get_metric().len(), 1, "one series, not two");
        let seconds = cpu.get_metric()[0].get_counter().get_value();
        let ticks = seconds * procfs::ticks_per_second() as f64;
        assert!(seconds > 0.0, "{seconds}");
        assert!(
            (ticks - ticks.round()).abs() < 1e-6,
            "whole ticks: {seconds}"
        );
        for name in ["process_open_fds", "process_resident_memory_bytes"] {
            assert!(families.iter().any(|f| f.name() == name), "{name}");
        }
    }
}
