//! How to reach Redis, and the one connection the counters and the rate share each keep to it.
//!
//! Three topologies, named by the URL's scheme (the `s` after `redis` is TLS):
//!
//! | URL | topology |
//! | --- | --- |
//! | `redis://[user:password@]host:port[/db]`, `rediss://...` | one server (or a proxy in front of several) |
//! | `redis+cluster://[user:password@]host:port[,host:port...]`, `rediss+cluster://...` | a Redis Cluster, found from its seed nodes; commands follow the slots as they move |
//! | `redis+sentinel://[user:password@]host:port[,host:port...]/MASTER[/db]`, `rediss+sentinel://...` | the primary that the sentinels name `MASTER`, asked again after every failure, so a failover is followed |
//!
//! The user and password are the data servers' (a sentinel is asked without them). For TLS, the
//! certificates an operator gives: a CA of their own (else the public web's roots) and a client
//! certificate when the servers ask for one. The URL is never shown: it may carry the password.

use std::time::Duration;

use futures_util::future::try_join_all;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{
    AsyncConnectionConfig, Client, Cmd, ErrorKind, FromRedisValue, IntoConnectionInfo, Pipeline, RedisError,
    RedisFuture, RedisResult, Script, ServerErrorKind, TlsMode, Value,
};

use crate::shared::CounterError;

/// The certificates of a TLS connection to Redis, PEM.
#[derive(Clone, Default)]
pub struct RedisTls {
    /// Trusted instead of the public web's roots.
    pub ca: Option<Vec<u8>>,
    /// A client certificate and its key, for a server that asks for one.
    pub client: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for RedisTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisTls")
            .field("ca", &self.ca.is_some())
            .field("client", &self.client.is_some())
            .finish()
    }
}

impl RedisTls {
    fn is_default(&self) -> bool {
        self.ca.is_none() && self.client.is_none()
    }

    fn certificates(&self) -> redis::TlsCertificates {
        redis::TlsCertificates {
            client_tls: self.client.as_ref().map(|(cert, key)| redis::ClientTlsConfig {
                client_cert: cert.clone(),
                client_key: key.clone(),
            }),
            root_cert: self.ca.clone(),
        }
    }
}

/// Where the data lives, as the URL names it.
enum Target {
    Server(Client),
    Cluster(ClusterClient),
    /// Asking the sentinels takes `&mut`: one connection attempt at a time.
    Sentinel(tokio::sync::Mutex<SentinelClient>),
}

/// A Redis connection of any topology, shared by the tasks that use it (each clone is a handle on
/// the same sockets).
#[derive(Clone)]
pub(crate) enum Connection {
    Server(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Server(connection) => connection.req_packed_command(cmd),
            Self::Cluster(connection) => connection.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Server(connection) => connection.req_packed_commands(pipeline, offset, count),
            Self::Cluster(connection) => connection.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Server(connection) => connection.get_db(),
            Self::Cluster(connection) => connection.get_db(),
        }
    }
}

impl Connection {
    /// Runs every command of `commands` and answers their replies in order: to one server as one
    /// pipeline; to a cluster each on its own, all at once (a cluster's pipeline must stay in one
    /// slot, and these name keys of many). A command that finds `scripts` gone (a restart, a
    /// failover to a replica that never loaded them) has them loaded and is sent again: callers
    /// send only commands that count nothing twice when repeated.
    pub(crate) async fn each<T: FromRedisValue>(
        &mut self,
        commands: &Pipeline,
        scripts: &[&Script],
    ) -> RedisResult<Vec<T>> {
        match self {
            Self::Server(connection) => match commands.query_async(connection).await {
                Err(e) if is_no_script(&e) => {
                    load(connection, scripts).await?;
                    commands.query_async(connection).await
                }
                other => other,
            },
            Self::Cluster(connection) => {
                try_join_all(commands.cmd_iter().map(|command| {
                    let mut connection = connection.clone();
                    async move {
                        match command.query_async(&mut connection).await {
                            Err(e) if is_no_script(&e) => {
                                load(&mut connection, scripts).await?;
                                command.query_async(&mut connection).await
                            }
                            other => other,
                        }
                    }
                }))
                .await
            }
        }
    }
}

fn is_no_script(e: &RedisError) -> bool {
    e.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
}

/// Loads `scripts` (in a cluster, on every primary).
async fn load(connection: &mut impl ConnectionLike, scripts: &[&Script]) -> RedisResult<()> {
    for script in scripts {
        script.load_async(connection).await?;
    }
    Ok(())
}

/// A Redis of any topology, connected lazily: the first call connects and loads the scripts, a
/// failure is forgotten so that the next call connects afresh (and, through Sentinel, finds the
/// primary of the moment).
pub(crate) struct Link {
    target: Target,
    connection: tokio::sync::Mutex<Option<Connection>>,
}

