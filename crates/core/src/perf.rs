//! Step timing models, shared by the mocker (which runs them) and the router (which
//! predicts latency with them), and announced by workers at registration.
//!
//! Two models:
//!
//! - the polynomial defaults (Dynamo's, so results compare): prefill ms =
//!   4.209989e-7·t² + 1.518344e-2·t + 16.50142; decode ms = −25.74·u² + 54.01·u + 5.74 for
//!   u = active KV blocks / capacity, at least 1 ms;
//! - a profile measured on a real engine: prefill time interpolated linearly in the prompt
//!   tokens, decode time bilinearly in (active KV tokens of the batch, mean context length),
//!   extrapolated linearly past the measured range (`switchyard_mocker::perf::load` reads
//!   one from JSON or NPZ).
//!
//! A step that prefills `t` new tokens and decodes a batch of `n` sequences: the polynomial
//! model charges the prefill time plus the decode time (Dynamo's mocker does, so results
//! compare). A measured profile comes from an engine that computes a mixed batch in one
//! forward pass (vLLM, SGLang and the candle engine do): the prompt tokens ride along with
//! the decoding rows, and what every pass costs whatever its rows (reading the weights,
//! launching the layers) is paid once, not twice. Of the two bounds, the phases added,
//! `prefill(t) + decode`, and the chunk's rows added to the decode pass, `decode +
//! prefill(t + n) − prefill(n)`, the profile's `mixed_step_saving` (0 to 1) says how far
//! toward the second a mixed step goes. The second also saves the fixed cost of the chunk's
//! own sequence, which an engine that attends sequence by sequence still pays:
//! `candle-bench --mixed` measures the candle engine at 0.64. The default is 0 (the phases
//! added, as before the field existed) until other engines are measured.
//!
//! A profile times each prompt in one step, so its prefill curve holds a prompt's attention
//! to itself but not a later chunk's attention to the chunks before it. The profile's
//! `prefill_context_ms` adds k·p·t to a step for each chunk of t tokens after p (computed
//! or cached) of its prompt; `candle-bench --context` measures k on the candle engine
//! (`scripts/calibrate-candle` does). 0, the default, prices a chunk as a whole prompt of
//! its length, as Dynamo's mocker and the polynomial model do.

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// What a step computes, as far as timing is concerned.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepShape {
    /// New prompt tokens computed in the step (all prefill chunks together).
    pub prefill_tokens: u32,
    /// Sequences producing their next token by decode.
    pub decode_seqs: u32,
    /// Sum of the context lengths of the decoding sequences.
    pub decode_kv_tokens: u64,
    /// Sum over the step's prompt chunks of the tokens before the chunk (computed or cached)
    /// times the chunk's tokens: the keys its queries attend to beyond its own.
    pub prefill_context: u64,
    /// KV blocks held by running sequences.
    pub active_blocks: u64,
    pub capacity_blocks: u64,
}

/// A profile that cannot be used, and why.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("invalid profile: {0}")]
pub struct InvalidProfile(pub String);

/// Measured timings, as stored in a profile file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    pub prefill_isl: Vec<f64>,
    pub prefill_ttft_ms: Vec<f64>,
    pub decode_active_kv_tokens: Vec<f64>,
    pub decode_context_length: Vec<f64>,
    /// `decode_itl[i][j]`: inter-token latency at `decode_active_kv_tokens[i]` and
    /// `decode_context_length[j]`.
    pub decode_itl: Vec<Vec<f64>>,
    /// How much of the two phases' overlap a mixed step saves, from 0 (the prefill and
    /// decode times added) to 1 (the chunk's rows added to the decode pass); see the
    /// module's notes.
    #[serde(default)]
    pub mixed_step_saving: f64,
    /// Milliseconds a step's prompt chunk takes per (token of the chunk × token before it):
    /// its attention to the earlier part of its prompt, which `prefill_ttft_ms` (each
    /// prompt timed in one step) never holds. 0 prices a chunk as a whole prompt of its
    /// length, as Dynamo's mocker does.
    #[serde(default)]
    pub prefill_context_ms: f64,
}

