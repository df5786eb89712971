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
//!
//! A process connecting with a user name takes its replies on `_INBOX_<user>.>`
//! ([`inbox_prefix`]), so that per-role permissions can keep each role to its own replies.
//!
//! Transport policy ([`NatsAuth::check_transport`]): a connection to a broker that is not
//! on loopback, over plain `nats://` and without any credentials, is refused unless
//! `allow_insecure` (`--allow-insecure`): anyone who can reach such a broker can publish
//! jobs to every worker and read every result. A password or token sent over plain
//! `nats://` to another host is allowed but warned about (an nkey or `.creds` file
//! proves identity without sending a secret).

use std::net::IpAddr;
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
    /// Allow a plain, unauthenticated connection to a broker that is not on loopback.
    pub allow_insecure: bool,
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
            .field("allow_insecure", &self.allow_insecure)
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
        for (what, secret) in [("password", &self.password), ("token", &self.token)] {
            if let Some(s) = secret.as_deref().filter(|s| is_placeholder(s)) {
                return bad(format!(
                    "the NATS {what} is a placeholder ({s:?}, from an example file): set the real \
                     one (HALYARD_NATS_PASSWORD, HALYARD_NATS_TOKEN)"
                ));
            }
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

    /// Whether an identity is configured (user, token, nkey or credentials file).
    fn has_identity(&self) -> bool {
        self.user.is_some()
            || self.token.is_some()
            || self.nkey_seed_file.is_some()
            || self.creds_file.is_some()
    }

    /// Whether TLS is asked for by these settings (the URL may ask for it too).
    fn wants_tls(&self) -> bool {
        self.require_tls || self.ca_file.is_some() || self.client_cert.is_some()
    }

    /// Refuse a plain, unauthenticated connection to a broker that is not on loopback
    /// (unless [`NatsAuth::allow_insecure`]); warn when a password or token would cross
    /// the network in clear. `urls` as given (`nats://h:4222`, `tls://…`, `h:4222`).
    pub fn check_transport(&self, urls: &[&str]) -> Result<(), BrokerError> {
        for url in urls {
            let (scheme, rest) = url.split_once("://").unwrap_or(("nats", url));
            let authority = rest.split(['/', '?']).next().unwrap_or_default();
            let (userinfo, hostport) = match authority.rsplit_once('@') {
                Some((u, h)) => (Some(u), h),
                None => (None, authority),
            };
            let host = match hostport.strip_prefix('[') {
                Some(v6) => v6.split(']').next().unwrap_or_default(),
                None => hostport.rsplit_once(':').map_or(hostport, |(h, _)| h),
            };
            let tls = self.wants_tls() || matches!(scheme, "tls" | "wss");
            let identity = self.has_identity() || userinfo.is_some();
            if tls || is_loopback_host(host) {
                continue;
            }
            if !identity && !self.allow_insecure {
                return Err(BrokerError::Config(format!(
                    "refusing to connect to {} over plain {scheme}:// without credentials or TLS: \
                     anyone who can reach that broker can publish jobs to every worker and read \
                     every result. Give credentials (--nats-user/HALYARD_NATS_PASSWORD, \
                     --nats-nkey, --nats-creds) and TLS (tls://, --nats-ca), or accept it on a \
                     trusted network with --allow-insecure",
                    halyard_proto::redact::url(url)
                )));
            }
            if self.user.is_some() || self.token.is_some() || userinfo.is_some() {
                tracing::warn!(url = %halyard_proto::redact::url(url),
                    "a password or token goes to the broker unencrypted (plain nats:// to another host); use TLS, or an nkey or .creds file");
            }
        }
        Ok(())
    }

    /// Apply to connect options (after [`NatsAuth::validate`]).
    pub(crate) async fn apply(
        &self,
        mut opts: ConnectOptions,
    ) -> Result<ConnectOptions, BrokerError> {
        self.validate()?;
        if let (Some(u), Some(p)) = (&self.user, &self.password) {
            opts =
                opts.user_and_password(u.clone(), p.clone()).custom_inbox_prefix(inbox_prefix(u));
        }
        if let Some(t) = &self.token {
            opts = opts.token(t.clone());
        }
        if let Some(path) = &self.nkey_seed_file {
            let seed = std::fs::read_to_string(path).map_err(|e| {
                BrokerError::Config(format!("nkey seed file {}: {e}", path.display()))
            })?;
            let seed = seed.trim().to_string();
            if let Err(e) = nkeys::KeyPair::from_seed(&seed) {
                return Err(BrokerError::Config(format!(
                    "nkey seed file {}: not an nkey seed: {e}",
                    path.display()
                )));
            }
            // Its replies on `_INBOX_<its public key>` (as a named user's on its name),
            // so that its permissions can keep it to its own replies.
            let inbox = inbox_prefix(&public_key(&seed)?);
            opts = opts.nkey(seed).custom_inbox_prefix(inbox);
        }

        if let Some(path) = &self.creds_file {
            opts = opts.credentials_file(path).await.map_err(|e| {
                BrokerError::Config(format!("credentials file {}: {e}", path.display()))
            })?;
            // The user's public key is the JWT's subject: replies on its own inbox too.
            let text = std::fs::read_to_string(path).map_err(|e| {
                BrokerError::Config(format!("credentials file {}: {e}", path.display()))
            })?;
            let seed = creds_seed(&text).ok_or_else(|| {
                BrokerError::Config(format!(
                    "credentials file {}: no user nkey seed in it",
                    path.display()
                ))
            })?;
            opts = opts.custom_inbox_prefix(inbox_prefix(&public_key(seed)?));
        }
        if let Some(ca) = &self.ca_file {
            opts = opts.add_root_certificates(ca.clone());
        }
        if let (Some(c), Some(k)) = (&self.client_cert, &self.client_key) {
            opts = opts.add_client_certificate(c.clone(), k.clone());
        }
        if self.wants_tls() {
            opts = opts.require_tls(true);
        }
        Ok(opts)
    }
}

