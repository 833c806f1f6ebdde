//! The guarantees, checked after a world ended, from the broker's log and
//! the providers' record of answers.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::world::{Ended, delivery_of, entity_type};
use crate::adapters::publish::Topics;
use crate::config::KafkaConfig;
use crate::services::pipeline::Outcome;

/// The providers give up on an answer after this long.
const ANSWER_LIMIT: Duration = Duration::from_secs(10);

/// Every guarantee the world broke, in words.
pub(super) fn violations(ended: &Ended) -> Vec<String> {
    let topics = Topics::new(&KafkaConfig::default());
    let mut broken = Vec::new();
    // The event index of every record of each key, in log order.
    let mut by_key: BTreeMap<&str, Vec<(usize, &str)>> = BTreeMap::new();
    let mut copies: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (at, record) in ended.log.iter().enumerate() {
        if record.topic == topics.dead_letter() {
            broken.push(format!(
                "a dead letter was written at {at} for a valid event: {:?}",
                delivery_of(record)
            ));
            continue;
        }
        let Some(delivery) = delivery_of(record) else {
            broken.push(format!("record {at} carries no delivery id"));
            continue;
        };
        let Some((id, event)) = ended.events.get_key_value(delivery.as_str()) else {
            broken.push(format!("record {at} is of no event: {delivery}"));
            continue;
        };
        if record.topic != topics.entity(entity_type(event.provider)) || record.key != event.key {
            broken.push(format!(
                "{delivery} went to {} under {}",
                record.topic, record.key
            ));
        }
        by_key
            .entry(event.key.as_str())
            .or_default()
            .push((event.index, id.as_str()));
        copies.entry(id.as_str()).or_default().push(at);
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

    // At most one copy per delivery, one more per acknowledgement lost.
    for (delivery, at) in &copies {
        let allowed = 1 + ended.lost_acks.get(*delivery).copied().unwrap_or(0) as usize;
        if at.len() > allowed {
            broken.push(format!(
                "{delivery} written {} times (at {at:?}), {} acknowledgement(s) lost",
                at.len(),
                allowed - 1
            ));
        }
    }

    if ended.spooled_at_end > 0 {
        broken.push(format!(
            "the spool still held {} deliveries an hour after the faults ended",
            ended.spooled_at_end
        ));
    }
    let mut answered_2xx = BTreeSet::new();
    for answer in &ended.answers {
        if answer.took > ANSWER_LIMIT {
            broken.push(format!(
                "{} answered after {} ms, past the providers' 10 s",
                answer.delivery,
                answer.took.as_millis()
            ));
        }
        let Ok(outcome) = answer.outcome else {
            if answer.last && answer.at > ended.faults_end + Duration::from_secs(5) {
                broken.push(format!(
                    "{}: its provider's last attempt, after the faults ended, was not taken: {:?}",
                    answer.delivery, answer.outcome
                ));
            }
            continue;
        };
        let event = &ended.events[&answer.delivery];
        // Nothing of a delivery is written after it was answered 2xx the
        // first time; a spooled one, by the drainer, once (and once more
        // per acknowledgement lost).
        if answered_2xx.insert(answer.delivery.as_str()) {
            let later: Vec<&usize> = copies
                .get(answer.delivery.as_str())
                .into_iter()
                .flatten()
                .filter(|at| **at >= answer.log_len)
                .collect();
            let allowed = if outcome == Outcome::Spooled {
                1 + ended
                    .lost_acks
                    .get(answer.delivery.as_str())
                    .copied()
                    .unwrap_or(0) as usize
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
            Outcome::Spooled
                if !ended.spools || event.provider != crate::domain::event::ProviderKind::ReceiptRoller =>
            {
                broken.push(format!(
                    "{} answered spooled, from a source that does not spool",
                    answer.delivery
                ));
            }
            _ if newest.is_none_or(|newest| newest < event.index) => broken.push(format!(
                "{} (event {} of {}) answered {}, and the topic's newest state of its key is {newest:?}",
                answer.delivery,
                event.index,
                event.key,
                outcome.as_str()
            )),
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
    broken
}
