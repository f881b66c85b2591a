//! `--sweep`: latency against offered load, as in the paper's Figure 5, and
//! each scheme's **saturation** — the highest swept rate up to which it
//! keeps up at every swept rate: it completes at least [`KEEP_UP`] of the
//! offered load (of the arrivals scheduled in the measured window; below
//! that the run is reported SATURATED) *and* its p99 stays within
//! [`MAX_P99_US`]. The completion rule alone cannot see a queue that grows
//! by less than 5 % of the rate: over a 10 s window that is up to half a
//! second of backlog (measured: ec-split "kept up" at 196k ops/s with a p99
//! of 374 ms), so a p99 far above any unqueued operation's (a swap-in takes
//! well under a millisecond here) counts as falling behind. A scheme that
//! never keeps up has none.
//!
//! The summary divides each saturation by `ec-split`'s (the scheme the
//! issue's goals compare against) and `non-ft`'s, and reads each scheme's
//! p99 at the swept rates closest to 25, 50 and 75 % of `ec-split`'s
//! saturation, where the goals are stated (ec-batch saturation ≥ 1.6×
//! ec-split's, ec-batch p99 ≥ 30 % lower). It is printed, written to the
//! JSON and drawn by `plot.rs`.
//!
//! `--sweep auto` picks the rates itself: a closed-loop run of every scheme
//! first (reported as such), then [`AUTO_RATES`] rates from 10 % to 120 %
//! of the fastest scheme's closed-loop throughput, the same for every
//! scheme, so their curves share their x values.

use serde_json::{Value, json};

use super::open_loop::MAX_RATE;
use super::record::Record;

/// Fraction of the offered load a scheme must complete to keep up.
pub(crate) const KEEP_UP: f64 = 0.95;
/// The p99 (µs) above which a scheme has fallen behind: a queue has built
/// up inside the window, whatever share of the load completed.
pub(crate) const MAX_P99_US: f64 = 50_000.0;
/// The scheme saturations and p99s are compared against.
pub(crate) const REFERENCE: &str = "ec-split";
/// The baseline every ratio divides by.
pub(crate) const BASELINE: &str = "non-ft";
/// Rates `--sweep auto` picks.
pub(crate) const AUTO_RATES: usize = 10;
/// Fractions of the reference's saturation at which p99s are compared.
pub(crate) const TARGETS: [f64; 3] = [0.25, 0.5, 0.75];

/// `--sweep`: the offered rates, or `auto`.
#[derive(Debug, Clone, PartialEq)]
pub enum Sweep {
    /// These rates (ops/s), in this order.
    Rates(Vec<f64>),
    /// Rates picked from a closed-loop run of every scheme.
    Auto,
}

/// Parses `--sweep R1,R2,...` or `--sweep auto`.
pub(crate) fn parse_sweep(s: &str) -> Result<Sweep, String> {
    if s.trim() == "auto" {
        return Ok(Sweep::Auto);
    }
    let rates = s
        .split(',')
        .map(|r| {
            let v: f64 = r
                .trim()
                .parse()
                .map_err(|_| format!("{r:?} is not a rate in ops/s (R1,R2,... or auto)"))?;
            if v.is_finite() && v > 0.0 && v <= MAX_RATE {
                Ok(v)
            } else {
                Err(format!("offered rates must be in (0, {MAX_RATE}] ops/s, got {r:?}"))
            }
        })
        .collect::<Result<Vec<f64>, String>>()?;
    Ok(Sweep::Rates(rates))
}

/// `--sweep auto`'s rates: [`AUTO_RATES`] evenly spaced from 10 % to 120 %
/// of `fastest` (ops/s), to three significant digits, each once.
pub(crate) fn auto_rates(fastest: f64) -> Vec<f64> {
    let mut out: Vec<f64> = Vec::new();
    for i in 0..AUTO_RATES {
        let f = 0.1 + 1.1 * i as f64 / (AUTO_RATES - 1) as f64;
        let r = round3(fastest * f).clamp(1.0, MAX_RATE);
        if !out.contains(&r) {
            out.push(r);
        }
    }
    out
}

