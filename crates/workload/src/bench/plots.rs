//! PNG and SVG plots of a run: TTFT and ITL CDFs, latency and throughput over time.

use std::path::{Path, PathBuf};
use std::sync::Once;

use plotters::coord::Shift;
use plotters::prelude::*;

use super::BenchError;
use super::record::RequestRecord;
use super::timeline::Timeline;
use crate::units::ms;

const SIZE: (u32, u32) = (960, 600);
/// More points than this add file size, not information.
const MAX_LINE_POINTS: usize = 1_000;
const MAX_SCATTER_POINTS: usize = 4_000;
const FONT: &str = "sans-serif";
const SERIES_A: RGBColor = RGBColor(31, 119, 180);
const SERIES_B: RGBColor = RGBColor(214, 39, 40);

/// Why a chart could not be drawn: plotters' error, whichever backend it came from.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct DrawError(Box<dyn std::error::Error + Send + Sync>);

impl<E: std::error::Error + Send + Sync + 'static> From<DrawingAreaErrorKind<E>> for DrawError {
    fn from(error: DrawingAreaErrorKind<E>) -> Self {
        DrawError(Box::new(error))
    }
}

type DrawResult = Result<(), DrawError>;

/// One chart, drawable on any backend.
trait Chart {
    fn draw<DB: DrawingBackend<ErrorType: 'static>>(
        &self,
        root: &DrawingArea<DB, Shift>,
    ) -> DrawResult;
}

/// Writes every plot that has data as `<name>.png` and `<name>.svg`.
pub(crate) fn write_all(dir: &Path, records: &[RequestRecord]) -> Result<Vec<PathBuf>, BenchError> {
    register_font();
    let ok: Vec<&RequestRecord> = records.iter().filter(|r| r.succeeded()).collect();
    let ttft: Vec<f64> = ok.iter().filter_map(|r| r.ttft).map(ms).collect();
    let itl: Vec<f64> = ok
        .iter()
        .flat_map(|r| r.itl.iter().copied().map(ms))
        .collect();
    let mut written = Vec::new();
    if !ttft.is_empty() {
        let chart = Cdf::new("Time to first token", "TTFT (ms)", ttft);
        written.extend(write_both(dir, "ttft_cdf", &chart)?);
    }
    if !itl.is_empty() {
        let chart = Cdf::new("Inter-token latency", "ITL (ms)", itl);
        written.extend(write_both(dir, "itl_cdf", &chart)?);
    }
    if !ok.is_empty() {
        let chart = LatencyOverTime::new(&ok);
        written.extend(write_both(dir, "latency_over_time", &chart)?);
        let chart = ThroughputOverTime(Timeline::of(records));
        written.extend(write_both(dir, "throughput_over_time", &chart)?);
    }
    Ok(written)
}

/// Registers the embedded font plots draw their text with (family "sans-serif"), once.
pub fn register_font() {
    static REGISTER: Once = Once::new();
    // Embedded, so plots render the same on a machine without system fonts; a failure
    // surfaces as a draw error naming the plot.
    REGISTER.call_once(|| {
        let _ = plotters::style::register_font(
            FONT,
            FontStyle::Normal,
            epaint_default_fonts::UBUNTU_LIGHT,
        );
    });
}

fn write_both(dir: &Path, name: &str, chart: &impl Chart) -> Result<[PathBuf; 2], BenchError> {
    let png = dir.join(format!("{name}.png"));
    let plot_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source: DrawError| BenchError::Plot { path, source }
    };
    {
        let root = BitMapBackend::new(&png, SIZE).into_drawing_area();
        chart.draw(&root).map_err(plot_err(&png))?;
        root.present()
            .map_err(|e| plot_err(&png)(DrawError::from(e)))?;
    }
    let svg = dir.join(format!("{name}.svg"));
    {
        let root = SVGBackend::new(&svg, SIZE).into_drawing_area();
        chart.draw(&root).map_err(plot_err(&svg))?;
        root.present()
            .map_err(|e| plot_err(&svg)(DrawError::from(e)))?;
    }
    Ok([png, svg])
}

/// An empirical CDF of latencies.
struct Cdf {
    title: &'static str,
    x_label: &'static str,
    /// `(value, fraction at or below)`, thinned to at most `MAX_LINE_POINTS`.
    points: Vec<(f64, f64)>,
    max: f64,
}

impl Cdf {
    fn new(title: &'static str, x_label: &'static str, mut values: Vec<f64>) -> Self {
        values.sort_by(f64::total_cmp);
        let n = values.len();
        let step = n.div_ceil(MAX_LINE_POINTS).max(1);
        let mut points: Vec<(f64, f64)> = (0..n)
            .step_by(step)
            .map(|i| (values[i], (i + 1) as f64 / n as f64))
            .collect();
        if let Some(&last) = values.last() {
            points.push((last, 1.0));
        }
        Self {
            title,
            x_label,
            max: values.last().copied().unwrap_or(1.0).max(1e-3),
            points,
        }
    }
}

