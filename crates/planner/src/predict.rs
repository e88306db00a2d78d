//! Load predictors: each takes one value per adjustment interval (requests, mean input or
//! output length) and predicts the next. All are small online filters; none allocates per
//! observation except the seasonal one's season table, once.
//!
//! - constant: the next interval repeats the last;
//! - moving average of the last `window` intervals;
//! - Holt: double exponential smoothing (a level and a trend);
//! - Kalman: a local linear trend model (level and slope as the state, the observation as
//!   a noisy level);
//! - seasonal: additive Holt–Winters with a period in intervals (a daily cycle at 30 s
//!   intervals is 2,880), falling back to Holt until one period has been seen.
//!
//! [`evaluate`] scores a predictor on a series by its one-step-ahead errors.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};
use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum PredictorConfig {
    Constant,
    MovingAverage {
        #[serde(default = "default_window")]
        window: usize,
    },
    Holt {
        #[serde(default = "default_alpha")]
        alpha: f64,
        #[serde(default = "default_beta")]
        beta: f64,
    },
    Kalman {
        /// Variance of the level's and the slope's random walk per interval, relative to
        /// the measurement noise: higher follows changes faster.
        #[serde(default = "default_process_noise")]
        process_noise: f64,
        #[serde(default = "default_measurement_noise")]
        measurement_noise: f64,
    },
    Seasonal {
        /// Intervals per season.
        period: usize,
        #[serde(default = "default_alpha")]
        alpha: f64,
        #[serde(default = "default_beta")]
        beta: f64,
        #[serde(default = "default_gamma")]
        gamma: f64,
    },
}

/// A predictor parameter out of its range.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum InvalidPredictor {
    #[error("{name} must be in (0, 1], not {value}")]
    NotAShare { name: &'static str, value: f64 },
    #[error("window must be at least 1")]
    EmptyWindow,
    #[error("process_noise and measurement_noise must be numbers > 0")]
    Noise,
    #[error("period must be at least 2 intervals")]
    ShortPeriod,
}

fn default_window() -> usize {
    5
}
fn default_alpha() -> f64 {
    0.5
}
fn default_beta() -> f64 {
    0.3
}
fn default_gamma() -> f64 {
    0.3
}
fn default_process_noise() -> f64 {
    1.0
}
fn default_measurement_noise() -> f64 {
    1.0
}

impl Default for PredictorConfig {
    fn default() -> Self {
        PredictorConfig::Holt {
            alpha: default_alpha(),
            beta: default_beta(),
        }
    }
}

impl PredictorConfig {
    /// Every predictor kind with its default parameters (the seasonal one with `period`).
    pub fn all(period: usize) -> Vec<PredictorConfig> {
        vec![
            PredictorConfig::Constant,
            PredictorConfig::MovingAverage {
                window: default_window(),
            },
            PredictorConfig::default(),
            PredictorConfig::Kalman {
                process_noise: default_process_noise(),
                measurement_noise: default_measurement_noise(),
            },
            PredictorConfig::Seasonal {
                period,
                alpha: default_alpha(),
                beta: default_beta(),
                gamma: default_gamma(),
            },
        ]
    }

    pub fn name(&self) -> &'static str {
        match self {
            PredictorConfig::Constant => "constant",
            PredictorConfig::MovingAverage { .. } => "moving_average",
            PredictorConfig::Holt { .. } => "holt",
            PredictorConfig::Kalman { .. } => "kalman",
            PredictorConfig::Seasonal { .. } => "seasonal",
        }
    }

    pub fn validate(&self) -> Result<(), InvalidPredictor> {
        let unit = |name: &'static str, v: f64| {
            if v > 0.0 && v <= 1.0 {
                Ok(())
            } else {
                Err(InvalidPredictor::NotAShare { name, value: v })
            }
        };
        match *self {
            PredictorConfig::Constant => Ok(()),
            PredictorConfig::MovingAverage { window: 0 } => Err(InvalidPredictor::EmptyWindow),
            PredictorConfig::MovingAverage { .. } => Ok(()),
            PredictorConfig::Holt { alpha, beta } => {
                unit("alpha", alpha)?;
                unit("beta", beta)
            }
            PredictorConfig::Kalman {
                process_noise,
                measurement_noise,
            } => {
                if process_noise.is_finite()
                    && process_noise > 0.0
                    && measurement_noise.is_finite()
                    && measurement_noise > 0.0
                {
                    Ok(())
                } else {
                    Err(InvalidPredictor::Noise)
                }
            }
            PredictorConfig::Seasonal {
                period,
                alpha,
                beta,
                gamma,
            } => {
                if period < 2 {
                    return Err(InvalidPredictor::ShortPeriod);
                }
                unit("alpha", alpha)?;
                unit("beta", beta)?;
                unit("gamma", gamma)
            }
        }
    }

    pub fn build(&self) -> Predictor {
        let state = match *self {
            PredictorConfig::Constant => State::Constant { last: None },
            PredictorConfig::MovingAverage { window } => State::MovingAverage {
                window: window.max(1),
                values: VecDeque::new(),
                sum: 0.0,
            },
            PredictorConfig::Holt { alpha, beta } => State::Holt(Holt::new(alpha, beta)),
            PredictorConfig::Kalman {
                process_noise,
                measurement_noise,
            } => State::Kalman(Kalman::new(process_noise, measurement_noise)),
            PredictorConfig::Seasonal {
                period,
                alpha,
                beta,
                gamma,
            } => State::Seasonal(Seasonal::new(period.max(2), alpha, beta, gamma)),
        };
        Predictor { state }
    }
}

