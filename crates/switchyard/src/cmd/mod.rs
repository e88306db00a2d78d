//! One module per subcommand.

pub mod bench;
pub mod distributed;
pub mod flags;
pub mod planner;
pub mod planner_metrics;
pub mod profile;
pub mod serve;
pub mod sim;
pub mod sim_disagg;
mod sim_output;
pub mod sim_planner;
pub mod synth;
