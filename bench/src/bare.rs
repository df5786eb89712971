//! (a) The bare JetStream round trip: the least any orchestrator on this broker must do
//! per job, with no checkpoint, no decoding and no bookkeeping.
//!
//! Jobs are loaded into `HALYARD_JOBS` beforehand (not timed): the very messages the
//! coordinator would publish for the noop benchmark, with their `Nats-Msg-Id`. The timed
//! loop then does, per job: pull it (the same pull consumer and pull requests as a
//! worker: as many jobs as free slots, waiting at the broker while the queue is empty),
//! publish a result of the size a worker publishes to `HALYARD_RESULTS` (with a
//! `Nats-Msg-Id`), await the broker's ack, ack the job. Up to `in_flight` jobs at once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use async_nats::jetstream;
use bytes::Bytes;
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use halyard_broker::{Broker, PullConsumer};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

/// Open pull requests wait this long at the broker (as the worker's do).
pub const PULL_WAIT: Duration = Duration::from_millis(500);

/// Publish `jobs` (already encoded, with their message ids) to `subject`, pipelined.
pub async fn preload(
    broker: &Broker,
    subject: &str,
    jobs: impl Iterator<Item = (String, Bytes)>,
) -> anyhow::Result<u64> {
    let mut acks = FuturesUnordered::new();
    let mut n = 0;
    for (msg_id, payload) in jobs {
        let m = jetstream::message::PublishMessage::build().payload(payload).message_id(msg_id);
        let ack =
            broker.js.send_publish(subject.to_string(), m).await.context("preload publish")?;
        acks.push(std::future::IntoFuture::into_future(ack));
        n += 1;
        while acks.len() >= 4096 {
            if let Some(r) = acks.next().await {
                r.context("preload publish ack")?;
            }
        }
    }
    while let Some(r) = acks.next().await {
        r.context("preload publish ack")?;
    }
    Ok(n)
}

/// Run `n` round trips with at most `in_flight` at once; returns the elapsed time.
pub async fn round_trip(
    broker: &Broker,
    consumer: &PullConsumer,
    result_subject: &str,
    result_payload: Bytes,
    n: u64,
    in_flight: usize,
) -> anyhow::Result<Duration> {
    let slots = Arc::new(Semaphore::new(in_flight.max(1)));
    let subject = async_nats::Subject::from(result_subject);
    let mut tasks: JoinSet<anyhow::Result<()>> = JoinSet::new();
    let start = Instant::now();
    let mut pulled = 0u64;
    let mut idle = true;
    while pulled < n {
        let first = slots.clone().acquire_owned().await?;
        let want = (slots.available_permits() + 1).min((n - pulled) as usize);
        // The worker's pulls (pool.rs): a batch while jobs are queued, one waiting job when idle.
        let mut batch = if idle {
            consumer.batch().max_messages(1).expires(PULL_WAIT).messages().await
        } else {
            consumer.fetch().max_messages(want).messages().await
        }
        .context("pull jobs")?;
        idle = true;
        let mut first = Some(first);
        while let Some(m) = batch.next().await {
            let Ok(m) = m else { break };
            idle = false;
            let permit = match first.take() {
                Some(p) => p,
                None => slots.clone().acquire_owned().await?,
            };
            pulled += 1;
            let (js, subject, payload) =
                (broker.js.clone(), subject.clone(), result_payload.clone());
            tasks.spawn(async move {
                let id = m
                    .headers
                    .as_ref()
                    .and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))
                    .map(|v| v.as_str().to_string());
                let Some(id) = id else { bail!("job message without Nats-Msg-Id") };
                let p = jetstream::message::PublishMessage::build().payload(payload).message_id(id);
                js.send_publish(subject, p).await?.await?;
                m.ack().await.map_err(|e| anyhow::anyhow!("ack: {e}"))?;
                drop(permit);
                Ok(())
            });
            while let Some(r) = tasks.try_join_next() {
                r??;
            }
        }
    }
    while let Some(r) = tasks.join_next().await {
        r??;
    }
    let elapsed = start.elapsed();
    // Make sure the last acks reached the broker before anyone looks at the stream.
    broker.client.flush().await.context("flush")?;
    Ok(elapsed)
}