/// `x` to three significant digits.
fn round3(x: f64) -> f64 {
    if x <= 0.0 || !x.is_finite() {
        return 0.0;
    }
    let scale = 10f64.powi(x.log10().floor() as i32 - 2);
    (x / scale).round() * scale
}

/// The highest rate of `points` (offered rate, fraction of it achieved,
/// p99 in µs) up to which every rate kept up: at least [`KEEP_UP`]
/// achieved and a p99 within [`MAX_P99_US`]. A rate that kept up above
/// one that did not is noise, not capacity.
pub(crate) fn saturation(points: impl IntoIterator<Item = (f64, f64, f64)>) -> Option<f64> {
    let mut pts: Vec<(f64, f64, f64)> = points.into_iter().collect();
    pts.sort_by(|a, b| a.0.total_cmp(&b.0));
    pts.into_iter()
        .take_while(|&(_, achieved, p99)| achieved >= KEEP_UP && p99 <= MAX_P99_US)
        .map(|(rate, _, _)| rate)
        .last()
}

/// One point of a scheme's curve.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Point {
    pub(crate) rate: f64,
    pub(crate) achieved: f64,
    pub(crate) p99_us: f64,
}

/// One scheme's curve and saturation.
#[derive(Debug, Clone)]
pub(crate) struct Curve {
    pub(crate) scheme: String,
    /// By increasing rate.
    pub(crate) points: Vec<Point>,
    pub(crate) saturation: Option<f64>,
}

impl Curve {
    fn p99_at(&self, rate: f64) -> Option<f64> {
        self.points.iter().find(|p| p.rate == rate).map(|p| p.p99_us)
    }
}

/// The sweep's curves and what is read off them.
pub(crate) struct Summary {
    /// One per scheme, in the order they ran.
    pub(crate) curves: Vec<Curve>,
    /// Every swept rate, increasing.
    pub(crate) rates: Vec<f64>,
    /// For each of [`TARGETS`]: the swept rate closest to that fraction of
    /// the reference's saturation (`None` without one).
    pub(crate) at: Vec<(f64, Option<f64>)>,
}

impl Summary {
    /// The curves of the open-loop records (none if there are none).
    pub(crate) fn of(records: &[Record]) -> Option<Self> {
        let mut curves: Vec<Curve> = Vec::new();
        for r in records {
            let (Some(rate), Some(achieved)) = (r.run.offered, r.achieved_fraction()) else {
                continue;
            };
            let p = Point {
                rate,
                achieved,
                p99_us: r.us(0.99),
            };
            match curves.iter_mut().find(|c| c.scheme == r.scheme) {
                Some(c) => c.points.push(p),
                None => curves.push(Curve {
                    scheme: r.scheme.clone(),
                    points: vec![p],
                    saturation: None,
                }),
            }
        }
        if curves.is_empty() {
            return None;
        }
        let mut rates: Vec<f64> = Vec::new();
        for c in &mut curves {
            c.points.sort_by(|a, b| a.rate.total_cmp(&b.rate));
            c.saturation = saturation(c.points.iter().map(|p| (p.rate, p.achieved, p.p99_us)));
            rates.extend(c.points.iter().map(|p| p.rate));
        }
        rates.sort_by(f64::total_cmp);
        rates.dedup();
        let mut s = Self {
            curves,
            rates,
            at: Vec::new(),
        };
        let reference = s.saturation_of(REFERENCE);
        s.at = TARGETS
            .iter()
            .map(|&f| (f, reference.and_then(|sat| closest(&s.rates, f * sat))))
            .collect();
        Some(s)
    }

    /// Whether `c` kept up at the highest rate swept: its saturation is then only a lower bound.
    pub(crate) fn at_top(&self, c: &Curve) -> bool {
        c.saturation.is_some() && c.saturation == self.rates.last().copied()
    }

    fn curve(&self, scheme: &str) -> Option<&Curve> {
        self.curves.iter().find(|c| c.scheme == scheme)
    }

    pub(crate) fn saturation_of(&self, scheme: &str) -> Option<f64> {
        self.curve(scheme).and_then(|c| c.saturation)
    }

    /// `c`'s saturation over `other`'s.
    fn sat_over(&self, c: &Curve, other: &str) -> Option<f64> {
        ratio(c.saturation, self.saturation_of(other))
    }

