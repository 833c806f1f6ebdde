//! The providers' APIs as the reconciler reads them, and the reconciler's
//! runs: each run reads every entity's newest state the provider held at
//! that moment and publishes it through the real pipeline, as
//! `Reconciler::publish` does (the same `reconciled` function builds it).
//!
//! The provider holds an event from the moment it happened, and it sends
//! its webhook at that moment or later: so event `i` of an entity happened
//! no later than the first attempt of `i` or of any later event of it. A
//! record read at a moment carries the newest state that happened by then,
//! and its version (the fetch time) falls between that event's time and
//! the next one's, as a real fetch's does. What cannot be normalized never
//! reaches the API here: a fetch returns the newest state that can.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use time::OffsetDateTime;

use super::clock::Clock;
use super::providers::{entity_type, event_time, source};
use super::world::{Event, Shared};
use crate::domain::event::ProviderKind;
use crate::services::pipeline::Pipeline;
use crate::services::reconcile::reconciled;

/// One entity as its provider's API shows it over time.
struct Entity {
    provider: ProviderKind,
    key: String,
    /// Its states that can be normalized, oldest first: index, when it
    /// happened, the API's record (the webhook's `data`).
    states: Vec<(usize, Duration, Value)>,
}

/// Every entity of the world, as the API shows it.
pub(super) struct FakeApi(Vec<Entity>);

impl FakeApi {
    /// The API over `events` (delivery id → event and webhook body), whose
    /// first attempts come at `firsts`.
    pub(super) fn new(
        events: &BTreeMap<String, (Event, Vec<u8>)>,
        firsts: &BTreeMap<String, Duration>,
    ) -> FakeApi {
        // Each key's events: delivery id, event, webhook body.
        type Events<'a> = Vec<(&'a str, &'a Event, &'a [u8])>;
        let mut by_key: BTreeMap<&str, Events> = BTreeMap::new();
        for (delivery, (event, body)) in events {
            by_key
                .entry(&event.key)
                .or_default()
                .push((delivery, event, body));
        }
        let entities = by_key
            .into_values()
            .map(|mut events| {
                events.sort_by_key(|(_, event, _)| event.index);
                let mut happened = Duration::MAX;
                let mut states = Vec::new();
                for (delivery, event, body) in events.iter().rev() {
                    happened = happened.min(firsts[*delivery]);
                    if !event.broken {
                        let body: Value = serde_json::from_slice(body).expect("a JSON body");
                        states.push((event.index, happened, body["data"].clone()));
                    }
                }
                states.reverse();
                let (_, event, _) = events[0];
                Entity {
                    provider: event.provider,
                    key: event.key.clone(),
                    states,
                }
            })
            .collect();
        FakeApi(entities)
    }

    /// What a fetch at world time `at` reads: each entity's newest state
    /// by then (provider, key, index, record) and the fetch's time.
    fn read(&self, at: Duration) -> Vec<(ProviderKind, &str, usize, &Value, OffsetDateTime)> {
        self.0
            .iter()
            .filter_map(|entity| {
                let (index, _, data) = entity
                    .states
                    .iter()
                    .rev()
                    .find(|(_, happened, _)| *happened <= at)?;
                // After its event, before the next one (a minute later),
                // and later at each later fetch, as a real fetch's time is:
                // a record in doubt at one fetch's version is then
                // replaced by the next fetch's.
                let at_ms = at.as_secs_f64() * 1000.0;
                let into = Duration::from_secs(1)
                    + Duration::from_secs_f64(58.0 * at_ms / (at_ms + 600_000.0));
                let fetched_at = event_time(*index) + into;
                Some((
                    entity.provider,
                    entity.key.as_str(),
                    *index,
                    data,
                    fetched_at,
                ))
            })
            .collect()
    }
}

/// Reconciles every `every` while this life lasts: each run reads the API
/// and publishes each record through `pipeline`, one after another.
pub(super) async fn reconcile(
    pipeline: Pipeline,
    api: Arc<FakeApi>,
    every: Duration,
    shared: Shared,
    clock: Clock,
) {
    loop {
        tokio::time::sleep(every).await;
        let at = clock.now();
        for (provider, key, index, data, fetched_at) in api.read(at) {
            let normalized = reconciled(&source(provider), entity_type(provider), data, fetched_at)
                .unwrap_or_else(|refused| {
                    panic!("the API's record of {key} normalizes: {}", refused.reason)
                });
            let id = normalized.event.event_id.clone();
            shared.reconciled(
                id.to_string(),
                Event {
                    key: key.to_owned(),
                    index,
                    provider,
                    broken: false,
                    raw: data.to_string().into_bytes(),
                },
            );
            let outcome = pipeline.apply(normalized).await;
            shared.step(
                clock.now(),
                format!(
                    "reconciler: {id} (event {index}) read at {:.3}s → {}",
                    at.as_secs_f64(),
                    match outcome {
                        Ok(outcome) => outcome.as_str().to_owned(),
                        Err(error) => format!("failed ({error})"),
                    }
                ),
            );
        }
    }
}
