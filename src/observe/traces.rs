//! Traces: one OpenTelemetry span per delivery, a child span for each stage
//! it went through (verify, dedup, normalize, guard, encode, produce,
//! commit; spool when it was spooled), its outcome as attributes, exported
//! in batches over OTLP/HTTP; and the W3C `traceparent` on every record
//! posbridge writes, so a consumer continues the trace.
//!
//! [`Traces`] is built once from `[telemetry.otlp]` by `App::build` and
//! held by the pipeline, not installed globally: several apps in one
//! process each export to their own collector. A delivery's
//! [`DeliveryTrace`] travels in its `Delivery`, so each stage opens its span
//! under it explicitly. Off (no endpoint), every handle here is `None`
//! inside: no span, no clock read, no header; each stage costs one branch.
//!
//! Spans are posbridge's own OpenTelemetry spans, apart from the `tracing`
//! spans that carry log fields: a log subscriber is process-wide, while the
//! exporter belongs to one app and its configuration.

use std::fmt::Display;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use opentelemetry::propagation::{Injector, TextMapPropagator};
use opentelemetry::trace::{
    Span as _, SpanKind, Status, TraceContextExt, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, InstrumentationScope, KeyValue};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    Sampler, SdkTracer, SdkTracerProvider, Span, SpanData, SpanExporter,
};
use tracing::{info, warn};

use crate::config::OtlpConfig;
use crate::domain::event::{EntityKey, PosEvent, ProviderKind};

/// Record header: the W3C trace context of the span that produced it.
pub const HEADER_TRACEPARENT: &str = "traceparent";
/// Record header: the W3C vendor trace state, when the trace carries one.
pub const HEADER_TRACESTATE: &str = "tracestate";

/// Span attribute: provider name.
pub const PROVIDER: &str = "posbridge.provider";
/// Span attribute: configured source name.
pub const SOURCE: &str = "posbridge.source";
/// Span attribute: the provider's delivery id.
pub const DELIVERY_ID: &str = "posbridge.delivery_id";
/// Span attribute: the entity type (`sale`, `order`, …).
pub const ENTITY_TYPE: &str = "posbridge.entity_type";
/// Span attribute: the entity's record key, as on its topic.
pub const ENTITY_KEY: &str = "posbridge.entity_key";
/// Span attribute: the event type as the provider sent it.
pub const EVENT_TYPE: &str = "posbridge.event_type";
/// Span attribute: how the delivery ended, the `outcome` metric label.
pub const OUTCOME: &str = "posbridge.outcome";
/// Span attribute: a dead letter's reason code.
pub const DEAD_LETTER_REASON: &str = "posbridge.dead_letter_reason";
/// Span attribute: why a request was refused (4xx; a 5xx says it in the
/// span's status).
pub const REFUSAL: &str = "posbridge.refusal";
/// Span attribute (OpenTelemetry semantic conventions): the answer's status.
pub const HTTP_STATUS: &str = "http.response.status_code";
/// Span attribute (semantic conventions): the route template.
pub const HTTP_ROUTE: &str = "http.route";
/// Span attribute (semantic conventions): the request method.
pub const HTTP_METHOD: &str = "http.request.method";
/// Span attribute (semantic conventions): `kafka`.
pub const MESSAGING_SYSTEM: &str = "messaging.system";
/// Span attribute (semantic conventions): the topic written to.
pub const MESSAGING_DESTINATION: &str = "messaging.destination.name";
/// Span attribute (semantic conventions): `send`.
pub const MESSAGING_OPERATION: &str = "messaging.operation.type";

/// The webhook route, as the router names it.
const WEBHOOK_ROUTE: &str = "/webhooks/{provider}/{source}";

/// The stages a delivery goes through, each a child span of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// The signature over the raw bytes.
    Verify,
    /// The lease on its delivery id (and the spool's index).
    Dedup,
    /// The provider's JSON into one event.
    Normalize,
    /// The entity's lock, written state and the stale-event decision.
    Guard,
    /// The Avro value.
    Encode,
    /// One record to Kafka, until the broker acknowledged it.
    Produce,
    /// The ledger's durable write.
    Commit,
    /// The outage spool's durable append.
    Spool,
}

impl Stage {
    /// The span name.
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Verify => "verify",
            Stage::Dedup => "dedup",
            Stage::Normalize => "normalize",
            Stage::Guard => "guard",
            Stage::Encode => "encode",
            Stage::Produce => "produce",
            Stage::Commit => "commit",
            Stage::Spool => "spool",
        }
    }
}