/// A predictor's state; feed it one value per interval.
#[derive(Debug, Clone)]
pub struct Predictor {
    state: State,
}

#[derive(Debug, Clone)]
enum State {
    Constant {
        last: Option<f64>,
    },
    MovingAverage {
        window: usize,
        values: VecDeque<f64>,
        sum: f64,
    },
    Holt(Holt),
    Kalman(Kalman),
    Seasonal(Seasonal),
}

impl Predictor {
    /// Takes the value of the interval that just ended. Non-finite values are ignored.
    pub fn observe(&mut self, value: f64) {
        if !value.is_finite() {
            return;
        }
        match &mut self.state {
            State::Constant { last } => *last = Some(value),
            State::MovingAverage {
                window,
                values,
                sum,
            } => {
                values.push_back(value);
                *sum += value;
                if values.len() > *window {
                    *sum -= values.pop_front().unwrap_or(0.0);
                }
            }
            State::Holt(h) => h.observe(value),
            State::Kalman(k) => k.observe(value),
            State::Seasonal(s) => s.observe(value),
        }
    }

    /// The next interval's value, never negative (loads are counts); `None` before the
    /// first observation.
    pub fn predict(&self) -> Option<f64> {
        self.predict_ahead(1)
    }

    /// The value `steps` intervals ahead (1: the next), never negative. The level-only
    /// predictors say the same for every step; the trend followers extrapolate.
    pub fn predict_ahead(&self, steps: u32) -> Option<f64> {
        let h = f64::from(steps.max(1));
        let raw = match &self.state {
            State::Constant { last } => *last,
            State::MovingAverage { values, sum, .. } => {
                (!values.is_empty()).then(|| sum / values.len() as f64)
            }
            State::Holt(holt) => holt.ahead(h),
            State::Kalman(k) => k.ahead(h),
            State::Seasonal(s) => s.ahead(steps.max(1)),
        };
        raw.map(|v| v.max(0.0))
    }
}

#[derive(Debug, Clone)]
struct Holt {
    alpha: f64,
    beta: f64,
    level: Option<f64>,
    trend: f64,
}

impl Holt {
    fn new(alpha: f64, beta: f64) -> Self {
        Holt {
            alpha,
            beta,
            level: None,
            trend: 0.0,
        }
    }

    fn observe(&mut self, x: f64) {
        match self.level {
            None => self.level = Some(x),
            Some(level) => {
                let next = self.alpha * x + (1.0 - self.alpha) * (level + self.trend);
                self.trend = self.beta * (next - level) + (1.0 - self.beta) * self.trend;
                self.level = Some(next);
            }
        }
    }

    fn ahead(&self, h: f64) -> Option<f64> {
        self.level.map(|l| l + h * self.trend)
    }
}

/// Local linear trend: state (level, slope), transition level += slope, observation of
/// the level with noise `r`; process noise `q` on both (the slope's scaled down by 10).
#[derive(Debug, Clone)]
struct Kalman {
    q: f64,
    r: f64,
    state: Option<[f64; 2]>,
    /// Covariance, row-major 2×2.
    p: [f64; 4],
}

impl Kalman {
    fn new(q: f64, r: f64) -> Self {
        Kalman {
            q,
            r,
            state: None,
            p: [0.0; 4],
        }
    }

