//! `switchyard sim --disagg P:D`: the trace on disaggregated fleets (P prefill and D decode
//! workers), each against the aggregated fleet of the same size, side by side.

use std::time::Instant;

use anyhow::{Result, bail};
use clap::Args;
use serde::Serialize;
use switchyard_sim::{DisaggSim, Link, PreparedWorkload, SimConfig, SimReport, Split, simulate};

use super::sim::{Plan, SimArgs, cache_view_for, view_name};

#[derive(Debug, Args)]
pub struct DisaggArgs {
    /// Run disaggregated fleets of P prefill and D decode workers (comma separated, e.g.
    /// `2:6,4:4`), each compared with the aggregated fleet of P+D workers; the first
    /// policy routes (a configuration's `workers.prefill` runs one such fleet on its own).
    #[arg(long, value_delimiter = ',', value_name = "P:D")]
    pub disagg: Vec<Split>,
    /// The link KV moves over from prefill to decode workers: nvlink, pcie5, ib or GB/s
    /// [default: workers.mocker.kv_transfer's].
    #[arg(long)]
    disagg_link: Option<Link>,
}

#[derive(Serialize)]
struct Row {
    fleet: String,
    report: SimReport,
}

#[derive(Serialize)]
struct Output<'a> {
    trace: String,
    policy: &'a str,
    fleets: &'a [Row],
}

/// `base` as a disaggregated fleet of `split` (its link from `--disagg-link`, else the
/// one `base` has from the configuration).
pub(super) fn with_split(
    args: &SimArgs,
    plan: &Plan,
    base: SimConfig,
    split: Split,
) -> Result<SimConfig> {
    let Some(workers) = split.prefill.checked_add(split.decode) else {
        bail!("--disagg {split}: too many workers");
    };
    let link = match (args.disagg.disagg_link, &base.disagg) {
        (Some(link), _) => link,
        (None, Some(d)) => d.link,
        (None, None) => switchyard::replay::kv_link(&plan.config),
    };
    let kv_bytes_per_token = base.faults.kv_bytes_per_token;
    Ok(SimConfig {
        workers,
        disagg: Some(DisaggSim {
            prefill: split.prefill,
            link,
            kv_bytes_per_token,
        }),
        ..base
    })
}

pub(super) fn run(args: &SimArgs, plan: &Plan, workload: &PreparedWorkload) -> Result<()> {
    let Some(&policy) = plan.policies.first() else {
        bail!("--policy needs a value");
    };
    let mut base = plan.base.clone();
    base.routing.router.cache_view = cache_view_for(args, policy, base.routing.router.cache_view);
    let mut rows: Vec<Row> = Vec::new();
    for &split in &args.disagg.disagg {
        let config = with_split(args, plan, base.clone(), split)?;
        let aggregated = format!("aggregated {}", config.workers);
        if !rows.iter().any(|r| r.fleet == aggregated) {
            let plain = SimConfig {
                disagg: None,
                ..config.clone()
            };
            rows.push(Row {
                report: run_one(&plain, workload, policy, &aggregated, args.json)?,
                fleet: aggregated,
            });
        }
        let name = format!("disagg {split}");
        rows.push(Row {
            report: run_one(&config, workload, policy, &name, args.json)?,
            fleet: name,
        });
    }
    let text = if args.json {
        format!(
            "{}\n",
            serde_json::to_string_pretty(&Output {
                trace: args.trace.display().to_string(),
                policy: policy.name(),
                fleets: &rows,
            })?
        )
    } else {
        let link = with_split(args, plan, base.clone(), args.disagg.disagg[0])?
            .disagg
            .map_or(switchyard::replay::kv_link(&plan.config), |d| d.link);
        table(
            args,
            &base,
            link,
            workload.requests.len(),
            policy.name(),
            &rows,
        )
    };
    super::sim_output::write_stdout(&text)
}

fn run_one(
    config: &SimConfig,
    workload: &PreparedWorkload,
    policy: switchyard_router::PolicyKind,
    name: &str,
    quiet: bool,
) -> Result<SimReport> {
    if !quiet {
        eprintln!("simulating {name} ...");
    }
    let started = Instant::now();
    let mut report = simulate(config, workload, policy, &mut |_| {})?;
    report.cache_view = view_name(config.routing.router.cache_view);
    report.wall_seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

fn table(
    args: &SimArgs,
    base: &SimConfig,
    link: Link,
    requests: usize,
    policy: &str,
    rows: &[Row],
) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{requests} requests from {} (policy {policy}, KV link {:.0} GB/s, {} bytes/token)",
        args.trace.display(),
        link.bandwidth / 1e9,
        base.faults.kv_bytes_per_token
    );
    let _ = writeln!(
        s,
        "{:<14} {:>20} {:>20} {:>9} {:>8} {:>8} {:>15} {:>9} {:>11}",
        "fleet",
        "TTFT p50/p90/p99 ms",
        "ITL p50/p90/p99 ms",
        "E2E p50",
        "tok/s",
        "req/s",
        "remote/short/sat",
        "KV moved",
        "xfer p50 ms"
    );
    for r in rows {
        let rep = &r.report;
        let (split, moved, xfer) = match &rep.disagg {
            Some(d) => (
                format!(
                    "{}/{}/{}",
                    d.remote_prefills, d.local_short, d.local_saturated
                ),
                format!("{:.1} GB", d.transferred_bytes as f64 / 1e9),
                format!("{:.2}", d.transfer_ms.p50),
            ),
            None => ("-".into(), "-".into(), "-".into()),
        };
        let _ = writeln!(
            s,
            "{:<14} {:>20} {:>20} {:>9.0} {:>8.0} {:>8.2} {:>15} {:>9} {:>11}",
            r.fleet,
            format!(
                "{:.0}/{:.0}/{:.0}",
                rep.ttft_ms.p50, rep.ttft_ms.p90, rep.ttft_ms.p99
            ),
            format!(
                "{:.1}/{:.1}/{:.1}",
                rep.itl_ms.p50, rep.itl_ms.p90, rep.itl_ms.p99
            ),
            rep.e2e_ms.p50,
            rep.throughput.output_tokens_per_sec,
            rep.throughput.requests_per_sec,
            split,
            moved,
            xfer
        );
    }
    s
}
