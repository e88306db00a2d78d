//! `switchyard bench`.

use anyhow::{Result, bail};
use clap::Args;

#[derive(Debug, Args)]
pub struct BenchArgs {}

pub fn run(_args: BenchArgs) -> Result<()> {
    bail!("`switchyard bench` is not implemented yet")
}
