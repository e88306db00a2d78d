//! The terminal report of `switchyard synth analyze`.

use std::fmt;
use std::time::Duration;

use super::TraceAnalysis;
use crate::stats::Summary;
use crate::units::{format_duration, thousands};

/// Width of the longest bar in the arrival-rate chart.
const BAR_WIDTH: usize = 40;

impl fmt::Display for TraceAnalysis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "Requests        {} over {} ({:.2} req/s)",
            thousands(self.requests as u64),
            format_duration(self.duration),
            self.mean_rate
        )?;
        writeln!(f, "Block size      {} tokens per hash id", self.block_size)?;
        writeln!(f)?;
        self.fmt_arrivals(f)?;
        writeln!(f)?;
        writeln!(
            f,
            "{:<22}{:>10}{:>10}{:>10}{:>10}{:>10}{:>10}",
            "", "mean", "min", "p50", "p90", "p99", "max"
        )?;
        summary_row(f, "Input tokens (ISL)", &self.input_length)?;
        summary_row(f, "Output tokens (OSL)", &self.output_length)?;
        summary_row(f, "Inter-arrival (ms)", &self.inter_arrival_ms)?;
        summary_row(
            f,
            "Shared blocks/request",
            &self.core_tree.shared_blocks_per_request,
        )?;
        summary_row(
            f,
            "Unique prompt blocks",
            &self.unique_prompts.length_blocks,
        )?;
        writeln!(f)?;
        let b = &self.blocks;
        writeln!(
            f,
            "Blocks          {} sent, {} distinct: reuse ratio {:.3}",
            thousands(b.total),
            thousands(b.distinct),
            b.reuse_ratio
        )?;
        let c = &self.core_tree;
        writeln!(
            f,
            "Core tree       {} shared blocks in {} radix nodes under {} root{}; depth up to {} blocks / {} nodes",
            thousands(c.blocks),
            thousands(c.radix_nodes as u64),
            c.roots,
            if c.roots == 1 { "" } else { "s" },
            c.max_depth_blocks,
            c.max_depth_nodes
        )?;
        let u = &self.unique_prompts;
        writeln!(
            f,
            "Unique prompts  {} requests continue past the core tree; {} end inside it",
            thousands(u.requests as u64),
            thousands(u.ending_in_core as u64)
        )?;
        write!(f, "{}", self.sessions)
    }
}

impl TraceAnalysis {
    fn fmt_arrivals(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rate = &self.arrival_rate;
        writeln!(
            f,
            "Arrival rate per {} window",
            format_duration(rate.window)
        )?;
        let peak = rate.requests.iter().copied().max().unwrap_or(0).max(1);
        for (slot, (count, per_sec)) in rate.requests.iter().zip(rate.rates()).enumerate() {
            let start = rate.window * slot as u32;
            let bar = "#".repeat(count * BAR_WIDTH / peak);
            writeln!(
                f,
                "  {:>9}  {:>7}  {:>8.2} req/s  {bar}",
                clock(start),
                thousands(*count as u64),
                per_sec
            )?;
        }
        Ok(())
    }
}

/// `h:mm:ss` from the first arrival.
fn clock(offset: Duration) -> String {
    let secs = offset.as_secs();
    format!("{}:{:02}:{:02}", secs / 3600, secs / 60 % 60, secs % 60)
}

fn summary_row(f: &mut fmt::Formatter<'_>, name: &str, s: &Summary) -> fmt::Result {
    writeln!(
        f,
        "{name:<22}{:>10.1}{:>10.0}{:>10.0}{:>10.0}{:>10.0}{:>10.0}",
        s.mean, s.min, s.p50, s.p90, s.p99, s.max
    )
}
