//! What a replay shows while it goes: a bar with counts and rate when stderr
//! is a terminal, else an INFO line every 10 s. Nothing is drawn when stderr
//! is not a terminal (stdout carries the report).

use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use tracing::info;

use super::report::Summary;

/// How often a run without a bar logs its progress.
const PROGRESS_LOG_EVERY: Duration = Duration::from_secs(10);

/// Progress of one run over `total` dead letters.
pub struct Progress {
    /// The bar, when stderr is a terminal.
    bar: Option<ProgressBar>,
    /// How many dead letters the run reads.
    total: u64,
    /// When the last progress log line was written.
    last_log: Instant,
}

impl Progress {
    /// Starts showing a run over `total` dead letters.
    pub fn start(total: u64) -> Progress {
        use std::io::IsTerminal;
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::new(total);
            bar.set_style(
                ProgressStyle::with_template(
                    "{bar:30} {pos}/{len} dead letters · {per_sec} · {elapsed} · {msg}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        });
        Progress {
            bar,
            total,
            last_log: Instant::now(),
        }
    }

    /// Shows the counts so far.
    pub fn update(&mut self, summary: &Summary) {
        if let Some(bar) = &self.bar {
            bar.set_position(summary.records);
            bar.set_message(summary.line());
        } else if self.last_log.elapsed() >= PROGRESS_LOG_EVERY {
            self.last_log = Instant::now();
            info!(
                read = summary.records,
                of = self.total,
                progress = %summary.line(),
                "Replaying dead letters."
            );
        }
    }

    /// Leaves the final counts on the bar.
    pub fn finish(&self, summary: &Summary) {
        if let Some(bar) = &self.bar {
            bar.finish_with_message(summary.line());
        }
    }
}
