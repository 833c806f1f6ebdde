//! What a run shows while it goes: a live line on a terminal (the one-shot
//! `posbridge reconcile` command), a log line every few seconds otherwise
//! (scheduled runs inside `serve`, whose terminal belongs to the log).

use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use tracing::info;

use super::Summary;

/// How often a run without a live line logs its progress.
const PROGRESS_LOG_EVERY: Duration = Duration::from_secs(10);

/// Progress of one run of one source.
pub struct Progress {
    /// The live line, when drawing one.
    bar: Option<ProgressBar>,
    /// `provider/source`, for log lines.
    label: String,
    /// When the run started, for the rate in log lines.
    started: Instant,
    /// When the last progress log line was written.
    last_log: std::sync::Mutex<Instant>,
}

impl Progress {
    /// Starts showing a run; `live` draws a line when stderr is a terminal.
    pub fn start(label: String, live: bool) -> Progress {
        use std::io::IsTerminal;
        let bar = (live && std::io::stderr().is_terminal()).then(|| {
            // The total is unknown until the last page: a spinner with the
            // records read so far and their rate.
            let bar = ProgressBar::new_spinner();
            bar.set_style(
                ProgressStyle::with_template(
                    "{spinner} {prefix} {elapsed} · {pos} records, {per_sec} · {msg}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            bar.set_prefix(label.clone());
            bar.enable_steady_tick(Duration::from_millis(120));
            bar
        });
        Progress {
            bar,
            label,
            started: Instant::now(),
            last_log: std::sync::Mutex::new(Instant::now()),
        }
    }

    fn line(summary: &Summary) -> String {
        format!(
            "pages {} · records {} · published {} · not newer {} · stale {} · dead-lettered {}",
            summary.pages,
            summary.records,
            summary.published,
            summary.unchanged,
            summary.stale,
            summary.dead_lettered
        )
    }

    /// Shows the counts so far.
    pub fn update(&self, summary: &Summary) {
        if let Some(bar) = &self.bar {
            bar.set_position(summary.records);
            bar.set_message(Self::line(summary));
            return;
        }
        let mut last = self
            .last_log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if last.elapsed() >= PROGRESS_LOG_EVERY {
            *last = Instant::now();
            let rate = summary.records as f64 / self.started.elapsed().as_secs_f64().max(1e-3);
            info!(
                run = %self.label,
                progress = %Self::line(summary),
                records_per_sec = format!("{rate:.0}"),
                "Reconciling."
            );
        }
    }

    /// Leaves the final counts on the live line.
    pub fn finish(&self, summary: &Summary) {
        if let Some(bar) = &self.bar {
            bar.set_position(summary.records);
            bar.finish_with_message(Self::line(summary));
        }
    }
}
