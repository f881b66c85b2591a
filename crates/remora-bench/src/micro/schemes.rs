//! Which schemes `remora bench micro` runs and how they are built.
//!
//! - `--scheme all` stands for every entry of the runtime's scheme table
//!   ([`SCHEMES`]), in its order (`non-ft` first, the baseline the ratio
//!   table divides by). The table is read, never copied, so a scheme added
//!   to the runtime is benchmarked without touching this file. The Redis
//!   baseline is not a remora scheme: it runs only when named.
//! - `--ec K+M` is the erasure code of the schemes whose table entry says it
//!   applies (`erasure_coded`); `--late-binding` is the `ec-split` switch.
//!   Both reach the runtime through [`SchemeOptions`] and [`make`], which is
//!   also what validates them (a code a scheme refuses is refused up front,
//!   before a cluster is started).
//! - The cluster every remora scheme shares has room for all of them: at
//!   least k + m + 1 memory nodes (a spare to rebuild onto), and far
//!   capacity for every run's redundancy at once, since a finished run's
//!   regions are reclaimed only after its heartbeat timeout.

use std::fmt;

use remora_runtime::scheme::{SCHEMES, SchemeInfo, SchemeOptions, make};

use super::MEMNODES;

/// The `--scheme` name that stands for every scheme of the table.
pub(crate) const ALL: &str = "all";
/// Replicas `redis-cache` gets when the name gives none.
const DEFAULT_REPLICAS: u32 = 2;
/// Most replicas `redis-cache:R` accepts.
pub(crate) const MAX_REPLICAS: u32 = 8;
/// Widest code `--ec` accepts: k + m + 1 memory-node processes on this machine.
pub(crate) const MAX_EC_WIDTH: usize = 16;
/// Far bytes a scheme without an erasure code may need per data byte
/// (replication keeps 3 copies; whatever the scheme, never assume less).
const FLAT_FACTOR: u64 = 3;

/// An erasure code given as `K+M`: k data and m parity spans (or fragments).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ec {
    /// Data spans per spanset.
    pub k: usize,
    /// Parity spans per spanset.
    pub m: usize,
}

impl fmt::Display for Ec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}+{}", self.k, self.m)
    }
}

/// Parses `--ec K+M`: k ≥ 1, m ≥ 0 and k + m ≤ [`MAX_EC_WIDTH`]. Whether a
/// scheme accepts the code (RS needs m ≥ 1) is its own call, checked by
/// [`check_builds`].
pub(crate) fn parse_ec(s: &str) -> Result<Ec, String> {
    let (k, m) = s
        .split_once('+')
        .ok_or_else(|| format!("{s:?} is not an erasure code K+M (e.g. 4+2)"))?;
    let num = |x: &str, what: &str| -> Result<usize, String> {
        let x = x.trim();
        if x.is_empty() || !x.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("{s:?}: {what} {x:?} is not a whole number (K+M, e.g. 4+2)"));
        }
        x.parse().map_err(|_| format!("{s:?}: {what} {x:?} is too large"))
    };
    let (k, m) = (num(k, "K")?, num(m, "M")?);
    if k == 0 {
        return Err(format!("{s:?}: K (data spans) must be at least 1"));
    }
    if k.saturating_add(m) > MAX_EC_WIDTH {
        return Err(format!(
            "{s:?}: K+M = {} is more than {MAX_EC_WIDTH} (the cluster runs K+M+1 memory nodes on this machine)",
            k.saturating_add(m)
        ));
    }
    Ok(Ec { k, m })
}

/// What one `--scheme` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Spec {
    /// A remora fault-tolerance scheme.
    Remora(String),
    /// The baseline: a local cache in front of Redis with this many replicas.
    Redis(u32),
}

impl Spec {
    pub(crate) fn parse(s: &str) -> Option<Self> {
        if s == "redis-cache" {
            return Some(Self::Redis(DEFAULT_REPLICAS));
        }
        if let Some(r) = s.strip_prefix("redis-cache:") {
            return r.parse().ok().filter(|&r| r <= MAX_REPLICAS).map(Self::Redis);
        }
        info(s).map(|_| Self::Remora(s.to_string()))
    }
}

