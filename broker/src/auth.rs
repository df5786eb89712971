//! How a process proves who it is to the broker, and how the connection is encrypted.
//!
//! Every Halyard process (`halyard run --nats`, `coordinator`, `worker`) takes the same
//! settings from flags or environment variables (see the CLI); none of them can come
//! from a sweep file, so a sweep can be shared without leaking a secret. Secrets are
//! never printed: [`NatsAuth`]'s `Debug` shows which methods are set, not their values.
//!
//! Methods (at most one identity, as nats-server accepts one per connection):
//! user + password, token, nkey seed (read from a file), or a `.creds` file (JWT + nkey
//! seed, decentralised auth). TLS: a custom CA to verify the server with, a client
//! certificate and key for servers that verify clients, and `require_tls` to refuse a
//! plain connection even when the URL says `nats://`.

use std::path::PathBuf;

use async_nats::ConnectOptions;

use crate::BrokerError;

/// Credentials and TLS settings for the broker connection. The default is none of them.
#[derive(Clone, Default)]
pub struct NatsAuth {
    pub user: Option<String>,
    pub password: Option<String>,
    pub token: Option<String>,
    /// File holding an nkey seed (`SU...`), the user's private key.
    pub nkey_seed_file: Option<PathBuf>,
    /// A NATS `.creds` file (user JWT and nkey seed).
    pub creds_file: Option<PathBuf>,
    /// PEM file of the CA(s) that signed the server's certificate.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate and its key, for servers that verify clients (mutual TLS).
    pub client_cert: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
    /// Refuse to talk to the server without TLS.
    pub require_tls: bool,
}

impl std::fmt::Debug for NatsAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let set = |o: bool| if o { "<set>" } else { "-" };
        f.debug_struct("NatsAuth")
            .field("user", &self.user)
            .field("password", &set(self.password.is_some()))
            .field("token", &set(self.token.is_some()))
            .field("nkey_seed_file", &self.nkey_seed_file)
            .field("creds_file", &self.creds_file)
            .field("ca_file", &self.ca_file)
            .field("client_cert", &self.client_cert)
            .field("client_key", &self.client_key)
            .field("require_tls", &self.require_tls)
            .finish()
    }
}

impl NatsAuth {
    /// Which identity method is configured, for messages ("user halyard", "token", …).
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(u) = &self.user {
            parts.push(format!("user {u:?}"));
        }
        if self.token.is_some() {
            parts.push("token".to_string());
        }
        if let Some(p) = &self.nkey_seed_file {
            parts.push(format!("nkey from {}", p.display()));
        }
        if let Some(p) = &self.creds_file {
            parts.push(format!("credentials file {}", p.display()));
        }
        if parts.is_empty() {
            "no credentials".to_string()
        } else {
            parts.join(", ")
        }
    }

    /// Check the combination before connecting: one identity at most, password with a
    /// user, certificate with key, and every named file readable.
    pub fn validate(&self) -> Result<(), BrokerError> {
        let bad = |m: String| Err(BrokerError::Config(m));
        let identities = [
            self.user.is_some(),
            self.token.is_some(),
            self.nkey_seed_file.is_some(),
            self.creds_file.is_some(),
        ];
        if identities.iter().filter(|x| **x).count() > 1 {
            return bad(format!("use one way to authenticate, not several ({})", self.describe()));
        }
        if self.password.is_some() != self.user.is_some() {
            return bad("a NATS user needs a password and a password needs a user (--nats-user, HALYARD_NATS_PASSWORD)".into());
        }
        if self.client_cert.is_some() != self.client_key.is_some() {
            return bad("a client certificate needs its key and a key needs its certificate (--nats-cert, --nats-key)".into());
        }
        for (what, p) in [
            ("nkey seed file", &self.nkey_seed_file),
            ("credentials file", &self.creds_file),
            ("CA file", &self.ca_file),
            ("client certificate", &self.client_cert),
            ("client key", &self.client_key),
        ] {
            if let Some(p) = p {
                if let Err(e) = std::fs::metadata(p) {
                    return bad(format!("{what} {}: {e}", p.display()));
                }
            }
        }
        Ok(())
    }

    /// Apply to connect options (after [`NatsAuth::validate`]).
    pub(crate) async fn apply(&self, mut opts: ConnectOptions) -> Result<ConnectOptions, BrokerError> {
        self.validate()?;
        if let (Some(u), Some(p)) = (&self.user, &self.password) {
            opts = opts.user_and_password(u.clone(), p.clone());
        }
        if let Some(t) = &self.token {
            opts = opts.token(t.clone());
        }
        if let Some(path) = &self.nkey_seed_file {
            let seed = std::fs::read_to_string(path)
                .map_err(|e| BrokerError::Config(format!("nkey seed file {}: {e}", path.display())))?;
            let seed = seed.trim().to_string();
            if let Err(e) = nkeys::KeyPair::from_seed(&seed) {
                return Err(BrokerError::Config(format!(
                    "nkey seed file {}: not an nkey seed: {e}",
                    path.display()
                )));
            }
            opts = opts.nkey(seed);
        }
        if let Some(path) = &self.creds_file {
            opts = opts
                .credentials_file(path)
                .await
                .map_err(|e| BrokerError::Config(format!("credentials file {}: {e}", path.display())))?;
        }
        if let Some(ca) = &self.ca_file {
            opts = opts.add_root_certificates(ca.clone());
        }
        if let (Some(c), Some(k)) = (&self.client_cert, &self.client_key) {
            opts = opts.add_client_certificate(c.clone(), k.clone());
        }
        if self.require_tls || self.ca_file.is_some() || self.client_cert.is_some() {
            opts = opts.require_tls(true);
        }
        Ok(opts)
    }
}
