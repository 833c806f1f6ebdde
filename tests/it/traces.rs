//! Traces over OTLP: a collector in the test (a real HTTP server on
//! loopback taking OTLP/HTTP protobuf on `POST /v1/traces`, decoded with
//! opentelemetry-proto), a real posbridge sending to it, the suite's Kafka.
//! One span per delivery with a child per stage and its outcome; the
//! records' `traceparent` names the span that produced them; a request's
//! `traceparent` is continued.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode, header};
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue};
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode as SpanStatus;
use prost::Message as _;

use crate::support::wait::look_for;
use crate::support::{TestApp, brokers, config, read_topic, rr_sale, signed_request, unique};

/// One span as the collector received it.
#[derive(Debug, Clone)]
struct Received {
    /// `service.name` of its resource.
    service: String,
    name: String,
    kind: SpanKind,
    trace_id: String,
    span_id: String,
    /// Empty for a root span.
    parent_span_id: String,
    attributes: HashMap<String, String>,
    status: SpanStatus,
    status_message: String,
}

impl Received {
    fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

/// The collector: every span it was sent, in arrival order.
struct Collector {
    /// Its base URL: posbridge adds `/v1/traces`.
    url: String,
    spans: Arc<Mutex<Vec<Received>>>,
}

impl Collector {
    async fn start() -> Collector {
        let spans: Arc<Mutex<Vec<Received>>> = Arc::default();
        let kept = spans.clone();
        let router = axum::Router::new().route(
            "/v1/traces",
            post(move |headers: HeaderMap, body: Bytes| {
                let kept = kept.clone();
                async move { receive(&kept, &headers, &body) }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        Collector { url, spans }
    }

    fn spans(&self) -> Vec<Received> {
        self.spans.lock().unwrap().clone()
    }

    /// Waits until `done` holds for the spans received, at most 60 s (the
    /// exporter sends a batch every 5 s while posbridge runs).
    async fn wait_for(&self, what: &str, done: impl Fn(&[Received]) -> bool) -> Vec<Received> {
        let received = look_for(Duration::from_secs(60), async || {
            let spans = self.spans();
            done(&spans).then_some(spans)
        })
        .await;
        received.unwrap_or_else(|| panic!("never received {what}; received {:#?}", self.spans()))
    }
}

/// One export request: protobuf in, protobuf out, as OTLP/HTTP has it.
fn receive(
    kept: &Mutex<Vec<Received>>,
    headers: &HeaderMap,
    body: &[u8],
) -> (StatusCode, [(header::HeaderName, &'static str); 1], Vec<u8>) {
    assert_eq!(
        headers[header::CONTENT_TYPE],
        "application/x-protobuf",
        "OTLP/HTTP protobuf"
    );
    let request = ExportTraceServiceRequest::decode(body).expect("an OTLP trace export");
    let mut spans = kept.lock().unwrap();
    for resource in request.resource_spans {
        let service = resource
            .resource
            .as_ref()
            .and_then(|r| text_of(&r.attributes).remove("service.name"))
            .unwrap_or_default();
        for scope in resource.scope_spans {
            for span in scope.spans {
                let status = span.status.clone().unwrap_or_default();
                spans.push(Received {
                    service: service.clone(),
                    kind: span.kind(),
                    name: span.name,
                    trace_id: hex::encode(&span.trace_id),
                    span_id: hex::encode(&span.span_id),
                    parent_span_id: hex::encode(&span.parent_span_id),
                    attributes: text_of(&span.attributes),
                    status: status.code(),
                    status_message: status.message,
                });
            }
        }
    }
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/x-protobuf")],
        ExportTraceServiceResponse::default().encode_to_vec(),
    )
}

/// Attributes as text (numbers and booleans written out).
fn text_of(attributes: &[KeyValue]) -> HashMap<String, String> {
    attributes
        .iter()
        .filter_map(|kv| {
            let text = match kv.value.as_ref().and_then(|v: &AnyValue| v.value.clone())? {
                Any::StringValue(s) => s,
                Any::IntValue(i) => i.to_string(),
                Any::BoolValue(b) => b.to_string(),
                Any::DoubleValue(d) => d.to_string(),
                other => format!("{other:?}"),
            };
            Some((kv.key.clone(), text))
        })
        .collect()
}

/// The delivery spans of `delivery_id`, in arrival order.
fn deliveries<'a>(spans: &'a [Received], delivery_id: &str) -> Vec<&'a Received> {
    spans
        .iter()
        .filter(|s| {
            s.name == "delivery" && s.attribute("posbridge.delivery_id") == Some(delivery_id)
        })
        .collect()
}

/// The stage spans under `parent`, by name.
fn stages<'a>(spans: &'a [Received], parent: &Received) -> HashMap<&'a str, &'a Received> {
    let children: Vec<&Received> = spans
        .iter()
        .filter(|s| s.trace_id == parent.trace_id && s.parent_span_id == parent.span_id)
        .collect();
    let named: HashMap<&str, &Received> = children.iter().map(|s| (s.name.as_str(), *s)).collect();
    assert_eq!(
        named.len(),
        children.len(),
        "each stage once: {children:#?}"
    );
    named
}

fn names(stages: &HashMap<&str, &Received>) -> Vec<String> {
    let mut names: Vec<String> = stages.keys().map(|n| (*n).to_owned()).collect();
    names.sort();
    names
}

/// `00-{trace id}-{span id}-01`: sampled.
fn traceparent(trace_id: &str, span_id: &str) -> String {
    format!("00-{trace_id}-{span_id}-01")
}

#[tokio::test]
async fn each_delivery_is_one_span_with_its_stages_and_its_records_carry_its_traceparent() {
    let collector = Collector::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&brokers(), &unique("traces"), dir.path());
    cfg.telemetry.otlp.endpoint = Some(collector.url.clone());
    cfg.telemetry.otlp.service_name = "posbridge-traces-test".into();
    assert_eq!(posbridge::app::problems(&cfg), vec![]);
    let mut app = TestApp::start_with(cfg).await;
    app.keep(dir);

