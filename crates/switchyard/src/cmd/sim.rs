//! `switchyard sim`.

use anyhow::{Result, bail};
use clap::Args;

#[derive(Debug, Args)]
pub struct SimArgs {}

pub fn run(_args: SimArgs) -> Result<()> {
    bail!("`switchyard sim` is not implemented yet")
}
