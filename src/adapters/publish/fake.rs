//! A fake of the broker, in memory, for the unit tests: it takes records
//! and acknowledges them, or fails, delays or holds them on command, and
//! says what it took. It stands in for what the pipeline decides given an
//! answer of Kafka's; what Kafka itself does (replication, idempotence,
//! compaction, its limits and refusals as configured) stays with the
//! integration tests on the real brokers.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use tokio::sync::watch;

use super::error::classify;
use super::watch::{Baseline, Observed};
use super::{BrokerHealth, OutgoingRecord, PublishError};
use crate::domain::record_at::RecordAt;
use crate::services::lookup::partition_of;

/// What the broker does with one send, when a plan decides
/// ([`FakeBroker::plan`]): a simulation's seeded schedule of faults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Takes the record and acknowledges it.
    Take,
    /// Takes the record into the log at once and acknowledges it after
    /// this long: sends after it may be acknowledged first, at higher offsets.
    Late(Duration),
    /// Refuses it with librdkafka's code (sorted as the real producer sorts it).
    Fail(RDKafkaErrorCode),
    /// Takes the record, and the acknowledgement is lost: the producer
    /// reports a timeout for a record the log holds (the in-doubt case).
    LoseAck,
}

/// Decides each send's [`Fault`].
type Plan = Box<dyn FnMut(&OutgoingRecord) -> Fault + Send>;

/// The fake broker. A topic has one partition unless it is given more
/// ([`FakeBroker::partitions`]); a record goes to the partition its key's
/// murmur2 names, as the producer's `murmur2_random` puts it.
pub struct FakeBroker {
    health: BrokerHealth,
    state: Mutex<State>,
    /// Sends that reached the broker (failed ones included).
    arrived: watch::Sender<usize>,
    /// While `true`, sends that reached the broker wait for their answer.
    holding: watch::Sender<bool>,
    /// Each send's fault, when a plan decides them.
    plan: Mutex<Option<Plan>>,
    /// The partitions posbridge keeps for each topic, as the `Publisher`
    /// keeps them ([`FakeBroker::start_up`]).
    baseline: Baseline,
}

impl std::fmt::Debug for FakeBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeBroker")
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Default)]
struct State {
    /// What was acknowledged, in order, with where it lies.
    taken: Vec<(RecordAt, OutgoingRecord)>,
    /// Sends that reached the broker and are not answered yet, by arrival,
    /// with where the log took each it took already.
    in_flight: BTreeMap<u64, (OutgoingRecord, Option<RecordAt>)>,
    /// Sends that reached the broker, ever.
    arrivals: u64,
    /// How many times the broker was replaced by an empty one.
    generation: u64,
    /// Each partition's next offset.
    next_offset: BTreeMap<(String, i32), i64>,
    /// Topics' partition counts, where not one.
    partitions: BTreeMap<String, usize>,
    /// How the next sends fail, one each, front first.
    next_failures: VecDeque<RDKafkaErrorCode>,
    /// How every send fails, after `next_failures`.
    every_failure: Option<RDKafkaErrorCode>,
    /// How long each send takes to be answered.
    delay: Duration,
    /// Topics' `max.message.bytes`.
    limits: BTreeMap<String, usize>,
}

impl Default for FakeBroker {
    fn default() -> FakeBroker {
        FakeBroker {
            health: BrokerHealth::default(),
            state: Mutex::default(),
            arrived: watch::Sender::new(0),
            holding: watch::Sender::new(false),
            plan: Mutex::default(),
            baseline: Baseline::default(),
        }
    }
}

impl FakeBroker {
    /// The next send fails with librdkafka's `code`, sorted as the real
    /// producer sorts it (retryable, or refused for good).
    pub fn fail_next(&self, code: RDKafkaErrorCode) {
        self.state().next_failures.push_back(code);
    }

    /// Every send fails with `code` until [`FakeBroker::recover`].
    pub fn fail_every(&self, code: RDKafkaErrorCode) {
        self.state().every_failure = Some(code);
    }

    /// No broker answers: sends fail at once, as the real producer's do once
    /// it knows, until [`FakeBroker::recover`].
    pub fn go_down(&self) {
        self.health.mark_down("the fake broker is down");
    }

    /// Sends succeed again, and the broker answers.
    pub fn recover(&self) {
        self.state().every_failure = None;
        self.health.mark_up();
    }

    /// Each send is answered `delay` after it reached the broker.
    pub fn delay(&self, delay: Duration) {
        self.state().delay = delay;
    }

    /// Sends that reach the broker wait for their answer until
    /// [`FakeBroker::release`]: a record in flight, on command.
    pub fn hold(&self) {
        self.holding.send_replace(true);
    }

