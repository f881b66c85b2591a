//! The READ latency phase: one request outstanding, the two sides
//! alternating in blocks of samples (see the module docs of `net`).

use std::time::Instant;

use remora_proto::ByteSize;

use super::pattern::{Image, Offsets};
use super::stats::Latency;
use super::{Checked, Endpoint, Names, NetArgs, Remora, Side, progress, to_usize};

/// The latency results of one size.
pub(super) struct LatencyRow {
    pub(super) size: ByteSize,
    pub(super) raw: Latency,
    pub(super) remora: Latency,
}

impl LatencyRow {
    pub(super) fn ratio(&self, q: f64) -> f64 {
        self.remora.at(q) as f64 / self.raw.at(q).max(1) as f64
    }
}

pub(super) fn latency_phase<B: Endpoint>(
    args: &NetArgs,
    raw: &mut B,
    rem: &mut Remora,
    names: Names,
    image: &Image,
    verified: &mut Checked,
) -> anyhow::Result<Vec<LatencyRow>> {
    let region = args.region_size.0;
    let mut rows = Vec::new();
    // Per size: a read buffer and one offset sequence per side, identical for both.
    let mut state = Vec::new();
    for (i, &size) in args.sizes.iter().enumerate() {
        rows.push(LatencyRow {
            size,
            raw: Latency::new()?,
            remora: Latency::new()?,
        });
        let seed = 0x5eed_0000 + i as u64;
        state.push((
            vec![0u8; to_usize(size.0)?],
            Offsets::new(seed, region, size.0),
            Offsets::new(seed, region, size.0),
        ));
    }
    progress(format_args!(
        "latency: warming up ({} round trips per size and side)",
        args.warmup
    ));
    for (buf, raw_offs, rem_offs) in &mut state {
        sample_block(raw, names.base, raw_offs, buf, args.warmup, image, None)?;
        sample_block(rem, names.subject, rem_offs, buf, args.warmup, image, None)?;
        verified.replies += 2 * args.warmup;
    }
    let rounds = args.samples.div_ceil(args.block);
    progress(format_args!(
        "latency: {} samples per size and side in {rounds} interleaved blocks of up to {}",
        args.samples, args.block
    ));
    let mut next_report = 1;
    for r in 0..rounds {
        let n = args.block.min(args.samples - r * args.block);
        for (i, (row, (buf, raw_offs, rem_offs))) in rows.iter_mut().zip(&mut state).enumerate() {
            for side in Side::order((r + i as u64) % 2 == 0) {
                match side {
                    Side::Raw => sample_block(raw, names.base, raw_offs, buf, n, image, Some(&mut row.raw))?,
                    Side::Remora => sample_block(rem, names.subject, rem_offs, buf, n, image, Some(&mut row.remora))?,
                }
            }
            verified.replies += 2 * n;
        }
        if (r + 1) * 10 >= next_report * rounds {
            let p50: Vec<String> = rows
                .iter()
                .map(|row| format!("{} {:.2}×", row.size, row.ratio(0.5)))
                .collect();
            progress(format_args!(
                "latency: {}% done; p50 {}/{} so far: {}",
                next_report * 10,
                names.subject,
                names.base,
                p50.join(", ")
            ));
            while next_report * rounds <= (r + 1) * 10 {
                next_report += 1;
            }
        }
    }
    Ok(rows)
}

/// `n` timed round trips; each reply is checked after the clock stops.
fn sample_block<E: Endpoint>(
    e: &mut E,
    side: &str,
    offs: &mut Offsets,
    buf: &mut [u8],
    n: u64,
    image: &Image,
    mut hist: Option<&mut Latency>,
) -> anyhow::Result<()> {
    for _ in 0..n {
        let off = offs.next_offset();
        let t0 = Instant::now();
        e.read(off, buf)?;
        let dt = t0.elapsed();
        if let Some(h) = hist.as_deref_mut() {
            h.record(dt);
        }
        image.check(side, off, buf)?;
    }
    Ok(())
}
