//! `switchyard sim --planner load,sla`: the trace on a fleet the planner sizes as it runs,
//! against the smallest fixed fleet that meets the same latency targets.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use serde::Serialize;
use switchyard_planner::{Mode, PlannerConfig, PredictorConfig, evaluate};
use switchyard_router::AdmissionConfig;
use switchyard_sim::{PlannerSim, PreparedWorkload, SimConfig, SimReport, SlaTargets, simulate};

use super::sim::{Plan, SimArgs, cache_view_for};
use switchyard_core::WorkerRole;
use switchyard_sim::TraceRequest;

#[derive(Debug, Args)]
pub struct PlanningArgs {
    /// Scale the fleet during the run with these planners (comma separated: load, sla),
    /// each compared with the smallest fixed fleet that meets the latency targets;
    /// --workers is the fleet they start with, the first --policy routes.
    #[arg(long, value_delimiter = ',', value_enum)]
    pub planner: Vec<PlannerArg>,
    /// Planner settings from a TOML file (the keys of the config tree's `[planner]`
    /// table), over the configuration's `[planner]`; the flags below override it.
    #[arg(long, value_name = "FILE.toml")]
    planner_config: Option<PathBuf>,
    /// Time to first token to hold [default: 500ms].
    #[arg(long, value_parser = humantime::parse_duration)]
    ttft_target: Option<Duration>,
    /// Inter-token latency to hold (of each request's mean) [default: 50ms].
    #[arg(long, value_parser = humantime::parse_duration)]
    itl_target: Option<Duration>,
    /// Share of requests that must meet both targets (for the fixed-fleet baseline).
    #[arg(long, default_value_t = 0.95)]
    sla_share: f64,
    /// How often the planner decides [default: 30s].
    #[arg(long, value_parser = humantime::parse_duration)]
    adjustment_interval: Option<Duration>,
    /// Most GPUs the fleet may use [default: 64].
    #[arg(long)]
    max_gpus: Option<u32>,
    /// Load predictor of the SLA planner [default: holt].
    #[arg(long, value_enum)]
    predictor: Option<PredictorArg>,
    /// Adjustment intervals per season, for the seasonal predictor.
    #[arg(long, default_value_t = 120)]
    season: usize,
    /// From a planner asking for a worker to the worker taking requests.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "30s")]
    cold_start: Duration,
    /// Where to write every decision of every planner (JSON lines).
    #[arg(long, value_name = "FILE.jsonl")]
    decision_log: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PlannerArg {
    Load,
    Sla,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum PredictorArg {
    Constant,
    MovingAverage,
    Holt,
    Kalman,
    Seasonal,
}

impl PlanningArgs {
    /// The planner settings: the file's (or the defaults), the flags over them, and the
    /// engines' cache shape from the fleet's flags.
    fn config(&self, plan: &Plan) -> Result<PlannerConfig> {
        let mut config = match &self.planner_config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("cannot read {}", path.display()))?;
                toml::from_str(&text)
                    .with_context(|| format!("{}: invalid planner settings", path.display()))?
            }
            None => plan.config.planner.clone(),
        };
        if let Some(t) = self.ttft_target {
            config.sla.ttft_target = t;
        }
        if let Some(t) = self.itl_target {
            config.sla.itl_target = t;
        }
        if let Some(i) = self.adjustment_interval {
            config.adjustment_interval = i;
        }
        if let Some(m) = self.max_gpus {
            config.budget.max_gpus = m;
        }
        if let Some(p) = self.predictor {
            let name = match p {
                PredictorArg::Constant => "constant",
                PredictorArg::MovingAverage => "moving_average",
                PredictorArg::Holt => "holt",
                PredictorArg::Kalman => "kalman",
                PredictorArg::Seasonal => "seasonal",
            };
            if let Some(chosen) = PredictorConfig::all(self.season)
                .into_iter()
                .find(|c| c.name() == name)
            {
                config.sla.predictor = chosen;
            }
        }
        config.sla.capacity_blocks = u64::from(plan.base.engine.num_gpu_blocks);
        config.sla.block_size = plan.base.engine.block_size;
        config.validate()?;
        Ok(config)
    }
}

