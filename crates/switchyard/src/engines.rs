//! The engines this build hosts: the worker crate's, and the CPU engine when it is built
//! with the `candle` feature. Adding an engine is registering it here.

use switchyard_worker::EngineRegistry;

/// How to get the CPU engine: said when a configuration names it and this build lacks it.
const CANDLE_ABSENT: &str = "build with `--features candle` (cargo run --release --features candle -- serve --engine candle --model PATH.gguf)";

/// The engines of this build, by name.
pub fn registry() -> EngineRegistry {
    let mut engines = EngineRegistry::builtin();
    engines.when_absent("candle", CANDLE_ABSENT);
    // Loading the model reads and repacks its weights for seconds: a blocking build.
    #[cfg(feature = "candle")]
    engines.register(switchyard_worker::EngineFactory::blocking(
        "candle",
        |config, worker, _model| {
            use switchyard_worker::{EngineConfig, WorkerError, registry};
            let EngineConfig::Candle(settings) = config else {
                return Err(registry::mismatched("candle", config));
            };
            let engine = switchyard_candle::CandleWorker::load(settings, worker)
                .map_err(|e| WorkerError::Build(Box::new(e)))?;
            Ok(Box::new(engine))
        },
    ));
    engines
}
