//! JetStream KV buckets, created in a form nats-server 2.9 accepts.
//!
//! async-nats's `create_key_value` first asks for account information in a form
//! nats-server 2.9 does not send, so the bucket's stream is created directly with the
//! KV layout (`KV_<bucket>`, `$KV.<bucket>.>`, one message per subject, rollups, direct
//! gets) and then opened as a KV store.

use std::time::Duration;

use async_nats::jetstream::{kv, stream};

use crate::{Broker, BrokerError};

/// How a bucket keeps its keys.
#[derive(Clone, Copy, Debug)]
pub struct BucketSpec<'a> {
    pub name: &'a str,
    /// Keys not written for this long expire (zero: never).
    pub max_age: Duration,
    /// Memory for ephemeral state, file for state that must survive a broker restart.
    pub storage: stream::StorageType,
}

/// Open the bucket, creating its stream if missing. An existing stream keeps its own
/// settings (a running cluster's bucket is not reconfigured by a new process); the
/// stream is returned with the store so callers can read those settings.
pub async fn open_bucket(
    broker: &Broker,
    spec: BucketSpec<'_>,
) -> Result<(kv::Store, stream::Stream), BrokerError> {
    let name = spec.name;
    let cfg = stream::Config {
        name: format!("KV_{name}"),
        subjects: vec![format!("$KV.{name}.>")],
        max_messages_per_subject: 1,
        max_age: spec.max_age,
        storage: spec.storage,
        allow_rollup: true,
        deny_delete: true,
        allow_direct: true,
        discard: stream::DiscardPolicy::New,
        num_replicas: crate::stream_replicas(broker).await,
        ..Default::default()
    };
    // Both requests are retried together: a broker restarting between them loses the
    // second's answer, or (a memory bucket) the stream itself, which the next try creates.
    let opened = crate::retry_js(&format!("open the KV bucket {name}"), || async {
        let s = broker.js.get_or_create_stream(cfg.clone()).await.map_err(|e| e.to_string())?;
        match broker.js.get_key_value(name).await {
            Ok(store) => Ok((store, s)),
            Err(e) => Err(crate::vanished(e.to_string())),
        }
    })
    .await?;
    crate::check_shape(&opened.1.cached_info().config, &cfg)?;
    // Memory buckets (membership, health) hold nothing a restart cannot rebuild.
    if spec.storage == stream::StorageType::File {
        let held = opened.1.cached_info().config.num_replicas;
        crate::check_replicas(broker, &format!("KV_{name}"), held).await;
    }
    Ok(opened)
}
