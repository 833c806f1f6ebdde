//! Operations endpoints: liveness, readiness and Prometheus metrics.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::AppState;
use crate::services::pipeline::Pipeline;

/// How long `/readyz` waits for the broker's metadata answer.
const BROKER_PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// How long after start-up a replica still on its first fill from the
/// topics says it is not ready though its spool would take deliveries.
/// Behind a balancer the others take its traffic meanwhile (a rolling
/// deploy moves on once it is filled, usually within seconds, instead of
/// sending the sources that do not spool to a replica that answers them
/// 503); a lone replica whose fill runs longer (its ledger lost) is ready
/// again after it, so its spooling sources are refused for a minute at
/// most, one of ReceiptRoller's four attempts. A fill that does not run
/// (the broker away at start) holds nothing: every replica is alike then.
const FIRST_FILL_UNREADY: Duration = Duration::from_secs(60);

/// `GET /healthz`: the process is up and serving HTTP.
pub async fn healthz() -> Response {
    (StatusCode::OK, Json(json!({ "status": "ok" }))).into_response()
}

/// How long the schema registry may take to answer a readiness question.
const REGISTRY_PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// The shared parts' state, as `/readyz` and the status page see it.
pub(super) struct Readiness {
    /// Whether a broker answers.
    pub broker: bool,
    /// Whether the schema registry answers (true without one).
    pub registry: bool,
    /// The ledger's check.
    pub ledger: Result<(), crate::adapters::ledger::LedgerError>,
    /// The spool's figures, when a source spools.
    pub spool: Option<crate::adapters::spool::SpoolStats>,
}

impl Readiness {
    /// Asks the ledger and the registry (at most [`REGISTRY_PROBE_TIMEOUT`]);
    /// with `ask_broker`, the broker too (at most [`BROKER_PROBE_TIMEOUT`]),
    /// else the broker's state is the last send's or probe's.
    pub(super) async fn of(pipeline: &Pipeline, ask_broker: bool) -> Readiness {
        let broker = async {
            if ask_broker {
                pipeline
                    .producer()
                    .broker_reachable(BROKER_PROBE_TIMEOUT)
                    .await
            } else {
                pipeline.producer().health().is_up()
            }
        };
        let registry = async {
            tokio::time::timeout(
                REGISTRY_PROBE_TIMEOUT,
                pipeline.encoder().registry_reachable(),
            )
            .await
            .unwrap_or(false)
        };
        let (broker, registry, ledger) = tokio::join!(broker, registry, pipeline.ledger().check());
        Readiness {
            broker,
            registry,
            ledger,
            spool: pipeline.spool().map(crate::adapters::spool::Spool::stats),
        }
    }

    /// The ledger's state in a word or its error.
    pub(super) fn ledger_text(&self) -> String {
        self.ledger
            .as_ref()
            .map_or_else(ToString::to_string, |()| "ok".to_owned())
    }
}

/// `GET /readyz`: a delivery can be accepted now. A load balancer should
/// stop sending traffic while this is 503. With Kafka or the ledger down but
/// a spool with room, posbridge stays ready: sources that spool still accept
/// (those that do not answer 503 until both are back), and taking the pod
/// out of service would fail every delivery instead, and says `degraded`;
/// so it does while the registry does not answer (records carry the schema
/// ids taken at start-up). Not while its first fill from the topics has
/// begun and not ended, for at most [`FIRST_FILL_UNREADY`] from start-up:
/// 503 `filling`. A topic Kafka refuses while the
/// cluster answers, or one that changed under posbridge (the topic watch),
/// is listed under `failing_topics` with the reason, and does not make the
/// pod unready: every other topic publishes. A spool whose writes fail (its
/// disk full) has no room, and says why under `spool.unwritable`. While the
/// ledger is filled from the topics, `ledger` says so and `ledger_rebuild`
/// shows how far it got (records and partitions read, seconds, ETA). From
/// the shutdown signal on it answers 503 `{"status": "stopping"}` at once,
/// asking nothing, while webhooks are still answered (`server.drain_delay_ms`).
pub async fn readyz(State(state): State<Arc<AppState>>) -> Response {
    if state.leaving.is_leaving() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "status": "stopping" })),
        )
            .into_response();
    }
    let pipeline = &state.pipeline;
    let readiness = Readiness::of(pipeline, true).await;
    let Readiness {
        broker,
        registry,
        spool,
        ..
    } = readiness;
    let spool_takes_it = spool.is_some_and(|stats| stats.has_room);
    // Records carry the schema ids taken at start-up: a registry that stops
    // answering later (or was away at a start on known ids) delays nothing.
    let ledger_ok = readiness.ledger.is_ok();
    let rebuild = pipeline.ledger().rebuild_progress();
    let first_fill = rebuild
        .first_fill_secs
        .is_some_and(|secs| secs < FIRST_FILL_UNREADY.as_secs_f64());
    let ready = (spool_takes_it && !first_fill) || (broker && ledger_ok);
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let word = |ok: bool| if ok { "ok" } else { "unavailable" };
    let overall = match (ready, broker && registry && ledger_ok) {
        (false, _) if first_fill => "filling",
        (false, _) => "unavailable",
        (true, true) => "ok",
        (true, false) => "degraded",
    };
    let spool = match (spool, pipeline.spool()) {
        (Some(stats), Some(handle)) => {
            let mut shown = json!({
                "entries": stats.entries,
                "bytes": stats.bytes,
                "has_room": stats.has_room,
                "writable": stats.writable,
                "draining": broker && ledger_ok && stats.entries > 0,
            });
            if let Some(reason) = handle.unwritable_reason() {
                shown["unwritable"] = json!(reason);
            }
            shown
        }
        _ => json!("disabled"),
    };
    (
        status,
        Json(json!({
            "status": overall,
            "encoding": pipeline.encoder().name(),
            "broker": word(broker),
            "schema_registry": word(registry),
            "ledger": readiness.ledger_text(),
            "ledger_rebuild": rebuild,
            "spool": spool,
            "failing_topics": pipeline.producer().health().failing_topics(),
        })),
    )
        .into_response()
}

/// `GET /metrics`: Prometheus text format.
pub async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        crate::observe::gone::render(&state.metrics),
    )
        .into_response()
}
