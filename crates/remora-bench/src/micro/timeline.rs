//! `--timeline`: throughput and far memory over each remora run, window by
//! window (paper Table 2 reports far memory; this shows whether it follows
//! the data as the run goes on, and what compaction costs in throughput
//! while it does). One SVG, two panels sharing the time axis: operations
//! per second on top, far memory below (held from the manager solid,
//! allocated to spans dashed), one colour per run.

use std::path::Path;

use anyhow::{Context, anyhow};
use plotters::prelude::*;
use remora_runtime::Stats;

use super::plot::{Area, COLOURS, titled};
use super::worker::{Snaps, rates};

/// One window of a run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Point {
    /// End of the window, seconds into the measured phase.
    pub(crate) t: f64,
    /// Operations completed per second in the window.
    pub(crate) ops_per_s: f64,
    /// Far bytes allocated to spans (data, parity, holes, kept copies).
    pub(crate) far_used: u64,
    /// Far bytes held from the manager (every region).
    pub(crate) far_held: u64,
}

/// The windows of a measured remora run.
pub(crate) fn points(snaps: &Snaps<Stats>) -> Vec<Point> {
    rates(snaps)
        .into_iter()
        .zip(&snaps.samples)
        .map(|((t, ops_per_s), s)| Point {
            t,
            ops_per_s,
            far_used: s.far.bytes_used,
            far_held: s.far.bytes_held,
        })
        .collect()
}

/// Far memory held in the first window at or after `after_s` seconds and
/// in the last window: how far memory moved over the run.
pub(crate) fn held_after(points: &[Point], after_s: f64) -> Option<(u64, u64)> {
    let first = points.iter().find(|p| p.t >= after_s)?;
    Some((first.far_held, points.last()?.far_held))
}

/// When the "start" level of [`print_drift`] is read: one minute in, or a
/// tenth of a shorter run.
fn settle_s(duration_s: f64) -> f64 {
    (duration_s / 10.0).min(60.0)
}

/// Prints, per remora run, far memory held once the run settled and at its
/// end, with its peak and the lowest throughput window.
pub(crate) fn print_drift(runs: &[(&str, &[Point])], duration_s: f64) {
    let after = settle_s(duration_s);
    println!();
    println!(
        "far memory held over the run (from the manager; 100 ms windows): at {after:.0} s, at the end, end / start, \
         peak; and the slowest window's throughput"
    );
    println!(
        "{:<22} {:>12} {:>12} {:>10} {:>12} {:>14}",
        "scheme", "start MiB", "end MiB", "end/start", "peak MiB", "min ops/s"
    );
    for (name, pts) in runs {
        let Some((start, end)) = held_after(pts, after) else {
            println!("{name:<22} (no windows)");
            continue;
        };
        let peak = pts.iter().map(|p| p.far_held).max().unwrap_or(0);
        let min_ops = pts.iter().map(|p| p.ops_per_s).fold(f64::INFINITY, f64::min);
        println!(
            "{:<22} {:>12.1} {:>12.1} {:>10.3} {:>12.1} {:>14.0}",
            name,
            start as f64 / MIB,
            end as f64 / MIB,
            end as f64 / start.max(1) as f64,
            peak as f64 / MIB,
            min_ops
        );
    }
}

const SIZE: (u32, u32) = (1100, 800);
const MIB: f64 = (1u64 << 20) as f64;

type Chart<'a, 'b> = ChartContext<
    'a,
    SVGBackend<'b>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

/// One panel: time across, `y_desc` up to `y_max`.
fn panel<'a, 'b>(
    area: &'a Area<'b>,
    t_max: f64,
    y_max: f64,
    y_desc: &str,
) -> Result<Chart<'a, 'b>, Box<dyn std::error::Error>> {
    let mut chart = ChartBuilder::on(area)
        .margin(15)
        .x_label_area_size(35)
        .y_label_area_size(75)
        .build_cartesian_2d(0.0..t_max, 0.0..y_max)?;
    chart
        .configure_mesh()
        .x_desc("seconds into the measured phase")
        .y_desc(y_desc)
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()?;
    Ok(chart)
}

