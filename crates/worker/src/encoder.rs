//! The mock encoder engine: a worker of role `encoder` that takes `Phase::Encode`
//! requests (a prompt's media spans) and answers when the batch holding them has run for
//! the time the routing core's cost model gives (the per-modality batching curve); the
//! embeddings themselves are not computed (LLM engines here take placeholder tokens). Its
//! encoders are the routing core's [`EncoderPool`] driven in real time.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use switchyard_core::protocol::{
    EngineError, FinishReason, GenerateOutput, GenerateRequest, MediaInput, Phase,
};
use switchyard_core::{Modalities, Modality, WorkerRole};
use switchyard_router::routing::encoders::{EncoderCost, EncoderPolicy, EncoderPool, MediaWork};
use switchyard_runtime::{EngineService, ResponseStream};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::engine::{Engine, EngineCapabilities, RunningEngine};
use crate::error::WorkerError;

/// A mock encoder worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EncoderConfig {
    /// Its timing: per-modality batch times and tokens per unit.
    pub cost: EncoderCost,
    /// Encoders in the worker (each runs one batch at a time).
    pub encoders: usize,
    /// Items queued or running at most; beyond, requests are refused as overloaded.
    pub max_pending: usize,
    /// Real encoders, for the modalities they take (the others keep the cost model's
    /// timing).
    pub models: EncoderModels,
}

impl Default for EncoderConfig {
    fn default() -> Self {
        EncoderConfig {
            cost: EncoderCost::default(),
            encoders: 1,
            max_pending: 256,
            models: EncoderModels::default(),
        }
    }
}

/// What an encoder worker encodes, and with which real encoders (a build with the
/// `encoders` feature): the items of the modalities they take are encoded for real from
/// the inputs the frontend prepared.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EncoderModels {
    /// The modalities the worker takes (empty: every one); the frontend sends it only
    /// those, so a fleet can have an encoder pool per modality.
    pub modalities: Vec<Modality>,
    /// An ONNX vision tower taking [batch, 3, 224, 224] (DINOv2 ViT-S/14), for images and
    /// video frames.
    pub vision: Option<PathBuf>,
    /// ONNX Runtime's shared library (`libonnxruntime.so`), loaded for `vision`.
    pub onnxruntime: Option<PathBuf>,
    /// Whisper's encoder, for audio: a CTranslate2 export (`model.bin` or its directory).
    pub audio: Option<PathBuf>,
    /// Threads of a forward pass (0: every core).
    pub threads: usize,
    /// Units (image squares, video frames, audio windows) in one forward pass at most.
    pub max_batch: usize,
    /// How long a batch waits for more items before it runs.
    #[serde(with = "humantime_serde")]
    pub batch_timeout: Duration,
    /// The largest item, in tokens, the encoder's memory holds (0: no limit): larger ones
    /// fail as out of memory, as on a device whose memory an item's activations overflow;
    /// the frontend then sends them again smaller.
    pub max_item_tokens: u32,
}

impl Default for EncoderModels {
    fn default() -> Self {
        EncoderModels {
            modalities: Vec::new(),
            vision: None,
            onnxruntime: None,
            audio: None,
            threads: 0,
            max_batch: 8,
            batch_timeout: Duration::from_millis(5),
            max_item_tokens: 0,
        }
    }
}

impl EncoderModels {
    /// The modalities the worker takes, as it announces them.
    pub fn modality_set(&self) -> Modalities {
        Modalities::from(self.modalities.clone())
    }

    /// Whether it names any model.
    pub fn any(&self) -> bool {
        self.vision.is_some() || self.audio.is_some()
    }
}

/// The mock encoder engine.
#[derive(Debug, Clone)]
pub struct MockEncoder {
    config: EncoderConfig,
}

impl MockEncoder {
    pub fn new(config: EncoderConfig) -> Result<Self, WorkerError> {
        config
            .cost
            .validate()
            .map_err(|e| WorkerError::Start(format!("the encoder cost model: {e}")))?;
        if config.encoders == 0 {
            return Err(WorkerError::Start(
                "an encoder worker needs at least one encoder".into(),
            ));
        }
        if config.models.max_batch == 0 {
            return Err(WorkerError::Start(
                "the encoder models' max_batch must be at least 1".into(),
            ));
        }
        if config.models.any() && !cfg!(feature = "encoders") {
            return Err(WorkerError::Start(
                "real encoder models are configured, but this build has no real encoders: build with `--features encoders`".into(),
            ));
        }
        Ok(MockEncoder { config })
    }
}

