//! The throughput timelines the apps draw (`demo`, `chaos`): time across in
//! seconds, thousands of operations per second up, on a white SVG canvas.

use std::path::Path;

use anyhow::{Result, anyhow};
use plotters::coord::Shift;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

/// A chart of the timeline.
pub(crate) type Chart<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// The drawing error of `path` as an `anyhow` error.
pub(crate) fn err<E: std::error::Error + Send + Sync>(
    path: &Path,
) -> impl Fn(DrawingAreaErrorKind<E>) -> anyhow::Error + Copy + '_ {
    move |e| anyhow!("drawing {}: {e}", path.display())
}

/// A white canvas of `size` to draw on.
pub(crate) fn canvas(path: &Path, size: (u32, u32)) -> Result<DrawingArea<SVGBackend<'_>, Shift>> {
    let root = SVGBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE).map_err(err(path))?;
    Ok(root)
}

/// The timeline's axes on `root`: `tmax` seconds across, `ymax` thousand
/// operations per second up (`y_desc` says of what).
pub(crate) fn timeline<'a, 'b>(
    path: &Path,
    root: &'a DrawingArea<SVGBackend<'b>, Shift>,
    title: &str,
    (tmax, ymax): (f64, f64),
    y_desc: &str,
) -> Result<Chart<'a, 'b>> {
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 15))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(55)
        .build_cartesian_2d(0.0..tmax, 0.0..ymax)
        .map_err(err(path))?;
    chart
        .configure_mesh()
        .x_desc("time (s)")
        .y_desc(y_desc)
        .light_line_style(RGBColor(238, 238, 238))
        .draw()
        .map_err(err(path))?;
    Ok(chart)
}
