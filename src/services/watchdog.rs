//! The webhook-health watchdog: notices a switched-off ReceiptRoller webhook
//! or a paused Mekari endpoint, says so loudly, resumes it where configured,
//! and catches up on what was missed while it was off.
//!
//! Neither provider keeps events that happen while a webhook is off, so the
//! catch-up reads the API from the last time the webhook was seen delivering
//! (kept in the ledger, so it survives a restart), minus the reconciler's
//! lookback. While a webhook stays off, every check catches up again, so data
//! keeps flowing through the API meanwhile.
//!
//! "Delivering" means on at the provider **and** its deliveries taken:
//! Kafka answers, or the source spools and the spool has room. During a
//! broker outage a source on `retry` answers 503, so an endpoint the
//! provider shows as active delivers nothing, and Mekari gives up on those
//! deliveries after ~11 hours (and pauses the endpoint after ten). So the
//! mark does not move while they are not taken, a catch-up that fails
//! (Kafka still away) leaves it where it was, and the first check that finds
//! the webhook on, its deliveries taken and the mark (or, never seen
//! delivering, the watchdog's start) older than a few checks catches up from
//! it before moving it: what the provider gave up on during the outage is
//! read back from its API, paused or not.
//!
//! A resume counts only once the provider's state reads back as on: a 2xx to
//! the switch is not proof (a provider can answer it and leave the webhook
//! off, and the API client follows no redirect to another host that could
//! answer in its place).

use std::time::Duration;

use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::adapters::ledger::{Commit, LedgerError};
use crate::adapters::providers::api::{ProviderApi, WebhookState};
use crate::domain::event::{ProviderKind, Source};
use crate::observe::board::WebhookSeen;
use crate::observe::telemetry;
use crate::services::reconcile::Reconciler;
use crate::services::ticker::Every;

/// Checks that may go by without a mark before the next one catches up on
/// the gap: one slow check (a long catch-up) is not yet a gap.
const CHECKS_BEFORE_A_GAP: u32 = 3;

/// How long a check waits for Kafka to answer a metadata request.
const BROKER_PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// What one check found for a source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// Provider.
    pub provider: ProviderKind,
    /// Source name.
    pub source: String,
    /// The state the provider reported.
    pub state: WebhookState,
    /// Whether the watchdog switched it back on.
    pub resumed: bool,
}

/// Makes a watched source's resume counter exist at 0, so a first resume
/// shows in a `rate()`.
fn announce(source: &Source) {
    metrics::counter!(
        telemetry::WEBHOOK_RESUMES,
        telemetry::PROVIDER => source.provider.as_str(),
        telemetry::SOURCE => source.name.clone()
    )
    .increment(0);
}

/// Checks the webhooks of the reconciler's sources.
pub struct Watchdog {
    reconciler: Reconciler,
    /// Catch-ups of a webhook never seen on start this long before now.
    started: OffsetDateTime,
    /// Time between checks.
    interval: Duration,
    /// A mark older than this, on a webhook found on with Kafka answering,
    /// is a time nothing was delivered (an outage, posbridge stopped): the
    /// check catches up from it.
    gap: time::Duration,
}

impl Watchdog {
    /// A watchdog over the reconciler's sources, checking every `interval`.
    /// Each source's resume counter exists from here on at 0, so a first
    /// resume shows in a `rate()`.
    pub fn new(reconciler: Reconciler, interval: Duration) -> Watchdog {
        for watched in reconciler.watched().iter() {
            announce(watched.source());
        }
        let gap = time::Duration::try_from(interval.saturating_mul(CHECKS_BEFORE_A_GAP))
            .unwrap_or(time::Duration::MAX);
        Watchdog {
            reconciler,
            started: OffsetDateTime::now_utc(),
            interval,
            gap,
        }
    }

