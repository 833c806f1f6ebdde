//! A spooled delivery replayed by the drainer, top-down: the webhook's
//! line without the spool and without an answer budget (nobody waits for
//! an answer; the producer's own deadline still bounds each record).

use tokio::time::Instant;

use super::intake::{Attempt, Taken, key_of};
use super::outcome::ended;
use super::tasks::Answer;
use super::{Delivery, Outcome, Pipeline, PipelineError};
use crate::observe::traces::Origin as TraceOrigin;

impl Pipeline {
    /// Replays one spooled delivery: the same line as [`Pipeline::deliver`],
    /// on a task of its own, with a trace of its own.
    ///
    /// # Errors
    /// As [`Pipeline::deliver`]; the drainer keeps the entry and tries again.
    pub async fn replay(&self, delivery: Delivery) -> Result<Outcome, PipelineError> {
        let pipeline = self.clone();
        self.on_its_task(|answer| pipeline.replay_on_its_task(delivery, answer))
            .await
    }

    /// [`Pipeline::replay`] on its task: taken in, then sent, within the
    /// in-flight wait and an answer budget; past that the drainer is told
    /// "try again" while a record already sent runs on to its commit.
    async fn replay_on_its_task(
        self,
        mut delivery: Delivery,
        answer: Answer<Result<Outcome, PipelineError>>,
    ) {
        let trace = self.trace_of_its_own(TraceOrigin::SpoolReplay, &mut delivery);
        let _in_flight = self.inner.in_flight.count(delivery.source.provider);
        let deadline = Instant::now() + self.inner.inflight_wait + self.inner.answer_budget;
        let key = key_of(&delivery);
        let (outcome, answer) = match self
            .take_in(&delivery, &key, deadline, Attempt::SpoolReplay)
            .await
        {
            Ok(Taken::Done(handled)) => (Ok(handled.outcome), answer),
            Ok(Taken::Sending(outgoing, _)) => {
                let late = async || {
                    let late = Err(PipelineError::DeadlinePassed);
                    ended(&trace, &late);
                    late
                };
                let sending = Box::pin(self.send_or_dead_letter(outgoing));
                let Some((sent, answer)) = answer.sent_by(deadline, sending, late).await else {
                    return;
                };
                (sent.map(|(outcome, _)| outcome), answer)
            }
            Err(error) => (Err(error), answer),
        };
        ended(&trace, &outcome);
        answer.send(outcome);
    }
}
