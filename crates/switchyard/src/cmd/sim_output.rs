//! What `switchyard sim` prints and writes: tables, sweep plots, every request's fate.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::time::Duration;

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use switchyard_router::PolicyKind;
use switchyard_sim::SimReport;

use super::sim::{SimArgs, SweepPoint};

/// One request's fate, as `--requests-out` writes it.
#[derive(Serialize)]
struct RequestLine<'a> {
    policy: &'a str,
    id: u64,
    arrival_ms: f64,
    ttft_ms: Option<f64>,
    e2e_ms: Option<f64>,
    worker: Option<u64>,
    output_tokens: u32,
    cached_tokens: u32,
    outcome: &'a str,
}

/// Writes every request of each run, labelled (a policy, or a planned or fixed fleet).
pub(super) fn write_requests<'a>(
    path: &std::path::Path,
    runs: impl IntoIterator<Item = (&'a str, &'a SimReport)>,
) -> Result<()> {
    use std::io::Write as _;
    let file =
        std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    let mut out = std::io::BufWriter::new(file);
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    for (label, report) in runs {
        for r in &report.request_records {
            let line = RequestLine {
                policy: label,
                id: r.id,
                arrival_ms: ms(r.arrival),
                ttft_ms: r.first_token.map(|t| ms(t.saturating_sub(r.arrival))),
                e2e_ms: r.finished.map(|t| ms(t.saturating_sub(r.arrival))),
                worker: r.worker.map(|w| w.worker_id.0),
                output_tokens: r.output_tokens,
                cached_tokens: r.cached_tokens,
                outcome: r.outcome,
            };
            serde_json::to_writer(&mut out, &line)?;
            out.write_all(b"\n")?;
        }
    }
    out.flush()
        .with_context(|| format!("cannot write {}", path.display()))
}

pub(super) fn sweep_table(trace: &std::path::Path, points: &[SweepPoint]) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(out, "sweep of {}", trace.display());
    let _ = writeln!(
        out,
        "{:<14} {:>7} {:>7} {:>9} {:>9} {:>9} {:>9} {:>8} {:>9} {:>8} {:>8} {:>7}",
        "policy",
        "workers",
        "speedup",
        "req/s/w",
        "ttft mean",
        "ttft p90",
        "ttft p99",
        "itl p99",
        "e2e mean",
        "hit rate",
        "refused",
        "wall s"
    );
    for p in points {
        let r = &p.report;
        let _ = writeln!(
            out,
            "{:<14} {:>7} {:>7} {:>9.3} {:>9.1} {:>9.1} {:>9.1} {:>8.2} {:>9.1} {:>7.1}% {:>8} {:>7.2}",
            r.policy,
            p.workers,
            p.speedup,
            p.offered_per_worker,
            r.ttft_ms.mean,
            r.ttft_ms.p90,
            r.ttft_ms.p99,
            r.itl_ms.p99,
            r.e2e_ms.mean,
            r.cache_hit_rate * 100.0,
            r.rejected + r.failed,
            r.wall_seconds
        );
    }
    out
}