    /// Checks every watched webhook once.
    pub async fn check(&self) -> Vec<Finding> {
        let mut findings = Vec::new();
        let now = OffsetDateTime::now_utc();
        // Asked at most once a check, and only when a source needs it.
        let mut broker_up = None;
        for watched in self.reconciler.watched().iter() {
            let api = watched.api();
            let spools = watched.spools();
            let watched = watched.source();
            // A source added while running (a sources directory's file)
            // gets its resume counter at its first check.
            announce(watched);
            let (provider, source) = (watched.provider, watched.name.as_str());
            let labels = [
                (telemetry::PROVIDER, provider.as_str().to_owned()),
                (telemetry::SOURCE, source.to_owned()),
            ];
            let state = match api.webhook_state().await {
                Ok(state) => state,
                Err(error) => {
                    warn!(%provider, source, %error, "Cannot read the webhook's state.");
                    if let Some(board) = self.reconciler.board() {
                        let last_seen_active = self.last_seen_active(watched).await.ok().flatten();
                        board.webhook_checked(
                            provider,
                            source,
                            WebhookSeen {
                                state: "unknown",
                                detail: Some(format!("cannot read its state: {error}")),
                                resumed: false,
                                checked_at: now,
                                last_seen_active,
                            },
                        );
                    }
                    continue;
                }
            };
            let mut resumed = false;
            // Whether this check moved the mark to `now`.
            let mut marked = false;
            // Read from the ledger once: the catch-up's start and the board's.
            let last_active;
            match &state {
                WebhookState::NotWatched => continue,
                WebhookState::Active => {
                    metrics::gauge!(telemetry::WEBHOOK_ACTIVE, &labels).set(1.0);
                    last_active = match self.last_seen_active(watched).await {
                        Ok(last) => last,
                        // Not known is not "never": no catch-up from the
                        // watchdog's start, no mark; the next check asks again.
                        Err(error) => {
                            warn!(%provider, source, %error, "Cannot read when the webhook was last seen delivering; asked again at the next check.");
                            continue;
                        }
                    };
                    // While deliveries are not taken the mark stays where
                    // they last were (see the module's comment).
                    if self.taken(spools, &mut broker_up).await {
                        // Never seen delivering: since the watchdog's start
                        // (posbridge started during an outage, say).
                        let since = last_active.unwrap_or(self.started);
                        let caught_up = if now - since > self.gap {
                            info!(%provider, source, since = %since, "Deliveries were not taken for a while (Kafka away, or posbridge stopped): catching up on what the provider may have given up on.");
                            self.catch_up(provider, source, since).await
                        } else {
                            true
                        };
                        marked = caught_up && self.mark(watched, now).await;
                    }
                }
                WebhookState::Off(detail) => {
                    metrics::gauge!(telemetry::WEBHOOK_ACTIVE, &labels).set(0.0);
                    error!(%provider, source, detail, "Webhook is switched off: the provider sends nothing and keeps nothing until it is back on.");
                    if resume(api, provider, source).await {
                        resumed = true;
                        // On again: 0 stays for a webhook that is still
                        // off, which is what needs a person.
                        metrics::gauge!(telemetry::WEBHOOK_ACTIVE, &labels).set(1.0);
                        metrics::counter!(telemetry::WEBHOOK_RESUMES, &labels).increment(1);
                        info!(%provider, source, "Webhook switched back on.");
                    }
                    last_active = self.last_seen_active(watched).await.ok().flatten();
                    let since = last_active.unwrap_or(self.started);
                    let caught_up = self.catch_up(provider, source, since).await;
                    // A failed catch-up, or deliveries not taken, leaves the
                    // mark: a later check that finds them taken catches up on it.
                    if resumed && caught_up && self.taken(spools, &mut broker_up).await {
                        marked = self.mark(watched, now).await;
                    }
                }
            }
            if let Some(board) = self.reconciler.board() {
                let last_seen_active = if marked { Some(now) } else { last_active };
                let (shown, detail) = match &state {
                    WebhookState::Off(detail) => ("off", Some(detail.clone())),
                    _ => ("active", None),
                };
                board.webhook_checked(
                    provider,
                    source,
                    WebhookSeen {
                        state: shown,
                        detail,
                        resumed,
                        checked_at: now,
                        last_seen_active,
                    },
                );
            }
            findings.push(Finding {
                provider,
                source: source.to_owned(),
                state,
                resumed,
            });
        }
        findings
    }

