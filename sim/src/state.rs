//! The simulator's shared state: one cheap `Clone` handle for the delivery
//! side, the API handlers and `main`, with the event log and its counters.
//!
//! Every lock here is a std `Mutex` held for a few field updates and never
//! across an `.await`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use posbridge::domain::event::ProviderKind;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::Semaphore;
use tokio_util::task::TaskTracker;

use crate::clock::{EventClock, TimeScale};
use crate::fault::ApiFault;
use crate::truth::Truth;
use crate::webhook_state::{Endpoint, Webhook};

/// Settings fixed at start-up (from the command line).
#[derive(Debug, Clone)]
pub struct Settings {
    /// posbridge's base URL, without a trailing slash.
    pub target: String,
    /// ReceiptRoller's webhook URL: `{target}/webhooks/receiptroller/{source}`.
    pub receiptroller_url: String,
    /// Mekari's endpoint URL: `{target}/webhooks/mekari/{source}`.
    pub mekari_url: String,
    /// Secret ReceiptRoller signs with (hex HMAC-SHA256).
    pub receiptroller_secret: String,
    /// Secret Mekari signs with (base64 HMAC-SHA256).
    pub mekari_secret: String,
    /// Bearer token the ReceiptRoller API accepts.
    pub receiptroller_token: String,
    /// Mekari API client id (HMAC `username`).
    pub mekari_client_id: String,
    /// Mekari API client secret (HMAC key).
    pub mekari_client_secret: String,
    /// Fraction of list requests answered 503 + `Retry-After: 1`.
    pub api_fail_rate: f64,
    /// Seconds the Mekari gateway's clock is ahead of the real one (negative:
    /// behind), to show how a skewed clock surfaces in the reconciler.
    pub api_clock_offset_secs: i64,
    /// How ReceiptRoller's API misbehaves, if it does (`--api-fault`).
    pub api_fault: Option<ApiFault>,
    /// Documented provider delays divided by this give real waits.
    pub scale: TimeScale,
    /// The seed the plan was drawn from.
    pub seed: u64,
    /// The run id in every business id.
    pub run_id: String,
}

/// What became of one event's delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Fate {
    /// Waiting for its first attempt or between attempts.
    Pending,
    /// Some attempt got a 2xx.
    Delivered,
    /// Every attempt failed, or one failed for good (Mekari 3xx/4xx).
    Failed,
    /// Never sent: the `--drop` fault.
    Dropped,
    /// Not sent: the webhook was off or the endpoint paused when it happened.
    Lost,
    /// Its waiting retries were dropped (ReceiptRoller restart, Mekari pause).
    Abandoned,
}

/// One event and its delivery, for `GET /sim/events` and the counters.
#[derive(Debug, Clone, Serialize)]
pub struct EventRecord {
    /// Who sent it.
    pub provider: ProviderKind,
    /// Its delivery id.
    pub delivery_id: String,
    /// The event name.
    pub event_type: &'static str,
    /// The entity's record key.
    pub key: String,
    /// When it happened (the body's time, as the provider formats it).
    pub at: String,
    /// What became of it so far.
    pub fate: Fate,
    /// HTTP requests made for it, duplicate copies included.
    pub attempts: u32,
    /// Of those, the ones not answered 2xx (no answer included).
    pub failed_attempts: u32,
    /// Of those, the ones that got no answer at all (the connection broke or
    /// timed out): the provider cannot know whether such an attempt wrote
    /// its record, so a second record of this delivery is in doubt, not a
    /// duplicate the receiver let through.
    pub unanswered_attempts: u32,
    /// The last HTTP status it got (0: no answer).
    pub last_status: Option<u16>,
    /// A second copy was sent.
    pub duplicated: bool,
    /// It was held back until after a later delivery.
    pub reordered: bool,
}

/// Delivery counters of one provider or both. The first three count HTTP
/// requests (`attempted = succeeded + failed`), the rest count events.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Counters {
    /// HTTP requests sent: first attempts, retries and duplicate copies.
    pub attempted: u64,
    /// Requests answered 2xx.
    pub succeeded: u64,
    /// Requests not answered 2xx, or not answered at all.
    pub failed: u64,
    /// Events delivered (some attempt got a 2xx).
    pub delivered: u64,
    /// Events that failed for good (attempts used up, or a Mekari 3xx/4xx).
    pub failed_for_good: u64,
    /// Events never sent (`--drop`).
    pub dropped: u64,
    /// Events sent a second time (`--duplicates`).
    pub duplicated: u64,
    /// Events held back behind a later one (`--reorder`).
    pub reordered: u64,
    /// Events not sent because the webhook was off / the endpoint paused.
    pub lost: u64,
    /// Events whose waiting retries were dropped (restart, pause).
    pub abandoned: u64,
    /// Events still being delivered.
    pub pending: u64,
}

