//! One module per subcommand.

pub mod bench;
pub mod sim;
pub mod synth;