/// The scheme table's entry for `name` (a scheme's name, or a label
/// `NAME:cN` for a compacting scheme run with N compaction threads).
pub(crate) fn info(name: &str) -> Option<&'static SchemeInfo> {
    let (base, threads) = split_label(name);
    SCHEMES
        .iter()
        .find(|s| s.name == base)
        .filter(|s| threads.is_none() || s.compacts)
}

/// A run label's scheme name and compaction threads: `ec-batch-local:c2`
/// is ("ec-batch-local", Some(2)); a plain name has `None`.
pub(crate) fn split_label(label: &str) -> (&str, Option<usize>) {
    if let Some((base, n)) = label.rsplit_once(":c") {
        if let Ok(n) = n.parse() {
            return (base, Some(n));
        }
    }
    (label, None)
}

/// The `--scheme` list with `all` replaced by every scheme of the table (in
/// its order), each name kept once, at its first place; with compaction
/// thread counts, each compacting scheme once per count (`NAME:cN`).
pub(crate) fn expand(names: &[String], compaction: &[u32]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for n in names {
        let all: Vec<String> = if n == ALL {
            SCHEMES.iter().map(|s| s.name.to_string()).collect()
        } else {
            vec![n.clone()]
        };
        let add = all.into_iter().flat_map(|a| {
            if !compaction.is_empty() && info(&a).is_some_and(|i| i.compacts) && split_label(&a).1.is_none() {
                compaction.iter().map(|c| format!("{a}:c{c}")).collect()
            } else {
                vec![a]
            }
        });
        for a in add {
            if !out.contains(&a) {
                out.push(a);
            }
        }
    }
    out
}

/// Every name `--scheme` accepts, for error messages.
pub(crate) fn known() -> String {
    let names: Vec<&str> = SCHEMES.iter().map(|s| s.name).collect();
    format!(
        "{}, {ALL} (every one of them), redis-cache[:R] with R <= {MAX_REPLICAS}",
        names.join(", ")
    )
}

/// The options every remora scheme is built with.
pub(crate) fn options(ec: Ec, late_binding: bool, compaction_trigger: Option<f64>) -> SchemeOptions {
    let d = SchemeOptions::default();
    SchemeOptions {
        k: ec.k,
        m: ec.m,
        late_binding,
        compaction_trigger: compaction_trigger.unwrap_or(d.compaction_trigger),
        ..d
    }
}

/// Builds each remora scheme of `names` once with `opts`, so a code or
/// switch a scheme refuses is an error before anything starts.
pub(crate) fn check_builds(names: &[String], opts: &SchemeOptions) -> Result<(), String> {
    for name in names {
        if let Some(i) = info(name) {
            make(split_label(name).0, opts).map_err(|e| {
                if i.erasure_coded {
                    format!("--ec {}+{}: scheme {name} refuses it: {e}", opts.k, opts.m)
                } else {
                    format!("scheme {name}: {e}")
                }
            })?;
        }
    }
    Ok(())
}

/// Whether any of `names` is an erasure-coded remora scheme.
pub(crate) fn any_erasure_coded(names: &[String]) -> bool {
    names.iter().any(|n| info(n).is_some_and(|i| i.erasure_coded))
}

/// Memory nodes of the cluster for `names`: [`MEMNODES`], or k + m + 1
/// when an erasure-coded scheme needs more.
pub(crate) fn memnodes(names: &[String], ec: Ec) -> usize {
    if any_erasure_coded(names) {
        MEMNODES.max(ec.k + ec.m + 1)
    } else {
        MEMNODES
    }
}