    /// Answers the sends held, and those after.
    pub fn release(&self) {
        self.holding.send_replace(false);
    }

    /// `topic` takes records of at most `bytes` (key, value and headers).
    pub fn limit(&self, topic: &str, bytes: usize) {
        self.state().limits.insert(topic.to_owned(), bytes);
    }

    /// `topic` has `count` partitions from now on (grown, say, while
    /// posbridge was stopped: its keys may then map to other partitions).
    pub fn partitions(&self, topic: &str, count: usize) {
        self.state()
            .partitions
            .insert(topic.to_owned(), count.max(1));
    }

    /// How many partitions `topic` has.
    pub fn partitions_of(&self, topic: &str) -> usize {
        self.state().partitions_of(topic)
    }

    /// What a starting posbridge's `Publisher` does with `topics`, the fake
    /// standing in for it and the cluster: the counts `kept` (the ledger's
    /// checkpoint's) kept, the others learnt as they are now, and a topic
    /// whose count differs from the one kept refused from now on (as
    /// `keep_partitions` then `check_topic_settings` do, with the same
    /// baseline and health).
    pub fn start_up(&self, kept: &BTreeMap<String, usize>, topics: &[String]) {
        self.baseline.keep(kept);
        let observed: BTreeMap<String, Observed> = topics
            .iter()
            .map(|topic| {
                let seen = Observed {
                    partitions: Some(self.partitions_of(topic)),
                    ..Observed::default()
                };
                (topic.clone(), seen)
            })
            .collect();
        self.baseline.learn_and_judge(&observed, &self.health);
    }

    /// As [`super::Publisher::kept_partitions`].
    pub fn kept_partitions(&self) -> BTreeMap<String, usize> {
        self.baseline.all()
    }

    /// As [`super::Publisher::keep_partitions_anew`].
    pub fn keep_partitions_anew(&self, now: &BTreeMap<String, usize>) {
        self.baseline.keep_anew(now, &self.health);
    }

    /// Each send from now on does what `plan` decides for it (after the
    /// failures asked for one by one, and while the broker is up).
    pub fn plan(&self, plan: impl FnMut(&OutgoingRecord) -> Fault + Send + 'static) {
        *self.plan.lock().unwrap_or_else(PoisonError::into_inner) = Some(Box::new(plan));
    }

    /// Waits until `count` sends in all have reached the broker.
    pub async fn arrivals(&self, count: usize) {
        let mut arrived = self.arrived.subscribe();
        // The sender lives as long as `self`.
        let _ = arrived.wait_for(|arrived| *arrived >= count).await;
    }

    /// Every record acknowledged, in order, with where it lies.
    pub fn placed(&self) -> Vec<(RecordAt, OutgoingRecord)> {
        self.state().taken.clone()
    }

    /// Every record acknowledged, in order.
    pub fn taken(&self) -> Vec<OutgoingRecord> {
        self.state()
            .taken
            .iter()
            .map(|(_, record)| record.clone())
            .collect()
    }

    /// How many records the log holds.
    pub fn taken_count(&self) -> usize {
        self.state().taken.len()
    }

    /// The records of `topic`'s `partition` at `offsets`, with their
    /// offsets, in order.
    pub fn log_of(
        &self,
        topic: &str,
        partition: i32,
        offsets: std::ops::Range<i64>,
    ) -> Vec<(i64, OutgoingRecord)> {
        self.state()
            .taken
            .iter()
            .filter(|(at, _)| {
                *at.topic == *topic && at.partition == partition && offsets.contains(&at.offset)
            })
            .map(|(at, record)| (at.offset, record.clone()))
            .collect()
    }

    /// The offset `topic`'s `partition`'s next record gets: its end.
    pub fn end_of(&self, topic: &str, partition: i32) -> i64 {
        self.state()
            .next_offset
            .get(&(topic.to_owned(), partition))
            .copied()
            .unwrap_or(0)
    }

    /// The cluster's id and each topic's, as `DescribeTopics` gives them:
    /// new ones once the broker was replaced.
    pub fn ids(&self) -> (String, u64) {
        let generation = self.state().generation;
        (format!("fake-cluster-{generation}"), generation)
    }