    /// Whether a source's deliveries are taken now (see the module's
    /// comment): it spools and the spool has room, or Kafka answers (asked
    /// once a check, kept in `broker_up`).
    async fn taken(&self, spools: bool, broker_up: &mut Option<bool>) -> bool {
        if spools && self.reconciler.spool_has_room() {
            return true;
        }
        if let Some(up) = *broker_up {
            return up;
        }
        let up = self.reconciler.broker_reachable(BROKER_PROBE_TIMEOUT).await;
        *broker_up = Some(up);
        up
    }

    /// Reads the source's API from `since` minus the lookback to now;
    /// whether it went through. A failure is said here, once.
    async fn catch_up(&self, provider: ProviderKind, source: &str, since: OffsetDateTime) -> bool {
        let since = since - self.reconciler.lookback();
        match self.reconciler.catch_up(provider, source, since).await {
            Ok(summary) => {
                info!(%provider, source, published = summary.published, "Caught up on the time the webhook was not delivering.");
                true
            }
            Err(error) => {
                error!(%provider, source, %error, "Catch-up of the time the webhook was not delivering failed; the next check tries again.");
                false
            }
        }
    }

    /// Moves the source's mark to `at`; whether it moved. A failure is said
    /// here (the next check's catch-up then covers a little more).
    async fn mark(&self, source: &Source, at: OffsetDateTime) -> bool {
        match self.mark_active(source, at).await {
            Ok(()) => true,
            Err(error) => {
                warn!(provider = %source.provider, source = %source.name, %error, "Cannot record that the webhook is delivering.");
                false
            }
        }
    }

    /// When the watchdog last saw this source's webhook delivering, kept in
    /// the ledger so a catch-up after a restart still covers the whole gap.
    async fn last_seen_active(
        &self,
        source: &Source,
    ) -> Result<Option<OffsetDateTime>, LedgerError> {
        let at = self
            .reconciler
            .ledger()
            .checkpoint(&last_active_name(source))
            .await?;
        Ok(at.and_then(|at| OffsetDateTime::from_unix_timestamp(at).ok()))
    }

    /// Records that the watchdog saw this source's webhook delivering at `at`.
    async fn mark_active(&self, source: &Source, at: OffsetDateTime) -> Result<(), LedgerError> {
        self.reconciler
            .ledger()
            .commit(Commit::checkpoint(
                last_active_name(source),
                at.unix_timestamp(),
            ))
            .await
    }

    /// Checks every interval until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut every = Every::new(self.interval, shutdown);
        while every.tick().await {
            if every.or_shutdown(self.check()).await.is_none() {
                return;
            }
        }
    }
}

/// Switches the webhook back on where the source is configured to, and
/// whether it then reads back as on. Each failure is said here, once.
async fn resume(api: &dyn ProviderApi, provider: ProviderKind, source: &str) -> bool {
    match api.resume().await {
        Ok(true) => {}
        Ok(false) => return false,
        Err(error) => {
            error!(%provider, source, %error, "Could not switch the webhook back on.");
            return false;
        }
    }
    match api.webhook_state().await {
        Ok(WebhookState::Active) => true,
        Ok(state) => {
            error!(%provider, source, ?state, "The provider accepted switching the webhook back on, but it still reads as off.");
            false
        }
        Err(error) => {
            error!(%provider, source, %error, "Cannot read the webhook's state back after switching it on; not counted as on.");
            false
        }
    }
}

/// The ledger name of when a source's webhook was last seen delivering.
fn last_active_name(source: &Source) -> String {
    format!("watchdog/{}/{}", source.provider, source.name)
}
