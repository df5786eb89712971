//! Broker credentials and TLS flags, the same on `run`, `coordinator` and `worker`.
//! Every flag has an environment variable; secrets (password, token) are best given
//! that way, since a command line is visible to other users in `ps`.

use std::path::PathBuf;

use clap::Args;
use halyard_broker::auth::NatsAuth;

#[derive(Args, Clone, Debug, Default)]
pub struct NatsAuthArgs {
    /// NATS user name (with HALYARD_NATS_PASSWORD).
    #[arg(long, env = "HALYARD_NATS_USER")]
    nats_user: Option<String>,
    /// NATS password (prefer the environment variable).
    #[arg(long, env = "HALYARD_NATS_PASSWORD", hide_env_values = true)]
    nats_password: Option<String>,
    /// NATS authentication token (prefer the environment variable).
    #[arg(long, env = "HALYARD_NATS_TOKEN", hide_env_values = true)]
    nats_token: Option<String>,
    /// File holding an nkey seed (SU…).
    #[arg(long, env = "HALYARD_NATS_NKEY")]
    nats_nkey: Option<PathBuf>,
    /// NATS credentials file (.creds: user JWT and nkey seed).
    #[arg(long, env = "HALYARD_NATS_CREDS")]
    nats_creds: Option<PathBuf>,
    /// PEM file of the CA that signed the server certificate (implies TLS).
    #[arg(long, env = "HALYARD_NATS_CA")]
    nats_ca: Option<PathBuf>,
    /// PEM client certificate, for servers that verify clients (with --nats-key).
    #[arg(long, env = "HALYARD_NATS_CERT")]
    nats_cert: Option<PathBuf>,
    /// PEM key of the client certificate.
    #[arg(long, env = "HALYARD_NATS_KEY")]
    nats_key: Option<PathBuf>,
    /// Refuse a connection without TLS.
    #[arg(long, env = "HALYARD_NATS_TLS")]
    nats_tls: bool,
    /// Allow a plain nats:// connection without credentials to a broker that is not on
    /// loopback (anyone who can reach it can publish jobs and read results).
    #[arg(long, env = "HALYARD_NATS_ALLOW_INSECURE")]
    allow_insecure: bool,
    /// Replicas of Halyard's streams and buckets (1..=5). Default: 1 on a lone server; in
    /// a cluster, 3 when JetStream accepts a 3-replica probe stream, else 1 (loudly).
    #[arg(long, env = "HALYARD_NATS_REPLICAS", value_parser = clap::value_parser!(u8).range(1..=5))]
    nats_replicas: Option<u8>,
}

impl NatsAuthArgs {
    pub fn replicas(&self) -> Option<usize> {
        self.nats_replicas.map(usize::from)
    }

    /// The settings, an empty value counted as none (`HALYARD_NATS_CA=""`, as the compose
    /// cluster's plain-text opt-out sets it, means no CA).
    pub fn auth(&self) -> NatsAuth {
        let text = |v: &Option<String>| v.clone().filter(|s| !s.is_empty());
        let path = |v: &Option<PathBuf>| v.clone().filter(|p| !p.as_os_str().is_empty());
        NatsAuth {
            user: text(&self.nats_user),
            password: text(&self.nats_password),
            token: text(&self.nats_token),
            nkey_seed_file: path(&self.nats_nkey),
            creds_file: path(&self.nats_creds),
            ca_file: path(&self.nats_ca),
            client_cert: path(&self.nats_cert),
            client_key: path(&self.nats_key),
            require_tls: self.nats_tls,
            allow_insecure: self.allow_insecure,
        }
    }
}
