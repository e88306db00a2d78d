//! `switchyard synth`.

use anyhow::{Result, bail};
use clap::Args;

#[derive(Debug, Args)]
pub struct SynthArgs {}

pub fn run(_args: SynthArgs) -> Result<()> {
    bail!("`switchyard synth` is not implemented yet")
}
