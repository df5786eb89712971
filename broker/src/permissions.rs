//! Per-pool broker users (issue 49, items 3 and 7): the nats-server authorization that
//! every generated deployment gets, derived from the one definition of the roles,
//! `deploy/nats/permissions.conf` (built in).
//!
//! The shipped file's worker role serves every pool. For a deployment whose pools are
//! known (a sweep's), [`Authorization::for_pools`] keeps the coordinator and status roles
//! as shipped and gives each pool a worker user of its own, `halyard-worker-<pool token>`
//! ([`worker_user`]), whose role is the shipped worker role with every subject that names
//! pools narrowed to that pool's ([`narrow_worker`]): its jobs (pull, ack), its results
//! subject, its pool-health record, its delivery-budget records, its quota announcements
//! and members, its provider batches, and its own replies (`_INBOX_<user>.>`: a process
//! connecting as a user takes its replies there, [`crate::auth::inbox_prefix`]). Such a
//! credential cannot pull, ack or answer another pool's jobs, pause, excuse or join
//! another pool, or read another pool's workers' replies.
//!
//! Two forms of the same block: nats-server configuration ([`Authorization::conf`],
//! passwords `$VAR` from the server's environment) and Helm values for the NATS chart
//! ([`Authorization::helm_values`], passwords `<< $VAR >>`, each variable filled from a
//! key of the Secret `halyard-nats-credentials`).

use std::collections::BTreeMap;

use halyard_proto::subjects::{pool_consumer, pool_token};
use serde_json::{json, Value};

use crate::BrokerError;

/// The shipped roles (`deploy/nats/permissions.conf`), built in.
pub const SHIPPED: &str = include_str!("../../deploy/nats/permissions.conf");

/// The Secret holding the role passwords (deploy/k8s/secrets).
pub const CREDENTIALS_SECRET: &str = "halyard-nats-credentials";

/// What a role may publish and subscribe to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Role {
    pub publish: Vec<String>,
    pub subscribe: Vec<String>,
}

/// One user of the generated block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct User {
    pub user: String,
    /// The server's environment variable holding its password.
    pub password_var: String,
    /// The key of [`CREDENTIALS_SECRET`] that fills `password_var` (Kubernetes).
    pub secret_key: String,
    /// The pool this user serves (None: coordinator, status).
    pub pool: Option<String>,
    pub role: Role,
}

/// Users and their permissions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Authorization {
    pub users: Vec<User>,
}

fn bad(m: impl Into<String>) -> BrokerError {
    BrokerError::Config(format!("deploy/nats/permissions.conf: {}", m.into()))
}

/// `text` without `#` comments (a `#` inside quotes is kept).
fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let mut quoted = false;
        for c in line.chars() {
            match c {
                '"' => quoted = !quoted,
                '#' if !quoted => break,
                _ => {}
            }
            out.push(c);
        }
        out.push('\n');
    }
    out
}

/// The quoted strings of `<direction> = { allow = [ ... ] }` in a role's block.
fn allow_list(block: &str, direction: &str, role: &str) -> Result<Vec<String>, BrokerError> {
    let start = block
        .find(&format!("{direction} = {{"))
        .ok_or_else(|| bad(format!("role {role}: no `{direction} = {{ allow = [...] }}`")))?;
    let rest = &block[start..];
    let open = rest.find('[').ok_or_else(|| bad(format!("role {role}: `{direction}` has no [")))?;
    let close = rest[open..]
        .find(']')
        .ok_or_else(|| bad(format!("role {role}: `{direction}`'s [ is not closed")))?;
    let list = &rest[open + 1..open + close];
    let subjects: Vec<String> = list.split('"').skip(1).step_by(2).map(str::to_string).collect();
    if subjects.is_empty() {
        return Err(bad(format!("role {role}: `{direction}` allows nothing")));
    }
    Ok(subjects)
}

/// The roles of a permissions file written as the shipped one (`HALYARD_<ROLE> = {
/// publish = { allow = [...] } subscribe = { allow = [...] } }`, then `users = [`).
pub fn parse_roles(text: &str) -> Result<BTreeMap<String, Role>, BrokerError> {
    let text = strip_comments(text);
    let mut starts = Vec::new();
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let t = line.trim();
        if let Some(name) = t.strip_suffix("= {").map(str::trim) {
            if name.starts_with("HALYARD_")
                && name.chars().all(|c| c.is_ascii_uppercase() || c == '_')
            {
                starts.push((name.to_string(), offset + line.len()));
            }
        }
        offset += line.len();
    }
    if starts.is_empty() {
        return Err(bad("no role blocks (`HALYARD_… = {`)"));
    }
    let users = text.find("users = [").ok_or_else(|| bad("no `users = [`"))?;
    let mut roles = BTreeMap::new();
    for (i, (name, from)) in starts.iter().enumerate() {
        let to = starts.get(i + 1).map_or(users, |(_, next)| *next);
        let block = text.get(*from..to).ok_or_else(|| bad(format!("role {name}: misplaced")))?;
        let role = Role {
            publish: allow_list(block, "publish", name)?,
            subscribe: allow_list(block, "subscribe", name)?,
        };
        roles.insert(name.clone(), role);
    }
    Ok(roles)
}