    // A provider (or a proxy in front of posbridge) that traces its calls.
    let (caller_trace, caller_span) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let sale = rr_sale(
        "tr-1",
        "sale.created",
        "2026-11-29T10:15:30Z",
        "T1|2026-11|71",
        1100,
    );
    let published = app
        .request("receiptroller", "main", &sale)
        .header("traceparent", traceparent(caller_trace, caller_span))
        .send()
        .await
        .unwrap();
    assert_eq!(published.status(), 200);
    let again = app.send("receiptroller", "main", &sale).await;
    assert_eq!(
        again.json::<serde_json::Value>().await.unwrap()["status"],
        "duplicate"
    );
    let unknown = rr_sale(
        "tr-2",
        "shift.closed",
        "2026-11-29T10:15:31Z",
        "T1|2026-11|72",
        1100,
    );
    let lettered = app.send("receiptroller", "main", &unknown).await;
    assert_eq!(
        lettered.json::<serde_json::Value>().await.unwrap()["status"],
        "dead_lettered"
    );
    // Wrongly signed, with a traceparent that is not one: a trace of its own.
    let wrongly_signed = rr_sale(
        "tr-3",
        "sale.created",
        "2026-11-29T10:15:32Z",
        "T1|2026-11|73",
        1100,
    );
    let refused = signed_request(
        &app.http,
        &app.base,
        "receiptroller",
        "main",
        "tr-3",
        serde_json::to_vec(&wrongly_signed).unwrap(),
        Some("not-the-secret"),
    )
    .header("traceparent", "00-zz-not-a-trace-01")
    .send()
    .await
    .unwrap();
    assert_eq!(refused.status(), 401);

    // Exported in batches while posbridge runs.
    let spans = collector
        .wait_for(
            "the four requests' delivery spans and their stages",
            |spans| {
                let [first, second] = deliveries(spans, "tr-1")[..] else {
                    return false;
                };
                let lettered = deliveries(spans, "tr-2");
                let refused = deliveries(spans, "tr-3");
                lettered.len() == 1
                    && refused.len() == 1
                    && stages(spans, first).len() == 7
                    && stages(spans, second).len() == 2
                    && stages(spans, lettered[0]).len() == 5
                    && stages(spans, refused[0]).len() == 1
            },
        )
        .await;
    assert!(spans.iter().all(|s| s.service == "posbridge-traces-test"));

