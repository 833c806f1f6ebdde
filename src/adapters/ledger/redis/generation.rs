//! Whether the Redis the ledger talks to is still the one it was filled
//! against: its *generation*.
//!
//! A Redis can lose its last writes and keep its keys: restarted from its
//! last RDB snapshot, or replaced by a replica that had not received them
//! (a failover). The generation mark survives both, so it cannot tell. The
//! server can: a restart gives it a new `run_id` (`INFO server`), and a
//! replica promoted to master takes a new replication id
//! (`master_replid`, `INFO replication`). On a cluster redis-rs asks every
//! master, so the generation is the set of every master's ids, and a
//! failover of any of them changes it.
//!
//! A restart drops the connection, so the first command after it fails and
//! the next reaches the new server ([`super::connection::Counted`] counts
//! those failures): a decision that finds the count changed looks at the
//! generation before it is made. A failover to another address is a
//! reconnect too. Beside that, the rebuild asks every second.
//!
//! What changed is only *accepted* once a fill read the topics from the
//! ledger's offsets against it: until then every look says it changed, so
//! every decision waits for that fill.

use std::collections::BTreeSet;
use std::sync::{Mutex, PoisonError};

use redis::Value;

use redis::AsyncCommands;

use super::RedisLedger;
use super::connection::{Counted, collect_text, is_connection_error};
use crate::adapters::ledger::LedgerError;

/// The ids of the servers the ledger talks to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Generation {
    /// Each server's `run_id`: a new one is a restart (its memory is its
    /// last snapshot's, or empty).
    run_ids: BTreeSet<String>,
    /// Each master's `master_replid`: a new one is a replica promoted (it
    /// holds what it had received).
    replids: BTreeSet<String>,
}

impl Generation {
    /// The ids in the text of `INFO server` and `INFO replication` (one
    /// server's, or every master's one after another); `None` when it holds
    /// no `run_id`.
    pub(super) fn parse(text: &str) -> Option<Generation> {
        let mut generation = Generation::default();
        for line in text.lines() {
            let line = line.trim();
            if let Some(id) = line.strip_prefix("run_id:") {
                generation.run_ids.insert(id.to_owned());
            } else if let Some(id) = line.strip_prefix("master_replid:") {
                generation.replids.insert(id.to_owned());
            }
        }
        (!generation.run_ids.is_empty()).then_some(generation)
    }

    /// What changed from `before`, in words; `None` when nothing did.
    pub(super) fn changed_from(&self, before: &Generation) -> Option<String> {
        if self.run_ids != before.run_ids {
            return Some(format!(
                "Redis restarted: run_id {} where it was {} (its memory is its last snapshot's)",
                join(&self.run_ids),
                join(&before.run_ids)
            ));
        }
        if self.replids != before.replids {
            return Some(format!(
                "Redis failed over: replication id {} where it was {} (a replica promoted holds only what it had received)",
                join(&self.replids),
                join(&before.replids)
            ));
        }
        None
    }

    /// The generation of the servers behind `conn`; `None` when they refuse
    /// `INFO` (an ACL without `@dangerous`).
    ///
    /// # Errors
    /// [`LedgerError::Redis`] when the connection fails.
    pub(super) async fn read(conn: &Counted) -> Result<Option<Generation>, LedgerError> {
        let mut text = String::new();
        for section in ["server", "replication"] {
            let info: redis::RedisResult<Value> = redis::cmd("INFO")
                .arg(section)
                .query_async(&mut conn.clone())
                .await;
            match info {
                Ok(info) => collect_text(&info, &mut text),
                Err(error) if is_connection_error(&error) => return Err(error.into()),
                Err(_) => return Ok(None),
            }
        }
        Ok(Generation::parse(&text))
    }
}

impl RedisLedger {
    /// Whether the generation mark is there.
    pub(super) async fn marked(&self) -> Result<bool, LedgerError> {
        Ok(self.conn.clone().exists(self.mark_key()).await?)
    }

    /// Before a decision: when the connection failed since the generation
    /// was last seen unchanged, it is looked at first. The failures counted
    /// now, for [`RedisLedger::still_same_server`].
    pub(super) async fn same_server(&self) -> Result<u64, LedgerError> {
        let drops = self.conn.drops();
        if self.watch.suspect(&self.conn) {
            self.watch.look(&self.conn).await?;
        }
        Ok(drops)
    }

    /// After a decision's command: a connection failure counted meanwhile
    /// (another command saw the old server go) may mean the command reached
    /// the new one, so the generation is looked at before the answer is
    /// used.
    pub(super) async fn still_same_server(&self, drops: u64) -> Result<(), LedgerError> {
        if self.conn.drops() == drops {
            return Ok(());
        }
        self.watch.look(&self.conn).await
    }
}

fn join(ids: &BTreeSet<String>) -> String {
    ids.iter().cloned().collect::<Vec<_>>().join(",")
}

impl Generation {
    /// The run ids and the replication ids, each space-separated, as the
    /// checkpoint script takes them.
    pub(super) fn ids(&self) -> (String, String) {
        let spaced = |ids: &BTreeSet<String>| ids.iter().cloned().collect::<Vec<_>>().join(" ");
        (spaced(&self.run_ids), spaced(&self.replids))
    }
}

/// What the ledger knows of the generation: the one its last fill read the
/// topics against, and the one the fill running now began on.
#[derive(Debug, Default)]
pub(super) struct Watch {
    inner: Mutex<Known>,
}

