//! The admin client every look at the cluster makes (the start-up check,
//! the topic watch, a dead letter's topic limit, the cluster's description),
//! dropped where no webhook waits for it.
//!
//! An rdkafka client's drop (`rd_kafka_destroy`) waits for its threads to
//! end: about a tenth of a second in which the thread dropping it runs
//! nothing else. Dropped on a runtime worker, every task on that worker
//! waited; the topic watch did that every `kafka.topic_check_secs`, and a
//! flood's p99 showed each one.

use std::ops::Deref;

use rdkafka::ClientConfig;
use rdkafka::admin::AdminClient;
use rdkafka::client::DefaultClientContext;

use super::PublishError;

/// An admin client whose drop runs on the runtime's blocking threads.
pub(super) struct Admin(Option<AdminClient<DefaultClientContext>>);

impl Admin {
    /// Makes one from the admin settings.
    ///
    /// # Errors
    /// [`PublishError::Config`] when librdkafka refuses a property.
    pub(super) fn new(config: &ClientConfig) -> Result<Admin, PublishError> {
        config
            .create()
            .map(|client| Admin(Some(client)))
            .map_err(PublishError::Config)
    }
}

impl Deref for Admin {
    type Target = AdminClient<DefaultClientContext>;

    fn deref(&self) -> &Self::Target {
        self.0
            .as_ref()
            .expect("an admin client is held until it is dropped")
    }
}

impl Drop for Admin {
    fn drop(&mut self) {
        let Some(client) = self.0.take() else {
            return;
        };
        // Outside a runtime (a tool's last use) nothing else waits.
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(move || drop(client))),
            Err(_) => drop(client),
        }
    }
}