/// Read from the network (a worker's registration) or a file, a profile is validated as it
/// is decoded: an unusable one is a decoding error, never a model the router computes with.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", try_from = "PerfModelWire")]
pub enum PerfModel {
    #[default]
    Polynomial,
    Interpolated(Profile),
}

/// [`PerfModel`] as encoded, before validation.
#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum PerfModelWire {
    Polynomial,
    Interpolated(Profile),
}

impl TryFrom<PerfModelWire> for PerfModel {
    type Error = InvalidProfile;

    fn try_from(wire: PerfModelWire) -> Result<Self, InvalidProfile> {
        match wire {
            PerfModelWire::Polynomial => Ok(PerfModel::Polynomial),
            PerfModelWire::Interpolated(profile) => PerfModel::from_profile(profile),
        }
    }
}

/// Largest timing a profile may give, in ms (a day): beyond any step, and small enough
/// that extrapolated predictions stay finite.
const MAX_TIMING_MS: f64 = 86_400_000.0;
/// Largest `prefill_context_ms` (a 1,000-token chunk after 1,000 tokens would take 100 s).
pub const MAX_CONTEXT_MS: f64 = 0.1;
/// Largest axis value (tokens) a profile may give.
const MAX_AXIS: f64 = 1e9;
/// Smallest step between two points of an axis: closer points make slopes, and so
/// extrapolated predictions, unbounded.
const MIN_AXIS_STEP: f64 = 1e-3;

impl PerfModel {
    /// Validates a profile and wraps it.
    pub fn from_profile(profile: Profile) -> Result<Self, InvalidProfile> {
        axis("prefill_isl", &profile.prefill_isl)?;
        axis("decode_active_kv_tokens", &profile.decode_active_kv_tokens)?;
        axis("decode_context_length", &profile.decode_context_length)?;
        if profile.prefill_ttft_ms.len() != profile.prefill_isl.len() {
            return Err(InvalidProfile(format!(
                "prefill_ttft_ms has {} values for {} prefill_isl points",
                profile.prefill_ttft_ms.len(),
                profile.prefill_isl.len()
            )));
        }
        let (rows, cols) = (
            profile.decode_active_kv_tokens.len(),
            profile.decode_context_length.len(),
        );
        if profile.decode_itl.len() != rows || profile.decode_itl.iter().any(|r| r.len() != cols) {
            return Err(InvalidProfile(format!(
                "decode_itl must be {rows} rows of {cols} values"
            )));
        }
        if !(0.0..=MAX_CONTEXT_MS).contains(&profile.prefill_context_ms) {
            return Err(InvalidProfile(format!(
                "prefill_context_ms must be a number from 0 to {MAX_CONTEXT_MS}, got {}",
                profile.prefill_context_ms
            )));
        }
        if !(0.0..=1.0).contains(&profile.mixed_step_saving) {
            return Err(InvalidProfile(format!(
                "mixed_step_saving must be from 0 to 1, got {}",
                profile.mixed_step_saving
            )));
        }
        let values = profile
            .prefill_ttft_ms
            .iter()
            .chain(profile.decode_itl.iter().flatten());
        if values
            .clone()
            .any(|v| !(v.is_finite() && (0.0..=MAX_TIMING_MS).contains(v)))
        {
            return Err(InvalidProfile(format!(
                "timings must be numbers from 0 to {MAX_TIMING_MS} ms"
            )));
        }
        Ok(PerfModel::Interpolated(profile))
    }

    /// Duration of one step in milliseconds (before any speedup).
    pub fn step_ms(&self, shape: &StepShape) -> f64 {
        let context = match self {
            PerfModel::Interpolated(p) => p.prefill_context_ms * shape.prefill_context as f64,
            PerfModel::Polynomial => 0.0,
        };
        self.phases_ms(shape) + context
    }

    /// The step's prefill and decode phases.
    fn phases_ms(&self, shape: &StepShape) -> f64 {
        match (shape.prefill_tokens, shape.decode_seqs) {
            (0, 0) => 0.0,
            (t, 0) => self.prefill_ms(t),
            (0, _) => self.decode_ms(shape),
            (t, n) => match self {
                PerfModel::Polynomial => self.prefill_ms(t) + self.decode_ms(shape),
                PerfModel::Interpolated(p) => {
                    let prefill = self.prefill_ms(t);
                    let rows = (self.prefill_ms(t.saturating_add(n)) - self.prefill_ms(n))
                        .clamp(0.0, prefill);
                    self.decode_ms(shape) + prefill - p.mixed_step_saving * (prefill - rows)
                }
            },
        }
    }