#[derive(Debug, Default)]
struct Known {
    /// The generation the last fill was against (`None`: `INFO` refused).
    filled: Option<Generation>,
    /// The connection's failures counted when it was last known unchanged.
    drops: u64,
    /// What the running fill began on: the generation and the failures.
    pending: Option<(Option<Generation>, u64)>,
}

impl Watch {
    fn known(&self) -> std::sync::MutexGuard<'_, Known> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A fill begins: what it reads the topics against.
    pub(super) async fn fill_begins(&self, conn: &Counted) -> Result<(), LedgerError> {
        let drops = conn.drops();
        let now = Generation::read(conn).await?;
        self.known().pending = Some((now, drops));
        Ok(())
    }

    /// The fill that began last ended: its generation is accepted.
    pub(super) fn fill_ended(&self) {
        let mut known = self.known();
        if let Some((generation, drops)) = known.pending.take() {
            known.filled = generation;
            known.drops = drops;
        }
    }

    /// The generation the last fill read against (`None` when `INFO` was
    /// refused), and whether the connection failed since it was last known
    /// unchanged: what a checkpoint may be written on.
    pub(super) fn accepted(&self, conn: &Counted) -> (Option<Generation>, bool) {
        let known = self.known();
        (known.filled.clone(), known.drops != conn.drops())
    }

    /// Whether the connection failed since the generation was last known
    /// unchanged: a decision must look again first.
    pub(super) fn suspect(&self, conn: &Counted) -> bool {
        self.known().drops != conn.drops()
    }

    /// Looks at the generation now.
    ///
    /// # Errors
    /// [`LedgerError::Changed`] when it is not the one the last fill was
    /// against, or cannot be told (a server that refuses `INFO`, after a
    /// reconnect); [`LedgerError::Redis`] when it cannot be read.
    pub(super) async fn look(&self, conn: &Counted) -> Result<(), LedgerError> {
        let drops = conn.drops();
        let now = Generation::read(conn).await?;
        let mut known = self.known();
        let changed = changed(known.filled.as_ref(), now.as_ref(), known.drops != drops);
        match changed {
            Some(why) => Err(LedgerError::Changed { why }),
            None => {
                known.drops = known.drops.max(drops);
                Ok(())
            }
        }
    }
}

/// What changed between the generation the last fill read against
/// (`filled`) and the one read `now` (`None`: `INFO` refused), in words;
/// `reconnected` when the connection failed since the generation was last
/// known unchanged. A server that refuses `INFO` cannot be told from
/// another once the connection failed.
fn changed(
    filled: Option<&Generation>,
    now: Option<&Generation>,
    reconnected: bool,
) -> Option<String> {
    match (filled, now) {
        (Some(filled), Some(now)) => now.changed_from(filled),
        (None, None) if reconnected => Some(
            "Redis reconnected, and refuses INFO: whether it is the same server cannot be told"
                .to_owned(),
        ),
        (None, None) => None,
        (Some(_), None) => {
            Some("Redis refuses INFO now: whether it is the same server cannot be told".to_owned())
        }
        (None, Some(_)) => Some("Redis answers INFO now, and did not when filled".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(run_ids: &[&str], replids: &[&str]) -> String {
        let mut text = String::new();
        for (run_id, replid) in run_ids.iter().zip(replids) {
            text.push_str(&format!(
                "# Server\r\nredis_version:7.0.15\r\nrun_id:{run_id}\r\ntcp_port:6379\r\n\n# Replication\r\nrole:master\r\nmaster_replid:{replid}\r\nmaster_replid2:0000\r\n\n"
            ));
        }
        text
    }

    #[test]
    fn a_restart_and_a_failover_are_told_apart_from_the_same_server() {
        let before = Generation::parse(&info(&["r1"], &["a"])).unwrap();
        assert_eq!(
            Generation::parse(&info(&["r1"], &["a"]))
                .unwrap()
                .changed_from(&before),
            None
        );
        let restarted = Generation::parse(&info(&["r2"], &["a"])).unwrap();
        let why = restarted.changed_from(&before).unwrap();
        assert!(why.contains("restarted") && why.contains("r2"), "{why}");
        let promoted = Generation::parse(&info(&["r1"], &["b"])).unwrap();
        let why = promoted.changed_from(&before).unwrap();
        assert!(why.contains("failed over"), "{why}");
        // `master_replid2` (the id a promoted replica inherited) is not the
        // replication id.
        assert_eq!(before.replids.len(), 1);
    }

    #[test]
    fn a_cluster_changes_when_any_master_does() {
        let before = Generation::parse(&info(&["r1", "r2", "r3"], &["a", "b", "c"])).unwrap();
        let same = Generation::parse(&info(&["r1", "r2", "r3"], &["a", "b", "c"])).unwrap();
        assert_eq!(same.changed_from(&before), None);
        let failed_over = Generation::parse(&info(&["r1", "r4", "r3"], &["a", "d", "c"])).unwrap();
        assert!(failed_over.changed_from(&before).is_some());
    }

    #[test]
    fn a_server_that_refuses_info_is_taken_as_changed_only_after_a_reconnect() {
        let generation = Generation::parse(&info(&["r1"], &["a"])).unwrap();
        assert_eq!(changed(None, None, false), None);
        assert!(changed(None, None, true).is_some());
        assert!(changed(Some(&generation), None, false).is_some());
        assert!(changed(None, Some(&generation), false).is_some());
        assert_eq!(changed(Some(&generation), Some(&generation), true), None);
    }

    #[test]
    fn text_without_a_run_id_is_no_generation() {
        assert_eq!(Generation::parse("# Server\r\nredis_version:7\r\n"), None);
    }
}