fn draw(path: &Path, runs: &[(&str, &[Point])], subtitle: &str) -> Result<(), Box<dyn std::error::Error>> {
    let (root, body) = titled(
        path,
        SIZE,
        "throughput and far memory over time (remora bench micro)",
        subtitle,
    )?;
    let (top, bottom) = body.split_vertically((SIZE.1 - 50) / 2);

    let t_max = runs
        .iter()
        .flat_map(|(_, p)| p.iter().map(|p| p.t))
        .fold(0.0f64, f64::max)
        .max(0.1);
    let ops_max = runs
        .iter()
        .flat_map(|(_, p)| p.iter().map(|p| p.ops_per_s))
        .fold(0.0f64, f64::max)
        .max(1.0)
        * 1.1;
    let far_max = runs
        .iter()
        .flat_map(|(_, p)| p.iter().map(|p| p.far_held.max(p.far_used) as f64 / MIB))
        .fold(0.0f64, f64::max)
        .max(1.0)
        * 1.1;

    let mut ops = panel(&top, t_max, ops_max, "ops/s")?;
    let mut far = panel(&bottom, t_max, far_max, "far memory (MiB): held solid, used dashed")?;

    for (i, (name, pts)) in runs.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        ops.draw_series(LineSeries::new(
            pts.iter().map(|p| (p.t, p.ops_per_s)),
            colour.stroke_width(2),
        ))?
        .label(name.to_string())
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2)));
        far.draw_series(LineSeries::new(
            pts.iter().map(|p| (p.t, p.far_held as f64 / MIB)),
            colour.stroke_width(2),
        ))?
        .label(name.to_string())
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2)));
        far.draw_series(DashedLineSeries::new(
            pts.iter().map(|p| (p.t, p.far_used as f64 / MIB)),
            6,
            4,
            colour.stroke_width(1),
        ))?;
    }
    for chart in [&mut ops, &mut far] {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()?;
    }
    root.present()?;
    Ok(())
}

/// Draws `runs` (a label and its windows each) to `path`.
pub(crate) fn write(path: &Path, runs: &[(&str, &[Point])], subtitle: &str) -> anyhow::Result<()> {
    draw(path, runs, subtitle)
        .map_err(|e| anyhow!("{e}"))
        .with_context(|| format!("drawing the timeline to {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pt(t: f64, ops_per_s: f64, held: u64) -> Point {
        Point {
            t,
            ops_per_s,
            far_used: held / 2,
            far_held: held,
        }
    }

    #[test]
    fn rates_are_per_window_not_cumulative() {
        let snaps = Snaps {
            first: Stats::default(),
            last: Stats::default(),
            samples: vec![Stats::default(); 3],
            at: vec![(0.1, 1000), (0.2, 1000), (0.3, 4000)],
            ops0: 0,
        };
        let r = rates(&snaps);
        let got: Vec<f64> = r.iter().map(|(_, x)| x.round()).collect();
        // A window with no progress shows as zero: a dip shorter than the
        // whole run is visible.
        assert_eq!(got, vec![10_000.0, 0.0, 30_000.0]);
    }

    #[test]
    fn held_after_a_minute_and_at_the_end() {
        let pts = [pt(30.0, 1.0, 50), pt(60.0, 1.0, 100), pt(600.0, 1.0, 105)];
        assert_eq!(held_after(&pts, 60.0), Some((100, 105)));
        assert_eq!(held_after(&pts, 700.0), None);
    }

    #[test]
    fn draws_every_run_in_both_panels() {
        let dir = std::env::temp_dir().join(format!("remora-timeline-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.svg");
        let a = [pt(0.1, 100.0, 8 << 20), pt(0.2, 120.0, 9 << 20)];
        let b = [pt(0.1, 50.0, 4 << 20), pt(0.2, 0.0, 4 << 20)];
        write(&path, &[("non-ft", &a), ("ec-batch:c2", &b)], "test").unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(
            svg.contains("non-ft") && svg.contains("ec-batch:c2"),
            "legend names every run"
        );
        for c in &COLOURS[..2] {
            let stroke = format!("stroke=\"#{:02X}{:02X}{:02X}\"", c.0, c.1, c.2);
            let lines = |width: &str| {
                svg.lines()
                    .filter(|l| l.starts_with("<polyline") && l.contains(&stroke) && l.contains(width))
                    .count()
            };
            // Throughput and far memory held, and their legend marks.
            assert_eq!(
                lines("stroke-width=\"2\""),
                4,
                "{stroke}: throughput and far memory held"
            );
            assert!(lines("stroke-width=\"1\"") >= 1, "{stroke}: far memory used, dashed");
        }
        std::fs::remove_dir_all(&dir).ok();
    }
}
