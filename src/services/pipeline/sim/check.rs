//! The guarantees, checked after a world ended, from the broker's log and
//! the providers' record of answers.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::providers::{entity_type, topics_of};
use super::world::{Answer, Ended, delivery_of};
use crate::adapters::ledger::{Recorded, Remembered};
use crate::adapters::publish::OutgoingRecord;
use crate::domain::event::ProviderKind;
use crate::domain::record_at::RecordAt;
use crate::services::pipeline::Outcome;

/// The providers give up on an answer after this long.
const ANSWER_LIMIT: Duration = Duration::from_secs(10);

/// Every guarantee the world broke, in words.
pub(super) fn violations(ended: &Ended) -> Vec<String> {
    let mut broken = ended.internal.clone();
    // A replaced broker's log is gone: what each broker holds is checked
    // against the answers given while it was the one.
    // A delivery spooled while an earlier broker was the one is drained
    // into a later one: a later answer (a duplicate of it, while it waits)
    // does not forbid the drainer's write.
    let mut lost_to_the_spool = BTreeSet::new();
    let mut spooled = BTreeSet::new();
    let eras: Vec<Vec<OutgoingRecord>> = ended
        .eras
        .iter()
        .map(|log| log.iter().map(|(_, record)| record.clone()).collect())
        .collect();
    for (era, log) in eras.iter().enumerate() {
        let answers: Vec<&Answer> = ended.answers.iter().filter(|a| a.era == era).collect();
        let later = &eras[era + 1..];
        lost_to_the_spool.extend(era_violations(
            ended,
            log,
            later,
            (&answers, &mut spooled),
            &mut broken,
        ));
    }
    if lost_to_the_spool.len() as u64 > ended.quarantined {
        broken.push(format!(
            "spooled deliveries {lost_to_the_spool:?} are missing, and only {} spool entries were set aside as damaged",
            ended.quarantined
        ));
    }
    if ended.spooled_at_end > 0 {
        broken.push(format!(
            "the spool still held {} deliveries an hour after the faults ended",
            ended.spooled_at_end
        ));
    }
    if let Some(log) = ended.eras.last() {
        lookup_violations(ended, log, &mut broken);
    }
    for answer in &ended.answers {
        if answer.took > ANSWER_LIMIT {
            broken.push(format!(
                "{} answered after {} ms, past the providers' 10 s",
                answer.delivery,
                answer.took.as_millis()
            ));
        }
        if answer.outcome.is_err() && answer.last && answer.at > ended.quiet_from {
            broken.push(format!(
                "{}: its provider's last attempt, after the faults ended, was not taken: {:?}",
                answer.delivery, answer.outcome
            ));
        }
    }
    broken
}

/// What a lookup of each delivery answers at the end (the last life's
/// ledger) against the last broker's `log`: a record place it names holds
/// that delivery's own record, on the topic its outcome says, and a
/// delivery it says was published or dead-lettered names one. (What it
/// forgot, it says nothing of: a lost ledger is filled back only from the
/// records of the dedup window.)
fn lookup_violations(ended: &Ended, log: &[(RecordAt, OutgoingRecord)], broken: &mut Vec<String>) {
    let placed: std::collections::HashMap<&RecordAt, &OutgoingRecord> =
        log.iter().map(|(at, record)| (at, record)).collect();
    for (delivery, remembered) in &ended.remembered {
        let Remembered::Done { answered, .. } = remembered else {
            continue;
        };
        let Some(event) = ended.events.get(delivery) else {
            continue;
        };
        let topics = topics_of(event.provider);
        let topic = match answered.outcome {
            Recorded::Published => topics.entity(entity_type(event.provider)),
            Recorded::DeadLettered => topics.dead_letter(),
            Recorded::Stale | Recorded::Unchanged | Recorded::Unknown => {
                if answered.place.is_some() {
                    broken.push(format!(
                        "lookup: {delivery} answered {} names a record",
                        answered.outcome.as_str()
                    ));
                }
                continue;
            }
        };
        let Some(place) = &answered.place else {
            broken.push(format!(
                "lookup: {delivery} answered {} names no record",
                answered.outcome.as_str()
            ));
            continue;
        };
        let there = placed.get(place);
        if *place.topic != **topic
            || there.and_then(|record| delivery_of(record)).as_deref() != Some(delivery.as_str())
        {
            broken.push(format!(
                "lookup: {delivery} answered {} at {place}, which holds {:?}",
                answered.outcome.as_str(),
                there.and_then(|record| delivery_of(record))
            ));
        }
    }
}