/// What started a trace of posbridge's own, with no request to continue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// A spooled delivery, replayed once Kafka answered again.
    SpoolReplay,
    /// A dead letter put through again (`replay-dead-letters`).
    Redelivery,
    /// A record the reconciler read from a provider's API.
    Reconcile,
    /// A record of the topic derived again (`posbridge rederive`).
    Rederive,
    /// A dead letter written outside a delivery: a reconciled record that
    /// does not normalize, a spooled delivery set aside.
    DeadLetter,
}

impl Origin {
    /// The root span's name.
    fn as_str(self) -> &'static str {
        match self {
            Origin::SpoolReplay => "spool_replay",
            Origin::Redelivery => "redelivery",
            Origin::Reconcile => "reconcile",
            Origin::Rederive => "rederive",
            Origin::DeadLetter => "dead_letter",
        }
    }
}

/// Why traces could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("cannot set up the OTLP trace exporter: {0}")]
pub struct TraceError(#[from] opentelemetry_otlp::ExporterBuildError);

/// The trace exporter of one app, or nothing. Cheap to clone.
#[derive(Clone, Default)]
pub struct Traces(Option<Arc<Exporting>>);

/// A running exporter.
struct Exporting {
    /// Batches finished spans and exports them from a thread of its own.
    provider: SdkTracerProvider,
    /// Makes the spans.
    tracer: SdkTracer,
}

impl std::fmt::Debug for Traces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.is_on() {
            "Traces(on)"
        } else {
            "Traces(off)"
        })
    }
}

impl Traces {
    /// Starts the exporter `config` describes; off when it names no endpoint.
    ///
    /// # Errors
    /// [`TraceError`] when the exporter refuses the settings.
    pub fn start(config: &OtlpConfig) -> Result<Traces, TraceError> {
        let Some(url) = config.traces_url() else {
            return Ok(Traces(None));
        };
        let headers = config
            .headers
            .iter()
            .map(|(name, value)| (name.clone(), value.expose().to_owned()))
            .collect();
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(url.clone())
            .with_timeout(config.timeout())
            .with_headers(headers)
            .build()?;
        let resource = opentelemetry_sdk::Resource::builder()
            .with_service_name(config.service_name.clone())
            .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
            .build();
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(Reporting {
                exporter,
                url,
                failing: AtomicBool::new(false),
            })
            // A request's traceparent decides for its trace; the ratio for
            // the traces posbridge starts.
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                config.sampling_ratio,
            ))))
            .with_resource(resource)
            .build();
        let tracer = provider.tracer_with_scope(
            InstrumentationScope::builder("posbridge")
                .with_version(env!("CARGO_PKG_VERSION"))
                .build(),
        );
        Ok(Traces(Some(Arc::new(Exporting { provider, tracer }))))
    }

    /// Whether spans are made at all.
    pub fn is_on(&self) -> bool {
        self.0.is_some()
    }

    /// A webhook delivery's span, from its request: a child of the
    /// request's `traceparent` when it carries a valid one, else a new trace.
    #[inline]
    pub fn delivery(
        &self,
        headers: &axum::http::HeaderMap,
        provider: ProviderKind,
        source: &str,
        delivery_id: Option<&str>,
    ) -> DeliveryTrace {
        match &self.0 {
            None => DeliveryTrace(None),
            Some(exporting) => exporting.delivery(headers, provider, source, delivery_id),
        }
    }

    /// The span of work no request started: a new trace.
    pub fn start_root(
        &self,
        origin: Origin,
        provider: ProviderKind,
        source: &str,
        delivery_id: &str,
    ) -> DeliveryTrace {
        let Some(exporting) = &self.0 else {
            return DeliveryTrace(None);
        };
        let attributes = vec![
            KeyValue::new(PROVIDER, provider.as_str()),
            KeyValue::new(SOURCE, source.to_owned()),
            KeyValue::new(DELIVERY_ID, delivery_id.to_owned()),
        ];
        exporting.root(
            origin.as_str(),
            SpanKind::Internal,
            attributes,
            &Context::new(),
        )
    }

    /// Exports the spans still batched, at most `timeout`, and stops: the
    /// end of a run.
    pub async fn shutdown(&self, timeout: Duration) {
        let Some(exporting) = &self.0 else {
            return;
        };
        let provider = exporting.provider.clone();
        // The SDK waits for its export thread: off the async workers.
        let stopped =
            tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(timeout)).await;
        if let Ok(Err(error)) = stopped {
            warn!(%error, "Spans still batched at shutdown were not all exported.");
        }
    }
}

