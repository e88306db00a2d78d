//! The `switchyard` command line: wiring only, the logic lives in the library crates.

mod cmd;
mod huge_pages;
mod logging;
mod signals;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "switchyard",
    version,
    about = "Distributed inference serving for LLM fleets"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the OpenAI API over a fleet of in-process workers (no external service).
    Serve(cmd::serve::ServeArgs),
    /// A frontend of a distributed deployment: workers from etcd, events from NATS.
    Frontend(cmd::distributed::FrontendArgs),
    /// A worker of a distributed deployment: registers in etcd, publishes to NATS, serves
    /// requests over HTTP/2. SIGTERM drains it.
    Worker(cmd::distributed::WorkerArgs),
    /// Replay a trace through the router and a simulated fleet, in virtual time.
    Sim(Box<cmd::sim::SimArgs>),
    /// Analyse a trace, or synthesise a new one with the same structure.
    Synth(cmd::synth::SynthArgs),
    /// Drive an OpenAI-compatible endpoint and measure it.
    Bench(cmd::bench::BenchArgs),
    /// Scale a running deployment's workers on its load or latency targets.
    Planner(cmd::planner::PlannerArgs),
    /// Measure an engine through its OpenAI API: a timing profile, a report and plots.
    Profile(cmd::profile::ProfileArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The commands that hold a KV index: its lookups gain from huge pages.
    if matches!(
        cli.command,
        Command::Serve(_) | Command::Frontend(_) | Command::Sim(_)
    ) {
        huge_pages::enable();
    }
    let result = match cli.command {
        Command::Serve(args) => cmd::serve::run(args, &std::env::vars().collect()),
        Command::Frontend(args) => {
            cmd::distributed::run_frontend(args, &std::env::vars().collect())
        }
        Command::Worker(args) => cmd::distributed::run_worker(args, &std::env::vars().collect()),
        Command::Sim(args) => cmd::sim::run(*args, &std::env::vars().collect()),
        Command::Synth(args) => cmd::synth::run(args),
        Command::Bench(args) => cmd::bench::run(args),
        Command::Planner(args) => cmd::planner::run(args, &std::env::vars().collect()),
        Command::Profile(args) => cmd::profile::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