/// The NATS user of `pool`'s workers: `halyard-worker-<pool token>`.
pub fn worker_user(pool: &str) -> String {
    format!("halyard-worker-{}", pool_token(pool))
}

/// The server's environment variable with the password of `pool`'s worker user:
/// `HALYARD_WORKER_<TOKEN>_PASSWORD` (the token upper-cased, `-` as `_`).
pub fn worker_password_var(pool: &str) -> String {
    format!("HALYARD_WORKER_{}_PASSWORD", pool_token(pool).to_ascii_uppercase().replace('-', "_"))
}

/// The key of [`CREDENTIALS_SECRET`] with the password of `pool`'s worker user.
pub fn worker_secret_key(pool: &str) -> String {
    format!("worker-{}-password", pool_token(pool))
}

/// The hex of a pool's name, as its quota subjects and member keys carry it.
fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

/// The shipped worker role kept to `pool` for the user `user`: every subject that names
/// pools narrowed to `pool`'s. Refused if the shipped role lacks one of the subjects
/// narrowed (the file changed and this must follow).
pub fn narrow_worker(worker: &Role, pool: &str, user: &str) -> Result<Role, BrokerError> {
    let token = pool_token(pool);
    let consumer = pool_consumer(pool);
    let h = hex(pool);
    let jobs = halyard_proto::subjects::JOBS_STREAM;
    let map = |subject: &str| -> Option<Vec<String>> {
        Some(match subject {
            "halyard.results.>" => vec![format!("halyard.results.*.{token}")],
            s if s == format!("$JS.API.CONSUMER.INFO.{jobs}.*") => {
                vec![format!("$JS.API.CONSUMER.INFO.{jobs}.{consumer}")]
            }
            s if s == format!("$JS.API.CONSUMER.MSG.NEXT.{jobs}.*") => {
                vec![format!("$JS.API.CONSUMER.MSG.NEXT.{jobs}.{consumer}")]
            }
            s if s == format!("$JS.ACK.{jobs}.>") => vec![format!("$JS.ACK.{jobs}.{consumer}.>")],
            "$KV.halyard_pool_health.>" => vec![format!("$KV.halyard_pool_health.{token}")],
            "$KV.halyard_delivery_budget.>" => {
                vec![format!("$KV.halyard_delivery_budget.{token}.>")]
            }
            "halyard.quota.>" => vec![format!("halyard.quota.{h}")],
            "$KV.halyard_quota_members.>" => vec![format!("$KV.halyard_quota_members.{h}.>")],
            // Provider batches: records, job claims, the queue ledger
            // (halyard_proto::provider_batch's keys).
            "$KV.halyard_batches.>" => vec![
                format!("$KV.halyard_batches.r.{token}.>"),
                format!("$KV.halyard_batches.j.{token}.>"),
                format!("$KV.halyard_batches.q.{token}"),
            ],
            "_INBOX_halyard-worker.>" => vec![format!("{}.>", crate::auth::inbox_prefix(user))],
            _ => return None,
        })
    };
    let narrow = |list: &[String], must: &[&str]| -> Result<Vec<String>, BrokerError> {
        for m in must {
            let m = m.replace("{jobs}", jobs);
            if !list.contains(&m) {
                return Err(bad(format!(
                    "the worker role has no {m:?}, which per-pool users narrow (halyard_broker::permissions)"
                )));
            }
        }
        Ok(list.iter().flat_map(|s| map(s.as_str()).unwrap_or_else(|| vec![s.clone()])).collect())
    };
    Ok(Role {
        publish: narrow(
            &worker.publish,
            &[
                "halyard.results.>",
                "$JS.API.CONSUMER.INFO.{jobs}.*",
                "$JS.API.CONSUMER.MSG.NEXT.{jobs}.*",
                "$JS.ACK.{jobs}.>",
                "$KV.halyard_pool_health.>",
                "$KV.halyard_delivery_budget.>",
                "halyard.quota.>",
                "$KV.halyard_quota_members.>",
                "$KV.halyard_batches.>",
            ],
        )?,
        subscribe: narrow(&worker.subscribe, &["_INBOX_halyard-worker.>", "halyard.quota.>"])?,
    })
}

