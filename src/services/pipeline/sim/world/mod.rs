//! One seed's world: the entities and their events, the providers that
//! deliver them by their rules, the broker's faults, posbridge's crashes
//! and what each leaves of its files, and what happened.
//!
//! Each life of posbridge runs on a runtime of its own: a crash ends the
//! runtime, and with it every task and all the process's memory, at once;
//! what outlives it is what outlives a real crash (the broker's log, the
//! files as they were on disk, the providers' retries).
//!
//! `faults.rs` holds the broker's answer to each send, `schedule.rs` the
//! events and the providers' attempts.

mod faults;
mod schedule;

use faults::sent_key;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tokio::time::Instant;

use super::api::{FakeApi, reconcile};
use super::clock::Clock;
use super::disk::{AIM_WITHIN, Armed, End, SimDisk};
use super::disk_plan::OnDisk;
pub(super) use super::ended::{Answer, Ended, Event};
use super::hooks::pause_commits;
use super::partitions::{AtStart, Grown};
use super::plan::Plan;
use super::process::{LedgerFate, Process, SpoolFate, after_crash};
use super::providers::{Door, Senders, cut, deliveries, send, unfinished};
pub(super) use super::shared::Shared;
use crate::adapters::ledger::Remembered;
use crate::adapters::publish::{FakeBroker, OutgoingRecord, TopicChange};
use crate::domain::event::DeliveryKey;
use crate::services::pipeline::HEADER_DELIVERY_ID;

/// Ample for one reconciler run over a world's few entities, faults over.
const RUN_TAKES: Duration = Duration::from_secs(10);

/// How long a clean stop refuses requests before it ends (the deliveries
/// in flight end meanwhile).
const STOP_TAKES: Duration = Duration::from_secs(10);

/// How long after the last start the rebuild may take before every
/// delivery must be taken again.
const START_SLACK: Duration = Duration::from_secs(30);

/// The world of one plan.
pub(super) struct World {
    plan: Plan,
    broker: Arc<FakeBroker>,
    shared: Shared,
    clock: Clock,
    /// The disk under the ledger's and the spool's files.
    disk: SimDisk,
}

impl World {
    /// The world `plan` says.
    pub(super) fn new(plan: Plan) -> World {
        let broker = Arc::new(FakeBroker::default());
        let shared = Shared::new(broker.clone());
        let clock = Clock::new();
        let disk = SimDisk::new(
            StdRng::seed_from_u64(plan.disk_seed),
            (clock.clone(), shared.clone()),
            plan.disk.sector,
            plan.disk.failing,
        );
        World {
            plan,
            shared,
            broker,
            clock,
            disk,
        }
    }