#[async_trait]
impl Engine for MockEncoder {
    fn capabilities(&self) -> EngineCapabilities {
        EngineCapabilities {
            role: WorkerRole::Encoder,
            kv_events: false,
            reports_load: false,
            block_size: None,
            capacity_blocks: None,
            max_num_seqs: None,
            dp_size: 1,
            prompt_text: false,
            media_embeddings: false,
            modalities: self.config.models.modality_set(),
            constraints: switchyard_core::protocol::ConstraintKinds::NONE,
            vocabularies: Vec::new(),
            logprobs: false,
            prompt_logprobs: false,
        }
    }

    async fn start(
        self: Box<Self>,
        _tracker: &TaskTracker,
        _cancel: CancellationToken,
    ) -> Result<RunningEngine, WorkerError> {
        let encoders = Encoders::start(
            self.config.encoders,
            self.config.cost.clone(),
            EncoderPolicy::Soonest,
            self.config.max_pending,
        );
        // Loading a model reads hundreds of megabytes: off the async threads.
        #[cfg(feature = "encoders")]
        let real = {
            let models = self.config.models.clone();
            tokio::task::spawn_blocking(move || crate::real_encoders::RealEncoders::load(&models))
                .await
                .map_err(|e| WorkerError::Start(format!("loading the encoder models: {e}")))??
        };
        Ok(RunningEngine {
            service: Arc::new(EncoderService {
                encoders,
                modalities: self.config.models.modality_set(),
                max_item_tokens: self.config.models.max_item_tokens,
                #[cfg(feature = "encoders")]
                real,
            }),
            events: None,
            load: None,
        })
    }
}

/// Answers `Phase::Encode` requests on the worker's encoders.
#[derive(Debug, Clone)]
pub struct EncoderService {
    encoders: Encoders,
    modalities: Modalities,
    max_item_tokens: u32,
    #[cfg(feature = "encoders")]
    real: Option<crate::real_encoders::RealEncoders>,
}