/// One fleet of the comparison.
#[derive(Serialize)]
struct Row {
    fleet: String,
    gpu_hours: f64,
    report: SimReport,
}

#[derive(Serialize)]
struct Output<'a> {
    trace: String,
    targets: SlaTargets,
    sla_share: f64,
    /// The admission every fleet ran behind.
    admission: AdmissionConfig,
    /// The smallest fixed fleet meeting the targets for `sla_share` of the requests, if
    /// one within the budget does.
    smallest_fixed: Option<u32>,
    fleets: &'a [Row],
    predictors: &'a [PredictorRow],
}

#[derive(Serialize)]
struct PredictorRow {
    predictor: &'static str,
    requests: switchyard_planner::ForecastError,
    isl: switchyard_planner::ForecastError,
}

pub(super) fn run(
    args: &SimArgs,
    plan: &Plan,
    requests: &[TraceRequest],
    base: &SimConfig,
) -> Result<()> {
    let planning = &args.planning;
    if !(planning.sla_share > 0.0 && planning.sla_share <= 1.0) {
        bail!("--sla-share must be in (0, 1], got {}", planning.sla_share);
    }
    let planner_config = planning.config(plan)?;
    let targets = SlaTargets {
        ttft: planner_config.sla.ttft_target,
        itl: planner_config.sla.itl_target,
    };
    let workload = PreparedWorkload::prepare(
        requests,
        args.trace_block_size,
        plan.base.engine.block_size,
        args.speedup[0],
    );
    let policy = plan.policies[0];
    let mut base = base.clone();
    base.routing.router.cache_view = cache_view_for(args, policy, base.routing.router.cache_view);
    base.sla_targets = Some(targets);
    // A planned fleet is served as the servers serve: a worker is busy at their KV
    // threshold, and a request whose wait in the frontend's queue would pass the TTFT
    // target is refused at once (it would miss the target anyway) instead of queued
    // inside an engine. Without it, a fleet the planner has not caught up with yet queues
    // everything in its engines, and the backlog outlives the burst: every request behind
    // it misses too (docs/benchmarks.md, "Admission in planned runs"). A wait target
    // given (`--wait-target`, or a configuration file's) wins.
    let admission = &mut base.routing.admission;
    let configured_target = args.wait_target.is_some()
        || plan.config.frontend.admission.wait_target
            != switchyard::config::Config::default()
                .frontend
                .admission
                .wait_target;
    if !configured_target {
        admission.wait_target = Some(targets.ttft);
    }
    let run_one = |config: &SimConfig, what: &str| -> Result<SimReport> {
        let started = Instant::now();
        if !args.json {
            eprintln!("simulating {what} ...");
        }
        let mut report = simulate(config, &workload, policy, &mut |_| {})?;
        report.wall_seconds = started.elapsed().as_secs_f64();
        Ok(report)
    };

    let mut rows = Vec::new();
    let mut decisions = Vec::new();
    for &mode in &planning.planner {
        let mut config = planner_config.clone();
        config.mode = match mode {
            PlannerArg::Load => Mode::Load,
            PlannerArg::Sla => Mode::Sla,
        };
        let name = format!("{mode:?} planner").to_lowercase();
        let sim = SimConfig {
            planner: Some(PlannerSim {
                config,
                cold_start: planning.cold_start,
            }),
            ..base.clone()
        };
        let report = run_one(&sim, &name)?;
        let p = report.planner.as_ref().map_or(0.0, |p| p.gpu_hours);
        if let Some(planner) = &report.planner {
            for d in &planner.decisions {
                decisions.push((name.clone(), d.clone()));
            }
        }
        rows.push(Row {
            fleet: name,
            gpu_hours: p,
            report,
        });
    }

    // The smallest fixed fleet within the targets: the share grows with the fleet. A
    // disaggregated one keeps the split's share of prefill workers (at least one of each).
    let per_engine = planner_config.budget.gpus_per_engine;
    let ratio = base
        .disagg
        .map(|d| f64::from(d.prefill) / f64::from(base.workers));
    let prefill_of = |n: u32| {
        ratio.map(|r| ((f64::from(n) * r).round() as u32).clamp(1, n.saturating_sub(1).max(1)))
    };
    let gpus_of = |n: u32| -> f64 {
        match prefill_of(n) {
            Some(p) => f64::from(
                p * per_engine.of(WorkerRole::Prefill)
                    + (n - p) * per_engine.of(WorkerRole::Decode),
            ),
            None => f64::from(n * per_engine.aggregated),
        }
    };
    let widest = match ratio {
        Some(_) => per_engine.prefill.max(per_engine.decode),
        None => per_engine.aggregated,
    };
    let least = if ratio.is_some() { 2 } else { 1 };
    let most = (planner_config.budget.max_gpus / widest.max(1)).max(least);
    let fixed = |n: u32| -> Result<SimReport> {
        let disagg = base.disagg.map(|d| switchyard_sim::DisaggSim {
            prefill: prefill_of(n).unwrap_or(d.prefill),
            ..d
        });
        let name = match &disagg {
            Some(d) => format!("fixed {}:{}", d.prefill, n - d.prefill),
            None => format!("{n} fixed workers"),
        };
        run_one(
            &SimConfig {
                workers: n,
                disagg,
                ..base.clone()
            },
            &name,
        )
    };
    let share = |r: &SimReport| r.sla.map_or(0.0, |s| s.share);
    let (mut lo, mut hi) = (least, most);
    let mut best: Option<(u32, SimReport)> = None;
    let top = fixed(most)?;
    if share(&top) >= planning.sla_share {
        best = Some((most, top));
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let r = fixed(mid)?;
            if share(&r) >= planning.sla_share {
                hi = mid;
                best = Some((mid, r));
            } else {
                lo = mid + 1;
            }
        }
    }
    let smallest_fixed = best.as_ref().map(|(n, _)| *n);
    if let Some((n, report)) = best {
        let hours = gpus_of(n) * report.simulated_seconds / 3600.0;
        let fleet = match prefill_of(n) {
            Some(p) => format!("fixed {p}:{}", n - p),
            None => format!("{n} fixed workers"),
        };
        rows.insert(
            0,
            Row {
                fleet,
                gpu_hours: hours,
                report,
            },
        );
    }

    let predictors = evaluate_predictors(
        &workload,
        planner_config.adjustment_interval,
        planning.season,
    );
    if let Some(path) = &planning.decision_log {
        write_decisions(path, &decisions)?;
    }
    if let Some(path) = &args.requests_out {
        super::sim_output::write_requests(
            path,
            rows.iter().map(|r| (r.fleet.as_str(), &r.report)),
        )?;
    }
    if let Some(path) = &args.plot {
        plot(path, &args.trace, &rows, planner_config.adjustment_interval)?;
    }
    let output = Output {
        trace: args.trace.display().to_string(),
        targets,
        admission: base.routing.admission,
        sla_share: planning.sla_share,
        smallest_fixed,
        fleets: &rows,
        predictors: &predictors,
    };
    let text = if args.json {
        serde_json::to_string_pretty(&output)? + "\n"
    } else {
        table(&output)
    };
    std::io::stdout().write_all(text.as_bytes())?;
    Ok(())
}

