//! The figures of `remora bench kv`, drawn as the paper draws them:
//! Figure 8 (TPC-A throughput and remote memory against the local memory
//! ratio) and Figure 10a (throughput per 100 ms window around a memory-node
//! kill).
//!
//! Drawn like `bench micro`'s sweep plot (its `titled` and `COLOURS`): `plotters`'
//! SVG backend with no font backend, text left to the viewer as `<text>`,
//! the same colours in the order the lines are given. Yardsticks (`local`,
//! and the Redis baselines `redis:…`) are dashed, remora's schemes solid,
//! so the eye separates what is measured from what it is measured against.

use std::path::Path;

use anyhow::{Context, anyhow};
use plotters::coord::types::RangedCoordf64;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::micro::{Area, COLOURS, titled};

/// Size of Figure 8 (two panels side by side), pixels.
const FIG8_SIZE: (u32, u32) = (1400, 620);
/// Size of Figure 10a, pixels.
const FIG10_SIZE: (u32, u32) = (1100, 620);
/// Bytes per MiB, the unit of remote memory.
const MIB: f64 = 1024.0 * 1024.0;
/// Headroom above the highest point, so the legend and labels clear the data.
const HEADROOM: f64 = 1.25;

/// One line of Figure 8: a scheme (or yardstick) measured at several local ratios.
pub(crate) struct Line {
    /// The scheme's name, as in the legend: `local`, `redis:2`, `ec-batch`, …
    pub(crate) label: String,
    /// (local ratio in 0..=1, transactions per second, remote bytes if measured).
    pub(crate) points: Vec<(f64, f64, Option<f64>)>,
}

/// One run of Figure 10a: throughput per window around a kill.
pub(crate) struct KillRun {
    /// The scheme's name, as in the legend.
    pub(crate) label: String,
    /// (end of the window in seconds since the start, transactions per second).
    pub(crate) windows: Vec<(f64, f64)>,
    /// When the memory node was killed, seconds since the start.
    pub(crate) kill_at: f64,
    /// When its data was rebuilt, seconds since the start, if it was.
    pub(crate) rebuilt_at: Option<f64>,
}

/// Whether `label` is a yardstick (drawn dashed) rather than a scheme.
fn yardstick(label: &str) -> bool {
    label == "local" || label.starts_with("redis")
}

type Chart<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;
type Res<T = ()> = Result<T, Box<dyn std::error::Error>>;

/// The path of a line over local ratios: its points by ratio, or, for a
/// single point (a yardstick measured once, like `local` or Redis, whose
/// figure does not depend on the ratio), a level across the whole axis.
fn span(points: &[(f64, f64)]) -> Vec<(f64, f64)> {
    match points {
        [(_, y)] => vec![(0.0, *y), (1.0, *y)],
        _ => {
            let mut p = points.to_vec();
            p.sort_by(|a, b| a.0.total_cmp(&b.0));
            p
        }
    }
}

/// Draws one labelled line with a dot at each point, dashed for a yardstick.
fn line(chart: &mut Chart, label: &str, colour: RGBColor, points: &[(f64, f64)]) -> Res {
    let style = colour.stroke_width(2);
    let path = span(points);
    if yardstick(label) {
        chart
            .draw_series(DashedLineSeries::new(path, 8, 5, style))?
            .label(label)
            .legend(move |(x, y)| DashedPathElement::new(vec![(x, y), (x + 24, y)], 6, 3, style));
    } else {
        chart
            .draw_series(LineSeries::new(path, style))?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], style));
    }
    chart.draw_series(points.iter().map(|&p| Circle::new(p, 4, colour.filled())))?;
    Ok(())
}

/// The top of a y axis from 0 holding `ys`, with headroom (1 when there is nothing).
fn y_top(ys: impl Iterator<Item = f64>) -> f64 {
    let hi = ys.filter(|y| y.is_finite()).fold(0.0, f64::max);
    if hi > 0.0 { hi * HEADROOM } else { 1.0 }
}

/// A line of a panel, ready to draw.
struct Drawn<'a> {
    label: &'a str,
    colour: RGBColor,
    points: Vec<(f64, f64)>,
}