/// A secret left as an example file has it (`REPLACE-ME`, `changeme`, `...`): never a real
/// one, so a process refuses to start with it rather than fail later, or worse, connect to
/// a broker configured with the same placeholder.
pub fn is_placeholder(s: &str) -> bool {
    let t = s.trim();
    t.contains("REPLACE-ME") || ["changeme", "..."].iter().any(|p| t.eq_ignore_ascii_case(p))
}

/// The reply-subject prefix of a process connecting as `user`: `_INBOX_<user>` (other
/// characters than letters, digits, `-` and `_` become `_`). Per user, so that broker
/// permissions can let each role subscribe to its own replies only
/// (`deploy/nats/permissions.conf`): a worker cannot read the coordinator's pulled
/// results or API answers.
///
/// An nkey or `.creds` user has no name: its public key (`U…`) stands for it, so its
/// permissions allow `_INBOX_<public key>.>`.
pub fn inbox_prefix(user: &str) -> String {
    let clean: String = user
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' })
        .collect();
    format!("_INBOX_{clean}")
}

/// The public key of an nkey seed.
fn public_key(seed: &str) -> Result<String, BrokerError> {
    nkeys::KeyPair::from_seed(seed.trim())
        .map(|k| k.public_key())
        .map_err(|e| BrokerError::Config(format!("not an nkey seed: {e}")))
}

/// The user seed of a `.creds` file: the line after `-----BEGIN USER NKEY SEED-----`.
fn creds_seed(text: &str) -> Option<&str> {
    let mut lines = text.lines().map(str::trim);
    lines.by_ref().find(|l| l.contains("BEGIN USER NKEY SEED"))?;
    lines.find(|l| !l.is_empty()).filter(|l| l.starts_with("SU"))
}

