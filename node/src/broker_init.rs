//! `halyard broker init`: shape a broker before any run (every stream and bucket of
//! `halyard_broker::layout`, each created if missing and checked if present), with the
//! coordinator role's credentials: the one process besides a coordinator that may.
//! Workers started before it wait for it, and are ready (`/readyz`) once it has run.

use std::time::Duration;

use crate::{Nats, NodeError};

/// Shape the broker at `nats`, the members bucket for quota membership TTL `quota_ttl`;
/// one line per stream, for people.
pub async fn run(nats: Nats, quota_ttl: Duration) -> Result<Vec<String>, NodeError> {
    let broker = halyard_broker::connect(&nats.broker_config("halyard-broker-init")).await?;
    let made =
        halyard_broker::init(&broker, &halyard_broker::layout::Options { quota_ttl }).await?;
    Ok(made
        .iter()
        .map(|m| {
            format!(
                "{:<28} {:<7} {} replica(s)",
                m.name,
                if m.created { "created" } else { "checked" },
                m.replicas
            )
        })
        .collect())
}