impl Link {
    /// Checks the URL and the certificates; does not connect.
    pub(crate) fn new(url: &str, tls: &RedisTls) -> Result<Self, CounterError> {
        Ok(Self { target: target(url, tls)?, connection: tokio::sync::Mutex::new(None) })
    }

    /// Whether the data is spread over a cluster's slots: keys a script reads together must then
    /// share a hash tag.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.target, Target::Cluster(_))
    }

    /// The connection, made (within `timeout`, each answer within it too) with `scripts` loaded if
    /// there is none.
    pub(crate) async fn connection(&self, timeout: Duration, scripts: &[&Script]) -> RedisResult<Connection> {
        let mut slot = self.connection.lock().await;
        if let Some(connection) = slot.as_ref() {
            return Ok(connection.clone());
        }
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout));
        let mut connection = match &self.target {
            Target::Server(client) => {
                Connection::Server(client.get_multiplexed_async_connection_with_config(&config).await?)
            }
            Target::Cluster(client) => {
                let config = redis::cluster::ClusterConfig::new()
                    .set_connection_timeout(timeout)
                    .set_response_timeout(timeout);
                Connection::Cluster(client.get_async_connection_with_config(config).await?)
            }
            Target::Sentinel(client) => {
                Connection::Server(client.lock().await.get_async_connection_with_config(&config).await?)
            }
        };
        load(&mut connection, scripts).await?;
        *slot = Some(connection.clone());
        Ok(connection)
    }

    /// After a failure: drops a server's connection, so that the next call connects again (through
    /// Sentinel, to the primary of the moment). A cluster's connection is kept: it reconnects to
    /// each server and follows the slots on its own, while building a new one would wait on every
    /// dead seed.
    pub(crate) async fn forget(&self) {
        let mut slot = self.connection.lock().await;
        if matches!(*slot, Some(Connection::Server(_))) {
            *slot = None;
        }
    }
}

/// The target `url` names, with `tls`'s certificates for a TLS scheme.
fn target(url: &str, tls: &RedisTls) -> Result<Target, CounterError> {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let (data_scheme, topology) = scheme.split_once('+').unwrap_or((scheme, ""));
    let secure = match data_scheme {
        "redis" => false,
        "rediss" => true,
        _ => {
            return Err(CounterError::Config(
                "the Redis URL must start with redis://, rediss://, redis+cluster://, rediss+cluster://, redis+sentinel:// or rediss+sentinel://".to_owned(),
            ));
        }
    };
    if !secure && !tls.is_default() {
        return Err(CounterError::Config(
            "a Redis CA or client certificate is for a rediss:// URL only".to_owned(),
        ));
    }
    if secure {
        use_ring();
    }
    let refused = |e: RedisError| CounterError::Config(format!("the Redis URL: {e}"));
    match topology {
        "" if tls.is_default() => Client::open(url).map(Target::Server).map_err(refused),
        "" => Client::build_with_tls(url, tls.certificates())
            .map(Target::Server)
            .map_err(|e| CounterError::Config(format!("the Redis TLS settings: {e}"))),
        "cluster" => {
            let seeds = servers(data_scheme, rest, false)?;
            // A command to a dead primary is retried soon and briefly (the client's defaults wait
            // seconds, then minutes): the caller's own bound gives up first, and the slot map the
            // retries read shows the replica promoted as soon as the cluster does.
            let mut builder =
                ClusterClientBuilder::new(seeds).retries(5).min_retry_wait(10).max_retry_wait(250);
            if secure && !tls.is_default() {
                builder = builder.certs(tls.certificates());
            }
            builder.build().map(Target::Cluster).map_err(refused)
        }
        "sentinel" => sentinel(data_scheme, rest, tls).map(|client| Target::Sentinel(client.into())),
        _ => Err(CounterError::Config(format!(
            "the Redis URL's scheme {data_scheme}+{topology}:// is unknown: +cluster or +sentinel"
        ))),
    }
}

/// The URL of each server of `host:port,host:port...` (what follows the credentials), each with the
/// credentials; with `with_path`, what follows the first `/` too, answered apart.
fn servers(scheme: &str, rest: &str, with_path: bool) -> Result<Vec<String>, CounterError> {
    let (credentials, hosts) = match rest.rsplit_once('@') {
        Some((credentials, hosts)) => (format!("{credentials}@"), hosts),
        None => (String::new(), rest),
    };
    let hosts = if with_path { hosts.split_once('/').map_or(hosts, |(hosts, _)| hosts) } else { hosts };
    let hosts = hosts.trim_end_matches('/');
    if hosts.is_empty() || hosts.split(',').any(str::is_empty) {
        return Err(CounterError::Config("the Redis URL names no host, or an empty one".to_owned()));
    }
    if !with_path && hosts.contains('/') {
        return Err(CounterError::Config(
            "a Redis Cluster URL has no database: the cluster has only database 0".to_owned(),
        ));
    }
    Ok(hosts.split(',').map(|host| format!("{scheme}://{credentials}{host}")).collect())
}