    /// `c`'s p99 at `rate` over the reference's there.
    fn p99_over_reference(&self, c: &Curve, rate: f64) -> Option<f64> {
        ratio(c.p99_at(rate), self.curve(REFERENCE).and_then(|r| r.p99_at(rate)))
    }

    /// Prints the saturation table.
    pub(crate) fn print(&self) {
        let w = self.curves.iter().map(|c| c.scheme.len()).max().unwrap_or(0).max(10);
        println!();
        println!(
            "saturation: the highest swept rate up to which a scheme completed >= {:.0} % of the offered load with a \
             p99 <= {:.0} ms at every swept rate; p99 (µs) at the swept rates closest to 25/50/75 % of \
             {REFERENCE}'s saturation, with its ratio to {REFERENCE}'s",
            KEEP_UP * 100.0,
            MAX_P99_US / 1000.0
        );
        let head: Vec<String> = self
            .at
            .iter()
            .map(|(f, r)| match r {
                Some(r) => format!("p99@{:.0}%={r:.0}/s", f * 100.0),
                None => format!("p99@{:.0}%", f * 100.0),
            })
            .collect();
        print!(
            "{:<w$} {:>12} {:>11} {:>9}",
            "scheme",
            "saturation/s",
            format!("÷{REFERENCE}"),
            format!("÷{BASELINE}")
        );
        for h in &head {
            print!(" {h:>22}");
        }
        println!();
        for c in &self.curves {
            print!(
                "{:<w$} {:>12} {:>11} {:>9}",
                c.scheme,
                match c.saturation {
                    Some(s) if self.at_top(c) => format!(">={s:.0}"),
                    Some(s) => format!("{s:.0}"),
                    None => "none".to_string(),
                },
                opt(self.sat_over(c, REFERENCE), 2),
                opt(self.sat_over(c, BASELINE), 2)
            );
            for (_, rate) in &self.at {
                let cell = match rate.and_then(|r| c.p99_at(r).map(|p| (r, p))) {
                    Some((r, p)) => format!("{p:.1} ({}x)", opt(self.p99_over_reference(c, r), 2)),
                    None => "-".to_string(),
                };
                print!(" {cell:>22}");
            }
            println!();
        }
        if self.curves.iter().any(|c| self.at_top(c)) {
            println!(
                "  >=: kept up at the highest swept rate, so its saturation is at least that (a lower bound; \
                 sweep higher to find it)"
            );
        }
        if self.curve(REFERENCE).is_none() {
            println!("  {REFERENCE} did not run: no ratios to it (it runs under --scheme all once the runtime has it)");
        } else if self.saturation_of(REFERENCE).is_none() {
            println!("  {REFERENCE} kept up at no swept rate: sweep lower rates to place the p99 columns");
        }
        if let (Some(b), Some(_)) = (self.curve("ec-batch"), self.curve(REFERENCE)) {
            let sat = self.sat_over(b, REFERENCE);
            let p99: Vec<String> = self
                .at
                .iter()
                .map(|(_, r)| {
                    r.and_then(|r| self.p99_over_reference(b, r))
                        .map_or("-".to_string(), |x| format!("{:+.0} %", (x - 1.0) * 100.0))
                })
                .collect();
            println!(
                "  goals: ec-batch saturation >= 1.6x {REFERENCE}'s: {}x; ec-batch p99 >= 30 % lower at 25/50/75 %: {}",
                opt(sat, 2),
                p99.join(" / ")
            );
        }
    }