/// Each predictor's one-step-ahead error on the trace's requests and mean prompt length
/// per adjustment interval.
fn evaluate_predictors(
    workload: &PreparedWorkload,
    interval: Duration,
    season: usize,
) -> Vec<PredictorRow> {
    let width = interval.as_secs_f64().max(1e-3);
    let end = workload
        .requests
        .last()
        .map_or(0.0, |r| r.arrival.as_secs_f64());
    let n = (end / width) as usize + 1;
    let (mut counts, mut tokens) = (vec![0.0; n], vec![0.0; n]);
    for r in &workload.requests {
        let i = ((r.arrival.as_secs_f64() / width) as usize).min(n - 1);
        counts[i] += 1.0;
        tokens[i] += r.prompt.total_tokens() as f64;
    }
    let isl: Vec<f64> = counts
        .iter()
        .zip(&tokens)
        .filter(|(c, _)| **c > 0.0)
        .map(|(c, t)| t / c)
        .collect();
    PredictorConfig::all(season.max(2))
        .iter()
        .map(|p| PredictorRow {
            predictor: p.name(),
            requests: evaluate(p, &counts),
            isl: evaluate(p, &isl),
        })
        .collect()
}

fn write_decisions(
    path: &Path,
    decisions: &[(String, switchyard_planner::Decision)],
) -> Result<()> {
    #[derive(Serialize)]
    struct Line<'a> {
        planner: &'a str,
        #[serde(flatten)]
        decision: &'a switchyard_planner::Decision,
    }
    let mut out = std::io::BufWriter::new(
        std::fs::File::create(path).with_context(|| format!("cannot write {}", path.display()))?,
    );
    for (planner, decision) in decisions {
        serde_json::to_writer(&mut out, &Line { planner, decision })?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(())
}