/// A client of the primary that the sentinels of `rest` (`[user:password@]host:port,.../MASTER[/db]`)
/// name.
fn sentinel(scheme: &str, rest: &str, tls: &RedisTls) -> Result<SentinelClient, CounterError> {
    let after_hosts = rest.rsplit_once('@').map_or(rest, |(_, hosts)| hosts);
    let path = after_hosts.split_once('/').map_or("", |(_, path)| path);
    let (master, db) = path.split_once('/').unwrap_or((path, ""));
    if master.is_empty() {
        return Err(CounterError::Config(
            "a Redis Sentinel URL names its primary: redis+sentinel://host:port,.../MASTER_NAME".to_owned(),
        ));
    }
    let refused = |e: RedisError| CounterError::Config(format!("the Redis URL: {e}"));
    let servers = servers(scheme, rest, true)?;
    // The credentials are the data servers': the sentinels are addressed without them.
    let mut credentials = None;
    let mut sentinels = Vec::with_capacity(servers.len());
    for server in &servers {
        let info = server.as_str().into_connection_info().map_err(refused)?;
        credentials.get_or_insert_with(|| info.redis_settings().clone());
        sentinels.push(info.addr().clone());
    }
    let mut builder =
        SentinelClientBuilder::new(sentinels, master, SentinelServerType::Master).map_err(refused)?;
    if let Some(settings) = credentials {
        if let Some(username) = settings.username() {
            builder = builder.set_client_to_redis_username(username);
        }
        if let Some(password) = settings.password() {
            builder = builder.set_client_to_redis_password(password);
        }
    }
    if !db.is_empty() {
        let db = db.trim_end_matches('/').parse().map_err(|_| {
            CounterError::Config("the Redis Sentinel URL's database is not a number".to_owned())
        })?;
        builder = builder.set_client_to_redis_db(db);
    }
    if scheme == "rediss" {
        builder = builder
            .set_client_to_redis_tls_mode(TlsMode::Secure)
            .set_client_to_sentinel_tls_mode(TlsMode::Secure);
        if !tls.is_default() {
            builder = builder
                .set_client_to_redis_certificates(tls.certificates())
                .set_client_to_sentinel_certificates(tls.certificates());
        }
    }
    builder.build().map_err(refused)
}

/// redis builds its TLS on the process's default rustls provider: ring, the tree's one (a no-op
/// once one is installed).
fn use_ring() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(url: &str, tls: &RedisTls) -> String {
        match target(url, tls) {
            Ok(_) => panic!("{url} accepted"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_refused_url_is_never_shown() {
        for url in [
            "http://user:s3cret-pw@host:6379/0",
            "redis://user:s3cret-pw@host:port/0",
            "redis+cluster://user:s3cret-pw@a:7000,b:port",
            "redis+cluster://user:s3cret-pw@a:7000,,b:7001",
            "redis+cluster://user:s3cret-pw@a:7000/3",
            "redis+sentinel://user:s3cret-pw@a:26379",
            "redis+sentinel://user:s3cret-pw@a:26379/primary/zero",
            "redis+shard://user:s3cret-pw@a:26379",
        ] {
            let refused = refusal(url, &RedisTls::default());
            assert!(!refused.contains("s3cret-pw"), "{refused}");
        }
        let tls = RedisTls { ca: Some(b"pem".to_vec()), client: None };
        let refused = refusal("redis://user:s3cret-pw@host:6379/0", &tls);
        assert!(refused.contains("rediss:// URL only") && !refused.contains("s3cret-pw"), "{refused}");
    }

    #[test]
    fn each_topology_is_read_from_its_scheme() {
        let plain = RedisTls::default();
        assert!(matches!(target("redis://127.0.0.1:6379/2", &plain), Ok(Target::Server(_))));
        assert!(matches!(target("rediss://h:6380", &plain), Ok(Target::Server(_))));
        assert!(matches!(target("redis+cluster://a:7000,b:7001/", &plain), Ok(Target::Cluster(_))));
        assert!(matches!(target("rediss+cluster://u:p@a:7000", &plain), Ok(Target::Cluster(_))));
        assert!(matches!(
            target("redis+sentinel://a:26379,b:26380/mymaster", &plain),
            Ok(Target::Sentinel(_))
        ));
        assert!(matches!(
            target("rediss+sentinel://u:p@a:26379/mymaster/1", &plain),
            Ok(Target::Sentinel(_))
        ));
        assert!(refusal("redis+sentinel://a:26379/", &plain).contains("MASTER_NAME"));
    }

    #[test]
    fn every_server_carries_the_credentials() {
        let seeds = servers("redis", "u:p%40ss@a:7000,b:7001/", false).expect("servers");
        assert_eq!(seeds, ["redis://u:p%40ss@a:7000", "redis://u:p%40ss@b:7001"]);
        let sentinels = servers("rediss", "a:26379,[::1]:26380/mymaster/2", true).expect("servers");
        assert_eq!(sentinels, ["rediss://a:26379", "rediss://[::1]:26380"]);
    }
}