    pub fn prefill_ms(&self, tokens: u32) -> f64 {
        let t = f64::from(tokens);
        let ms = match self {
            PerfModel::Polynomial => 4.209989e-7 * t * t + 1.518344e-2 * t + 16.50142,
            PerfModel::Interpolated(p) => interp1(&p.prefill_isl, &p.prefill_ttft_ms, t),
        };
        ms.max(0.0)
    }

    pub fn decode_ms(&self, shape: &StepShape) -> f64 {
        let ms = match self {
            PerfModel::Polynomial => {
                let u = if shape.capacity_blocks == 0 {
                    0.0
                } else {
                    shape.active_blocks as f64 / shape.capacity_blocks as f64
                };
                -25.74 * u * u + 54.01 * u + 5.74
            }
            PerfModel::Interpolated(p) => {
                let kv = shape.decode_kv_tokens as f64;
                let context = kv / f64::from(shape.decode_seqs.max(1));
                interp2(
                    &p.decode_active_kv_tokens,
                    &p.decode_context_length,
                    &p.decode_itl,
                    kv,
                    context,
                )
            }
        };
        // Token-emitting steps never collapse onto the same instant.
        ms.max(1.0)
    }
}

fn axis(name: &str, values: &[f64]) -> Result<(), InvalidProfile> {
    if values.len() < 2 {
        return Err(InvalidProfile(format!(
            "{name} needs at least 2 points, got {}",
            values.len()
        )));
    }
    if values
        .iter()
        .any(|v| !(v.is_finite() && v.abs() <= MAX_AXIS))
        || values.windows(2).any(|w| w[1] - w[0] < MIN_AXIS_STEP)
    {
        return Err(InvalidProfile(format!(
            "{name} must be increasing numbers within ±{MAX_AXIS}, at least {MIN_AXIS_STEP} apart"
        )));
    }
    Ok(())
}

/// The segment `[i, i+1]` to interpolate (or extrapolate) `x` on, and the position in it.
fn locate(xs: &[f64], x: f64) -> (usize, f64) {
    let i = xs
        .partition_point(|&v| v <= x)
        .saturating_sub(1)
        .min(xs.len() - 2);
    (i, (x - xs[i]) / (xs[i + 1] - xs[i]))
}

fn interp1(xs: &[f64], ys: &[f64], x: f64) -> f64 {
    let (i, t) = locate(xs, x);
    ys[i] + t * (ys[i + 1] - ys[i])
}

fn interp2(xs: &[f64], ys: &[f64], z: &[Vec<f64>], x: f64, y: f64) -> f64 {
    let (i, t) = locate(xs, x);
    let (j, u) = locate(ys, y);
    let (z00, z01, z10, z11) = (z[i][j], z[i][j + 1], z[i + 1][j], z[i + 1][j + 1]);
    (1.0 - t) * (1.0 - u) * z00 + (1.0 - t) * u * z01 + t * (1.0 - u) * z10 + t * u * z11
}