impl Exporting {
    fn delivery(
        &self,
        headers: &axum::http::HeaderMap,
        provider: ProviderKind,
        source: &str,
        delivery_id: Option<&str>,
    ) -> DeliveryTrace {
        let parent =
            TraceContextPropagator::new().extract(&opentelemetry_http::HeaderExtractor(headers));
        let mut attributes = vec![
            KeyValue::new(PROVIDER, provider.as_str()),
            KeyValue::new(SOURCE, source.to_owned()),
            KeyValue::new(HTTP_METHOD, "POST"),
            KeyValue::new(HTTP_ROUTE, WEBHOOK_ROUTE),
        ];
        if let Some(id) = delivery_id {
            attributes.push(KeyValue::new(DELIVERY_ID, id.to_owned()));
        }
        self.root("delivery", SpanKind::Server, attributes, &parent)
    }

    fn root(
        &self,
        name: &'static str,
        kind: SpanKind,
        attributes: Vec<KeyValue>,
        parent: &Context,
    ) -> DeliveryTrace {
        let span = self
            .tracer
            .span_builder(name)
            .with_kind(kind)
            .with_attributes(attributes)
            .start_with_context(&self.tracer, parent);
        DeliveryTrace(Some(Arc::new(Traced {
            tracer: self.tracer.clone(),
            context: parent.with_span(span),
        })))
    }
}

/// One delivery's span, travelling with it down the line; nothing when
/// traces are off. Cheap to clone. The span ends with [`DeliveryTrace::answered`],
/// or when the last clone is dropped.
#[derive(Clone, Default)]
pub struct DeliveryTrace(Option<Arc<Traced>>);

/// A delivery's span and what makes its children.
struct Traced {
    /// Makes the stage spans.
    tracer: SdkTracer,
    /// Holds the delivery's span: the parent of its stages.
    context: Context,
}

impl Traced {
    fn child(&self, name: &'static str, kind: SpanKind, attributes: Vec<KeyValue>) -> StageSpan {
        let span = self
            .tracer
            .span_builder(name)
            .with_kind(kind)
            .with_attributes(attributes)
            .start_with_context(&self.tracer, &self.context);
        StageSpan(Some(Box::new(span)))
    }

    fn event(&self, event: &PosEvent, key: &EntityKey) {
        let span = self.context.span();
        span.set_attribute(KeyValue::new(ENTITY_TYPE, event.entity_type.as_str()));
        span.set_attribute(KeyValue::new(ENTITY_KEY, key.as_str().to_owned()));
        span.set_attribute(KeyValue::new(EVENT_TYPE, event.event_type.to_string()));
    }

    fn outcome(&self, outcome: &'static str, dead_letter_reason: Option<&'static str>) {
        let span = self.context.span();
        span.set_attribute(KeyValue::new(OUTCOME, outcome));
        if let Some(code) = dead_letter_reason {
            span.set_attribute(KeyValue::new(DEAD_LETTER_REASON, code));
        }
    }

    fn answered(
        &self,
        outcome: &'static str,
        dead_letter_reason: Option<&'static str>,
        status: u16,
        error: Option<&dyn Display>,
    ) {
        self.outcome(outcome, dead_letter_reason);
        let span = self.context.span();
        span.set_attribute(KeyValue::new(HTTP_STATUS, i64::from(status)));
        match error {
            Some(error) if status >= 500 => span.set_status(Status::error(error.to_string())),
            Some(error) => span.set_attribute(KeyValue::new(REFUSAL, error.to_string())),
            None => {}
        }
        span.end();
    }
}

impl std::fmt::Debug for DeliveryTrace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            None => f.write_str("DeliveryTrace(off)"),
            Some(traced) => write!(
                f,
                "DeliveryTrace({})",
                traced.context.span().span_context().trace_id()
            ),
        }
    }
}

impl DeliveryTrace {
    /// A stage's span, a child of the delivery's, ended when dropped.
    /// Inlined, as the other calls on the way of every delivery: off, each
    /// is the one branch on `None`.
    #[inline]
    pub fn stage(&self, stage: Stage) -> StageSpan {
        match &self.0 {
            None => StageSpan(None),
            Some(traced) => traced.child(stage.as_str(), SpanKind::Internal, Vec::new()),
        }
    }

    /// The produce stage's span for a record to `topic`: the span whose
    /// context the record's `traceparent` carries.
    #[inline]
    pub fn produce(&self, topic: &str) -> StageSpan {
        match &self.0 {
            None => StageSpan(None),
            Some(traced) => traced.child(
                Stage::Produce.as_str(),
                SpanKind::Producer,
                vec![
                    KeyValue::new(MESSAGING_SYSTEM, "kafka"),
                    KeyValue::new(MESSAGING_DESTINATION, topic.to_owned()),
                    KeyValue::new(MESSAGING_OPERATION, "send"),
                ],
            ),
        }
    }