impl Chart for Cdf {
    fn draw<DB: DrawingBackend<ErrorType: 'static>>(
        &self,
        root: &DrawingArea<DB, Shift>,
    ) -> DrawResult {
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(root)
            .caption(self.title, (FONT, 24))
            .margin(16)
            .x_label_area_size(48)
            .y_label_area_size(64)
            .build_cartesian_2d(0.0..self.max * 1.05, 0.0..1.0)?;
        chart
            .configure_mesh()
            .x_desc(self.x_label)
            .y_desc("fraction of samples")
            .label_style((FONT, 14))
            .draw()?;
        chart.draw_series(LineSeries::new(
            self.points.iter().copied(),
            SERIES_A.stroke_width(2),
        ))?;
        Ok(())
    }
}

/// End-to-end latency and TTFT of each successful request against when it was sent.
struct LatencyOverTime {
    latency: Vec<(f64, f64)>,
    ttft: Vec<(f64, f64)>,
    max_x: f64,
    max_y: f64,
}

impl LatencyOverTime {
    fn new(ok: &[&RequestRecord]) -> Self {
        let step = ok.len().div_ceil(MAX_SCATTER_POINTS).max(1);
        let sampled: Vec<&&RequestRecord> = ok.iter().step_by(step).collect();
        let at = |r: &RequestRecord| r.start.as_secs_f64();
        let latency: Vec<(f64, f64)> = sampled.iter().map(|r| (at(r), ms(r.latency))).collect();
        let ttft = sampled
            .iter()
            .filter_map(|r| r.ttft.map(|t| (at(r), ms(t))))
            .collect();
        Self {
            max_x: latency.iter().map(|p| p.0).fold(1e-3, f64::max),
            max_y: latency.iter().map(|p| p.1).fold(1e-3, f64::max),
            latency,
            ttft,
        }
    }
}

impl Chart for LatencyOverTime {
    fn draw<DB: DrawingBackend<ErrorType: 'static>>(
        &self,
        root: &DrawingArea<DB, Shift>,
    ) -> DrawResult {
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(root)
            .caption("Latency over time", (FONT, 24))
            .margin(16)
            .x_label_area_size(48)
            .y_label_area_size(72)
            // Headroom above the points for the legend.
            .build_cartesian_2d(0.0..self.max_x * 1.02, 0.0..self.max_y * 1.25)?;
        chart
            .configure_mesh()
            .x_desc("request sent at (s)")
            .y_desc("ms")
            .y_label_formatter(&|v| axis_label(*v, self.max_y))
            .label_style((FONT, 14))
            .draw()?;
        chart
            .draw_series(
                self.latency
                    .iter()
                    .map(|&p| Circle::new(p, 2, SERIES_A.filled())),
            )?
            .label("end-to-end latency")
            .legend(|(x, y)| Circle::new((x + 8, y), 4, SERIES_A.filled()));
        if !self.ttft.is_empty() {
            chart
                .draw_series(
                    self.ttft
                        .iter()
                        .map(|&p| Circle::new(p, 2, SERIES_B.filled())),
                )?
                .label("time to first token")
                .legend(|(x, y)| Circle::new((x + 8, y), 4, SERIES_B.filled()));
        }
        chart
            .configure_series_labels()
            .label_font((FONT, 14))
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperLeft)
            .draw()?;
        Ok(())
    }
}

/// Output tokens per second above, completed requests per second below.
struct ThroughputOverTime(Timeline);

impl Chart for ThroughputOverTime {
    fn draw<DB: DrawingBackend<ErrorType: 'static>>(
        &self,
        root: &DrawingArea<DB, Shift>,
    ) -> DrawResult {
        root.fill(&WHITE)?;
        let root = root.titled("Throughput over time", (FONT, 24))?;
        let (top, bottom) = root.split_vertically(root.dim_in_pixel().1 / 2);
        let width = self.0.bucket.as_secs_f64();
        let series = [
            (
                &top,
                &self.0.output_tokens_per_s,
                "output tokens/s",
                SERIES_A,
            ),
            (
                &bottom,
                &self.0.completions_per_s,
                "completed requests/s",
                SERIES_B,
            ),
        ];
        for (area, values, label, color) in series {
            let max_x = values.len() as f64 * width;
            let max_y = values.iter().copied().fold(1e-3, f64::max);
            let mut chart = ChartBuilder::on(area)
                .margin(12)
                .x_label_area_size(40)
                .y_label_area_size(72)
                .build_cartesian_2d(0.0..max_x, 0.0..max_y * 1.1)?;
            chart
                .configure_mesh()
                .x_desc(format!("time (s), {:.1} s buckets", width))
                .y_desc(label)
                .y_label_formatter(&|v| axis_label(*v, max_y))
                .label_style((FONT, 14))
                .draw()?;
            // A step line: each bucket's value held across its width.
            let steps = values.iter().enumerate().flat_map(|(i, &v)| {
                let x = i as f64 * width;
                [(x, v), (x + width, v)]
            });
            chart.draw_series(LineSeries::new(steps, color.stroke_width(2)))?;
        }
        Ok(())
    }
}

/// Axis labels without decimals that carry no information.
fn axis_label(value: f64, range_max: f64) -> String {
    if range_max >= 20.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.1}")
    }
}
