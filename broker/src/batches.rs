//! Reading the provider batches bucket ([`halyard_proto::provider_batch`]) from outside
//! the worker that owns the batches: the coordinator's progress, `halyard status`,
//! `/metrics`. Read-only; a bucket that does not exist yet reads as no batches.

use std::time::Duration;

use futures::StreamExt;
use halyard_proto::provider_batch::{summarize, BatchGroup, BatchRecord, BATCHES_BUCKET};

use crate::Broker;

/// How long one reading of the bucket may take before it is given up (status must not
/// hang on a slow broker).
const READ_TIMEOUT: Duration = Duration::from_secs(3);

/// Every readable batch record (values that do not parse are skipped: the bucket is on a
/// shared broker). Empty when the bucket does not exist or cannot be read in time.
pub async fn records(broker: &Broker) -> Vec<BatchRecord> {
    let read = async {
        let Ok(kv) = broker.js.get_key_value(BATCHES_BUCKET).await else { return Vec::new() };
        let Ok(mut keys) = kv.keys().await else { return Vec::new() };
        let mut out = Vec::new();
        while let Some(Ok(k)) = keys.next().await {
            if !k.starts_with("r.") {
                continue;
            }
            if let Ok(Some(v)) = kv.get(&k).await {
                if let Ok(r) = serde_json::from_slice::<BatchRecord>(&v) {
                    out.push(r);
                }
            }
        }
        out
    };
    tokio::time::timeout(READ_TIMEOUT, read).await.unwrap_or_default()
}

/// The live batches of `pools` (all pools when empty), grouped by pool and state.
pub async fn summary(broker: &Broker, pools: &[String]) -> Vec<BatchGroup> {
    let mut records = records(broker).await;
    if !pools.is_empty() {
        records.retain(|r| pools.contains(&r.pool));
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    summarize(&records, now)
}
