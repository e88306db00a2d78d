//! The engines a worker can host, by name: each a function that builds one from its
//! configuration. This crate's engines are registered in [`EngineRegistry::builtin`]; a
//! binary adds its own (the CPU engine, behind its `candle` feature) with
//! [`EngineRegistry::register`], and starting a worker asks the registry for the engine its
//! configuration names, whichever it is. Adding an engine is registering it.

use std::collections::BTreeMap;

use switchyard_core::WorkerKey;

use crate::config::EngineConfig;
use crate::echo::Echo;
use crate::encoder::MockEncoder;
use crate::engine::Engine;
use crate::error::WorkerError;
use crate::mocker::Mocker;
use crate::upstream::OpenAiUpstream;

/// Builds an engine from its configuration: as `worker`, serving `model`.
pub type BuildEngine = fn(
    config: &EngineConfig,
    worker: WorkerKey,
    model: &str,
) -> Result<Box<dyn Engine>, WorkerError>;

/// One engine: its name (the [`EngineConfig::kind`] it builds) and how it is built.
#[derive(Debug, Clone, Copy)]
pub struct EngineFactory {
    pub name: &'static str,
    pub build: BuildEngine,
    /// Whether building takes long on the CPU (loading a model): it then runs on a blocking
    /// thread, off the async ones.
    pub blocking: bool,
}

impl EngineFactory {
    /// An engine built at once.
    pub const fn new(name: &'static str, build: BuildEngine) -> Self {
        EngineFactory {
            name,
            build,
            blocking: false,
        }
    }

    /// An engine whose building blocks (it loads a model).
    pub const fn blocking(name: &'static str, build: BuildEngine) -> Self {
        EngineFactory {
            name,
            build,
            blocking: true,
        }
    }
}

/// The engines of a build, by name.
#[derive(Debug, Clone)]
pub struct EngineRegistry {
    engines: BTreeMap<&'static str, EngineFactory>,
    /// How to get the engines this build may lack, by name: said when a configuration names
    /// one that is not registered.
    absent: BTreeMap<&'static str, &'static str>,
}

impl EngineRegistry {
    /// This crate's engines: `mocker`, `echo`, `openai` (an upstream server) and `encoder`.
    pub fn builtin() -> Self {
        let mut registry = EngineRegistry {
            engines: BTreeMap::new(),
            absent: BTreeMap::new(),
        };
        registry
            .register(EngineFactory::new("mocker", mocker))
            .register(EngineFactory::new("echo", echo))
            .register(EngineFactory::new("openai", upstream))
            .register(EngineFactory::new("encoder", encoder))
            .when_absent(
                "candle",
                "it is built by the switchyard binary (feature `candle`), not here",
            );
        registry
    }

    /// Adds an engine, in place of any of the same name.
    pub fn register(&mut self, factory: EngineFactory) -> &mut Self {
        self.engines.insert(factory.name, factory);
        self
    }

    /// Says how to get engine `name` when it is not registered (the error a configuration
    /// naming it gets then).
    pub fn when_absent(&mut self, name: &'static str, how: &'static str) -> &mut Self {
        self.absent.insert(name, how);
        self
    }

    /// The names of the registered engines, in order.
    pub fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.engines.keys().copied()
    }

    /// Builds the engine `config` names, as `worker`, serving `model`; a blocking build
    /// runs on a blocking thread.
    pub async fn build(
        &self,
        config: &EngineConfig,
        worker: WorkerKey,
        model: &str,
    ) -> Result<Box<dyn Engine>, WorkerError> {
        let name = config.kind();
        let Some(factory) = self.engines.get(name).copied() else {
            return Err(WorkerError::NotBuilt {
                name: name.to_owned(),
                how: self
                    .absent
                    .get(name)
                    .copied()
                    .unwrap_or("no engine of that name is registered")
                    .to_owned(),
            });
        };
        if !factory.blocking {
            return (factory.build)(config, worker, model);
        }
        let (config, model) = (config.clone(), model.to_owned());
        tokio::task::spawn_blocking(move || (factory.build)(&config, worker, &model))
            .await
            .map_err(|e| WorkerError::Build(Box::new(e)))?
    }
}

/// The error of a factory handed another engine's configuration (registered under a name
/// that is not its own).
pub fn mismatched(factory: &str, config: &EngineConfig) -> WorkerError {
    WorkerError::Start(format!(
        "the {factory} engine was handed a {} configuration",
        config.kind()
    ))
}

fn mocker(
    config: &EngineConfig,
    worker: WorkerKey,
    _model: &str,
) -> Result<Box<dyn Engine>, WorkerError> {
    let EngineConfig::Mocker(mocker) = config else {
        return Err(mismatched("mocker", config));
    };
    Ok(Box::new(Mocker::new(worker, mocker)?))
}

fn echo(
    config: &EngineConfig,
    _worker: WorkerKey,
    _model: &str,
) -> Result<Box<dyn Engine>, WorkerError> {
    let EngineConfig::Echo(echo) = config else {
        return Err(mismatched("echo", config));
    };
    Ok(Box::new(Echo::new(echo.clone())))
}

fn upstream(
    config: &EngineConfig,
    worker: WorkerKey,
    model: &str,
) -> Result<Box<dyn Engine>, WorkerError> {
    let EngineConfig::Openai(openai) = config else {
        return Err(mismatched("openai", config));
    };
    Ok(Box::new(OpenAiUpstream::new(
        worker,
        model,
        openai.clone(),
    )?))
}

fn encoder(
    config: &EngineConfig,
    _worker: WorkerKey,
    _model: &str,
) -> Result<Box<dyn Engine>, WorkerError> {
    let EngineConfig::Encoder(encoder) = config else {
        return Err(mismatched("encoder", config));
    };
    Ok(Box::new(MockEncoder::new(encoder.clone())?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{CandleConfig, EchoConfig};

    #[tokio::test]
    async fn an_engine_is_built_by_the_factory_its_kind_names() {
        let engines = EngineRegistry::builtin();
        assert_eq!(
            engines.names().collect::<Vec<_>>(),
            ["echo", "encoder", "mocker", "openai"]
        );
        let key = WorkerKey::from(switchyard_core::WorkerId(1));
        let echo = EngineConfig::Echo(EchoConfig::default());
        let built = engines.build(&echo, key, "m").await.unwrap();
        assert_eq!(built.capabilities().block_size, Some(16));
    }

    #[tokio::test]
    async fn an_engine_missing_from_the_build_says_how_to_get_it() {
        let mut engines = EngineRegistry::builtin();
        let key = WorkerKey::from(switchyard_core::WorkerId(1));
        let candle = EngineConfig::Candle(CandleConfig::default());
        engines.when_absent("candle", "build with `--features candle`");
        let err = engines.build(&candle, key, "m").await.err().unwrap();
        assert_eq!(
            err.to_string(),
            "this build has no candle engine: build with `--features candle`"
        );
        // Registered, it is built (blocking, on a blocking thread), and the hint is unused.
        engines.register(EngineFactory::blocking("candle", |_, _, _| {
            Ok(Box::new(Echo::new(EchoConfig::default())))
        }));
        assert!(engines.build(&candle, key, "m").await.is_ok());
    }
}