/// Whether `record` is a valid spooled delivery the drainer set aside to
/// the dead-letter topic (`spool_unpublishable`, its body raw): what it
/// does with an entry whose topic stays refused while Kafka answers, which
/// in a world is a topic grown while posbridge was stopped and not
/// accepted yet. Named and kept for `posbridge replay`, not lost.
fn set_aside_from_the_spool(ended: &Ended, record: &OutgoingRecord) -> bool {
    ended.drawn.contains("topic grown while stopped")
        && record.headers.iter().any(|(name, value)| {
            *name == crate::services::pipeline::record::HEADER_REASON_CODE
                && value == crate::services::drain::SPOOL_UNPUBLISHABLE
        })
}

/// The guarantees over one broker's log and the answers given while it
/// was the one; how many deliveries answered `spooled` are missing from it
/// and from the `later` brokers' logs, which the spool drains into once
/// this one was replaced (a damaged spool entry may lose one). `spooled`
/// holds the deliveries answered `spooled` so far, in this era or before.
fn era_violations<'a>(
    ended: &'a Ended,
    log: &[OutgoingRecord],
    later: &[Vec<OutgoingRecord>],
    (answers, spooled): (&[&'a Answer], &mut BTreeSet<&'a str>),
    broken: &mut Vec<String>,
) -> BTreeSet<String> {
    // The event index of every record of each key, in log order.
    let mut by_key: BTreeMap<&str, Vec<(usize, &str)>> = BTreeMap::new();
    let mut copies: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    // Spooled deliveries the drainer set aside whole, raw, for `replay`.
    let mut set_aside: BTreeSet<&str> = BTreeSet::new();
    for (at, record) in log.iter().enumerate() {
        let Some(delivery) = delivery_of(record) else {
            broken.push(format!("record {at} carries no delivery id"));
            continue;
        };
        let Some((id, event)) = ended.events.get_key_value(delivery.as_str()) else {
            broken.push(format!("record {at} is of no event: {delivery}"));
            continue;
        };
        let topics = topics_of(event.provider);
        if record.topic == *topics.dead_letter() && set_aside_from_the_spool(ended, record) {
            // Not a copy of its state: each time a provider's retry of it
            // is spooled again while the topic is refused, the drainer sets
            // that entry aside too; `posbridge replay` publishes the first
            // and finds the others duplicates.
            set_aside.insert(id.as_str());
            continue;
        }
        copies.entry(id.as_str()).or_default().push(at);
        let holds_raw = record
            .payload
            .as_deref()
            .is_some_and(|payload| memchr::memmem::find(payload, &event.raw).is_some());
        if !holds_raw {
            broken.push(format!(
                "{delivery}'s record at {at} does not hold its body as it was sent"
            ));
        }
        if record.topic == *topics.dead_letter() || event.broken {
            if !event.broken || record.topic != *topics.dead_letter() {
                broken.push(format!(
                    "{delivery} (broken: {}) was written to {} at {at}",
                    event.broken, record.topic
                ));
            }
            continue;
        }
        if record.topic != *topics.entity(entity_type(event.provider)) || record.key != event.key {
            broken.push(format!(
                "{delivery} went to {} under {}",
                record.topic, record.key
            ));
        }
        by_key
            .entry(event.key.as_str())
            .or_default()
            .push((event.index, id.as_str()));
    }

    // No key's versions go back.
    for (key, indexes) in &by_key {
        for pair in indexes.windows(2) {
            if pair[1].0 < pair[0].0 {
                broken.push(format!(
                    "{key}: {} (event {}) written after {} (event {}): an older state after a newer one",
                    pair[1].1, pair[1].0, pair[0].1, pair[0].0
                ));
            }
        }
    }

    // At most one copy per delivery, one more per doubt.
    let allowed = |delivery: &str| 1 + ended.in_doubt.get(delivery).copied().unwrap_or(0) as usize;
    for (delivery, at) in &copies {
        if at.len() > allowed(delivery) {
            broken.push(format!(
                "{delivery} written {} times (at {at:?}), {} time(s) in doubt",
                at.len(),
                allowed(delivery) - 1
            ));
        }
    }

    // A state of `event`'s key at least as new in a later broker's log.
    let newer_later = |event: &super::world::Event| {
        !event.broken
            && later.iter().flatten().any(|record| {
                delivery_of(record)
                    .and_then(|id| ended.events.get(&id))
                    .is_some_and(|written| {
                        !written.broken && written.key == event.key && written.index >= event.index
                    })
            })
    };
    // A spooled delivery reached a later broker: its own record, or (the
    // drainer found a newer state there first) one at least as new.
    let drained_later = |delivery: &str| {
        newer_later(&ended.events[delivery])
            || later
                .iter()
                .flatten()
                .any(|record| delivery_of(record).as_deref() == Some(delivery))
    };
    let mut lost_to_the_spool = BTreeSet::new();
    let mut answered_2xx = BTreeSet::new();
    for answer in answers {
        let Ok(outcome) = answer.outcome else {
            continue;
        };
        if outcome == Outcome::Spooled {
            spooled.insert(answer.delivery.as_str());
        }
        let event = &ended.events[&answer.delivery];
        // Nothing of a delivery is written after it was answered 2xx the
        // first time; a spooled one, by the drainer, once (and once more
        // per doubt).
        if answered_2xx.insert(answer.delivery.as_str()) {
            let later: Vec<&usize> = copies
                .get(answer.delivery.as_str())
                .into_iter()
                .flatten()
                .filter(|at| **at >= answer.log_len)
                .collect();
            let waits_in_the_spool = outcome == Outcome::Spooled
                || (outcome == Outcome::Duplicate && spooled.contains(answer.delivery.as_str()));
            // A delivery that wrote nothing is not remembered by a ledger
            // filled again from the topics: a retry after a lost ledger is
            // decided again, and writes its state when the one it was
            // judged against never reached the topic (a state in doubt).
            let decided_again = matches!(outcome, Outcome::Stale | Outcome::Unchanged)
                && ended
                    .ledger_lost
                    .iter()
                    .any(|(era, len)| *era == answer.era && *len >= answer.log_len);
            let allowed = if waits_in_the_spool || decided_again {
                allowed(&answer.delivery)
            } else {
                0
            };
            if later.len() > allowed {
                broken.push(format!(
                    "{} written at {later:?}, after it was answered {}",
                    answer.delivery,
                    outcome.as_str()
                ));
            }
        }
        // What a 2xx promised is in the topic: the delivery's own record,
        // or (stale, unchanged, duplicate) a state of its key at least as new.
        let newest = by_key
            .get(event.key.as_str())
            .and_then(|indexes| indexes.iter().map(|(index, _)| *index).max());
        match outcome {
            _ if event.broken => {
                let written = copies.contains_key(answer.delivery.as_str());
                if !matches!(
                    outcome,
                    Outcome::DeadLettered | Outcome::Duplicate | Outcome::Spooled
                ) || (!written && !spooled.contains(answer.delivery.as_str()))
                {
                    broken.push(format!(
                        "{}, which cannot be normalized, answered {} and has no dead letter",
                        answer.delivery,
                        outcome.as_str(),
                    ));
                } else if !written && !drained_later(&answer.delivery) {
                    lost_to_the_spool.insert(answer.delivery.clone());
                }
            }
            Outcome::Published if !copies.contains_key(answer.delivery.as_str()) => {
                broken.push(format!(
                    "{} answered published, and its record is not in the topic",
                    answer.delivery
                ));
            }
            Outcome::DeadLettered => broken.push(format!(
                "{} answered dead_lettered: a valid event",
                answer.delivery
            )),
            Outcome::Spooled if !ended.spools || event.provider != ProviderKind::ReceiptRoller => {
                broken.push(format!(
                    "{} answered spooled, from a source that does not spool",
                    answer.delivery
                ));
            }
            _ if newest.is_none_or(|newest| newest < event.index) => {
                // A spooled delivery (and a duplicate of it, answered while
                // it waits in the spool) is written by the drainer, into
                // whichever broker is there by then.
                if spooled.contains(answer.delivery.as_str()) {
                    if !drained_later(&answer.delivery)
                        && !set_aside.contains(answer.delivery.as_str())
                    {
                        lost_to_the_spool.insert(answer.delivery.clone());
                    }
                } else if newer_later(event) {
                    // Judged against a newer state in doubt (sent, never
                    // acknowledged, not in this log): its own retry wrote
                    // it into the broker that replaced this one.
                } else {
                    broken.push(format!(
                        "{} (event {} of {}) answered {}, and the topic's newest state of its key is {newest:?}",
                        answer.delivery,
                        event.index,
                        event.key,
                        outcome.as_str()
                    ));
                }
            }
            _ => {}
        }
    }
    // The last record of each key is its newest state.
    for (key, indexes) in &by_key {
        let newest = indexes.iter().map(|(index, _)| *index).max();
        if indexes.last().map(|(index, _)| *index) != newest {
            broken.push(format!("{key}: the last record is not the newest state"));
        }
    }
    lost_to_the_spool
}