    fn observe(&mut self, z: f64) {
        let Some([level, slope]) = self.state else {
            // The first value fixes the level; the scale of the noise follows it, so the
            // filter behaves alike for 3 requests per interval and for 30,000.
            self.state = Some([z, 0.0]);
            let scale = z.abs().max(1.0);
            self.q *= scale;
            self.r *= scale;
            self.p = [self.r, 0.0, 0.0, self.r];
            return;
        };
        // Predict: x = F x, P = F P Fᵀ + Q with F = [[1, 1], [0, 1]].
        let [p00, p01, p10, p11] = self.p;
        let (l, s) = (level + slope, slope);
        let a00 = p00 + p01 + p10 + p11 + self.q;
        let a01 = p01 + p11;
        let a10 = p10 + p11;
        let a11 = p11 + self.q * 0.1;
        // Update with H = [1, 0].
        let innovation = z - l;
        let s_cov = a00 + self.r;
        let (k0, k1) = (a00 / s_cov, a10 / s_cov);
        self.state = Some([l + k0 * innovation, s + k1 * innovation]);
        self.p = [
            (1.0 - k0) * a00,
            (1.0 - k0) * a01,
            a10 - k1 * a00,
            a11 - k1 * a01,
        ];
    }

    fn ahead(&self, h: f64) -> Option<f64> {
        self.state.map(|[level, slope]| level + h * slope)
    }
}

/// Additive Holt–Winters. The first period's values seed the season; until then it is Holt.
#[derive(Debug, Clone)]
struct Seasonal {
    period: usize,
    alpha: f64,
    beta: f64,
    gamma: f64,
    /// Values of the first period, until it is complete.
    first: Vec<f64>,
    holt: Holt,
    level: f64,
    trend: f64,
    season: Vec<f64>,
    /// Index of the next observation.
    t: usize,
}

impl Seasonal {
    fn new(period: usize, alpha: f64, beta: f64, gamma: f64) -> Self {
        Seasonal {
            period,
            alpha,
            beta,
            gamma,
            first: Vec::with_capacity(period.min(4096)),
            holt: Holt::new(alpha, beta),
            level: 0.0,
            trend: 0.0,
            season: Vec::new(),
            t: 0,
        }
    }

    fn observe(&mut self, x: f64) {
        if self.season.is_empty() {
            self.holt.observe(x);
            self.first.push(x);
            if self.first.len() == self.period {
                self.level = self.first.iter().sum::<f64>() / self.period as f64;
                self.season = self.first.iter().map(|v| v - self.level).collect();
                self.first = Vec::new();
            }
        } else {
            let i = self.t % self.period;
            let level = self.level;
            self.level =
                self.alpha * (x - self.season[i]) + (1.0 - self.alpha) * (level + self.trend);
            self.trend = self.beta * (self.level - level) + (1.0 - self.beta) * self.trend;
            self.season[i] = self.gamma * (x - self.level) + (1.0 - self.gamma) * self.season[i];
            // Keep the season centred on zero, its mean moved into the level: otherwise
            // level and season can drift against each other, and a spike takes hundreds
            // of periods to wash out.
            let mean = self.season.iter().sum::<f64>() / self.period as f64;
            for s in &mut self.season {
                *s -= mean;
            }
            self.level += mean;
        }
        self.t += 1;
    }

    fn ahead(&self, steps: u32) -> Option<f64> {
        if self.season.is_empty() {
            self.holt.ahead(f64::from(steps))
        } else {
            let i = (self.t + steps as usize - 1) % self.period;
            Some(self.level + f64::from(steps) * self.trend + self.season[i])
        }
    }
}

/// One-step-ahead errors of a predictor over a series.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ForecastError {
    /// Predictions scored (every value after the first).
    pub predictions: usize,
    pub mean_absolute: f64,
    pub root_mean_square: f64,
    /// Mean absolute error over the mean of the values: comparable across series.
    pub relative: f64,
}