    /// The summary as JSON (`plot`: the SVG written, if any).
    pub(crate) fn to_json(&self, plot: Option<&std::path::Path>) -> Value {
        json!({
            "rates": self.rates,
            "keep_up_fraction": KEEP_UP,
            "keep_up_max_p99_us": MAX_P99_US,
            "reference": REFERENCE,
            "baseline": BASELINE,
            "plot": plot.map(|p| p.display().to_string()),
            "schemes": self.curves.iter().map(|c| json!({
                "scheme": c.scheme,
                "saturation_ops": c.saturation,
                "saturation_is_lower_bound": self.at_top(c),
                "saturation_over_ec_split": self.sat_over(c, REFERENCE),
                "saturation_over_non_ft": self.sat_over(c, BASELINE),
                "points": c.points.iter().map(|p| json!({
                    "rate": p.rate, "achieved_fraction": p.achieved, "p99_us": p.p99_us,
                })).collect::<Vec<_>>(),
                "p99_at": self.at.iter().map(|&(f, rate)| json!({
                    "fraction_of_ec_split_saturation": f,
                    "rate": rate,
                    "p99_us": rate.and_then(|r| c.p99_at(r)),
                    "p99_over_ec_split": rate.and_then(|r| self.p99_over_reference(c, r)),
                })).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        })
    }
}

/// The rate of `rates` closest to `target` (the lower one on a tie).
fn closest(rates: &[f64], target: f64) -> Option<f64> {
    rates
        .iter()
        .copied()
        .min_by(|a, b| (a - target).abs().total_cmp(&(b - target).abs()).then(a.total_cmp(b)))
}

/// `a / b` when both are known and `b` is positive.
pub(crate) fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 && a.is_finite() => Some(a / b),
        _ => None,
    }
}

fn opt(x: Option<f64>, prec: usize) -> String {
    x.map_or("-".to_string(), |x| format!("{x:.prec$}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saturation_is_the_highest_rate_that_keeps_up() {
        let ok = 500.0;
        assert_eq!(
            saturation([(100.0, 1.0, ok), (200.0, 0.99, ok), (300.0, 0.7, ok)]),
            Some(200.0)
        );
        // A rate that kept up above one that fell behind is noise.
        assert_eq!(
            saturation([(300.0, 0.96, ok), (100.0, 0.97, ok), (200.0, 0.5, ok)]),
            Some(100.0)
        );
        // Exactly 95 % keeps up; just below does not.
        assert_eq!(saturation([(100.0, 0.95, ok), (200.0, 0.9499, ok)]), Some(100.0));
        // 96 % completed but a p99 of 374 ms: a queue grew inside the window
        // (measured for ec-split at 196k ops/s).
        assert_eq!(
            saturation([(110.0, 0.9999, 17_039.0), (196.0, 0.96, 374_341.0)]),
            Some(110.0)
        );
        assert_eq!(saturation([(100.0, 0.5, ok)]), None);
        assert_eq!(saturation(std::iter::empty()), None);
    }

    #[test]
    fn closest_rate_and_ratios() {
        let rates = [1000.0, 2000.0, 4000.0, 8000.0];
        assert_eq!(closest(&rates, 2900.0), Some(2000.0));
        assert_eq!(closest(&rates, 3000.0), Some(2000.0));
        assert_eq!(closest(&rates, 3100.0), Some(4000.0));
        assert_eq!(closest(&rates, 1e9), Some(8000.0));
        assert_eq!(closest(&[], 1.0), None);
        assert_eq!(ratio(Some(3.0), Some(2.0)), Some(1.5));
        assert_eq!(ratio(Some(3.0), Some(0.0)), None);
        assert_eq!(ratio(None, Some(2.0)), None);
    }

    #[test]
    fn sweep_parses_rates_or_auto() {
        assert_eq!(parse_sweep("auto"), Ok(Sweep::Auto));
        assert_eq!(parse_sweep("100, 2000.5"), Ok(Sweep::Rates(vec![100.0, 2000.5])));
        for bad in ["", "100,", "nan", "100,inf", "0", "-5", "auto,100", "1e9"] {
            assert!(parse_sweep(bad).is_err(), "{bad:?} was accepted");
        }
        let r = auto_rates(123_456.0);
        assert_eq!(r.len(), AUTO_RATES);
        assert_eq!(r[0], 12_300.0);
        assert_eq!(r[AUTO_RATES - 1], 148_000.0);
        assert!(r.windows(2).all(|w| w[0] < w[1]), "{r:?}");
        // Tiny throughputs still give valid, distinct rates.
        let r = auto_rates(3.0);
        assert!(
            r.iter().all(|&x| x >= 1.0) && r.windows(2).all(|w| w[0] < w[1]),
            "{r:?}"
        );
    }
}