    /// The process that sent to it crashed: of the sends not answered yet,
    /// those the log took already and those `reached` says it takes now
    /// are in it, the others lost; none is answered (the process that
    /// would hear it is gone). The sends the log holds.
    pub fn crash(&self, mut reached: impl FnMut(&OutgoingRecord) -> bool) -> Vec<OutgoingRecord> {
        let mut state = self.state();
        let in_flight = std::mem::take(&mut state.in_flight);
        let mut logged = Vec::new();
        for (record, taken) in in_flight.into_values() {
            if taken.is_some() || reached(&record) {
                if taken.is_none() {
                    state.append(&record);
                }
                logged.push(record);
            }
        }
        logged
    }

    /// An empty broker at the same address: its log gone, its cluster and
    /// topics new ones (another cluster id, other topic ids), made with
    /// the partitions they had.
    pub fn replace(&self) {
        let mut state = self.state();
        state.taken.clear();
        state.next_offset.clear();
        state.in_flight.clear();
        state.generation += 1;
    }

    /// The records acknowledged on `topic`, in order.
    pub fn taken_on(&self, topic: &str) -> Vec<OutgoingRecord> {
        self.state()
            .taken
            .iter()
            .filter(|(at, _)| *at.topic == *topic)
            .map(|(_, record)| record.clone())
            .collect()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The answer to `record` once it is due, as `fault` says.
    fn answer(
        &self,
        arrival: u64,
        record: &OutgoingRecord,
        fault: Fault,
    ) -> Result<RecordAt, PublishError> {
        let mut state = self.state();
        if let Some((_, Some(delivered))) = state.in_flight.remove(&arrival) {
            return Ok(delivered);
        }
        let failure = state.next_failures.pop_front().or(state.every_failure);
        let too_large = state
            .limits
            .get(&*record.topic)
            .is_some_and(|limit| size(record) > *limit);
        let failure = failure
            .or(too_large.then_some(RDKafkaErrorCode::MessageSizeTooLarge))
            .or(match fault {
                Fault::Fail(code) => Some(code),
                _ => None,
            });
        if let Some(code) = failure {
            return Err(classify(KafkaError::MessageProduction(code)));
        }
        let delivered = state.append(record);
        if fault == Fault::LoseAck {
            return Err(classify(KafkaError::MessageProduction(
                RDKafkaErrorCode::MessageTimedOut,
            )));
        }
        Ok(delivered)
    }
}

impl State {
    fn partitions_of(&self, topic: &str) -> usize {
        self.partitions.get(topic).copied().unwrap_or(1)
    }

    /// `record` at the end of the partition of its topic its key maps to.
    fn append(&mut self, record: &OutgoingRecord) -> RecordAt {
        let partition = partition_of(record.key.as_bytes(), self.partitions_of(&record.topic));
        let offset = self
            .next_offset
            .entry((record.topic.to_string(), partition))
            .or_default();
        let delivered = RecordAt {
            topic: record.topic.clone(),
            partition,
            offset: *offset,
        };
        *offset += 1;
        self.taken.push((delivered.clone(), record.clone()));
        delivered
    }
}

/// What a record weighs against a topic's limit.
fn size(record: &OutgoingRecord) -> usize {
    let headers: usize = record
        .headers
        .iter()
        .map(|(name, value)| name.len() + value.len())
        .sum();
    record.key.len() + record.payload.as_ref().map_or(0, Vec::len) + headers
}

/// What [`super::Producer`] asks of the fake.
impl FakeBroker {
    /// As [`super::Publisher::send`], by the plan.
    pub async fn send(&self, record: &OutgoingRecord) -> Result<RecordAt, PublishError> {
        if !self.health.is_up() {
            return Err(PublishError::BrokerDown);
        }
        if let Some(change) = self.health.changed(&record.topic) {
            return Err(PublishError::TopicChanged {
                topic: record.topic.to_string(),
                change,
            });
        }
        self.arrived.send_modify(|arrived| *arrived += 1);
        let fault = self
            .plan
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_mut()
            .map_or(Fault::Take, |plan| plan(record));
        let (mut delay, arrival) = {
            let mut state = self.state();
            state.arrivals += 1;
            let arrival = state.arrivals;
            let taken = matches!(fault, Fault::Late(_)).then(|| state.append(record));
            state.in_flight.insert(arrival, (record.clone(), taken));
            (state.delay, arrival)
        };
        if let Fault::Late(late) = fault {
            delay += late;
        }
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let mut holding = self.holding.subscribe();
        // The sender lives as long as `self`.
        let _ = holding.wait_for(|holding| !holding).await;
        self.answer(arrival, record, fault)
    }

    /// The limit set for `topic`.
    pub fn topic_limit(&self, topic: &str) -> Option<usize> {
        self.state().limits.get(topic).copied()
    }

    /// Whether it is up, as the tests set it.
    pub fn health(&self) -> &BrokerHealth {
        &self.health
    }
}
