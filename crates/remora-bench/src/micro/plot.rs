//! The `--sweep` plot: p99 latency (log scale) against offered load, one
//! line per scheme, each scheme's saturation a dashed vertical line of its
//! colour labelled with its name and rate — the paper's Figure 5 drawn from
//! one run.
//!
//! Drawn with `plotters`' SVG backend and no font backend: plotters then
//! lays text out with approximate metrics and the SVG carries it as
//! `<text>` elements for the viewer to render, so nothing here needs
//! fontconfig, FreeType or a font file. A rate at which a scheme did not
//! keep up is drawn as a cross instead of a dot: its p99 grows with the
//! run's length and is a lower bound.

use std::path::Path;

use anyhow::{Context, anyhow};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::sweep::{Curve, KEEP_UP, Summary};

/// Size of the image, pixels.
const SIZE: (u32, u32) = (1100, 680);

/// Colours of the curves, in the order the schemes ran (then repeated).
pub(crate) const COLOURS: [RGBColor; 8] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
    RGBColor(0x17, 0xbe, 0xcf),
];

/// The y range: whole decades around every positive p99, with room for
/// the saturation labels above the highest.
fn y_range(curves: &[Curve]) -> (f64, f64) {
    let ps = curves
        .iter()
        .flat_map(|c| c.points.iter().map(|p| p.p99_us))
        .filter(|&p| p > 0.0);
    let (lo, hi) = ps.fold((f64::INFINITY, 0.0f64), |(lo, hi), p| (lo.min(p), hi.max(p)));
    if lo.is_finite() {
        (
            10f64.powf((lo / 1.5).log10().floor()),
            10f64.powf((hi * 4.0).log10().ceil()),
        )
    } else {
        (1.0, 1000.0)
    }
}

/// A log axis label: 1, 2 and 5 times a power of ten are labelled, the
/// other grid lines are not.
fn log_label(y: f64) -> String {
    if y <= 0.0 || !y.is_finite() {
        return String::new();
    }
    let lead = (y / 10f64.powf(y.log10().floor())).round();
    if ![1.0, 2.0, 5.0, 10.0].contains(&lead) {
        String::new()
    } else if y >= 1.0 {
        format!("{y:.0}")
    } else {
        format!("{y}")
    }
}

/// A white SVG canvas of `size` at `path` with a title and a subtitle line;
/// returns the whole canvas (to present) and the area below the titles.
pub(crate) type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

pub(crate) fn titled<'a>(
    path: &'a Path,
    size: (u32, u32),
    title: &str,
    subtitle: &str,
) -> Result<(Area<'a>, Area<'a>), Box<dyn std::error::Error>> {
    let root = SVGBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE)?;
    let (head, body) = root.split_vertically(50);
    head.draw(&Text::new(title.to_string(), (20, 6), ("sans-serif", 20).into_font()))?;
    head.draw(&Text::new(
        subtitle.to_string(),
        (20, 30),
        ("sans-serif", 13).into_font(),
    ))?;
    Ok((root, body))
}

