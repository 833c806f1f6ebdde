//! What a long run shows while it goes (a reconcile of one source, a
//! dead-letter replay): a live line with the count and its rate when the run
//! asks for one and stderr is a terminal, else an INFO log line every 10 s.
//! Runs inside `serve` never ask (its terminal belongs to the log), and
//! nothing is drawn when stderr is not a terminal.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use tracing::info;

/// How often a run without a live line logs its progress.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// Progress of one run.
pub struct Progress {
    /// The live line, when drawing one.
    bar: Option<ProgressBar>,
    /// What runs, for log lines (`reconcile receiptroller/main`).
    label: String,
    /// How many items the run will handle, when known.
    total: Option<u64>,
    /// When the run started, for the rate in log lines.
    started: Instant,
    /// When the last progress log line was written.
    last_log: Mutex<Instant>,
}

impl Progress {
    /// Starts showing a run of `unit` (`records`, `dead letters`) out of
    /// `total` when known; `live` draws a line when stderr is a terminal.
    pub fn start(label: String, unit: &str, total: Option<u64>, live: bool) -> Progress {
        use std::io::IsTerminal;
        let bar = (live && std::io::stderr().is_terminal()).then(|| {
            let (bar, template) = match total {
                Some(total) => (
                    ProgressBar::new(total),
                    format!("{{prefix}} {{bar:30}} {{pos}}/{{len}} {unit} · {{per_sec}} · {{elapsed}} · {{msg}}"),
                ),
                // The total is unknown until the last page: a spinner.
                None => (
                    ProgressBar::new_spinner(),
                    format!("{{spinner}} {{prefix}} {{elapsed}} · {{pos}} {unit}, {{per_sec}} · {{msg}}"),
                ),
            };
            bar.set_style(
                ProgressStyle::with_template(&template)
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            bar.set_prefix(label.clone());
            bar.enable_steady_tick(Duration::from_millis(120));
            bar
        });
        Progress {
            bar,
            label,
            total,
            started: Instant::now(),
            last_log: Mutex::new(Instant::now()),
        }
    }

    /// Shows `done` items so far and the run's own counts in `line`.
    pub fn update(&self, done: u64, line: &str) {
        if let Some(bar) = &self.bar {
            bar.set_position(done);
            bar.set_message(line.to_owned());
            return;
        }
        let mut last = self.last_log.lock().unwrap_or_else(PoisonError::into_inner);
        if last.elapsed() >= LOG_EVERY {
            *last = Instant::now();
            let rate = done as f64 / self.started.elapsed().as_secs_f64().max(1e-3);
            info!(
                run = %self.label,
                done,
                total = ?self.total,
                per_sec = format!("{rate:.0}"),
                progress = %line,
                "Still running."
            );
        }
    }

    /// Leaves the final counts on the live line.
    pub fn finish(&self, done: u64, line: &str) {
        if let Some(bar) = &self.bar {
            bar.set_position(done);
            bar.finish_with_message(line.to_owned());
        }
    }
}
