//! `--census`: the local spans of each remora run by what they are doing,
//! averaged over the samples of its measured phase
//! ([`remora_runtime::internals::LocalCensus`]). It says where the local budget goes
//! when the objects kept locally fall short of what it would hold: holes
//! left by moved objects, cold spans waiting for eviction, spans pinned.

use remora_runtime::internals::LocalCensus;

/// Groups below this share of the spans are left out of the table (the
/// JSON has them all).
const SHOWN_SHARE: f64 = 0.005;

/// Censuses added up over a run's samples.
#[derive(Debug, Default)]
pub(crate) struct CensusSum {
    samples: u64,
    total: LocalCensus,
}

impl CensusSum {
    pub(crate) fn add(&mut self, c: &LocalCensus) {
        self.samples += 1;
        self.total.add(c);
    }

    /// The average census, `None` without a sample.
    pub(crate) fn average(&self) -> Option<CensusAvg> {
        (self.samples > 0).then(|| CensusAvg {
            samples: self.samples,
            total: self.total.clone(),
        })
    }
}

/// A run's average census: the sum of its samples, divided on the way out.
#[derive(Debug, Clone)]
pub(crate) struct CensusAvg {
    samples: u64,
    total: LocalCensus,
}

impl CensusAvg {
    fn per_sample(&self, n: usize) -> f64 {
        n as f64 / self.samples as f64
    }

    fn spans(&self) -> f64 {
        self.per_sample(self.total.spans())
    }

    fn live(&self) -> f64 {
        self.per_sample(self.total.live())
    }

    fn free_slots(&self) -> f64 {
        self.per_sample(self.total.free_slots())
    }

    fn cold_queue(&self) -> f64 {
        self.per_sample(self.total.cold_queue)
    }

    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "samples": self.samples,
            "spans": self.spans(),
            "live_objects": self.live(),
            "free_slots": self.free_slots(),
            "cold_queue": self.cold_queue(),
            "groups": self.total.groups.iter().map(|g| serde_json::json!({
                "cold": g.usage.cold,
                "kept": g.usage.kept,
                "pinned": g.usage.pinned,
                "listed": g.usage.listed,
                "object_size": g.object_size,
                "capacity": g.capacity,
                "live": g.live,
                "spans": self.per_sample(g.spans),
            })).collect::<Vec<_>>(),
        })
    }
}

/// Prints the census of every run that took one.
pub(crate) fn print(runs: &[(&str, &CensusAvg)], w: usize) {
    if runs.is_empty() {
        return;
    }
    println!();
    println!(
        "local spans by use (--census: averages of the samples every 100 ms; groups under {:.1} % of the spans \
         left out)",
        SHOWN_SHARE * 100.0
    );
    println!(
        "{:<w$} {:>5} {:>5} {:>7} {:>7} {:>7} {:>10} {:>10} {:>8} {:>11}",
        "scheme", "cold", "kept", "pinned", "listed", "slot B", "live/slots", "spans", "% spans", "free slots"
    );
    let yes = |b: bool| if b { "yes" } else { "-" };
    for (scheme, c) in runs {
        let total = c.spans().max(1e-9);
        for g in &c.total.groups {
            let spans = c.per_sample(g.spans);
            if spans / total < SHOWN_SHARE {
                continue;
            }
            println!(
                "{:<w$} {:>5} {:>5} {:>7} {:>7} {:>7} {:>10} {:>10.1} {:>7.1}% {:>11.0}",
                scheme,
                yes(g.usage.cold),
                yes(g.usage.kept),
                yes(g.usage.pinned),
                yes(g.usage.listed),
                g.object_size,
                format!("{}/{}", g.live, g.capacity),
                spans,
                100.0 * spans / total,
                c.per_sample(g.free_slots())
            );
        }
        println!(
            "{:<w$} total: {:.0} spans, {:.0} live objects, {:.0} free slots ({:.2} % of the slots); \
             cold queue {:.0} entries",
            scheme,
            c.spans(),
            c.live(),
            c.free_slots(),
            100.0 * c.free_slots() / (c.live() + c.free_slots()).max(1e-9),
            c.cold_queue()
        );
    }
    println!(
        "  cold: flagged cold by filtering (evicted first); kept: swapped in, far copy kept (evicted again \
         without a write while clean); pinned: held by an eviction or filtering thread; listed: on its class's \
         list of spans with free slots (allocations and hot moved objects fill it)"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use remora_runtime::internals::{CensusGroup, SpanUse};

    #[test]
    fn averages_over_samples_and_counts_holes() {
        let usage = SpanUse {
            cold: false,
            kept: false,
            pinned: false,
            listed: true,
        };
        let census = |spans: usize, queue: usize| LocalCensus {
            groups: vec![CensusGroup {
                usage,
                object_size: 1152,
                capacity: 7,
                live: 6,
                spans,
            }],
            cold_queue: queue,
        };
        let mut sum = CensusSum::default();
        assert!(sum.average().is_none());
        sum.add(&census(10, 4));
        sum.add(&census(20, 0));
        let avg = sum.average().expect("two samples");
        assert_eq!(avg.samples, 2);
        assert!((avg.spans() - 15.0).abs() < 1e-9);
        assert!((avg.live() - 90.0).abs() < 1e-9);
        assert!((avg.free_slots() - 15.0).abs() < 1e-9);
        assert!((avg.cold_queue() - 2.0).abs() < 1e-9);
        let j = avg.json();
        assert_eq!(j["groups"][0]["listed"], true);
        assert_eq!(j["groups"][0]["live"], 6);
    }
}