fn table(o: &Output<'_>) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Trace {}\nTargets: TTFT ≤ {:?}, mean ITL ≤ {:?}, for {:.0} % of requests",
        o.trace,
        o.targets.ttft,
        o.targets.itl,
        o.sla_share * 100.0
    );
    let _ = writeln!(
        s,
        "Admission: a worker is busy at {:.0} % of its KV blocks; {}",
        o.admission.busy_kv_threshold * 100.0,
        match o.admission.wait_target {
            Some(t) => format!("requests predicted to wait past {t:?} are refused"),
            None => "no wait target".to_string(),
        }
    );
    let baseline = o
        .smallest_fixed
        .and_then(|_| o.fleets.first())
        .map(|r| r.gpu_hours);
    if o.smallest_fixed.is_none() {
        let _ = writeln!(s, "No fixed fleet within the GPU budget meets the targets.");
    }
    let _ = writeln!(
        s,
        "\n{:<18} {:>9} {:>9} {:>10} {:>8} {:>22} {:>14} {:>11}",
        "fleet",
        "GPU-h",
        "vs fixed",
        "within SLA",
        "refused",
        "TTFT p50/p90/p99 ms",
        "ITL p50/p99",
        "workers"
    );
    for r in o.fleets {
        let rep = &r.report;
        let versus = baseline.map_or("-".to_string(), |b| {
            format!("{:.0} %", 100.0 * r.gpu_hours / b.max(f64::MIN_POSITIVE))
        });
        let workers = rep.planner.as_ref().map_or_else(
            || format!("{}", rep.workers),
            |p| format!("{:.1}/{}", p.mean_workers, p.peak_workers),
        );
        let _ = writeln!(
            s,
            "{:<18} {:>9.2} {:>9} {:>9.1} % {:>6.1} % {:>22} {:>14} {:>11}",
            r.fleet,
            r.gpu_hours,
            versus,
            rep.sla.map_or(0.0, |a| a.share * 100.0),
            100.0 * rep.rejected as f64 / rep.requests.max(1) as f64,
            format!(
                "{:.0}/{:.0}/{:.0}",
                rep.ttft_ms.p50, rep.ttft_ms.p90, rep.ttft_ms.p99
            ),
            format!("{:.1}/{:.1}", rep.itl_ms.p50, rep.itl_ms.p99),
            workers
        );
    }
    let _ = writeln!(
        s,
        "\nPredictors, relative mean absolute error one interval ahead (requests | mean ISL):"
    );
    for p in o.predictors {
        let _ = writeln!(
            s,
            "  {:<15} {:>6.3} | {:.3}",
            p.predictor, p.requests.relative, p.isl.relative
        );
    }
    s
}