/// TTFT p90 against offered load, a line per policy and fleet size.
pub(super) fn plot(
    path: &std::path::Path,
    trace: &std::path::Path,
    points: &[SweepPoint],
) -> Result<()> {
    use plotters::prelude::*;

    switchyard_workload::bench::register_font();
    let mut series: BTreeMap<(String, u32), Vec<(f64, f64)>> = BTreeMap::new();
    for p in points {
        series
            .entry((p.report.policy.clone(), p.workers))
            .or_default()
            .push((p.offered_per_worker, p.report.ttft_ms.p90));
    }
    let x_max = points
        .iter()
        .map(|p| p.offered_per_worker)
        .fold(0.0, f64::max)
        * 1.05;
    let y_max = points
        .iter()
        .map(|p| p.report.ttft_ms.p90)
        .fold(0.0, f64::max)
        * 1.1;
    let draw = || -> Result<(), Box<dyn std::error::Error>> {
        let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
        root.fill(&WHITE)?;
        let name = trace.file_name().map_or_else(
            || trace.display().to_string(),
            |n| n.to_string_lossy().into(),
        );
        let mut chart = ChartBuilder::on(&root)
            .caption(format!("TTFT p90 against load: {name}"), ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(44)
            .y_label_area_size(64)
            .build_cartesian_2d(0.0..x_max.max(1e-3), 0.0..y_max.max(1.0))?;
        chart
            .configure_mesh()
            .x_desc("offered load, requests/s per worker")
            .y_desc("TTFT p90, ms")
            .draw()?;
        for (i, ((policy, workers), mut line)) in series.into_iter().enumerate() {
            line.sort_by(|a, b| a.0.total_cmp(&b.0));
            let color = Palette99::pick(i).to_rgba();
            chart
                .draw_series(LineSeries::new(line.clone(), color.stroke_width(2)))?
                .label(format!("{policy}, {workers} workers"))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
            chart.draw_series(line.into_iter().map(|p| Circle::new(p, 3, color.filled())))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
        root.present()?;
        Ok(())
    };
    draw().map_err(|e| anyhow::anyhow!("cannot draw {}: {e}", path.display()))
}

pub(super) fn progress_bar(len: u64, policy: PolicyKind, quiet: bool) -> ProgressBar {
    if quiet || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    let style =
        ProgressStyle::with_template("{prefix:>14} [{bar:40}] {pos}/{len} requests ({elapsed})")
            .map(|s| s.progress_chars("=> "))
            .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar.set_prefix(policy.name());
    bar
}

/// Writes the output; a reader that went away (`| head`) is not an error.
pub(super) fn write_stdout(text: &str) -> Result<()> {
    use std::io::Write;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

pub(super) fn table(
    args: &SimArgs,
    workers: &[u32],
    requests: usize,
    reports: &[SimReport],
) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} requests from {} on {} workers",
        requests,
        args.trace.display(),
        workers
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",")
    );
    let _ = writeln!(
        out,
        "{:<14} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8} {:>9} {:>10} {:>10} {:>8} {:>7} {:>8} {:>8} {:>8}",
        "policy",
        "ttft mean",
        "ttft p50",
        "ttft p90",
        "ttft p99",
        "itl mean",
        "itl p99",
        "tpot p99",
        "e2e mean",
        "e2e p99",
        "hit rate",
        "req cv",
        "preempt",
        "refused",
        "wall s"
    );
    for r in reports {
        let _ = writeln!(
            out,
            "{:<14} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>8.2} {:>8.2} {:>9.2} {:>10.1} {:>10.1} {:>7.1}% {:>7.3} {:>8} {:>8} {:>8.2}",
            r.policy,
            r.ttft_ms.mean,
            r.ttft_ms.p50,
            r.ttft_ms.p90,
            r.ttft_ms.p99,
            r.itl_ms.mean,
            r.itl_ms.p99,
            r.tpot_ms.p99,
            r.e2e_ms.mean,
            r.e2e_ms.p99,
            r.cache_hit_rate * 100.0,
            r.load_spread.requests_cv,
            r.preemptions,
            r.rejected + r.failed,
            r.wall_seconds
        );
    }
    if let Some(r) = reports.first() {
        let _ = writeln!(
            out,
            "(ms; {:.0} simulated seconds; {:.2} req/s, {:.0} output tok/s for {})",
            r.simulated_seconds,
            r.throughput.requests_per_sec,
            r.throughput.output_tokens_per_sec,
            r.policy
        );
    }
    for r in reports {
        let Some(m) = &r.media else {
            continue;
        };
        let classes = m
            .ttft_ms_by_class
            .iter()
            .map(|(class, d)| format!("{class} {:.0}/{:.0}", d.p50, d.p99))
            .collect::<Vec<_>>()
            .join(", ");
        let _ = writeln!(
            out,
            "{}: {} requests with media ({} items, {} found in the feature store), {} routed to a worker holding \
             theirs; {} \
             encoders {:.1} % busy, encoded p50 {:.0} ms p99 {:.0} ms after admission; TTFT \
             p50/p99 ms by class: {classes}",
            r.policy,
            m.requests,
            m.items,
            m.cached,
            m.skipped,
            m.encoders,
            m.encoder_utilisation * 100.0,
            m.encode_wait_ms.p50,
            m.encode_wait_ms.p99,
        );
    }
    for r in reports {
        let Some(s) = &r.sessions else {
            continue;
        };
        let turns = s
            .ttft_ms_by_turn
            .iter()
            .zip(&s.requests_by_turn)
            .enumerate()
            .filter(|(_, (_, n))| **n > 0)
            .map(|(i, (d, _))| {
                let plus = if i + 1 == switchyard_sim::sessions::TURNS_REPORTED {
                    "+"
                } else {
                    ""
                };
                format!("{}{plus} {:.0}/{:.0}", i + 1, d.p50, d.p99)
            })
            .collect::<Vec<_>>()
            .join(", ");
        let total = (s.fleet_seconds + s.tool_seconds + s.client_seconds).max(f64::MIN_POSITIVE);
        let _ = writeln!(
            out,
            "{}: {} sessions (closed loop), {:.1} turns each (most {}), lasting p50 {:.1} s p99 \
             {:.1} s; waiting on the fleet {:.0} %, on tools {:.0} %, on the client {:.0} %; \
             TTFT p50/p99 ms by turn: {turns}",
            r.policy,
            s.sessions,
            s.turns_mean,
            s.turns_max,
            s.duration_ms.p50 / 1e3,
            s.duration_ms.p99 / 1e3,
            100.0 * s.fleet_seconds / total,
            100.0 * s.tool_seconds / total,
            100.0 * s.client_seconds / total,
        );
    }
    for r in reports {
        let Some(f) = &r.failures else {
            continue;
        };
        let _ = writeln!(
            out,
            "{}: {} faults, {} requests caught ({} restarted, {} moved mid-stream: {} by KV \
             transfer, {} by re-prefill), {} failed, {} completed after a move; stall p50 {:.0} \
             ms p99 {:.0} ms; e2e mean {:.0} ms moved vs {:.0} ms untouched; {:.0} worker-s down",
            r.policy,
            f.faults,
            f.interrupted,
            f.restarted,
            f.migrations,
            f.by_transfer,
            f.by_reprefill,
            f.failed,
            f.completed_after_move,
            f.stall_ms.p50,
            f.stall_ms.p99,
            f.moved_e2e_ms.mean,
            f.untouched_e2e_ms.mean,
            f.worker_seconds_down
        );
    }
    out
}
