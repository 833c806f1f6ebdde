//! Which time a run reads, in which steps, and where a job's checkpoint is
//! kept: pure functions of the clock, the checkpoint and the settings.

use time::OffsetDateTime;

use crate::adapters::providers::api::{Job, Paging};
use crate::config::ReconcileConfig;
use crate::domain::event::Source;

/// The ledger name of a job's checkpoint:
/// `{provider}/{source}/{outlet or -}/{entity type}`, e.g. `mekari/main/OUT-1/orders`.
pub fn checkpoint_name(source: &Source, job: &Job) -> String {
    format!(
        "{}/{}/{}/{}",
        source.provider,
        source.name,
        job.outlet.as_deref().unwrap_or("-"),
        job.entity_type.plural()
    )
}

/// Where a scheduled run of a job starts: its checkpoint minus the
/// lookback, or, with no checkpoint yet, the initial window before `now`.
pub fn scheduled_start(
    checkpoint: Option<i64>,
    now: OffsetDateTime,
    config: &ReconcileConfig,
) -> OffsetDateTime {
    match checkpoint {
        Some(at) => OffsetDateTime::from_unix_timestamp(at).unwrap_or(now) - lookback(config),
        None => now - seconds(config.initial_window_secs),
    }
}

/// How far before a checkpoint (or a last-seen-active time) a run starts.
pub fn lookback(config: &ReconcileConfig) -> time::Duration {
    seconds(config.lookback_secs)
}

/// The steps `[from, to)` is read in: windowed lists in steps of `step_secs`
/// (the checkpoint moves after each), any other list in one step.
pub fn steps(
    from: OffsetDateTime,
    to: OffsetDateTime,
    paging: Paging,
    step_secs: u64,
) -> Vec<(OffsetDateTime, OffsetDateTime)> {
    if paging != Paging::Window {
        return vec![(from, to)];
    }
    let step = seconds(step_secs.max(1));
    let mut steps = Vec::new();
    let mut start = from;
    while start < to {
        let end = (start + step).min(to);
        steps.push((start, end));
        start = end;
    }
    steps
}

fn seconds(secs: u64) -> time::Duration {
    time::Duration::seconds(i64::try_from(secs).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::event::{EntityType, ProviderKind};
    use time::macros::datetime;

    #[test]
    fn windowed_lists_are_read_in_steps_ending_at_the_window_end() {
        let from = datetime!(2026-11-29 10:00 UTC);
        let to = datetime!(2026-11-29 12:30 UTC);
        let steps = steps(from, to, Paging::Window, 3600);
        assert_eq!(
            steps,
            vec![
                (from, datetime!(2026-11-29 11:00 UTC)),
                (
                    datetime!(2026-11-29 11:00 UTC),
                    datetime!(2026-11-29 12:00 UTC)
                ),
                (datetime!(2026-11-29 12:00 UTC), to),
            ]
        );
        assert_eq!(
            super::steps(from, to, Paging::NewestFirst, 3600),
            vec![(from, to)]
        );
        assert_eq!(super::steps(to, from, Paging::Window, 3600), vec![]);
    }

    #[test]
    fn a_scheduled_run_starts_a_lookback_before_its_checkpoint() {
        let config = ReconcileConfig::default();
        let now = datetime!(2026-11-30 00:00 UTC);
        let checkpoint = datetime!(2026-11-29 23:00 UTC).unix_timestamp();
        assert_eq!(
            scheduled_start(Some(checkpoint), now, &config),
            datetime!(2026-11-29 21:30 UTC)
        );
        assert_eq!(
            scheduled_start(None, now, &config),
            datetime!(2026-11-29 00:00 UTC)
        );
    }

    #[test]
    fn checkpoints_are_named_per_source_outlet_and_entity_type() {
        let source = Source {
            provider: ProviderKind::Mekari,
            name: "main".into(),
            account: None,
            topic_prefix: None,
        };
        let job = |outlet: Option<&str>, entity_type| Job {
            entity_type,
            outlet: outlet.map(str::to_owned),
            paging: Paging::Window,
        };
        assert_eq!(
            checkpoint_name(&source, &job(Some("OUT-1"), EntityType::Order)),
            "mekari/main/OUT-1/orders"
        );
        assert_eq!(
            checkpoint_name(&source, &job(None, EntityType::Product)),
            "mekari/main/-/products"
        );
    }
}