/// Far bytes scheme `name` may need per data byte, rounded up: its
/// redundancy twice over (holes and kept copies of swapped-in spans stay
/// allocated), and never less than [`FLAT_FACTOR`].
pub(crate) fn far_factor(name: &str, ec: Ec) -> u64 {
    match info(name) {
        Some(i) if i.erasure_coded => {
            let k = ec.k.max(1) as u64;
            (2 * (k + ec.m as u64)).div_ceil(k).max(FLAT_FACTOR)
        }
        _ => FLAT_FACTOR,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ec_parses_and_refuses_bad_codes() {
        assert_eq!(parse_ec("4+2"), Ok(Ec { k: 4, m: 2 }));
        assert_eq!(parse_ec(" 8 + 3 "), Ok(Ec { k: 8, m: 3 }));
        assert_eq!(parse_ec("1+0"), Ok(Ec { k: 1, m: 0 }));
        assert_eq!(parse_ec("10+6"), Ok(Ec { k: 10, m: 6 }));
        for bad in [
            "",
            "4",
            "4+",
            "+2",
            "0+2",
            "4+-1",
            "-4+2",
            "4+2+1",
            "a+b",
            "4.0+2",
            "10+7",
            "99999999999999999999+1",
        ] {
            assert!(parse_ec(bad).is_err(), "{bad:?} was accepted");
        }
        assert_eq!(Ec { k: 4, m: 2 }.to_string(), "4+2");
    }

    #[test]
    fn all_expands_to_the_scheme_table_in_order() {
        let table: Vec<String> = SCHEMES.iter().map(|s| s.name.to_string()).collect();
        assert_eq!(table.first().map(String::as_str), Some("non-ft"));
        assert_eq!(expand(&["all".into()], &[]), table);
        // Named schemes keep their place; `all` adds the rest once each;
        // the Redis baseline only when named.
        let mut want = vec!["ec-batch".to_string(), "redis-cache".to_string()];
        want.extend(table.iter().filter(|s| *s != "ec-batch").cloned());
        assert_eq!(
            expand(
                &["ec-batch".into(), "redis-cache".into(), "all".into(), "non-ft".into()],
                &[]
            ),
            want
        );
        assert!(!expand(&["all".into()], &[]).iter().any(|s| s.starts_with("redis")));
        for s in expand(&["all".into()], &[]) {
            assert_eq!(Spec::parse(&s), Some(Spec::Remora(s.clone())));
        }
    }

    #[test]
    fn compaction_thread_counts_expand_compacting_schemes_only() {
        let got = expand(
            &["non-ft".into(), "ec-batch-local".into(), "ec-batch-remote".into()],
            &[0, 2],
        );
        assert_eq!(
            got,
            [
                "non-ft",
                "ec-batch-local:c0",
                "ec-batch-local:c2",
                "ec-batch-remote:c0",
                "ec-batch-remote:c2"
            ]
        );
        for s in &got {
            assert_eq!(Spec::parse(s), Some(Spec::Remora(s.clone())), "{s}");
        }
        assert_eq!(split_label("ec-batch-local:c2"), ("ec-batch-local", Some(2)));
        assert_eq!(split_label("ec-batch"), ("ec-batch", None));
        // A count on a scheme that does not compact is not a scheme.
        assert_eq!(Spec::parse("non-ft:c2"), None);
    }

    #[test]
    fn schemes_build_with_the_code_or_say_why_not() {
        let all = expand(&["all".into()], &[]);
        assert!(check_builds(&all, &options(Ec { k: 4, m: 2 }, false, None)).is_ok());
        assert!(check_builds(&all, &options(Ec { k: 6, m: 3 }, false, None)).is_ok());
        // RS needs a parity span: the erasure-coded schemes refuse m = 0, by name.
        let err = check_builds(&all, &options(Ec { k: 4, m: 0 }, false, None)).unwrap_err();
        assert!(err.contains("--ec 4+0") && err.contains("ec-batch"), "{err}");
        // Schemes without a code ignore it.
        assert!(
            check_builds(
                &["non-ft".into(), "replication".into()],
                &options(Ec { k: 4, m: 0 }, false, None)
            )
            .is_ok()
        );
        // A trigger that is not a share is refused before anything starts.
        let err = check_builds(&all, &options(Ec { k: 4, m: 2 }, false, Some(1.5))).unwrap_err();
        assert!(err.contains("trigger"), "{err}");
        assert_eq!(memnodes(&["non-ft".into()], Ec { k: 10, m: 6 }), MEMNODES);
        assert_eq!(memnodes(&all, Ec { k: 10, m: 6 }), 17);
        assert_eq!(memnodes(&all, Ec { k: 4, m: 2 }), MEMNODES);
        assert_eq!(far_factor("ec-batch", Ec { k: 4, m: 2 }), 3);
        assert_eq!(far_factor("ec-batch", Ec { k: 1, m: 3 }), 8);
        assert_eq!(far_factor("non-ft", Ec { k: 1, m: 3 }), 3);
    }
}