/// Linear interpolation through `points` (sorted by x), extrapolated from the end segments;
/// a single point is a constant, and a segment of no width its left value.
pub fn interpolate(points: &[(f64, f64)], x: f64) -> f64 {
    match points {
        [] => 0.0,
        [(_, y)] => *y,
        _ => {
            let i = points
                .windows(2)
                .position(|w| x <= w[1].0)
                .unwrap_or(points.len() - 2);
            let ((x0, y0), (x1, y1)) = (points[i], points[i + 1]);
            if (x1 - x0).abs() < f64::EPSILON {
                y0
            } else {
                y0 + (y1 - y0) * (x - x0) / (x1 - x0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile() -> Profile {
        Profile {
            prefill_isl: vec![100.0, 1000.0, 4000.0],
            prefill_ttft_ms: vec![10.0, 40.0, 160.0],
            decode_active_kv_tokens: vec![0.0, 10_000.0],
            decode_context_length: vec![100.0, 1100.0],
            decode_itl: vec![vec![5.0, 7.0], vec![15.0, 25.0]],
            mixed_step_saving: 1.0,
            prefill_context_ms: 0.0,
        }
    }

    #[test]
    fn a_chunk_pays_for_attending_to_the_tokens_before_it() {
        let plain = PerfModel::from_profile(Profile {
            mixed_step_saving: 0.0,
            prefill_context_ms: 0.0,
            ..profile()
        })
        .unwrap();
        let priced = PerfModel::from_profile(Profile {
            mixed_step_saving: 0.0,
            prefill_context_ms: 0.001,
            ..profile()
        })
        .unwrap();
        // 200 tokens after 300, beside two decodes.
        let chunk = StepShape {
            prefill_tokens: 200,
            prefill_context: 300 * 200,
            decode_seqs: 2,
            decode_kv_tokens: 1000,
            ..StepShape::default()
        };
        assert!((priced.step_ms(&chunk) - plain.step_ms(&chunk) - 60.0).abs() < 1e-9);
        // Without the measurement, or for the first chunk of a prompt: a prompt's price.
        let first = StepShape {
            prefill_context: 0,
            ..chunk
        };
        assert_eq!(priced.step_ms(&first), plain.step_ms(&first));
        assert_eq!(
            plain.step_ms(&chunk),
            plain.step_ms(&first),
            "no measurement, no term"
        );
        assert_eq!(
            PerfModel::Polynomial.step_ms(&chunk),
            PerfModel::Polynomial.step_ms(&first)
        );
        // A negative or absurd coefficient is refused.
        for bad in [-1e-3, f64::NAN, 1.0] {
            assert!(
                PerfModel::from_profile(Profile {
                    prefill_context_ms: bad,
                    ..profile()
                })
                .is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn polynomial_matches_the_published_coefficients() {
        let m = PerfModel::Polynomial;
        assert!((m.prefill_ms(0) - 16.50142).abs() < 1e-9);
        let t = 8192.0_f64;
        assert!(
            (m.prefill_ms(8192) - (4.209989e-7 * t * t + 1.518344e-2 * t + 16.50142)).abs() < 1e-9
        );
        let idle = StepShape {
            decode_seqs: 1,
            active_blocks: 0,
            capacity_blocks: 100,
            ..StepShape::default()
        };
        assert!((m.decode_ms(&idle) - 5.74).abs() < 1e-9);
        let full = StepShape {
            active_blocks: 100,
            ..idle
        };
        assert!((m.decode_ms(&full) - (-25.74 + 54.01 + 5.74)).abs() < 1e-9);
        // A mixed step pays both phases; an empty one nothing.
        let mixed = StepShape {
            prefill_tokens: 8192,
            ..idle
        };
        assert!((m.step_ms(&mixed) - (m.prefill_ms(8192) + 5.74)).abs() < 1e-9);
        assert_eq!(m.step_ms(&StepShape::default()), 0.0);
    }

    #[test]
    fn interpolation_is_linear_and_bilinear_and_extrapolates() {
        let m = PerfModel::from_profile(profile()).unwrap();
        assert!((m.prefill_ms(550) - 25.0).abs() < 1e-9);
        assert!(
            (m.prefill_ms(5000) - 200.0).abs() < 1e-9,
            "extrapolated past the last point"
        );
        // Centre of the cell: mean of the four corners.
        let s = StepShape {
            decode_seqs: 10,
            decode_kv_tokens: 5_000,
            ..StepShape::default()
        };
        // context = 500: u = 0.4; kv 5000: t = 0.5.
        let expected = 0.5 * (0.6 * 5.0 + 0.4 * 7.0) + 0.5 * (0.6 * 15.0 + 0.4 * 25.0);
        assert!((m.decode_ms(&s) - expected).abs() < 1e-9);
        // Alone, each phase costs what the profile says.
        let prefill_only = StepShape {
            prefill_tokens: 550,
            ..StepShape::default()
        };
        assert!((m.step_ms(&prefill_only) - 25.0).abs() < 1e-9);
        assert!((m.step_ms(&s) - expected).abs() < 1e-9);
        // Mixed, the chunk's tokens join the decoding rows in one pass: the decode step
        // plus what 450 rows add to a pass of 10 (1/30 ms a row), not the chunk's own
        // prefill time (which holds the profile's fixed cost of a pass, 6.67 ms here).
        let mixed = StepShape {
            prefill_tokens: 450,
            ..s
        };
        assert!((m.step_ms(&mixed) - (expected + 15.0)).abs() < 1e-9);
        assert!(m.step_ms(&mixed) < m.prefill_ms(450) + m.decode_ms(&s));
        // Saving nothing adds the phases; half saves half the difference.
        for (saving, step) in [(0.0, expected + 65.0 / 3.0), (0.5, expected + 55.0 / 3.0)] {
            let m = PerfModel::from_profile(Profile {
                mixed_step_saving: saving,
                prefill_context_ms: 0.0,
                ..profile()
            })
            .unwrap();
            assert!((m.step_ms(&mixed) - step).abs() < 1e-9, "{saving}");
        }
    }

    #[test]
    fn bad_profiles_are_rejected_precisely() {
        let mut p = profile();
        p.prefill_isl = vec![100.0, 50.0, 4000.0];
        assert!(
            PerfModel::from_profile(p)
                .unwrap_err()
                .to_string()
                .contains("increasing numbers")
        );
        let mut p = profile();
        p.mixed_step_saving = 1.5;
        assert!(
            PerfModel::from_profile(p)
                .unwrap_err()
                .to_string()
                .contains("mixed_step_saving must be from 0 to 1")
        );
        let mut p = profile();
        p.decode_itl.pop();
        assert!(
            PerfModel::from_profile(p)
                .unwrap_err()
                .to_string()
                .contains("decode_itl must be 2 rows")
        );
    }

    #[test]
    fn a_profile_is_validated_as_it_is_decoded() {
        let good = r#"{"interpolated":{"prefill_isl":[100.0,1000.0],"prefill_ttft_ms":[10.0,40.0],
            "decode_active_kv_tokens":[0.0,10000.0],"decode_context_length":[100.0,1100.0],
            "decode_itl":[[5.0,7.0],[15.0,25.0]]}}"#;
        let model: PerfModel = serde_json::from_str(good).unwrap();
        // Without the field, a mixed step adds its phases, as before the field existed.
        assert!(matches!(&model, PerfModel::Interpolated(p) if p.mixed_step_saving == 0.0));
        assert_eq!(
            serde_json::from_str::<PerfModel>(&serde_json::to_string(&model).unwrap()).unwrap(),
            model
        );
        assert_eq!(
            serde_json::from_str::<PerfModel>(r#""polynomial""#).unwrap(),
            PerfModel::Polynomial
        );
        // Found by fuzzing discovery records: each of these used to decode, and then made
        // the router index an empty axis or build an infinite `Duration`.
        for bad in [
            r#"{"interpolated":{"prefill_isl":[],"prefill_ttft_ms":[],"decode_active_kv_tokens":[],"decode_context_length":[],"decode_itl":[]}}"#,
            r#"{"interpolated":{"prefill_isl":[0.0,1.0],"prefill_ttft_ms":[0.0,1e308],"decode_active_kv_tokens":[0.0,1.0],"decode_context_length":[0.0,1.0],"decode_itl":[[1.0,1.0],[1.0,1.0]]}}"#,
            r#"{"interpolated":{"prefill_isl":[100.0,1000.0],"prefill_ttft_ms":[10.0,40.0],"decode_active_kv_tokens":[0,0,10000.0],"decode_context_length":[100.0,1100.0],"decode_itl":[[2.0,7.0],[15.0,25.0]]}}"#,
            r#"{"interpolated":{"prefill_isl":[0.0,1e-300],"prefill_ttft_ms":[0.0,86400000.0],"decode_active_kv_tokens":[0.0,1.0],"decode_context_length":[0.0,1.0],"decode_itl":[[1.0,1.0],[1.0,1.0]]}}"#,
        ] {
            let error = serde_json::from_str::<PerfModel>(bad)
                .unwrap_err()
                .to_string();
            assert!(error.contains("invalid profile"), "{error}");
        }
    }
}