impl Authorization {
    /// The shipped coordinator and status users, and one worker user per pool of
    /// `pools` (no user for every pool). Pools whose users or password variables would
    /// be the same are refused, naming both.
    pub fn for_pools<'a>(
        pools: impl IntoIterator<Item = &'a str>,
    ) -> Result<Authorization, BrokerError> {
        Self::from_shipped(SHIPPED, pools)
    }

    /// [`Authorization::for_pools`] from the permissions file `text`.
    pub fn from_shipped<'a>(
        text: &str,
        pools: impl IntoIterator<Item = &'a str>,
    ) -> Result<Authorization, BrokerError> {
        let roles = parse_roles(text)?;
        let role =
            |name: &str| roles.get(name).cloned().ok_or_else(|| bad(format!("no role {name}")));
        let worker = role("HALYARD_WORKER")?;
        let mut users = vec![
            User {
                user: "halyard-coordinator".into(),
                password_var: "HALYARD_COORDINATOR_PASSWORD".into(),
                secret_key: "coordinator-password".into(),
                pool: None,
                role: role("HALYARD_COORDINATOR")?,
            },
            User {
                user: "halyard-status".into(),
                password_var: "HALYARD_STATUS_PASSWORD".into(),
                secret_key: "status-password".into(),
                pool: None,
                role: role("HALYARD_STATUS")?,
            },
        ];
        let mut seen: BTreeMap<String, String> = BTreeMap::new();
        let mut any = false;
        for pool in pools {
            any = true;
            if users.iter().any(|u| u.pool.as_deref() == Some(pool)) {
                continue;
            }
            let user = worker_user(pool);
            let var = worker_password_var(pool);
            for name in [&user, &var, &worker_secret_key(pool)] {
                let key = name.to_ascii_lowercase();
                if let Some(other) = seen.insert(key, pool.to_string()) {
                    return Err(BrokerError::Config(format!(
                        "pools {other:?} and {pool:?} would both get the broker name {name}: rename one"
                    )));
                }
            }
            let role = narrow_worker(&worker, pool, &user)?;
            users.push(User {
                secret_key: worker_secret_key(pool),
                user,
                password_var: var,
                pool: Some(pool.to_string()),
                role,
            });
        }
        if !any {
            return Err(BrokerError::Config("no pool to make a worker user for".into()));
        }
        Ok(Authorization { users })
    }

    /// The worker users (one per pool).
    pub fn workers(&self) -> impl Iterator<Item = &User> {
        self.users.iter().filter(|u| u.pool.is_some())
    }

    fn block(&self, password: impl Fn(&str) -> String) -> Value {
        json!({
            "users": self.users.iter().map(|u| json!({
                "user": u.user,
                "password": password(&u.password_var),
                "permissions": {
                    "publish": { "allow": u.role.publish },
                    "subscribe": { "allow": u.role.subscribe },
                },
            })).collect::<Vec<_>>()
        })
    }

    /// A comment line per user: its pool (escaped: a pool name is data).
    fn header(&self, generator: &str) -> String {
        let mut out = format!(
            "# Generated by {generator} from deploy/nats/permissions.conf: the coordinator and\n\
             # status roles as shipped, and one worker user per pool, kept to that pool's jobs,\n\
             # results, records and replies (the book's \"Broker credentials\").\n"
        );
        for u in self.workers() {
            let pool = u.pool.as_deref().unwrap_or_default();
            out.push_str(&format!(
                "#   pool {}: user {}, password ${}\n",
                pool.escape_debug(),
                u.user,
                u.password_var
            ));
        }
        out
    }

    /// nats-server configuration: an `authorization` block, passwords from the server's
    /// environment (`$VAR`: nats-server refuses to start when one is unset).
    pub fn conf(&self, generator: &str) -> String {
        let marker = "__HALYARD_VAR__";
        let block = self.block(|var| format!("{marker}{var}"));
        let mut text = serde_json::to_string_pretty(&block).unwrap_or_default();
        for u in &self.users {
            text = text.replace(
                &format!("\"{marker}{}\"", u.password_var),
                &format!("${}", u.password_var),
            );
        }
        format!("{}authorization {text}\n", self.header(generator))
    }

    /// Helm values for the NATS chart: the block under `config.merge.authorization`
    /// (passwords `<< $VAR >>`, unquoted configuration variables) and the server
    /// container's environment filling each variable from [`CREDENTIALS_SECRET`].
    pub fn helm_values(&self, generator: &str) -> String {
        let block = self.block(|var| format!("<< ${var} >>"));
        let env: serde_json::Map<String, Value> = self
            .users
            .iter()
            .map(|u| {
                (
                    u.password_var.clone(),
                    json!({ "valueFrom": { "secretKeyRef": { "name": CREDENTIALS_SECRET, "key": u.secret_key } } }),
                )
            })
            .collect();
        let values = json!({
            "config": { "merge": { "authorization": block } },
            "container": { "env": env },
        });
        // JSON is YAML: every subject quoted exactly.
        format!(
            "{}{}\n",
            self.header(generator),
            serde_json::to_string_pretty(&values).unwrap_or_default()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shipped roles parse, and a pool's worker keeps every subject of the shipped
    /// worker role except those naming pools, which name its pool only.
    #[test]
    fn a_pool_worker_is_the_worker_role_kept_to_its_pool() {
        let roles = parse_roles(SHIPPED).unwrap();
        assert_eq!(
            roles.keys().collect::<Vec<_>>(),
            ["HALYARD_COORDINATOR", "HALYARD_STATUS", "HALYARD_WORKER"]
        );
        let a = Authorization::for_pools(["free", "paid tier"]).unwrap();
        let names: Vec<&str> = a.users.iter().map(|u| u.user.as_str()).collect();
        let hashed = pool_token("paid tier");
        let hashed_user = format!("halyard-worker-{hashed}");
        assert_eq!(
            names,
            ["halyard-coordinator", "halyard-status", "halyard-worker-free", hashed_user.as_str()]
        );
        let free = &a.users[2].role;
        for s in [
            "halyard.results.*.free",
            "$JS.API.CONSUMER.MSG.NEXT.HALYARD_JOBS.pool-free",
            "$JS.ACK.HALYARD_JOBS.pool-free.>",
            "$KV.halyard_pool_health.free",
            "$KV.halyard_delivery_budget.free.>",
            "halyard.quota.66726565",
            "$KV.halyard_quota_members.66726565.>",
            "$KV.halyard_batches.q.free",
            "$JS.API.STREAM.INFO.HALYARD_JOBS",
        ] {
            assert!(free.publish.iter().any(|p| p == s), "{s}");
        }
        assert_eq!(free.subscribe, ["_INBOX_halyard-worker-free.>", "halyard.quota.66726565"]);
        for p in free.publish.iter().chain(&free.subscribe) {
            assert!(!p.ends_with(".*") || !p.contains("HALYARD_JOBS"), "{p}");
            assert!(
                !["halyard.results.>", "halyard.quota.>", "$KV.halyard_pool_health.>"]
                    .contains(&p.as_str()),
                "{p}"
            );
        }
        assert_eq!(
            a.users[3].password_var,
            format!("HALYARD_WORKER_{}_PASSWORD", hashed.to_ascii_uppercase().replace('-', "_"))
        );
    }

    /// Two pools that would share a user or a password variable are refused, naming
    /// both; a role missing a narrowed subject is refused, naming it.
    #[test]
    fn clashing_pools_and_changed_roles_are_refused() {
        let e = Authorization::for_pools(["a-b", "a_b"]).unwrap_err().to_string();
        assert!(e.contains("\"a-b\"") && e.contains("\"a_b\"") && e.contains("rename"), "{e}");
        let e = Authorization::for_pools(["Free", "free"]).unwrap_err().to_string();
        assert!(e.contains("rename"), "{e}");
        assert!(Authorization::for_pools(std::iter::empty::<&str>()).is_err());
        let changed = SHIPPED.replace("\"$JS.ACK.HALYARD_JOBS.>\"", "\"$JS.ACK.HALYARD_JOBS.x\"");
        let e = Authorization::from_shipped(&changed, ["free"]).unwrap_err().to_string();
        assert!(e.contains("$JS.ACK.HALYARD_JOBS.>"), "{e}");
    }

    /// A pool name is data: escaped in the header comment, absent from every subject but
    /// as its token or hex.
    #[test]
    fn pool_names_stay_in_their_comment_line() {
        let a = Authorization::for_pools(["p\nusers = []"]).unwrap();
        for text in [a.conf("test"), a.helm_values("test")] {
            assert!(!text.lines().any(|l| l.trim_start().starts_with("users = []")), "{text}");
        }
        let conf = a.conf("test");
        assert!(conf.contains("\"password\": $HALYARD_COORDINATOR_PASSWORD"), "{conf}");
        let helm = a.helm_values("test");
        assert!(helm.contains("<< $HALYARD_STATUS_PASSWORD >>"), "{helm}");
    }
}