#[async_trait]
impl EngineService for EncoderService {
    async fn generate(&self, request: GenerateRequest) -> Result<ResponseStream, EngineError> {
        if request.phase != Phase::Encode {
            return Err(EngineError::Unsupported(
                "an encoder worker only encodes media (phase `encode`)".into(),
            ));
        }
        let spans = &request.prompt.media;
        if let Some(other) = spans.iter().find(|s| !self.modalities.contains(s.modality)) {
            return Err(EngineError::Unsupported(format!(
                "this encoder does not encode {}",
                other.modality.name()
            )));
        }
        if let Some(large) = spans
            .iter()
            .find(|s| self.max_item_tokens > 0 && s.length > self.max_item_tokens)
        {
            return Err(EngineError::OutOfMemory(format!(
                "the {} item of {} tokens does not fit the encoder's memory ({} tokens at most)",
                large.modality.name(),
                large.length,
                self.max_item_tokens
            )));
        }
        if !self.encoders.has_room(spans.len()) {
            return Err(EngineError::Overloaded(
                "the encoder's queue is full".into(),
            ));
        }
        // Items a real encoder takes are encoded from their inputs; the rest are timed.
        #[cfg(feature = "encoders")]
        let (real, spans): (Vec<_>, Vec<_>) = {
            let real_encoders = self.real.clone();
            let takes = |m| real_encoders.as_ref().is_some_and(|r| r.takes(m));
            if spans.iter().any(|s| takes(s.modality)) && request.media_inputs.len() != spans.len()
            {
                return Err(EngineError::Unsupported(
                    "this encoder computes real embeddings and the request carries no prepared media inputs".into(),
                ));
            }
            let mut real = Vec::new();
            let mut timed = Vec::new();
            for (i, span) in spans.iter().enumerate() {
                if takes(span.modality) {
                    real.push((span.modality, request.media_inputs[i].clone()));
                } else {
                    timed.push(*span);
                }
            }
            (real, timed)
        };
        #[cfg(feature = "encoders")]
        let real_encoders = self.real.clone();
        let items: Vec<(Modality, u32)> = spans
            .iter()
            .map(|span| (span.modality, span.length))
            .collect();
        let encoders = self.encoders.clone();
        // The items are queued when the stream is first polled; dropping it gives up the
        // wait (the items still run: a batch once started is not cut short).
        let done = async move {
            // The items' embeddings, when a real encoder computed every one of them (none
            // is left to time).
            #[cfg(feature = "encoders")]
            let features = match &real_encoders {
                Some(real_encoders) => {
                    let _held = encoders.hold(real.len()).map_err(|Saturated| {
                        EngineError::Overloaded("the encoder's queue is full".into())
                    })?;
                    let started = std::time::Instant::now();
                    let encoded = futures::future::try_join_all(
                        real.iter()
                            .map(|(m, input)| real_encoders.encode(*m, input)),
                    )
                    .await?;
                    if !encoded.is_empty() {
                        let units: usize = encoded.iter().map(Vec::len).sum();
                        let tokens: usize = encoded.iter().flatten().map(|e| e.tokens).sum();
                        tracing::debug!(
                            items = encoded.len(),
                            units,
                            tokens,
                            ms = started.elapsed().as_secs_f64() * 1e3,
                            "encoded media"
                        );
                    }
                    items
                        .is_empty()
                        .then(|| {
                            encoded
                                .iter()
                                .map(|units| crate::real_encoders::item_embeddings(units))
                                .collect::<Option<Vec<MediaInput>>>()
                        })
                        .flatten()
                }
                None => None,
            };
            #[cfg(not(feature = "encoders"))]
            let features: Option<Vec<MediaInput>> = None;
            match encoders.encode(&items).await {
                Ok(()) => {
                    let mut outputs = Vec::with_capacity(2);
                    if let Some(items) = features {
                        outputs.push(Ok(GenerateOutput::Features { items }));
                    }
                    outputs.push(Ok(GenerateOutput::Finished {
                        reason: FinishReason::Length,
                        completion_tokens: 0,
                        cached_tokens: None,
                    }));
                    Ok(outputs)
                }
                Err(Saturated) => Err(EngineError::Overloaded(
                    "the encoder's queue is full".into(),
                )),
            }
        };
        let stream = futures::StreamExt::flat_map(futures::stream::once(done), |outcome| {
            futures::stream::iter(outcome.unwrap_or_else(|e| vec![Err(e)]))
        });
        Ok(Box::pin(stream))
    }
}

/// A handle on the encoders' task.
#[derive(Debug, Clone)]
pub struct Encoders {
    submit: mpsc::UnboundedSender<(MediaWork, oneshot::Sender<()>)>,
    /// Items queued or being encoded, and how many may be.
    pending: Arc<AtomicUsize>,
    limit: usize,
}

/// The encoders hold as many items as they may: the request is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Saturated;

impl Encoders {
    /// Starts `count` encoders on the current tokio runtime; at most `limit` items wait
    /// or run at once.
    pub fn start(count: usize, cost: EncoderCost, policy: EncoderPolicy, limit: usize) -> Self {
        let (submit, requests) = mpsc::unbounded_channel();
        tokio::spawn(drive(EncoderPool::new(count, cost, policy), requests));
        Encoders {
            submit,
            pending: Arc::new(AtomicUsize::new(0)),
            limit: limit.max(1),
        }
    }

    /// Whether `n` more items may wait now.
    pub fn has_room(&self, n: usize) -> bool {
        self.pending.load(Ordering::Acquire) + n <= self.limit
    }

    /// Counts `n` items against the limit until the guard is dropped (when their request is
    /// done or gone; the items finish regardless); refused past the limit.
    pub fn hold(&self, n: usize) -> Result<impl Drop + '_, Saturated> {
        let before = self.pending.fetch_add(n, Ordering::AcqRel);
        let release = Release(&self.pending, n);
        if before + n > self.limit {
            return Err(Saturated);
        }
        Ok(release)
    }

    /// Encodes the items (all queued at once, so they may share batches) and returns when
    /// the last is done; refused at once if they would take the encoders past their limit.
    pub async fn encode(&self, items: &[(Modality, u32)]) -> Result<(), Saturated> {
        let _held = self.hold(items.len())?;
        let mut done = Vec::with_capacity(items.len());
        for &(modality, tokens) in items {
            let (tx, rx) = oneshot::channel();
            let work = MediaWork {
                owner: 0,
                modality,
                tokens,
            };
            if self.submit.send((work, tx)).is_err() {
                return Ok(());
            }
            done.push(rx);
        }
        for rx in done {
            let _ = rx.await;
        }
        Ok(())
    }
}