impl Counters {
    fn add(&mut self, record: &EventRecord) {
        self.attempted += u64::from(record.attempts);
        self.failed += u64::from(record.failed_attempts);
        self.succeeded += u64::from(record.attempts - record.failed_attempts);
        self.duplicated += u64::from(record.duplicated);
        self.reordered += u64::from(record.reordered);
        match record.fate {
            Fate::Pending => self.pending += 1,
            Fate::Delivered => self.delivered += 1,
            Fate::Failed => self.failed_for_good += 1,
            Fate::Dropped => self.dropped += 1,
            Fate::Lost => self.lost += 1,
            Fate::Abandoned => self.abandoned += 1,
        }
    }
}

/// The shared state behind [`Sim`].
#[derive(Debug)]
pub struct Shared {
    /// Start-up settings.
    pub settings: Settings,
    /// Every entity's current state.
    pub truth: Mutex<Truth>,
    /// Every event that happened, in order, with its delivery's fate.
    pub events: Mutex<Vec<EventRecord>>,
    /// ReceiptRoller's webhook: active flag and the pending-retry generation.
    pub receiptroller: Mutex<Webhook>,
    /// Mekari's endpoint: status, failure count and the retry generation.
    pub mekari: Mutex<Endpoint>,
    /// Event times: the wall clock, strictly increasing.
    pub clock: EventClock,
    /// Limits concurrent webhook requests ("modest concurrency").
    pub permits: Semaphore,
    /// Every delivery task, so the end of sending can be awaited.
    pub tasks: TaskTracker,
    /// The HTTP client deliveries go out with (10 s answer timeout, no redirects).
    pub client: reqwest::Client,
    /// Random draws of the API fault injection, seeded from the run's seed.
    pub api_rng: Mutex<StdRng>,
    /// All events happened and every delivery finished or was abandoned.
    pub sending_done: AtomicBool,
    /// How many events the plan has.
    pub planned: usize,
    /// Requests `/sim/elsewhere/…` answered: what a client following a
    /// redirect to another host sent there.
    pub elsewhere_requests: AtomicU64,
}

/// Cheap handle on the simulator's state.
#[derive(Debug, Clone)]
pub struct Sim(Arc<Shared>);

impl std::ops::Deref for Sim {
    type Target = Shared;
    fn deref(&self) -> &Shared {
        &self.0
    }
}

/// Locks a mutex, recovering the data if a panicking thread poisoned it (the
/// simulator's state stays consistent field by field).
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Sim {
    /// Builds the state.
    pub fn new(
        settings: Settings,
        truth: Truth,
        planned: usize,
        concurrency: usize,
        client: reqwest::Client,
    ) -> Sim {
        let api_rng = StdRng::seed_from_u64(settings.seed ^ 0x5eed_a91f);
        Sim(Arc::new(Shared {
            settings,
            truth: Mutex::new(truth),
            events: Mutex::new(Vec::new()),
            receiptroller: Mutex::new(Webhook::default()),
            mekari: Mutex::new(Endpoint::default()),
            clock: EventClock::default(),
            permits: Semaphore::new(concurrency.max(1)),
            tasks: TaskTracker::new(),
            client,
            api_rng: Mutex::new(api_rng),
            sending_done: AtomicBool::new(false),
            planned,
            elsewhere_requests: AtomicU64::new(0),
        }))
    }

    /// Updates one event's record.
    pub fn record(&self, index: usize, update: impl FnOnce(&mut EventRecord)) {
        if let Some(record) = lock(&self.events).get_mut(index) {
            update(record);
        }
    }

    /// Whether a list request should be answered 503 (`--api-fail-rate`).
    pub fn api_should_fail(&self) -> bool {
        let rate = self.settings.api_fail_rate;
        rate > 0.0 && lock(&self.api_rng).random_bool(rate)
    }

    /// Whether every event happened and every delivery is over.
    pub fn sending_done(&self) -> bool {
        self.sending_done.load(Ordering::SeqCst)
    }

    /// `GET /sim/status`.
    pub fn status(&self) -> Value {
        let (mut total, mut receiptroller, mut mekari) = (
            Counters::default(),
            Counters::default(),
            Counters::default(),
        );
        let events = {
            let events = lock(&self.events);
            for record in events.iter() {
                total.add(record);
                match record.provider {
                    ProviderKind::ReceiptRoller => receiptroller.add(record),
                    ProviderKind::Mekari => mekari.add(record),
                }
            }
            events.len()
        };
        let webhook = lock(&self.receiptroller).active;
        let (status, failures) = {
            let endpoint = lock(&self.mekari);
            (endpoint.status(), endpoint.consecutive_failures)
        };
        json!({
            "sending_done": self.sending_done(),
            "events": events,
            "events_planned": self.planned,
            "deliveries": total,
            "receiptroller_active": webhook,
            "mekari_status": status,
            "mekari_consecutive_failures": failures,
            "by_provider": {"receiptroller": receiptroller, "mekari": mekari},
            "seed": self.settings.seed,
            "run_id": self.settings.run_id,
            "elsewhere_requests": self.elsewhere_requests.load(Ordering::SeqCst),
        })
    }

    /// The final line: the status plus how many entities the truth holds.
    pub fn summary(&self) -> Value {
        let mut status = self.status();
        let entities = lock(&self.truth).entities().count();
        status["truth_entities"] = json!(entities);
        status
    }
}