/// Feeds `series` to a fresh predictor, scoring each prediction against the value that
/// follows it.
pub fn evaluate(config: &PredictorConfig, series: &[f64]) -> ForecastError {
    let mut predictor = config.build();
    let (mut n, mut abs, mut sq) = (0usize, 0.0, 0.0);
    for &x in series {
        if let Some(p) = predictor.predict() {
            n += 1;
            abs += (p - x).abs();
            sq += (p - x) * (p - x);
        }
        predictor.observe(x);
    }
    let mean = series.iter().sum::<f64>() / series.len().max(1) as f64;
    let mae = if n == 0 { 0.0 } else { abs / n as f64 };
    ForecastError {
        predictions: n,
        mean_absolute: mae,
        root_mean_square: if n == 0 { 0.0 } else { (sq / n as f64).sqrt() },
        relative: if mean > 0.0 { mae / mean } else { 0.0 },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn after(config: &PredictorConfig, series: &[f64]) -> f64 {
        let mut p = config.build();
        for &x in series {
            p.observe(x);
        }
        p.predict().unwrap()
    }

    #[test]
    fn nothing_to_say_before_the_first_value() {
        for config in PredictorConfig::all(4) {
            assert_eq!(config.build().predict(), None, "{}", config.name());
        }
    }

    #[test]
    fn constant_repeats_and_moving_average_averages_its_window() {
        assert_eq!(after(&PredictorConfig::Constant, &[1.0, 7.0, 3.0]), 3.0);
        let ma = PredictorConfig::MovingAverage { window: 2 };
        assert_eq!(after(&ma, &[100.0, 2.0, 4.0]), 3.0);
    }

    #[test]
    fn trend_followers_extrapolate_a_ramp_the_others_lag_it() {
        let ramp: Vec<f64> = (0..40).map(|i| 10.0 + 5.0 * f64::from(i)).collect();
        let next = 10.0 + 5.0 * 40.0;
        for config in [
            PredictorConfig::default(),
            PredictorConfig::Kalman {
                process_noise: 1.0,
                measurement_noise: 1.0,
            },
        ] {
            let p = after(&config, &ramp);
            assert!((p - next).abs() < 2.0, "{}: {p} vs {next}", config.name());
        }
        assert_eq!(after(&PredictorConfig::Constant, &ramp), next - 5.0);
        assert!(after(&PredictorConfig::MovingAverage { window: 5 }, &ramp) <= next - 15.0);
    }

    #[test]
    fn predictions_further_ahead_follow_the_trend() {
        let ramp: Vec<f64> = (0..40).map(|i| 10.0 + 5.0 * f64::from(i)).collect();
        let mut holt = PredictorConfig::default().build();
        let mut constant = PredictorConfig::Constant.build();
        for &x in &ramp {
            holt.observe(x);
            constant.observe(x);
        }
        let (one, three) = (
            holt.predict_ahead(1).unwrap(),
            holt.predict_ahead(3).unwrap(),
        );
        assert!((three - one - 10.0).abs() < 1.0, "{one} {three}");
        assert_eq!(constant.predict_ahead(3), constant.predict());
        assert_eq!(holt.predict_ahead(0), holt.predict());
    }

    #[test]
    fn seasonal_learns_a_cycle_that_holt_cannot() {
        // A square wave: 6 intervals quiet, 6 busy.
        let cycle: Vec<f64> = (0..12).map(|i| if i < 6 { 10.0 } else { 50.0 }).collect();
        let series: Vec<f64> = cycle.iter().cycle().take(12 * 8).copied().collect();
        let seasonal = PredictorConfig::Seasonal {
            period: 12,
            alpha: 0.3,
            beta: 0.05,
            gamma: 0.5,
        };
        let s = evaluate(&seasonal, &series);
        let h = evaluate(&PredictorConfig::default(), &series);
        assert!(
            s.mean_absolute < h.mean_absolute / 2.0,
            "seasonal {s:?} vs holt {h:?}"
        );
        // After a few seasons it knows the quiet half starts next.
        assert!((after(&seasonal, &series) - 10.0).abs() < 3.0);
    }

    #[test]
    fn evaluation_scores_one_step_ahead() {
        let e = evaluate(&PredictorConfig::Constant, &[2.0, 4.0, 4.0, 8.0]);
        assert_eq!(e.predictions, 3);
        assert_eq!(e.mean_absolute, (2.0 + 0.0 + 4.0) / 3.0);
        assert_eq!(e.root_mean_square, ((4.0 + 0.0 + 16.0) / 3.0_f64).sqrt());
        assert_eq!(e.relative, e.mean_absolute / 4.5);
    }

    #[test]
    fn invalid_parameters_are_refused() {
        assert!(
            PredictorConfig::MovingAverage { window: 0 }
                .validate()
                .is_err()
        );
        assert!(
            PredictorConfig::Holt {
                alpha: 1.5,
                beta: 0.1
            }
            .validate()
            .is_err()
        );
        assert!(
            PredictorConfig::Seasonal {
                period: 1,
                alpha: 0.5,
                beta: 0.5,
                gamma: 0.5
            }
            .validate()
            .is_err()
        );
        for config in PredictorConfig::all(4) {
            config.validate().unwrap();
        }
    }

    proptest! {
        /// Fed a constant, every predictor predicts it (eventually, for the filters), and
        /// none ever predicts a negative or non-finite load.
        #[test]
        fn predictions_are_finite_and_settle_on_a_constant(
            series in proptest::collection::vec(0.0f64..1e6, 1..200),
            level in 0.0f64..1e5,
        ) {
            for config in PredictorConfig::all(7) {
                let mut p = config.build();
                for &x in &series {
                    p.observe(x);
                    let v = p.predict().unwrap();
                    prop_assert!(v.is_finite() && v >= 0.0, "{}: {v}", config.name());
                }
                for _ in 0..3_000 {
                    p.observe(level);
                }
                let v = p.predict().unwrap();
                prop_assert!((v - level).abs() <= 1e-3 * level.max(1.0) + 1e-6,
                    "{}: {v} vs {level}", config.name());
            }
        }
    }
}
