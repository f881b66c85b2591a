//! What `remora chaos` measured: throughput in 50 ms windows, each fault's
//! dip against the 5 s before it, how long until throughput was back, and
//! the longest stretch at zero (overall, and outside the manager's outages,
//! in which far memory waits by design); drawn as an SVG with every fault
//! marked.

use std::path::Path;

use anyhow::Result;
use plotters::prelude::*;

use super::nemesis::FaultKind;

/// Width of a throughput window, seconds.
pub(crate) const WINDOW: f64 = 0.05;
/// A fault as it happened.
#[derive(Debug, Clone)]
pub(crate) struct Done {
    pub(crate) kind: FaultKind,
    /// The memory node's address.
    pub(crate) node: String,
    pub(crate) at: f64,
    /// How long a pause or partition was held; for a manager outage, how
    /// long the manager was down in fact (until its restart was ready),
    /// once it is back.
    pub(crate) hold: f64,
    /// For a kill: when the runtime had rebuilt what the node held.
    pub(crate) rebuilt_at: Option<f64>,
}

impl Done {
    /// A fault of `kind` on `node`, struck at `at` for `hold` seconds.
    pub(crate) fn new(kind: FaultKind, node: String, at: f64, hold: f64) -> Self {
        Self {
            kind,
            node,
            at,
            hold,
            rebuilt_at: None,
        }
    }
}

pub(crate) use crate::throughput::Dip;

/// The dip of a fault at `at` that lasted until `end`, over windows of
/// [`WINDOW`] (see [`crate::throughput::dip`]).
pub(crate) fn dip(windows: &[(f64, f64)], at: f64, end: f64, back_from: f64) -> Option<Dip> {
    crate::throughput::dip(windows, WINDOW, at, end, back_from)
}

/// Far memory needs this long after the manager is back before it flows
/// again: the memory nodes re-register and the leases are renewed.
pub(crate) const AFTER_OUTAGE: f64 = 2.0;

/// Longest stretch of consecutive windows with no operation completed,
/// seconds, over windows `(end of window, ops/s)`. Windows whose end lies
/// in one of `skip`'s `(from, to]` intervals are left out: they end a
/// stretch without being counted. A window's start is the end of the one
/// before, so a window stretched by a slow tick counts at its real length.
pub(crate) fn longest_zero(windows: &[(f64, f64)], skip: &[(f64, f64)]) -> f64 {
    let (mut best, mut run_from): (f64, Option<f64>) = (0.0, None);
    let mut prev_end = windows.first().map_or(0.0, |w| w.0 - WINDOW);
    for w in windows {
        let skipped = skip.iter().any(|&(a, b)| w.0 > a && w.0 <= b);
        if w.1 <= 0.0 && !skipped {
            let from = *run_from.get_or_insert(prev_end);
            best = best.max(w.0 - from);
        } else {
            run_from = None;
        }
        prev_end = w.0;
    }
    best
}

/// The manager's outages as `(killed at, back at)` intervals, the fault's
/// planned end standing in for one still under way at the end of the run.
pub(crate) fn manager_outages(faults: &[Done]) -> Vec<(f64, f64)> {
    faults
        .iter()
        // A group's leader killed is no outage: the others go on.
        .filter(|d| d.kind == FaultKind::Manager)
        .map(|d| (d.at, d.at + d.hold))
        .collect()
}

fn colour(kind: FaultKind) -> RGBColor {
    match kind {
        FaultKind::Kill => RGBColor(214, 39, 40),
        FaultKind::Pause => RGBColor(255, 127, 14),
        FaultKind::Partition => RGBColor(148, 103, 189),
        FaultKind::Manager => RGBColor(44, 160, 44),
        FaultKind::ManagerLeader => RGBColor(23, 190, 207),
        FaultKind::Shrink => RGBColor(140, 86, 75),
    }
}

