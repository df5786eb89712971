//! JetStream KV buckets, created in a form nats-server 2.9 accepts.
//!
//! async-nats's `create_key_value` first asks for account information in a form
//! nats-server 2.9 does not send, so [`crate::layout::init`] creates a bucket's stream
//! directly with the KV layout (`KV_<bucket>`, `$KV.<bucket>.>`, one message per
//! subject, rollups, direct gets, on disk), and [`open`] opens it as a KV store.

use async_nats::jetstream::{kv, stream};

use crate::{Broker, BrokerError};

use crate::layout::BucketSpec;

/// Open the bucket as the coordinator (or `halyard broker init`) made it, waiting while
/// it does not exist ([`crate::layout::open`]); its stream is returned with the store so
/// that callers can read the settings it was made with.
pub async fn open(
    broker: &Broker,
    spec: BucketSpec,
) -> Result<(kv::Store, stream::Stream), BrokerError> {
    let name = spec.name;
    let s = crate::layout::open(broker, &spec.config(1)).await?;
    let store =
        crate::retry_js(&format!("open the KV bucket {name}"), || broker.js.get_key_value(name))
            .await?;
    Ok((store, s))
}