    /// The event the delivery became: its entity and event type.
    #[inline]
    pub fn event(&self, event: &PosEvent, key: &EntityKey) {
        if let Some(traced) = &self.0 {
            traced.event(event, key);
        }
    }

    /// The pipeline's outcome, for deliveries no request waits for (a
    /// spooled delivery's replay, a redelivery, a reconciled record).
    pub fn outcome(&self, outcome: &'static str, dead_letter_reason: Option<&'static str>) {
        if let Some(traced) = &self.0 {
            traced.outcome(outcome, dead_letter_reason);
        }
    }

    /// Why the pipeline could not finish, for deliveries no request waits for.
    pub fn failed(&self, error: &dyn Display) {
        if let Some(traced) = &self.0 {
            traced
                .context
                .span()
                .set_status(Status::error(error.to_string()));
        }
    }

    /// The answer to the delivery's request, and the end of its span: the
    /// outcome (the metric label), the status, and what went wrong for a
    /// refusal (an attribute for 4xx, the span's error status for 5xx, as
    /// OpenTelemetry's HTTP conventions have it).
    #[inline]
    pub fn answered(
        &self,
        outcome: &'static str,
        dead_letter_reason: Option<&'static str>,
        status: u16,
        error: Option<&dyn Display>,
    ) {
        if let Some(traced) = &self.0 {
            traced.answered(outcome, dead_letter_reason, status, error);
        }
    }
}

/// A stage's span; nothing when traces are off. Ends when dropped. Boxed,
/// so that a future holding one across an `.await` grows by a pointer only.
pub struct StageSpan(Option<Box<Span>>);

impl StageSpan {
    /// Marks the stage failed, with why.
    #[inline]
    pub fn failed(&mut self, error: &dyn Display) {
        if let Some(span) = &mut self.0 {
            span.set_status(Status::error(error.to_string()));
        }
    }

    /// Marks the stage failed when `result` is an error; hands it back.
    #[inline]
    pub fn result<T, E: Display>(mut self, result: Result<T, E>) -> Result<T, E> {
        if let (Some(_), Err(error)) = (&self.0, &result) {
            self.failed(error);
        }
        result
    }

    /// The record headers that carry this span's context (`traceparent`,
    /// and `tracestate` when the trace has one); none when traces are off.
    /// A trace that is not sampled is propagated too (flags `00`), so the
    /// consumer does not sample it either.
    #[inline]
    pub fn record_headers(&self) -> Vec<(&'static str, String)> {
        match &self.0 {
            None => Vec::new(),
            Some(span) => context_headers(span),
        }
    }
}

/// The W3C headers of a span's context.
fn context_headers(span: &Span) -> Vec<(&'static str, String)> {
    let context = Context::new().with_remote_span_context(span.span_context().clone());
    let mut headers = RecordHeaders(Vec::with_capacity(1));
    TraceContextPropagator::new().inject_context(&context, &mut headers);
    headers.0
}

/// Collects the propagator's headers under their constant names.
struct RecordHeaders(Vec<(&'static str, String)>);

impl Injector for RecordHeaders {
    fn set(&mut self, key: &str, value: String) {
        let key = match key {
            HEADER_TRACEPARENT => HEADER_TRACEPARENT,
            HEADER_TRACESTATE => HEADER_TRACESTATE,
            _ => return,
        };
        self.0.push((key, value));
    }
}

/// The OTLP exporter, saying once when exports start failing and once when
/// they work again (the batch processor retries every batch, and would
/// otherwise fail silently: its own logs are not built in).
#[derive(Debug)]
struct Reporting {
    /// OTLP/HTTP, protobuf.
    exporter: opentelemetry_otlp::SpanExporter,
    /// Where it posts, for the log.
    url: String,
    /// Whether the last export failed.
    failing: AtomicBool,
}

impl SpanExporter for Reporting {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans = batch.len();
        let result = self.exporter.export(batch).await;
        match &result {
            Ok(()) if self.failing.swap(false, Ordering::Relaxed) => {
                info!(url = %self.url, "Spans are exported again.");
            }
            Err(error) if !self.failing.swap(true, Ordering::Relaxed) => {
                warn!(url = %self.url, %error, spans, "Spans cannot be exported; they are dropped until the collector takes them.");
            }
            _ => {}
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.exporter.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.exporter.force_flush()
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        self.exporter.set_resource(resource);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_makes_no_span_and_no_header() {
        let traces = Traces::start(&OtlpConfig::default()).unwrap();
        assert!(!traces.is_on());
        let trace = traces.delivery(
            &axum::http::HeaderMap::new(),
            ProviderKind::Mekari,
            "main",
            Some("d1"),
        );
        assert!(trace.0.is_none());
        assert!(trace.produce("pos.orders").record_headers().is_empty());
    }
}
