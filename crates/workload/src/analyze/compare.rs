//! Source against synthetic trace: the statistics synthesis is meant to preserve.

use std::fmt;

use serde::Serialize;

use super::TraceAnalysis;
use crate::stats::relative_diff;

/// Reads one statistic off an analysis.
type Statistic = fn(&TraceAnalysis) -> f64;

/// One statistic of both traces.
#[derive(Debug, Clone, Serialize)]
pub struct ComparisonRow {
    pub name: &'static str,
    pub source: f64,
    pub synthetic: f64,
    /// `|synthetic - source| / source`.
    pub relative_diff: f64,
}

/// The statistics `switchyard synth generate` prints after writing a trace.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    pub rows: Vec<ComparisonRow>,
}

impl Comparison {
    pub fn of(source: &TraceAnalysis, synthetic: &TraceAnalysis) -> Self {
        let pick: [(&'static str, Statistic); 12] = [
            ("requests", |a| a.requests as f64),
            ("duration (s)", |a| a.duration.as_secs_f64()),
            ("block reuse ratio", |a| a.blocks.reuse_ratio),
            ("ISL mean", |a| a.input_length.mean),
            ("ISL p50", |a| a.input_length.p50),
            ("ISL p90", |a| a.input_length.p90),
            ("OSL mean", |a| a.output_length.mean),
            ("OSL p50", |a| a.output_length.p50),
            ("OSL p90", |a| a.output_length.p90),
            ("core tree blocks", |a| a.core_tree.blocks as f64),
            ("shared blocks/request", |a| {
                a.core_tree.shared_blocks_per_request.mean
            }),
            ("unique prompt blocks", |a| {
                a.unique_prompts.length_blocks.mean
            }),
        ];
        let rows = pick
            .into_iter()
            .map(|(name, stat)| {
                let (source, synthetic) = (stat(source), stat(synthetic));
                ComparisonRow {
                    name,
                    source,
                    synthetic,
                    relative_diff: relative_diff(synthetic, source),
                }
            })
            .collect();
        Self { rows }
    }

    /// The row named `name`.
    pub fn row(&self, name: &str) -> Option<&ComparisonRow> {
        self.rows.iter().find(|r| r.name == name)
    }
}

impl fmt::Display for Comparison {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:<24}{:>12}{:>12}{:>9}",
            "", "source", "synthetic", "diff"
        )?;
        for row in &self.rows {
            let precision = if row.source.abs() < 10.0 { 3 } else { 0 };
            writeln!(
                f,
                "{:<24}{:>12.*}{:>12.*}{:>8.1}%",
                row.name,
                precision,
                row.source,
                precision,
                row.synthetic,
                row.relative_diff * 100.0
            )?;
        }
        Ok(())
    }
}