/// Workers over time per planned fleet (and the fixed one), the request rate, and the mean
/// TTFT per interval: three panels sharing the time axis.
fn plot(path: &Path, trace: &Path, rows: &[Row], interval: Duration) -> Result<()> {
    use plotters::prelude::*;

    switchyard_workload::bench::register_font();
    let planned: Vec<&Row> = rows.iter().filter(|r| r.report.planner.is_some()).collect();
    let Some(first) = planned.first() else {
        bail!("--plot needs a planned run");
    };
    let series = |r: &Row, f: &dyn Fn(&switchyard_planner::Decision) -> f64| -> Vec<(f64, f64)> {
        r.report
            .planner
            .as_ref()
            .map(|p| p.decisions.iter().map(|d| (d.at, f(d))).collect())
            .unwrap_or_default()
    };
    let end = rows
        .iter()
        .map(|r| r.report.simulated_seconds)
        .fold(0.0, f64::max)
        .max(interval.as_secs_f64());
    let workers_of = |d: &switchyard_planner::Decision| {
        f64::from(
            d.actions
                .first()
                .map_or(d.replicas.values().sum(), |a| a.replicas),
        )
    };
    let most_workers = rows
        .iter()
        .map(|r| {
            r.report
                .planner
                .as_ref()
                .map_or(f64::from(r.report.workers), |p| f64::from(p.peak_workers))
        })
        .fold(1.0, f64::max);
    let rate = series(first, &|d| d.interval.traffic.rate);
    let most_rate = rate.iter().map(|p| p.1).fold(1e-3, f64::max);
    let ttfts: Vec<(String, Vec<(f64, f64)>)> = planned
        .iter()
        .map(|r| {
            (
                r.fleet.clone(),
                series(r, &|d| d.interval.traffic.ttft_ms.unwrap_or(0.0)),
            )
        })
        .collect();
    let most_ttft = ttfts
        .iter()
        .flat_map(|(_, s)| s.iter().map(|p| p.1))
        .fold(1.0, f64::max);
    let draw = || -> Result<(), Box<dyn std::error::Error>> {
        let root = SVGBackend::new(path, (900, 840)).into_drawing_area();
        root.fill(&WHITE)?;
        let name = trace.file_name().map_or_else(
            || trace.display().to_string(),
            |n| n.to_string_lossy().into(),
        );
        let panels = root.split_evenly((3, 1));
        let mut chart = ChartBuilder::on(&panels[0])
            .caption(format!("Workers over time: {name}"), ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(54)
            .build_cartesian_2d(0.0..end, 0.0..most_workers * 1.1)?;
        chart.configure_mesh().y_desc("workers").draw()?;
        for (i, r) in rows.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            let line = if r.report.planner.is_some() {
                series(r, &workers_of)
            } else {
                let n = f64::from(r.report.workers);
                vec![(0.0, n), (end, n)]
            };
            chart
                .draw_series(LineSeries::new(line, color.stroke_width(2)))?
                .label(r.fleet.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
        let mut chart = ChartBuilder::on(&panels[1])
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(54)
            .build_cartesian_2d(0.0..end, 0.0..most_rate * 1.1)?;
        chart.configure_mesh().y_desc("requests/s").draw()?;
        chart.draw_series(LineSeries::new(rate.clone(), BLACK.stroke_width(2)))?;
        let mut chart = ChartBuilder::on(&panels[2])
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(54)
            .build_cartesian_2d(0.0..end, 0.0..most_ttft * 1.1)?;
        chart
            .configure_mesh()
            .x_desc("seconds")
            .y_desc("mean TTFT, ms")
            .draw()?;
        for (i, (label, line)) in ttfts.iter().enumerate() {
            let color = Palette99::pick(i + rows.len() - planned.len()).to_rgba();
            chart
                .draw_series(LineSeries::new(line.clone(), color.stroke_width(2)))?
                .label(label.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        }
        root.present()?;
        Ok(())
    };
    draw().map_err(|e| anyhow::anyhow!("cannot draw {}: {e}", path.display()))
}