    /// Plays the schedule to its end, one life of posbridge per runtime, its
    /// files in `dir`: every provider's attempts, then the spool drained.
    pub(super) fn run(mut self, dir: &Path) -> Ended {
        let (from, to) = self.plan.faults;
        self.shared.step(
            Duration::ZERO,
            format!("the plan of seed {}", self.plan.seed),
        );
        self.shared.step(
            Duration::ZERO,
            format!(
                "broker {} from {:.3}s to {:.3}s",
                if self.plan.outage { "outage" } else { "faults" },
                from.as_secs_f64(),
                to.as_secs_f64()
            ),
        );
        if self.plan.spools {
            self.shared.step(Duration::ZERO, "ReceiptRoller spools");
            self.shared.drew("spooling source");
        }
        if self.plan.outage {
            self.shared.drew("broker outage");
        }
        for crash in &self.plan.crashes {
            self.shared
                .drew(if crash.clean { "clean stop" } else { "crash" });
            if crash.broker_replaced {
                self.shared.drew("broker replaced");
            }
            match crash.ledger {
                LedgerFate::Lost => self.shared.drew("ledger lost"),
                LedgerFate::Damaged => self.shared.drew("ledger damaged"),
                LedgerFate::Kept => {}
            }
            if crash.spool == SpoolFate::Damaged {
                self.shared.drew("spool damaged");
            }
        }
        self.shared.step(
            Duration::ZERO,
            format!(
                "the ledger checkpoints every {:?}",
                self.plan.checkpoint_every
            ),
        );
        self.plan.disk.announce(&self.shared);
        self.plan.partitions.make(&self.broker, &self.shared);
        self.plan_faults();
        let events = self.events();
        let (senders, firsts) = self.senders(&events);
        let api = self.plan.reconcile_every.map(|every| {
            self.shared.drew("reconciler");
            self.shared.step(
                Duration::ZERO,
                format!("the reconciler runs every {every:?}"),
            );
            (Arc::new(FakeApi::new(&events, &firsts)), every)
        });
        let mut quarantined = 0;
        let mut ledger_lost = Vec::new();
        let mut spooled_at_end = 0;
        let mut remembered = BTreeMap::new();
        let mut eras = Vec::new();
        let mut quiet_from = self.plan.faults.1;
        let mut life_dir = dir.join("life-0");
        std::fs::create_dir_all(&life_dir).expect("a life's directory");
        let mut begins = (Duration::ZERO, Duration::ZERO);
        let grown = self.plan.partitions.grown.clone();
        // The log's length when the topic grew.
        let mut grew_at = 0;
        for life in 0..=self.plan.crashes.len() {
            let meets = grown
                .as_ref()
                .and_then(|grown| Some((grown.at_start(life)?, grown)));
            let crash = self.plan.crashes.get(life).copied();
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .start_paused(true)
                .build()
                .expect("a current-thread runtime builds");
            let mut rng = StdRng::seed_from_u64(self.plan.lives[life]);
            let on_disk = self.plan.disk.crashes.get(life).copied();
            let lived = runtime.block_on(self.live(
                &life_dir,
                begins,
                crash.zip(on_disk).map(|(c, d)| (c.at, c.clean, d)),
                (&senders, meets),
                api.clone(),
                (life, &mut rng),
            ));
            if let Some((AtStart::Refused, grown)) = meets {
                self.nothing_written_to(grown, grew_at);
            }
            quarantined += lived.quarantined;
            let Some(crash) = crash else {
                spooled_at_end = lived.spooled;
                remembered = lived.remembered;
                break;
            };
            let ended = lived.ended;
            if crash.clean {
                // Its files closed as a stopping process closes them.
                drop(runtime);
            }
            // What the disk keeps of what was not synced; every handle of
            // this life dies (an unclean one's runtime is dropped below).
            let end = if crash.clean {
                End::Clean
            } else {
                End::Crash {
                    machine: on_disk.is_some_and(|d| d.machine),
                }
            };
            self.disk.end_life(end, ended);
            if crash.ledger != LedgerFate::Kept {
                ledger_lost.push((self.shared.record().era, self.broker.taken_count()));
            }
            let next_dir = dir.join(format!("life-{}", life + 1));
            for said in after_crash(
                &life_dir,
                &next_dir,
                (crash.ledger, crash.spool),
                &lived.spooled_ids,
                &mut rng,
            ) {
                self.shared.step(ended, said);
            }
            if let Some(grown) = grown.as_ref().filter(|grown| grown.after == life) {
                self.broker.partitions(&grown.topic, grown.to);
                grew_at = self.broker.taken_count();
                self.shared.step(
                    ended,
                    format!(
                        "{} grows from {} to {} partitions",
                        grown.topic, grown.from, grown.to
                    ),
                );
            }
            if crash.broker_replaced {
                eras.push(self.broker.placed());
                self.broker.replace();
                self.shared.record().era += 1;
                self.shared
                    .step(ended, "the broker is replaced by an empty one");
            }
            life_dir = next_dir;
            begins = (ended, crash.down);
            quiet_from = quiet_from.max(ended + crash.down + START_SLACK);
        }
        pause_commits(None);
        eras.push(self.broker.placed());
        let record = std::mem::take(&mut *self.shared.record());
        let mut kept = self.plan;
        kept.broker.answers = record.replies;
        kept.broker.cut_taken = record.cut_taken;
        Ended {
            spools: kept.spools,
            kept,
            events: events
                .into_iter()
                .map(|(id, (event, _))| (id, event))
                .chain(record.reconciled)
                .collect(),
            answers: record.answers,
            eras,
            in_doubt: record.in_doubt,
            quiet_from,
            spooled_at_end,
            remembered,
            quarantined,
            internal: record.internal,
            steps: record.steps,
            drawn: record.drawn,
            ledger_lost,
        }
    }

