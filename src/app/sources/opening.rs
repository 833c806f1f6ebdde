//! Opening the files' own topics apart from the reads of the directory: a
//! broker that does not answer makes each opening last 20-30 s, and a read
//! that waited for it would hold back every other file's change.
//!
//! A read takes the files whose topics are open (or need none) at once;
//! the others wait, their topics opened in the background, a few prefixes
//! at a time and one attempt per prefix at a time, and are taken by the
//! read that follows each opening: admitted once their topics are in use,
//! refused with Kafka's answer when they could not be made (tried again at
//! the next read the directory's own causes make). A file waiting keeps
//! what it had: its source's last good settings, or none, so a source never
//! answers before its own topics exist.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use tokio::task::{Id, JoinSet};

use crate::app::topics::{OpenError, OwnTopics};
use crate::config::KafkaConfig;
use crate::config::source_files::{Listing, SourceFile};

/// At most this many prefixes are opened at once: each holds a connection
/// to Kafka and a blocking thread for its metadata calls.
const AT_ONCE: usize = 4;

/// The openings under way, and what the last attempt of each prefix that
/// failed said.
pub(super) struct Openings {
    own_topics: OwnTopics,
    kafka: Arc<KafkaConfig>,
    running: JoinSet<Result<(), OpenError>>,
    /// The prefix each running opening opens.
    prefixes: HashMap<Id, String>,
    /// Why a prefix's last attempt failed, until the next retry.
    failed: BTreeMap<String, String>,
}

impl Openings {
    pub(super) fn new(own_topics: OwnTopics, kafka: Arc<KafkaConfig>) -> Openings {
        Openings {
            own_topics,
            kafka,
            running: JoinSet::new(),
            prefixes: HashMap::new(),
            failed: BTreeMap::new(),
        }
    }

    /// Splits a read of the directory: what can be applied now (the files
    /// whose topics are open or need none, and those refused, a failed
    /// opening's among them), and the files waiting for their topics, whose
    /// openings start here unless under way. With `retry`, the prefixes
    /// that failed are tried again, their files waiting meanwhile.
    pub(super) fn sort(&mut self, mut listing: Listing, retry: bool) -> (Listing, Vec<SourceFile>) {
        if retry {
            self.failed.clear();
        }
        let mut waiting = Vec::new();
        for file in std::mem::take(&mut listing.files) {
            // A prefix the shared topics take is refused by the file's checks.
            let Some(prefix) = file
                .config
                .topic_prefix
                .clone()
                .filter(|p| !self.own_topics.is_open(p))
                .filter(|p| self.kafka.shared_topic_clash(p).is_none())
            else {
                listing.files.push(file);
                continue;
            };
            if let Some(reason) = self.failed.get(&prefix) {
                listing.refused.push(file.refused(&format!(
                    "{}.topic_prefix: its topics cannot be opened: {reason}",
                    file.entry().key()
                )));
                continue;
            }
            if !self.prefixes.values().any(|p| *p == prefix) && self.prefixes.len() < AT_ONCE {
                let own_topics = self.own_topics.clone();
                let opening = prefix.clone();
                let task = self
                    .running
                    .spawn(async move { own_topics.open(&opening).await });
                self.prefixes.insert(task.id(), prefix);
            }
            waiting.push(file);
        }
        (listing, waiting)
    }

    /// Waits for the next opening to end and keeps its failure; never ends
    /// when none is under way.
    pub(super) async fn next(&mut self) {
        let Some(ended) = self.running.join_next_with_id().await else {
            return std::future::pending().await;
        };
        let (id, failure) = match ended {
            Ok((id, result)) => (id, result.err().map(|e| e.to_string())),
            Err(error) => (error.id(), Some(format!("the opening ended: {error}"))),
        };
        if let Some(prefix) = self.prefixes.remove(&id)
            && let Some(reason) = failure
        {
            self.failed.insert(prefix, reason);
        }
    }
}
