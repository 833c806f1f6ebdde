//! Which cluster and which topics posbridge writes to: the cluster's id and
//! each topic's id, so that the ledger can tell the topics it caches from
//! others of the same name (a cluster replaced at the same address, a topic
//! deleted and made again while posbridge was stopped).
//!
//! rust-rdkafka wraps neither librdkafka's `DescribeTopics` (which alone
//! returns a topic's id) nor its topic-id type, so this module calls the C
//! API directly: the one place in posbridge that does. Every pointer it
//! gets from librdkafka is used and destroyed within one call, on a
//! blocking thread.

#![allow(unsafe_code)]

use std::collections::BTreeMap;
use std::ffi::{CStr, CString, c_char};
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::admin::AdminClient;
use rdkafka::bindings as rd;
use rdkafka::client::DefaultClientContext;
use rdkafka::util::Timeout;

use super::PublishError;
use super::admin_client::Admin;

/// How long one description may take.
const DESCRIBE_TIMEOUT: Duration = Duration::from_secs(10);

/// What the cluster says of itself and of the topics asked for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Described {
    /// The cluster's id; `None` when the broker gives none.
    pub cluster: Option<String>,
    /// Each topic the cluster knows, by name; a topic it does not know is absent.
    pub topics: BTreeMap<String, TopicIdentity>,
}

/// One topic as the cluster describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicIdentity {
    /// The id the cluster gave the topic when it was made (base64, as
    /// Kafka's tools print it); `None` when the broker gives none (the zero id).
    pub id: Option<String>,
    /// Its partitions.
    pub partitions: usize,
}

/// Describes the cluster and `topics` with the admin client configuration.
///
/// # Errors
/// [`PublishError::Describe`] when the broker does not answer or refuses.
pub(super) async fn describe(
    admin_config: &ClientConfig,
    topics: &[String],
) -> Result<Described, PublishError> {
    let admin = Admin::new(admin_config)?;
    let topics = topics.to_vec();
    tokio::task::spawn_blocking(move || {
        let cluster = admin
            .inner()
            .fetch_cluster_id(Timeout::After(DESCRIBE_TIMEOUT));
        let topics = describe_topics(&admin, &topics)?;
        Ok(Described { cluster, topics })
    })
    .await
    .map_err(|join| PublishError::Describe(join.to_string()))?
}

/// librdkafka's `DescribeTopics`, answered on a queue of its own.
fn describe_topics(
    admin: &AdminClient<DefaultClientContext>,
    topics: &[String],
) -> Result<BTreeMap<String, TopicIdentity>, PublishError> {
    let names: Vec<CString> = topics
        .iter()
        .map(|t| CString::new(t.as_str()))
        .collect::<Result<_, _>>()
        .map_err(|e| PublishError::Describe(e.to_string()))?;
    let mut pointers: Vec<*const c_char> = names.iter().map(|n| n.as_ptr()).collect();
    let rk = admin.inner().native_ptr();
    let timeout_ms = i32::try_from(DESCRIBE_TIMEOUT.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: `rk` lives as long as `admin`, borrowed for the whole call;
    // `names` outlives the collection made of its pointers; every object
    // created here is destroyed before returning, the event last (the
    // descriptions read from it live inside it).
    unsafe {
        let queue = rd::rd_kafka_queue_new(rk);
        let collection =
            rd::rd_kafka_TopicCollection_of_topic_names(pointers.as_mut_ptr(), pointers.len());
        let options = rd::rd_kafka_AdminOptions_new(
            rk,
            rd::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_DESCRIBETOPICS,
        );
        let mut errstr = [0 as c_char; 256];
        rd::rd_kafka_AdminOptions_set_request_timeout(
            options,
            timeout_ms,
            errstr.as_mut_ptr(),
            errstr.len(),
        );
        rd::rd_kafka_DescribeTopics(rk, collection, options, queue);
        // Past librdkafka's own request timeout, so its answer (maybe a
        // timeout error) is what ends the wait.
        let event = rd::rd_kafka_queue_poll(queue, timeout_ms.saturating_add(5_000));
        let described = if event.is_null() {
            Err(PublishError::Describe(
                "no answer to DescribeTopics".to_owned(),
            ))
        } else {
            read_described(event)
        };
        if !event.is_null() {
            rd::rd_kafka_event_destroy(event);
        }
        rd::rd_kafka_AdminOptions_destroy(options);
        rd::rd_kafka_TopicCollection_destroy(collection);
        rd::rd_kafka_queue_destroy(queue);
        described
    }
}

/// The topics a `DescribeTopics` result event holds.
///
/// # Safety
/// `event` is a live, non-null event from `rd_kafka_queue_poll`.
unsafe fn read_described(
    event: *mut rd::rd_kafka_event_t,
) -> Result<BTreeMap<String, TopicIdentity>, PublishError> {
    // SAFETY: as the function's contract says; the strings and arrays read
    // belong to the event and are copied out before it is destroyed.
    unsafe {
        let code = rd::rd_kafka_event_error(event);
        if code != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            let reason = text(rd::rd_kafka_event_error_string(event));
            return Err(PublishError::Describe(reason));
        }
        let result = rd::rd_kafka_event_DescribeTopics_result(event);
        if result.is_null() {
            return Err(PublishError::Describe(
                "the answer was not a DescribeTopics result".to_owned(),
            ));
        }
        let mut count = 0;
        let descriptions = rd::rd_kafka_DescribeTopics_result_topics(result, &raw mut count);
        let mut topics = BTreeMap::new();
        for index in 0..count {
            let description = *descriptions.add(index);
            let error = rd::rd_kafka_TopicDescription_error(description);
            if !error.is_null()
                && rd::rd_kafka_error_code(error)
                    != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
            {
                // Unknown to the cluster (or not described to us): absent.
                continue;
            }
            let name = text(rd::rd_kafka_TopicDescription_name(description));
            let uuid = rd::rd_kafka_TopicDescription_topic_id(description);
            let id = (!uuid.is_null()
                && (rd::rd_kafka_Uuid_most_significant_bits(uuid) != 0
                    || rd::rd_kafka_Uuid_least_significant_bits(uuid) != 0))
                .then(|| text(rd::rd_kafka_Uuid_base64str(uuid)));
            let mut partitions = 0;
            rd::rd_kafka_TopicDescription_partitions(description, &raw mut partitions);
            topics.insert(name, TopicIdentity { id, partitions });
        }
        Ok(topics)
    }
}

/// A C string librdkafka owns, copied; empty when null.
///
/// # Safety
/// `pointer` is null or a NUL-terminated string alive for the call.
unsafe fn text(pointer: *const c_char) -> String {
    if pointer.is_null() {
        return String::new();
    }
    // SAFETY: as the function's contract says.
    unsafe { CStr::from_ptr(pointer) }
        .to_string_lossy()
        .into_owned()
}