    /// One life: from world time `begins.0`, posbridge down for `begins.1`,
    /// then up until it crashes (or stops cleanly) at `crash` (or, at the
    /// end, until every provider is done and the spool drained). A crash
    /// ends the life's runtime when this returns, and every task and all
    /// memory with it. A crash aimed at a store's op, or whose time falls
    /// in one, ends it when it lands there.
    async fn live(
        &self,
        dir: &Path,
        (at, down): (Duration, Duration),
        crash: Option<(Duration, bool, OnDisk)>,
        (senders, grown): (&Senders, Option<(AtStart, &Grown)>),
        api: Option<(Arc<FakeApi>, Duration)>,
        (life, rng): (usize, &mut StdRng),
    ) -> Lived {
        self.clock.begin_life(at);
        // One commit in five waits up to 300 ms after its acknowledgement.
        let mut pauses = StdRng::seed_from_u64(rng.random());
        pause_commits(Some(Box::new(move || {
            if pauses.random_bool(0.2) {
                Duration::from_millis(pauses.random_range(1..300))
            } else {
                Duration::ZERO
            }
        })));
        let door: Door = Arc::default();
        let providers: Vec<_> = unfinished(senders)
            .into_iter()
            .map(|index| {
                tokio::spawn(send(
                    index,
                    senders.clone(),
                    door.clone(),
                    self.shared.clone(),
                    self.clock.clone(),
                ))
            })
            .collect();
        tokio::time::sleep(down).await;
        let process = Process::start(
            (dir, self.disk.store_disk(), self.plan.disk.spool_room),
            (
                self.broker.clone(),
                grown
                    .filter(|(at, _)| *at == AtStart::Accepted)
                    .map(|(_, grown)| grown.topic.as_str()),
            ),
            self.plan.spools,
            self.checkpoints_every(crash.is_some()),
            {
                let (shared, clock) = (self.shared.clone(), self.clock.clone());
                Arc::new(move |broken| {
                    let broken = format!("t={:.3}s {broken}", clock.now().as_secs_f64());
                    let mut record = shared.record();
                    record.steps.push(broken.clone());
                    record.internal.push(broken);
                })
            },
            self.clock.ledgers(),
        )
        .await;
        self.shared.step(self.clock.now(), "posbridge starts");
        if let Some((at, grown)) = grown {
            self.grown_topic_at_start(at, grown);
        }
        self.disk.serve(crash.and_then(|(at, clean, on_disk)| {
            (!clean).then_some(Armed {
                at,
                aimed: on_disk.aimed,
            })
        }));
        *door.lock().unwrap_or_else(PoisonError::into_inner) = Some(process.pipeline.clone());
        let reconciles = api.as_ref().map(|(_, every)| *every);
        if let Some((api, every)) = api {
            tokio::spawn(reconcile(
                process.pipeline.clone(),
                api,
                every,
                self.shared.clone(),
                self.clock.clone(),
            ));
        }
        if let Some((crash, clean, on_disk)) = crash {
            if clean {
                let closing = crash.saturating_sub(STOP_TAKES);
                tokio::time::sleep_until(self.clock.instant_at(closing)).await;
                self.shared
                    .step(self.clock.now(), "posbridge stops taking requests");
                *door.lock().unwrap_or_else(PoisonError::into_inner) = None;
            }
            let due = crash + on_disk.aimed.map_or(Duration::ZERO, |_| AIM_WITHIN);
            tokio::select! {
                () = tokio::time::sleep_until(self.clock.instant_at(due)) => {}
                () = self.disk.died() => {}
            }
            let now = self.clock.now();
            if clean {
                process.stop();
                // Its outcome is seen by the next start, which reads on from
                // what is durable whatever it is.
                let _ = process.ledger.fill().persist().await;
                self.disk.rest();
                self.shared.step(now, "posbridge stopped");
            } else {
                self.shared.step(now, "posbridge crashes");
            }
            for record in self
                .broker
                .crash(|record| self.cut_taken(life, record, rng))
            {
                let delivery = delivery_of(&record).unwrap_or_default();
                self.shared.step(
                    now,
                    format!("the log took {delivery}, whose send the crash cut"),
                );
                self.shared.in_doubt(delivery);
            }
            cut(senders, &self.shared, now);
            return Lived {
                ended: now,
                remembered: BTreeMap::new(),
                quarantined: process.spool.stats().quarantined,
                spooled: 0,
                spooled_ids: process
                    .spool
                    .oldest(usize::MAX)
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(_, spooled)| spooled.delivery_id)
                    .collect(),
            };
        }
        for provider in providers {
            provider.await.expect("a provider's task does not panic");
        }
        // Records still in the producer when their answer was cut are
        // committed by their own tasks, and the drainer empties the spool
        // once the faults ended: let them end.
        // A reconciled record left in doubt (sent, never acknowledged) is
        // replaced by the reconciler's next run, as webhooks answered
        // `stale` against it were promised: let one whole run follow the
        // faults and this start.
        if let Some(every) = reconciles {
            let quiet = self.plan.faults.1.max(at + down);
            tokio::time::sleep_until(self.clock.instant_at(quiet) + every + RUN_TAKES).await;
        }
        let deadline = self.clock.instant_at(self.plan.faults.1) + Duration::from_secs(3600);
        loop {
            tokio::time::sleep(Duration::from_secs(60)).await;
            if process.spool.stats().entries == 0 || Instant::now() > deadline {
                break;
            }
        }
        process.stop();
        let mut remembered = BTreeMap::new();
        for (provider, id) in deliveries(senders) {
            let key = DeliveryKey::new(provider, &id);
            match process.pipeline.ledger().remembered(&key).await {
                Ok(found) => {
                    remembered.insert(id, found);
                }
                Err(error) => self.shared.record().internal.push(format!(
                    "the ledger cannot say what became of {id}: {error}"
                )),
            }
        }
        let stats = process.spool.stats();
        Lived {
            ended: self.clock.now(),
            remembered,
            quarantined: stats.quarantined,
            spooled: usize::try_from(stats.entries).unwrap_or(usize::MAX),
            spooled_ids: Vec::new(),
        }
    }

    /// What a start found of the topic grown while posbridge was stopped:
    /// refused for its partitions and named, the first time; taken again
    /// once the operator accepted its new count.
    fn grown_topic_at_start(&self, at: AtStart, grown: &Grown) {
        let change = self.broker.health().changed(&grown.topic);
        let expected = (at == AtStart::Refused).then_some(TopicChange::Partitions {
            from: grown.from,
            to: grown.to,
        });
        let named = self
            .broker
            .health()
            .failing_topics()
            .get(&grown.topic)
            .cloned();
        if change != expected || (at == AtStart::Refused) != named.is_some() {
            self.shared.record().internal.push(format!(
                "{} grown from {} to {} partitions while posbridge was stopped ({at:?}): at the start its change is {change:?} and it is named {named:?}",
                grown.topic, grown.from, grown.to
            ));
        }
    }

    /// Nothing was written to the topic `grown` since the log was `from`
    /// long: posbridge refuses it until its new count is accepted.
    fn nothing_written_to(&self, grown: &Grown, from: usize) {
        let placed = self.broker.placed();
        for (at, record) in placed.iter().skip(from) {
            if *at.topic == *grown.topic {
                self.shared.record().internal.push(format!(
                    "{} written at {at} while {} had grown to {} partitions and posbridge kept {}",
                    delivery_of(record).unwrap_or_default(),
                    grown.topic,
                    grown.to,
                    grown.from
                ));
            }
        }
    }

    /// Whether the log took `record`, a send the crash that ends life
    /// `life` cut: as the plan says, else drawn (drawn either way, so that
    /// the draws after it are those of the run that kept it); noted.
    fn cut_taken(&self, life: usize, record: &OutgoingRecord, rng: &mut StdRng) -> bool {
        let drawn = rng.random_bool(0.5);
        let key = format!(
            "{life} {}",
            sent_key(&delivery_of(record).unwrap_or_default(), record)
        );
        let mut noted = self.shared.record();
        let nth = noted.cut_taken.get(&key).map_or(0, Vec::len);
        let taken = self
            .plan
            .broker
            .cut_taken
            .get(&key)
            .and_then(|kept| kept.get(nth).copied())
            .unwrap_or(drawn);
        noted.cut_taken.entry(key).or_default().push(taken);
        taken
    }

    /// How often a life's ledger checkpoints, and until when: every
    /// `checkpoint_every` in a life a crash ends; in the last (where what
    /// is durable decides nothing, and hours pass) only while the disk's
    /// writes fail and a while after, as a service's checkpoint thread
    /// retries a write (and the reopen before it) that failed.
    fn checkpoints_every(&self, crashes: bool) -> Option<(Duration, Option<Instant>)> {
        if crashes {
            return Some((self.plan.checkpoint_every, None));
        }
        let failing = self.plan.disk.failing?;
        let until = self.clock.instant_at(failing.to + Duration::from_secs(60));
        Some((self.plan.checkpoint_every, Some(until)))
    }
}

/// What one life left besides its files.
struct Lived {
    /// When it ended, from the world's start: a crash that landed in a
    /// disk op ends it then, not at its planned time.
    ended: Duration,
    /// What its ledger remembers of each delivery at its end, when it ended
    /// without a crash (the world's last life).
    remembered: BTreeMap<String, Remembered>,
    /// Spool entries it set aside as damaged.
    quarantined: u64,
    /// Deliveries its spool still held when it ended.
    spooled: usize,
    /// Their ids, when it ended with a crash.
    spooled_ids: Vec<String>,
}

/// A record's delivery id header.
pub(super) fn delivery_of(record: &OutgoingRecord) -> Option<String> {
    record.header(HEADER_DELIVERY_ID).map(str::to_owned)
}