struct Release<'a>(&'a AtomicUsize, usize);

impl Drop for Release<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(self.1, Ordering::AcqRel);
    }
}

/// The encoders' task: takes items, starts batches, and at each batch's end wakes the
/// requests whose items it held. Ends when every handle is gone and nothing is pending.
async fn drive(
    mut pool: EncoderPool,
    mut requests: mpsc::UnboundedReceiver<(MediaWork, oneshot::Sender<()>)>,
) {
    let origin = Instant::now();
    let mut waiting: HashMap<u64, oneshot::Sender<()>> = HashMap::new();
    let mut next_owner = 0u64;
    let mut ends: Vec<Option<Duration>> = vec![None; pool.len()];
    let mut open = true;
    loop {
        let next_end = ends
            .iter()
            .enumerate()
            .filter_map(|(e, t)| t.map(|t| (t, e)))
            .min();
        if !open && next_end.is_none() {
            return;
        }
        let sleep = async {
            match next_end {
                Some((at, _)) => tokio::time::sleep_until(origin + at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            received = requests.recv(), if open => {
                let Some((mut work, reply)) = received else {
                    open = false;
                    continue;
                };
                work.owner = next_owner;
                next_owner = next_owner.wrapping_add(1);
                waiting.insert(work.owner, reply);
                let now = origin.elapsed();
                if let (_, Some(started)) = pool.submit(work, now) {
                    ends[started.encoder] = Some(started.ends);
                }
            }
            () = sleep => {
                let Some((at, encoder)) = next_end else { continue };
                let (done, started) = pool.finish(encoder, at);
                ends[encoder] = started.map(|s| s.ends);
                for item in done {
                    if let Some(reply) = waiting.remove(&item.owner) {
                        let _ = reply.send(());
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slow_images() -> EncoderCost {
        EncoderCost {
            image_batch_ms: vec![(1.0, 200.0), (4.0, 260.0)],
            ..EncoderCost::default()
        }
    }

    #[tokio::test]
    async fn a_request_waits_for_its_batch_and_concurrent_images_share_one() {
        tokio::time::pause();
        let encoders = Encoders::start(1, slow_images(), EncoderPolicy::Soonest, 16);
        let start = Instant::now();
        encoders.encode(&[(Modality::Image, 576)]).await.unwrap();
        // Timers round up to the millisecond.
        let took = start.elapsed();
        assert!((200..=202).contains(&took.as_millis()), "{took:?}");
        // Four at once, the encoder idle: one batch of four, 260 ms for all.
        let start = Instant::now();
        let each = (0..4).map(|_| {
            let e = encoders.clone();
            tokio::spawn(async move { e.encode(&[(Modality::Image, 576)]).await.unwrap() })
        });
        let handles: Vec<_> = each.collect();
        for h in handles {
            h.await.unwrap();
        }
        // The first starts alone (200 ms), the other three batch after it (200 + 60 × 2/3
        // = 240 ms by the curve).
        let took = start.elapsed();
        assert!((439..=443).contains(&took.as_millis()), "{took:?}");
    }

    #[tokio::test]
    async fn two_encoders_run_side_by_side() {
        tokio::time::pause();
        let encoders = Encoders::start(2, slow_images(), EncoderPolicy::Soonest, 16);
        let start = Instant::now();
        let a = encoders.clone();
        let b = encoders.clone();
        let (x, y) = tokio::join!(
            a.encode(&[(Modality::Image, 576)]),
            b.encode(&[(Modality::Video, 30 * 144)])
        );
        assert_eq!((x, y), (Ok(()), Ok(())));
        // The video (30 × 1.6 = 48 ms) and the image (200 ms) on separate encoders.
        let took = start.elapsed();
        assert!((200..=202).contains(&took.as_millis()), "{took:?}");
    }

    #[tokio::test]
    async fn beyond_the_limit_a_request_is_refused_and_room_comes_back() {
        tokio::time::pause();
        let encoders = Encoders::start(1, slow_images(), EncoderPolicy::Soonest, 2);
        let e = encoders.clone();
        let first = tokio::spawn(async move { e.encode(&[(Modality::Image, 576); 2]).await });
        tokio::task::yield_now().await;
        assert_eq!(
            encoders.encode(&[(Modality::Image, 576)]).await,
            Err(Saturated)
        );
        assert_eq!(first.await.unwrap(), Ok(()));
        assert_eq!(encoders.encode(&[(Modality::Image, 576)]).await, Ok(()));
    }
}

#[cfg(test)]
mod service_tests {
    use futures::StreamExt;
    use switchyard_core::protocol::Prompt;
    use switchyard_core::{MediaSpan, RequestId};

    use super::*;

    fn encode_request(items: &[(Modality, u32)]) -> GenerateRequest {
        let mut prompt = Prompt::tokens(Vec::new());
        prompt.media = items
            .iter()
            .map(|&(modality, length)| MediaSpan {
                modality,
                media_hash: 1,
                offset: 0,
                length,
            })
            .collect();
        GenerateRequest {
            phase: Phase::Encode,
            prompt,
            ..GenerateRequest::text(RequestId(1), Vec::new(), 0)
        }
    }

    #[tokio::test]
    async fn an_encoder_worker_answers_encode_requests_after_their_batch_and_only_those() {
        tokio::time::pause();
        let engine = MockEncoder::new(EncoderConfig {
            cost: EncoderCost {
                image_batch_ms: vec![(1.0, 120.0), (2.0, 150.0)],
                ..EncoderCost::default()
            },
            encoders: 1,
            max_pending: 2,
            models: EncoderModels::default(),
        })
        .unwrap();
        assert_eq!(engine.capabilities().role, WorkerRole::Encoder);
        let running = Box::new(engine)
            .start(&TaskTracker::new(), CancellationToken::new())
            .await
            .unwrap();
        let service = running.service;
        let start = Instant::now();
        let mut stream = service
            .generate(encode_request(&[(Modality::Image, 576)]))
            .await
            .unwrap();
        assert!(matches!(
            stream.next().await,
            Some(Ok(GenerateOutput::Finished { .. }))
        ));
        let took = start.elapsed().as_millis();
        assert!((120..=122).contains(&took), "{took} ms");
        // A text request is not for it; more items than it may hold are refused.
        let text = GenerateRequest::text(RequestId(2), vec![1, 2, 3], 4);
        assert!(matches!(
            service.generate(text).await,
            Err(EngineError::Unsupported(_))
        ));
        assert!(matches!(
            service
                .generate(encode_request(&[(Modality::Image, 576); 3]))
                .await,
            Err(EngineError::Overloaded(_))
        ));
        assert!(
            MockEncoder::new(EncoderConfig {
                encoders: 0,
                ..EncoderConfig::default()
            })
            .is_err()
        );
    }

    #[tokio::test]
    async fn an_encoder_worker_of_some_modalities_says_so_and_refuses_the_others() {
        let engine = MockEncoder::new(EncoderConfig {
            models: EncoderModels {
                modalities: vec![Modality::Audio],
                ..EncoderModels::default()
            },
            ..EncoderConfig::default()
        })
        .unwrap();
        let announced = engine.capabilities().modalities;
        assert!(announced.contains(Modality::Audio) && !announced.contains(Modality::Image));
        let service = Box::new(engine)
            .start(&TaskTracker::new(), CancellationToken::new())
            .await
            .unwrap()
            .service;
        assert!(matches!(
            service
                .generate(encode_request(&[(Modality::Audio, 1500), (Modality::Image, 576)]))
                .await,
            Err(EngineError::Unsupported(m)) if m.contains("image")
        ));
        let mut stream = service
            .generate(encode_request(&[(Modality::Audio, 1500)]))
            .await
            .unwrap();
        assert!(matches!(
            stream.next().await,
            Some(Ok(GenerateOutput::Finished { .. }))
        ));
    }
}