/// Draws the throughput timeline with every fault marked.
pub(crate) fn draw(path: &Path, windows: &[(f64, f64)], faults: &[Done], title: &str) -> Result<()> {
    let err = crate::plot::err(path);
    let tmax = windows.last().map_or(1.0, |w| w.0).max(1.0);
    let ymax = windows.iter().map(|w| w.1).fold(1.0, f64::max) * 1.15 / 1000.0;
    let root = crate::plot::canvas(path, (1100, 420))?;
    let mut chart = crate::plot::timeline(path, &root, title, (tmax, ymax), "k ops/s (50 ms windows)")?;
    for f in faults {
        let end = match f.kind {
            FaultKind::Kill | FaultKind::Shrink => f.rebuilt_at.unwrap_or(f.at),
            _ => f.at + f.hold,
        };
        if end > f.at {
            let c = colour(f.kind);
            let shade = RGBColor(c.0 / 8 + 223, c.1 / 8 + 223, c.2 / 8 + 223);
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(f.at, 0.0), (end, ymax)],
                    shade.filled(),
                )))
                .map_err(err)?;
        }
    }
    let blue = RGBColor(31, 119, 180);
    chart
        .draw_series(LineSeries::new(
            windows.iter().map(|w| (w.0, w.1 / 1000.0)),
            blue.stroke_width(1),
        ))
        .map_err(err)?
        .label("throughput")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], blue.stroke_width(2)));
    for kind in [
        FaultKind::Kill,
        FaultKind::Pause,
        FaultKind::Partition,
        FaultKind::Manager,
        FaultKind::ManagerLeader,
        FaultKind::Shrink,
    ] {
        let marks: Vec<&Done> = faults.iter().filter(|f| f.kind == kind).collect();
        if marks.is_empty() {
            continue;
        }
        let c = colour(kind);
        for (i, f) in marks.iter().enumerate() {
            let s = chart
                .draw_series(std::iter::once(PathElement::new(
                    vec![(f.at, 0.0), (f.at, ymax)],
                    c.stroke_width(2),
                )))
                .map_err(err)?;
            if i == 0 {
                s.label(format!("{} (shaded: until rebuilt / healed / back)", kind.name()))
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
            }
            let label = if kind == FaultKind::Manager {
                format!(" manager down {:.1}s", f.hold)
            } else if kind == FaultKind::ManagerLeader {
                format!(" leader down {:.1}s", f.hold)
            } else {
                format!(" {} {}", kind.name(), f.node)
            };
            chart
                .draw_series(std::iter::once(Text::new(
                    label,
                    (f.at, ymax * 0.97),
                    ("sans-serif", 11).into_font().color(&c),
                )))
                .map_err(err)?;
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn windows(f: impl Fn(f64) -> f64, secs: f64) -> Vec<(f64, f64)> {
        let n = (secs / WINDOW).round() as usize;
        (1..=n).map(|i| i as f64 * WINDOW).map(|t| (t, f(t))).collect()
    }

    #[test]
    fn a_dip_shorter_than_a_window_is_seen_and_back_can_be_under_one_window() {
        // Flat at 1000 ops/s: the fault changes nothing, back at once.
        let flat = windows(|_| 1000.0, 20.0);
        let d = dip(&flat, 10.0, 10.01, 10.0).unwrap();
        assert!((d.ratio - 1.0).abs() < 1e-9);
        assert_eq!(d.back_after, Some(0.0), "less than one window");
        // One window at zero right after the fault: its own window shows it.
        let one = windows(
            |t| {
                if (10.0..10.05 + 1e-9).contains(&(t - 1e-9)) {
                    0.0
                } else {
                    1000.0
                }
            },
            20.0,
        );
        let d = dip(&one, 10.0, 10.01, 10.0).unwrap();
        assert!(d.ratio < 0.01, "{d:?}");
        assert!((d.back_after.unwrap() - WINDOW).abs() < 1e-9, "{d:?}");
        assert!((longest_zero(&one, &[]) - WINDOW).abs() < 1e-9);
    }

    #[test]
    fn a_halved_rebuild_period_and_a_zero_stretch() {
        let w = windows(
            |t| match t {
                t if t > 10.0 && t <= 11.0 => 0.0,
                t if t > 11.0 && t <= 14.0 => 500.0,
                _ => 1000.0,
            },
            30.0,
        );
        let d = dip(&w, 10.0, 14.0, 10.0).unwrap();
        assert!(
            (d.ratio - 0.375).abs() < 1e-6,
            "(1 s at 0 + 3 s at 500) / 4 s / 1000: {d:?}"
        );
        assert!((d.back_after.unwrap() - 4.0).abs() < 1e-6, "{d:?}");
        assert!((longest_zero(&w, &[]) - 1.0).abs() < 1e-6);
        // The same second at zero inside a manager outage is not counted.
        assert!(longest_zero(&w, &[(9.0, 10.5)]) < 0.5 + 1e-6);
        assert!(longest_zero(&w, &[(9.0, 11.5)]).abs() < 1e-9);
        // A tick that overran: one window of 0.3 s at zero counts 0.3 s.
        let slow = [(0.05, 10.0), (0.10, 10.0), (0.40, 0.0), (0.45, 10.0)];
        assert!((longest_zero(&slow, &[]) - 0.3).abs() < 1e-9);
        assert!(dip(&w, 2.0, 3.0, 2.0).is_some_and(|d| (d.baseline - 1000.0).abs() < 1e-9));
        assert!(dip(&[], 2.0, 3.0, 2.0).is_none());
        // Back counted from the end of a manager outage: 4 s of zero then normal.
        let out = windows(|t| if t > 10.0 && t <= 14.0 { 0.0 } else { 1000.0 }, 30.0);
        assert!(dip(&out, 10.0, 14.0, 14.0).is_some_and(|d| d.back_after == Some(0.0)));
    }
}