    // The published one continues the caller's trace, under the caller's span.
    let by_outcome = |id: &str, outcome: &str| {
        let matching: Vec<&Received> = deliveries(&spans, id)
            .into_iter()
            .filter(|s| s.attribute("posbridge.outcome") == Some(outcome))
            .collect();
        assert_eq!(matching.len(), 1, "one {outcome} span of {id}");
        matching[0].clone()
    };
    let delivery = by_outcome("tr-1", "published");
    assert_eq!(
        delivery.trace_id, caller_trace,
        "the caller's trace is continued"
    );
    assert_eq!(delivery.parent_span_id, caller_span);
    assert_eq!(delivery.kind, SpanKind::Server);
    for (key, value) in [
        ("posbridge.provider", "receiptroller"),
        ("posbridge.source", "main"),
        ("posbridge.entity_type", "sale"),
        ("posbridge.entity_key", "receiptroller:T1|2026-11|71"),
        ("posbridge.event_type", "sale.created"),
        ("http.response.status_code", "200"),
        ("http.route", "/webhooks/{provider}/{source}"),
    ] {
        assert_eq!(delivery.attribute(key), Some(value), "{key}");
    }
    let published_stages = stages(&spans, &delivery);
    assert_eq!(
        names(&published_stages),
        [
            "commit",
            "dedup",
            "encode",
            "guard",
            "normalize",
            "produce",
            "verify"
        ]
    );
    let produce = published_stages["produce"];
    assert_eq!(produce.kind, SpanKind::Producer);
    assert_eq!(
        produce.attribute("messaging.destination.name"),
        Some(app.topic("sales").as_str())
    );
    // The record names the span that produced it, in the same trace.
    let records = read_topic(&brokers(), &app.topic("sales"));
    assert_eq!(records.len(), 1);
    assert_eq!(
        records[0].headers.get("traceparent"),
        Some(&traceparent(caller_trace, &produce.span_id)),
        "the record's traceparent: the caller's trace, posbridge's produce span"
    );

    // The duplicate: a trace of its own (it carried no traceparent), dedup
    // and nothing after it.
    let duplicate = by_outcome("tr-1", "duplicate");
    assert_ne!(duplicate.trace_id, caller_trace);
    assert_eq!(duplicate.parent_span_id, "", "a new trace");
    assert_eq!(names(&stages(&spans, &duplicate)), ["dedup", "verify"]);

    // The dead letter: normalize failed, the raw body produced to the
    // dead-letter topic under the delivery's trace.
    let letter = by_outcome("tr-2", "dead_lettered");
    assert_eq!(
        letter.attribute("posbridge.dead_letter_reason"),
        Some("unknown_event_type")
    );
    let letter_stages = stages(&spans, &letter);
    assert_eq!(
        names(&letter_stages),
        ["commit", "dedup", "normalize", "produce", "verify"]
    );
    assert_eq!(letter_stages["normalize"].status, SpanStatus::Error);
    assert!(
        letter_stages["normalize"]
            .status_message
            .contains("shift.closed")
    );
    let dead_letters = read_topic(&brokers(), &app.config.kafka.dead_letter_topic());
    assert_eq!(dead_letters.len(), 1);
    assert_eq!(
        dead_letters[0].headers.get("traceparent"),
        Some(&traceparent(
            &letter.trace_id,
            &letter_stages["produce"].span_id
        ))
    );

    // The refusal: verify failed, a 401 with why, and not a continuation of
    // a traceparent that is not valid.
    let refusal = by_outcome("tr-3", "unauthorized");
    assert_eq!(refusal.parent_span_id, "");
    assert_eq!(refusal.attribute("http.response.status_code"), Some("401"));
    assert!(refusal.attribute("posbridge.refusal").is_some());
    assert_eq!(refusal.status, SpanStatus::Unset, "a 4xx is the caller's");
    let verify = stages(&spans, &refusal)["verify"];
    assert_eq!(verify.status, SpanStatus::Error);

    // What is still batched when posbridge stops is exported by the stop:
    // once `stop` returns there is nothing to wait for.
    let last = rr_sale(
        "tr-4",
        "sale.updated",
        "2026-11-29T10:15:33Z",
        "T1|2026-11|71",
        1200,
    );
    assert_eq!(app.send("receiptroller", "main", &last).await.status(), 200);
    app.stop().await;
    let spans = collector.spans();
    let last = deliveries(&spans, "tr-4");
    assert_eq!(
        last.len(),
        1,
        "the last delivery's span, exported at shutdown"
    );
    assert_eq!(stages(&spans, last[0]).len(), 7);
}
