//! A progress bar on stderr, drawn only when stderr is a terminal.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::record::RequestRecord;

#[derive(Debug)]
pub(crate) struct Progress {
    bar: Option<ProgressBar>,
    succeeded: usize,
    failed: usize,
}

impl Progress {
    /// A bar counting to `total` when known, else a spinner; nothing when `enabled` is
    /// false or stderr is not a terminal (logs and pipes get no control characters).
    pub fn new(enabled: bool, total: Option<usize>) -> Self {
        let bar = (enabled && std::io::stderr().is_terminal()).then(|| {
            let target = ProgressDrawTarget::stderr();
            let (bar, template) = match total {
                Some(n) => (
                    ProgressBar::with_draw_target(Some(n as u64), target),
                    "{elapsed_precise} [{wide_bar}] {pos}/{len} {msg}",
                ),
                None => (
                    ProgressBar::with_draw_target(None, target),
                    "{elapsed_precise} {spinner} {pos} requests {msg}",
                ),
            };
            if let Ok(style) = ProgressStyle::with_template(template) {
                bar.set_style(style.progress_chars("=> "));
            }
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        });
        Self {
            bar,
            succeeded: 0,
            failed: 0,
        }
    }

    pub fn record(&mut self, record: &RequestRecord) {
        if record.succeeded() {
            self.succeeded += 1;
        } else {
            self.failed += 1;
        }
        if let Some(bar) = &self.bar {
            bar.inc(1);
            bar.set_message(format!("{} ok, {} failed", self.succeeded, self.failed));
        }
    }

    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
