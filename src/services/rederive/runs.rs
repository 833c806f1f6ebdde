//! A run inside `serve` (`POST /admin/rederive`), for a deployment whose
//! embedded ledger `serve` holds: one run at a time, in the background,
//! through the serving pipeline, its counts and sample lines kept for
//! `GET /admin/rederive`.

use std::sync::{Arc, Mutex, PoisonError};

use serde::Serialize;
use time::OffsetDateTime;
use tracing::warn;

use super::{Options, Rederive, Summary};
use crate::adapters::publish::TopicSets;
use crate::config::Config;
use crate::services::pipeline::Pipeline;

/// The run in progress or the last one. Cheap to clone.
#[derive(Clone)]
pub struct Runs {
    config: Arc<Config>,
    pipeline: Pipeline,
    topics: TopicSets,
    last: Arc<Mutex<Option<Run>>>,
}

/// One run as it stands.
struct Run {
    started_at: OffsetDateTime,
    options: Options,
    live: Arc<Mutex<Summary>>,
    lines: Arc<Mutex<Vec<u8>>>,
    ended: Arc<Mutex<Option<Ended>>>,
}

/// How a run ended.
#[derive(Debug, Clone, Serialize)]
struct Ended {
    at: OffsetDateTime,
    /// Why it stopped before its end.
    error: Option<String>,
}

/// A run as `GET /admin/rederive` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct RunView {
    /// When it started.
    #[serde(with = "time::serde::rfc3339")]
    pub started_at: OffsetDateTime,
    /// What it was asked.
    pub options: Options,
    /// Whether it still runs.
    pub running: bool,
    /// When it ended.
    #[serde(with = "time::serde::rfc3339::option")]
    pub ended_at: Option<OffsetDateTime>,
    /// Why it stopped before its end (POST again to resume).
    pub error: Option<String>,
    /// Its counts so far.
    pub summary: Summary,
    /// The sample's lines, as the command prints them.
    pub lines: Vec<serde_json::Value>,
}

/// A run is in progress already.
#[derive(Debug, thiserror::Error)]
#[error("a rederive run is in progress (started {0}); GET /admin/rederive shows it")]
pub struct Busy(pub OffsetDateTime);

/// A `Write` into shared memory: a run's sample lines (at most `sample`
/// lines and the summary).
struct Shared(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Shared {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Runs {
    /// Runs over `topics` through `pipeline`, none yet.
    pub fn new(config: &Config, pipeline: Pipeline, topics: TopicSets) -> Runs {
        Runs {
            config: Arc::new(config.clone()),
            pipeline,
            topics,
            last: Arc::default(),
        }
    }

    /// Runs over the default configuration's shared topics, for tests of
    /// the routes around it.
    #[cfg(test)]
    pub fn idle(pipeline: Pipeline) -> Runs {
        let config = Config::from_toml("").expect("the defaults read");
        let topics = TopicSets::new(&config.kafka);
        Runs::new(&config, pipeline, topics)
    }

    /// Starts a run of `options` in the background.
    ///
    /// # Errors
    /// [`Busy`] while another runs.
    pub fn start(&self, options: Options) -> Result<RunView, Busy> {
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(run) = last.as_ref().filter(|run| run.is_running()) {
            return Err(Busy(run.started_at));
        }
        let ended = Arc::new(Mutex::new(None));
        let lines = Arc::new(Mutex::new(Vec::new()));
        let run = match Rederive::new(&self.config, self.pipeline.clone(), &self.topics.all()) {
            Ok(rederive) => {
                let live = rederive.live();
                let (ended, lines) = (ended.clone(), lines.clone());
                let task_options = options.clone();
                tokio::spawn(async move {
                    let result = rederive.run(&task_options, &mut Shared(lines)).await;
                    if let Err(error) = &result {
                        warn!(%error, "The rederive run stopped; POST /admin/rederive again resumes it.");
                    }
                    *ended.lock().unwrap_or_else(PoisonError::into_inner) = Some(Ended {
                        at: OffsetDateTime::now_utc(),
                        error: result.err().map(|e| e.to_string()),
                    });
                });
                live
            }
            Err(error) => {
                *ended.lock().unwrap_or_else(PoisonError::into_inner) = Some(Ended {
                    at: OffsetDateTime::now_utc(),
                    error: Some(error.to_string()),
                });
                Arc::default()
            }
        };
        let run = Run {
            started_at: OffsetDateTime::now_utc(),
            options,
            live: run,
            lines,
            ended,
        };
        let view = run.view();
        *last = Some(run);
        Ok(view)
    }

    /// The run in progress, or the last one; none since start.
    pub fn view(&self) -> Option<RunView> {
        self.last
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(Run::view)
    }
}

impl Run {
    fn is_running(&self) -> bool {
        self.ended
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_none()
    }

    fn view(&self) -> RunView {
        let ended = self
            .ended
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let lines = self.lines.lock().unwrap_or_else(PoisonError::into_inner);
        RunView {
            started_at: self.started_at,
            options: self.options.clone(),
            running: ended.is_none(),
            ended_at: ended.as_ref().map(|e| e.at),
            error: ended.and_then(|e| e.error),
            summary: self
                .live
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
            lines: String::from_utf8_lossy(&lines)
                .lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .filter(|l: &serde_json::Value| l.get("summary").is_none())
                .collect(),
        }
    }
}