/// True for `localhost` (and `*.localhost`), 127.0.0.0/8 and ::1 (IPv6 with or without
/// brackets).
pub fn is_loopback_host(host: &str) -> bool {
    let h = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = h.parse::<IpAddr>() {
        return ip.is_loopback();
    }
    let d = h.trim_end_matches('.').to_ascii_lowercase();
    d == "localhost" || d.ends_with(".localhost")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 33: a password or token left as an example file's placeholder is refused
    /// before connecting, naming what to set; a real one passes.
    #[test]
    fn placeholder_secrets_are_refused() {
        let with = |password: &str| NatsAuth {
            user: Some("halyard-worker".into()),
            password: Some(password.into()),
            ..Default::default()
        };
        for p in ["REPLACE-ME", " REPLACE-ME\n", "changeme", "CHANGEME", "..."] {
            let e = with(p).validate().unwrap_err().to_string();
            assert!(e.contains("placeholder") && e.contains("HALYARD_NATS_PASSWORD"), "{p:?}: {e}");
        }
        assert!(with("k3rT-91xq").validate().is_ok());
        let token = NatsAuth { token: Some("REPLACE-ME".into()), ..Default::default() };
        assert!(token.validate().unwrap_err().to_string().contains("token"));
    }

    /// Issue 13: plain, anonymous connections leave the machine only with
    /// `allow_insecure`; credentials, TLS or loopback are each enough; the refusal says
    /// why and hides URL credentials.
    #[test]
    fn insecure_brokers_are_refused() {
        let none = NatsAuth::default();
        for ok in [
            "nats://127.0.0.1:4222",
            "localhost:4222",
            "nats://[::1]:4222",
            "tls://nats.example:4222",
        ] {
            assert!(none.check_transport(&[ok]).is_ok(), "{ok}");
        }
        for bad in ["nats://nats.example:4222", "10.0.0.3:4222", "nats://[2001:db8::1]:4222"] {
            let e = none.check_transport(&["nats://127.0.0.1:1", bad]).unwrap_err().to_string();
            assert!(
                e.contains("--allow-insecure") && e.contains("without credentials or TLS"),
                "{e}"
            );
        }
        let url = "nats://nats.example:4222";
        let with = |a: NatsAuth| a.check_transport(&[url]).is_ok();
        assert!(with(NatsAuth { allow_insecure: true, ..Default::default() }));
        assert!(with(NatsAuth { nkey_seed_file: Some("seed.nk".into()), ..Default::default() }));
        assert!(with(NatsAuth { require_tls: true, ..Default::default() }));
        assert!(with(NatsAuth {
            user: Some("u".into()),
            password: Some("p".into()),
            ..Default::default()
        }));
        assert!(none.check_transport(&["nats://u:p@nats.example:4222"]).is_ok());
        let e =
            none.check_transport(&["nats://nats.example:4222/?x=sk-abcdefgh123456"]).unwrap_err();
        assert!(!e.to_string().contains("sk-abcdefgh123456"), "{e}");
    }

    /// Reply prefixes are per user and always a valid subject token.
    #[test]
    fn inbox_prefixes() {
        assert_eq!(inbox_prefix("halyard-worker"), "_INBOX_halyard-worker");
        assert_eq!(inbox_prefix("a.b c>*"), "_INBOX_a_b_c__");
    }

    /// The seed of a `.creds` file (the format `nsc` writes) and its public key.
    #[test]
    fn creds_files_give_their_user_key() {
        let k = nkeys::KeyPair::new_user();
        let seed = k.seed().unwrap();
        let text = format!(
            "-----BEGIN NATS USER JWT-----\neyJ0eXAi.e30.sig\n------END NATS USER JWT------\n\n\
             ************************* IMPORTANT *************************\n\n\
             -----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n"
        );
        assert_eq!(creds_seed(&text), Some(seed.as_str()));
        assert_eq!(public_key(creds_seed(&text).unwrap()).unwrap(), k.public_key());
        assert_eq!(creds_seed("no seed here"), None);
    }

    /// Loopback names and addresses, and nothing else.
    #[test]
    fn loopback_hosts() {
        for h in
            ["localhost", "LOCALHOST.", "a.localhost", "127.0.0.1", "127.1.2.3", "::1", "[::1]"]
        {
            assert!(is_loopback_host(h), "{h}");
        }
        for h in ["localhost.example", "10.0.0.1", "::2", "", "nats"] {
            assert!(!is_loopback_host(h), "{h}");
        }
    }
}