/// One panel of Figure 8: each line against the local ratio, its legend at `legend`.
fn panel(area: &Area, caption: &str, y_desc: &str, lines: &[Drawn], legend: SeriesLabelPosition) -> Res {
    let top = y_top(lines.iter().flat_map(|l| l.points.iter().map(|p| p.1)));
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 16))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(75)
        .build_cartesian_2d(0.0..1.0, 0.0..top)?;
    chart
        .configure_mesh()
        .x_desc("local memory ratio")
        .y_desc(y_desc)
        .x_label_formatter(&|x| format!("{x:.1}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    for l in lines {
        line(&mut chart, l.label, l.colour, &l.points)?;
    }
    if !lines.is_empty() {
        chart
            .configure_series_labels()
            .position(legend)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()?;
    }
    Ok(())
}

/// The finite points of `points`, with `f` picking the y.
fn finite(points: &[(f64, f64, Option<f64>)], f: impl Fn(&(f64, f64, Option<f64>)) -> Option<f64>) -> Vec<(f64, f64)> {
    points
        .iter()
        .filter_map(|p| Some((p.0, f(p)?)))
        .filter(|(x, y)| x.is_finite() && y.is_finite())
        .collect()
}

fn draw_figure8(path: &Path, lines: &[Line], subtitle: &str) -> Res {
    let (root, body) = titled(
        path,
        FIG8_SIZE,
        "TPC-A throughput and remote memory vs local memory ratio (remora bench kv)",
        subtitle,
    )?;
    let (left, right) = body.split_horizontally((FIG8_SIZE.0 / 2) as i32);
    // A line keeps its colour in both panels, whether or not it has remote bytes.
    let colour = |i: usize| COLOURS[i % COLOURS.len()];
    let tps: Vec<_> = lines
        .iter()
        .enumerate()
        .map(|(i, l)| Drawn {
            label: &l.label,
            colour: colour(i),
            points: finite(&l.points, |p| Some(p.1)),
        })
        .filter(|l| !l.points.is_empty())
        .collect();
    let remote: Vec<_> = lines
        .iter()
        .enumerate()
        .map(|(i, l)| Drawn {
            label: &l.label,
            colour: colour(i),
            points: finite(&l.points, |p| p.2.map(|b| b / MIB)),
        })
        .filter(|l| !l.points.is_empty())
        .collect();
    // Each legend in the corner its curves leave empty: throughput rises
    // with the local ratio, remote memory falls.
    panel(
        &left,
        "(a) throughput",
        "transactions per second",
        &tps,
        SeriesLabelPosition::LowerRight,
    )?;
    panel(
        &right,
        "(b) remote memory",
        "remote memory (MiB)",
        &remote,
        SeriesLabelPosition::UpperRight,
    )?;
    root.present()?;
    Ok(())
}

/// Writes Figure 8 of `lines` to `path`: (a) TPS and (b) remote memory
/// (MiB, for the lines that measured it) against the local ratio; a line
/// of one point is drawn as a level across the axis. `subtitle` says what ran.
pub(crate) fn figure8(path: &Path, lines: &[Line], subtitle: &str) -> anyhow::Result<()> {
    draw_figure8(path, lines, subtitle)
        .map_err(|e| anyhow!("{e}"))
        .with_context(|| format!("drawing Figure 8 to {}", path.display()))
}

fn draw_figure10a(path: &Path, runs: &[KillRun], subtitle: &str) -> Res {
    let (root, body) = titled(
        path,
        FIG10_SIZE,
        "TPC-A throughput per 100 ms window around a memory-node kill (remora bench kv)",
        subtitle,
    )?;
    let x_max = runs
        .iter()
        .flat_map(|r| r.windows.iter().map(|w| w.0).chain([r.kill_at]).chain(r.rebuilt_at))
        .filter(|x| x.is_finite())
        .fold(0.0, f64::max);
    let x_max = if x_max > 0.0 { x_max * 1.02 } else { 1.0 };
    let top = y_top(runs.iter().flat_map(|r| r.windows.iter().map(|w| w.1)));
    let mut chart = ChartBuilder::on(&body)
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(75)
        .build_cartesian_2d(0.0..x_max, 0.0..top)?;
    chart
        .configure_mesh()
        .x_desc("time (s)")
        .y_desc("transactions per second (100 ms windows)")
        .x_label_formatter(&|x| format!("{x:.1}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    for (i, r) in runs.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let pts: Vec<(f64, f64)> = r
            .windows
            .iter()
            .copied()
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .collect();
        chart
            .draw_series(LineSeries::new(pts, colour.stroke_width(2)))?
            .label(r.label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], colour.stroke_width(2)));
        // Marker labels stacked from the top, a row per run, so runs killed
        // at the same moment stay readable.
        let y = top * (0.97 - 0.05 * i as f64);
        let marks = [(Some(r.kill_at), "kill"), (r.rebuilt_at, "rebuilt")];
        for (at, what) in marks
            .into_iter()
            .filter_map(|(at, w)| Some((at.filter(|a| a.is_finite())?, w)))
        {
            let (dash, gap) = if what == "kill" { (6, 4) } else { (2, 3) };
            chart.draw_series(DashedLineSeries::new(
                vec![(at, 0.0), (at, top)],
                dash,
                gap,
                colour.stroke_width(1),
            ))?;
            // Left of the line in the right half of the plot, so it stays inside.
            let (h, text) = if at > x_max / 2.0 {
                (HPos::Right, format!("{what} "))
            } else {
                (HPos::Left, format!(" {what}"))
            };
            let style = ("sans-serif", 12)
                .into_font()
                .color(&colour)
                .pos(Pos::new(h, VPos::Center));
            chart.draw_series(std::iter::once(Text::new(text, (at, y), style)))?;
        }
    }
    if !runs.is_empty() {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()?;
    }
    root.present()?;
    Ok(())
}