fn draw(path: &Path, summary: &Summary, subtitle: &str) -> Result<(), Box<dyn std::error::Error>> {
    let (root, body) = titled(
        path,
        SIZE,
        "p99 latency vs offered load (remora bench micro, open loop)",
        subtitle,
    )?;

    let x_max = summary.rates.iter().copied().fold(0.0, f64::max) * 1.05;
    let (y_lo, y_hi) = y_range(&summary.curves);
    let mut chart = ChartBuilder::on(&body)
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(75)
        .build_cartesian_2d(0.0..x_max.max(1.0), (y_lo..y_hi).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("offered load (ops/s)")
        .y_desc("p99 latency (µs, log scale)")
        .x_label_formatter(&|x| format!("{x:.0}"))
        // Enough points for plotters to place a grid line at each 1..9 x 10^n.
        .y_labels(100)
        .y_label_formatter(&|y| log_label(*y))
        .light_line_style(WHITE.mix(0.0))
        .draw()?;

    for (i, c) in summary.curves.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let pts: Vec<(f64, f64)> = c
            .points
            .iter()
            .filter(|p| p.p99_us > 0.0)
            .map(|p| (p.rate, p.p99_us))
            .collect();
        chart
            .draw_series(LineSeries::new(pts, colour.stroke_width(2)))?
            .label(c.scheme.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2)));
        for p in c.points.iter().filter(|p| p.p99_us > 0.0) {
            if p.achieved >= KEEP_UP {
                chart.draw_series(std::iter::once(Circle::new((p.rate, p.p99_us), 4, colour.filled())))?;
            } else {
                chart.draw_series(std::iter::once(Cross::new(
                    (p.rate, p.p99_us),
                    5,
                    colour.stroke_width(2),
                )))?;
            }
        }
        if let Some(sat) = c.saturation {
            chart.draw_series(DashedLineSeries::new(
                vec![(sat, y_lo), (sat, y_hi)],
                6,
                4,
                colour.stroke_width(1),
            ))?;
            // Labels stacked from the top, one line per scheme, so two
            // schemes saturating at the same rate stay readable.
            // Left of the line when it is in the right half, so it stays inside.
            let y = y_hi / 1.25f64.powi(i as i32 + 1);
            let what = if summary.at_top(c) {
                format!("{} kept up at every rate swept (saturation >= {sat:.0}/s)", c.scheme)
            } else {
                format!("{} saturates at {sat:.0}/s", c.scheme)
            };
            let (h, label) = if sat > x_max / 2.0 {
                (HPos::Right, format!("{what} "))
            } else {
                (HPos::Left, format!(" {what}"))
            };
            let style = ("sans-serif", 12)
                .into_font()
                .color(&colour)
                .pos(Pos::new(h, VPos::Center));
            chart.draw_series(std::iter::once(Text::new(label, (sat, y), style)))?;
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

/// Writes the plot of `summary` to `path`; `subtitle` says what ran.
pub(crate) fn write(path: &Path, summary: &Summary, subtitle: &str) -> anyhow::Result<()> {
    draw(path, summary, subtitle)
        .map_err(|e| anyhow!("{e}"))
        .with_context(|| format!("drawing the sweep plot to {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::super::sweep::Point;
    use super::*;

    #[test]
    fn log_axis_labels_one_two_five() {
        let ys = [1.0, 2.0, 3.0, 5.0, 9.0, 10.0, 200.0, 700.0, 1000.0, 5000.0, 0.5, 0.0];
        let got: Vec<String> = ys.iter().map(|&y| log_label(y)).collect();
        assert_eq!(got, ["1", "2", "", "5", "", "10", "200", "", "1000", "5000", "0.5", ""]);
    }

    #[test]
    fn plot_names_every_scheme_and_marks_saturation() {
        let curve = |scheme: &str, sat: Option<f64>| Curve {
            scheme: scheme.to_string(),
            points: vec![
                Point {
                    rate: 1000.0,
                    achieved: 1.0,
                    p99_us: 20.0,
                },
                Point {
                    rate: 2000.0,
                    achieved: 0.5,
                    p99_us: 5000.0,
                },
            ],
            saturation: sat,
        };
        let s = Summary {
            curves: vec![
                curve("non-ft", Some(1000.0)),
                curve("ec-batch", None),
                curve("replication", Some(2000.0)),
            ],
            rates: vec![1000.0, 2000.0],
            at: vec![],
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.svg");
        write(&path, &s, "test").unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(200)]);
        for want in ["non-ft", "ec-batch", "non-ft saturates at 1000/s", "offered load"] {
            assert!(svg.contains(want), "{want} missing");
        }
        assert!(!svg.contains("ec-batch saturates"));
        assert!(svg.contains("replication kept up at every rate swept (saturation &gt;= 2000/s)"));
        assert!(!s.at_top(&s.curves[0]) && !s.at_top(&s.curves[1]) && s.at_top(&s.curves[2]));
        assert_eq!(y_range(&s.curves), (10.0, 100_000.0));
        assert!(write(&dir.path().join("no/such/dir/p.svg"), &s, "test").is_err());
    }
}
