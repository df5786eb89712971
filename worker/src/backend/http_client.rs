//! The HTTP client the worker's HTTP backends share (one connection pool, the workers'
//! TLS provider), and the largest answer body they read.

use std::time::Duration;

use crate::call_error::CallError;

/// A shared client: cloning shares its connection pool.
#[derive(Clone)]
pub struct HttpClient {
    pub client: reqwest::Client,
    /// Largest response body read (bytes).
    pub max_body_bytes: u64,
}

impl HttpClient {
    pub fn new(max_body_bytes: u64) -> Result<HttpClient, CallError> {
        // reqwest is built without a default TLS provider; use ring (already linked by async-nats).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(64)
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| CallError::permanent(format!("cannot build HTTP client: {e}")))?;
        Ok(HttpClient { client, max_body_bytes })
    }
}
