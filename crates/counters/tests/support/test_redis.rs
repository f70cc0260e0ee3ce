//! The Redis the counters' tests use: 127.0.0.1:6379 (or `RECOVEA_TEST_REDIS_URL`) unless a test
//! names a topology of its own, a key prefix of each test's own, and its keys deleted when the test
//! ends. Included with `#[path]`.

#![allow(dead_code)]

use std::time::Duration;

pub fn redis_url() -> String {
    std::env::var("RECOVEA_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

/// A Redis deployment under test: the URL the store is given, and how a test looks at the data.
#[derive(Debug)]
pub struct Deployment {
    pub url: String,
    pub inspect: Inspect,
}

/// Where a test reads and deletes keys, past the store.
#[derive(Debug, Clone)]
pub enum Inspect {
    /// One server (directly, or the primary that sentinels name).
    Server(String),
    /// A cluster, through its seeds; keys are deleted server by server.
    Cluster(Vec<String>),
}

/// The shared local Redis.
pub fn local() -> &'static Deployment {
    static LOCAL: std::sync::OnceLock<Deployment> = std::sync::OnceLock::new();
    LOCAL.get_or_init(|| {
        let url = redis_url();
        Deployment { inspect: Inspect::Server(url.clone()), url }
    })
}

/// A deployment that lives as long as the test binary (its processes are the caller's).
pub fn leak(url: String, inspect: Inspect) -> &'static Deployment {
    Box::leak(Box::new(Deployment { url, inspect }))
}

/// A deployment checked with `PING` (the test fails, never skips, without it) and a fresh prefix.
pub struct TestRedis {
    pub url: String,
    pub inspect: Inspect,
    pub prefix: String,
}

impl TestRedis {
    pub async fn connect() -> Self {
        Self::on(local()).await
    }

    pub async fn on(deployment: &Deployment) -> Self {
        let suffix: String = std::iter::repeat_with(fastrand::alphanumeric).take(16).collect();
        let redis = Self {
            url: deployment.url.clone(),
            inspect: deployment.inspect.clone(),
            prefix: format!("recovea-test:{suffix}"),
        };
        let url = redis.url.clone();
        tokio::task::spawn_blocking(move || {
            let pong: String = redis.query(&redis::cmd("PING")).unwrap_or_else(|e| {
                panic!("these tests need Redis at {url} (redis-server --save '' --appendonly no): {e}")
            });
            assert_eq!(pong, "PONG");
            redis
        })
        .await
        .expect("PING")
    }

    /// `command`'s answer, from the server that holds its key (blocking: tests only).
    pub fn query<T: redis::FromRedisValue>(&self, command: &redis::Cmd) -> redis::RedisResult<T> {
        match &self.inspect {
            Inspect::Server(url) => {
                let client = redis::Client::open(url.as_str())?;
                command.query(&mut client.get_connection_with_timeout(Duration::from_secs(5))?)
            }
            Inspect::Cluster(seeds) => {
                let client = redis::cluster::ClusterClient::new(seeds.clone())?;
                command.query(&mut client.get_connection()?)
            }
        }
    }

    /// Deletes every key under the prefix, as a flush would.
    pub fn clear(&self) {
        self.try_clear().expect("delete the test's keys");
    }

    fn try_clear(&self) -> redis::RedisResult<()> {
        let servers = match &self.inspect {
            Inspect::Server(url) => vec![url.clone()],
            Inspect::Cluster(servers) => servers.clone(),
        };
        for server in servers {
            let client = redis::Client::open(server.as_str())?;
            let Ok(mut connection) = client.get_connection_with_timeout(Duration::from_secs(2)) else {
                // A cluster server killed by the test: its keys are its replica's now.
                continue;
            };
            let keys: Vec<String> =
                redis::cmd("KEYS").arg(format!("{}:*", self.prefix)).query(&mut connection)?;
            for key in keys {
                // One key at a time: in a cluster, a command's keys must share a slot. A replica
                // refuses (MOVED): its primary deletes the key.
                let _: redis::RedisResult<i64> = redis::cmd("DEL").arg(key).query(&mut connection);
            }
        }
        Ok(())
    }
}

impl Drop for TestRedis {
    fn drop(&mut self) {
        let _ = self.try_clear();
    }
}