/// Writes Figure 10a of `runs` to `path`: TPS per window against time, a
/// line per run, and in the run's colour a dashed vertical line at its
/// kill and a dotted one at its rebuild. `subtitle` says what ran.
pub(crate) fn figure10a(path: &Path, runs: &[KillRun], subtitle: &str) -> anyhow::Result<()> {
    draw_figure10a(path, runs, subtitle)
        .map_err(|e| anyhow!("{e}"))
        .with_context(|| format!("drawing Figure 10a to {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figure8_names_every_line() {
        let ratios = [0.1, 0.25, 0.5, 1.0];
        let scheme = |label: &str, tps: f64| Line {
            label: label.to_string(),
            points: ratios
                .iter()
                .map(|&r| (r, tps * r, Some(64.0 * MIB * (1.0 - r) + MIB)))
                .collect(),
        };
        let lines = vec![
            Line {
                label: "local".to_string(),
                points: vec![(1.0, 90_000.0, None)],
            },
            Line {
                label: "redis:2".to_string(),
                points: vec![(0.0, 30_000.0, Some(300.0 * MIB))],
            },
            scheme("ec-batch", 80_000.0),
            scheme("replication", 70_000.0),
        ];
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fig8.svg");
        figure8(&path, &lines, "test run").unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.contains("<svg"), "{}", &svg[..svg.len().min(200)]);
        for want in [
            "local",
            "redis:2",
            "ec-batch",
            "replication",
            "(a) throughput",
            "(b) remote memory",
            "test run",
        ] {
            assert!(svg.contains(want), "{want} missing");
        }
        assert_eq!(span(&[(0.3, 5.0)]), [(0.0, 5.0), (1.0, 5.0)]);
        assert_eq!(span(&[(0.5, 1.0), (0.1, 2.0)]), [(0.1, 2.0), (0.5, 1.0)]);
        assert!(yardstick("local") && yardstick("redis:2+wait") && !yardstick("ec-batch"));
        assert!(figure8(&dir.path().join("no/such/dir/f.svg"), &lines, "t").is_err());
        // Nothing to draw is still a figure (empty axes), not an error.
        figure8(&dir.path().join("empty.svg"), &[], "t").unwrap();
    }

    #[test]
    fn figure10a_names_every_run_and_marks_kill_and_rebuild() {
        let run = |label: &str, kill_at: f64, rebuilt_at: Option<f64>| KillRun {
            label: label.to_string(),
            windows: (1..=60)
                .map(|i| {
                    let t = f64::from(i) * 0.1;
                    (
                        t,
                        if t > kill_at && t < kill_at + 0.5 {
                            2_000.0
                        } else {
                            50_000.0
                        },
                    )
                })
                .collect(),
            kill_at,
            rebuilt_at,
        };
        let runs = vec![
            run("ec-batch", 2.0, Some(3.1)),
            run("replication", 2.0, Some(2.6)),
            run("non-ft", 4.5, None),
        ];
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fig10a.svg");
        figure10a(&path, &runs, "test run").unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.contains("<svg"), "{}", &svg[..svg.len().min(200)]);
        for want in ["ec-batch", "replication", "non-ft", "kill", "rebuilt", "test run"] {
            assert!(svg.contains(want), "{want} missing");
        }
        // The title names the kill once; the rest are the markers' labels.
        assert_eq!(svg.matches("kill").count(), 1 + 3, "a kill label per run");
        assert_eq!(svg.matches("rebuilt").count(), 2, "a rebuilt label per rebuilt run");
    }
}
